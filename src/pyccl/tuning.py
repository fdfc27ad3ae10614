"""Size-based algorithm tables: which algorithm each collective uses at each
message size, per (GPU, world size, dtype), measured by ``python -m pyccl.tune``.

A table is JSON (``"version": 1``)::

    {"version": 1, "gpu": "NVIDIA H200", "world": 4, "dtype": "bfloat16",
     "date": "...", "command": "...",
     "collectives": {"all_reduce": [{"max_bytes": 131072, "algorithm": "1pa_ll"},
                                    ...,
                                    {"max_bytes": null, "algorithm": "nccl"}], ...}}

Entries are in increasing ``max_bytes``; a message of n bytes (the whole
buffer, as nccl-tests counts it) takes the first entry with n <= max_bytes
(``null``: no limit). ``"nccl"`` means the torch group's NCCL, where the call
has one. ``"plan"`` means a plan of pyccl's DSL library run by the plan
interpreter, named with its launch shape::

    {"max_bytes": 65536, "algorithm": "plan", "plan": "allreduce_1pa_ll", "instances": 8, "threads": 512,
     "kernel": "1pa_ll"}

A plan entry's ``"kernel"`` (optional) is the fastest kernel at its sizes: what
runs there where the plan cannot (a caller that runs no plans, an input the
plan does not split into whole chunks, the engine's own choice by size),
instead of the defaults' kernel. The selector takes it from the table of the
call's dtype.

Tables ship in ``pyccl/tuning_tables/``; ``PYCCL_TUNING_FILE`` points at
another (e.g. one ``pyccl.tune`` wrote for this machine).
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional

from . import _C
from .errors import InvalidArgumentError

TABLE_VERSION = 1
# What each collective can be tuned (and forced) to: pyccl's kernels, each a
# forced column of pyccl.bench, and NCCL.
# The names are the selector's (csrc/dispatch/selector.cpp, algorithmsOf). all_reduce_symmetric: input and
# output in symmetric buffers, where 2PA HB runs zero-copy.
CANDIDATES: Dict[str, tuple] = {
    c: tuple(_C.algorithms_of("all_reduce" if c == "all_reduce_symmetric" else c))
    for c in ("all_reduce", "all_reduce_symmetric", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
}
# The collectives pyccl.bench and pyccl.tune measure (all_reduce_symmetric comes
# from the all-reduce rows).
COLLECTIVES = tuple(c for c in CANDIDATES if c != "all_reduce_symmetric")
# Library plans (pyccl.algorithms.LIBRARY) that a table may choose, per collective,
# and the launch shapes pyccl.tune tries for each: instances (thread blocks per
# plan block) and threads per block.
PLANS: Dict[str, tuple] = {
    "all_reduce": ("allreduce_1pa_ll", "allreduce_2pa_ll", "allreduce_1pa_hb",
                   "allreduce_2pa_hb_pull", "allreduce_2pa_hb", "allreduce_ring"),
    "all_gather": ("allgather_allpairs", "allgather_ring"),
    "reduce_scatter": ("reduce_scatter_ring",),
}
#: The all-reduce plans' earlier names, before each took the name of its algorithm's kernel
#: (docs/collectives.md): pyccl.algorithms still gives them, with a DeprecationWarning; a table naming one is
#: refused, naming the new name.
FORMER_NAMES = {
    "allreduce_allpairs_ll": "allreduce_1pa_ll",
    "allreduce_allpairs_ll2": "allreduce_2pa_ll",
    "allreduce_allpairs_hb1": "allreduce_1pa_hb",
    "allreduce_allpairs_hb_push": "allreduce_2pa_hb",
    "allreduce_allpairs_hb": "allreduce_2pa_hb_pull",
}
PLAN_SHAPES = tuple((instances, threads) for instances in (8, 32, 128) for threads in (256, 512))
_MAX_INSTANCES = 1024
# A plan entry's threads per block: whole warps, up to a block's limit.
_MIN_THREADS, _MAX_THREADS = 32, 1024


def plan_column(name: str) -> str:
    """A bench row's column for library plan `name` (its best launch shape's
    time); the shape is under ``plan_column(name) + ":shape"``."""
    return f"plan:{name}"


#: How much faster (a fraction) a candidate must be to displace the one the
#: table already runs at the size below (or, for a plan, the fastest kernel):
#: medians of graph replays move by 1-3% between runs, and a table that
#: follows that noise changes algorithm at every size.
DEFAULT_MARGIN = 0.03


def _kernel_of(entry: Optional[dict]) -> Optional[str]:
    """The kernel (or "nccl") an entry runs: its algorithm, or a plan entry's fallback."""
    if entry is None:
        return None
    return entry.get("kernel") if entry["algorithm"] == "plan" else entry["algorithm"]


def _winner_entry(row: dict, kernels: Dict[str, float], plans: Dict[str, float], previous: Optional[dict],
                  margin: float) -> tuple:
    """(the entry for one measured size, the entry without plans): the fastest
    kernel (NCCL included), unless the size below's choice is within `margin`
    of it; a plan only where it beats the fastest kernel by more than `margin`."""
    kernel_entry = None
    if kernels:
        fastest = min(kernels, key=kernels.get)
        kept = _kernel_of(previous)
        choice = kept if kept in kernels and kernels[kept] <= kernels[fastest] * (1 + margin) else fastest
        kernel_entry = {"algorithm": choice}
    if not plans:
        return kernel_entry, kernel_entry
    best = min(plans, key=plans.get)
    instances, threads = row[best + ":shape"]
    plan = {"algorithm": "plan", "plan": best[len("plan:"):], "instances": instances, "threads": threads}
    ours = {k: t for k, t in kernels.items() if k != "nccl"}
    if ours:  # what runs where the plan cannot: the fastest of pyccl's kernels
        plan["kernel"] = min(ours, key=ours.get)
    if not kernels:
        return plan, None
    if plans[best] * (1 + margin) < min(kernels.values()):
        return plan, kernel_entry
    return kernel_entry, kernel_entry


def _same_choice(a: dict, b: dict) -> bool:
    return {k: v for k, v in a.items() if k != "max_bytes"} == {k: v for k, v in b.items() if k != "max_bytes"}


def _plan_shape(entry: dict) -> Optional[tuple]:
    return (entry["plan"], entry["instances"], entry["threads"]) if entry["algorithm"] == "plan" else None


def _lone_plans_out(winners: List[tuple]) -> List[tuple]:
    """(bytes, entry) per measured size, from (bytes, entry, the entry
    without plans): a plan that wins a size while neither neighbour has it at
    the same launch shape gives way to the choice without plans. A lead at one
    size is within the sweep's scatter, so a plan must win two sizes in a row."""
    out = []
    for i, (n, best, without) in enumerate(winners):
        shape = _plan_shape(best)
        if shape is not None and without is not None and all(
                _plan_shape(winners[j][1]) != shape for j in (i - 1, i + 1) if 0 <= j < len(winners)):
            best = without
        out.append((n, best))
    return out


def check_margin(margin: float) -> None:
    """Raises InvalidArgumentError unless `margin` (see DEFAULT_MARGIN) is in [0, 1)."""
    if not 0 <= margin < 1:
        raise InvalidArgumentError(f"margin must be in [0, 1), got {margin!r}")


def build_table(tables: Dict[str, List[dict]], *, gpu: str, world: int, dtype: str, date: str,
                command: str, margin: float = DEFAULT_MARGIN) -> dict:
    """A table from the bench's rows (``pyccl.bench._bench_rank`` with all
    algorithms): at each measured size the fastest candidate wins, library
    plans (``plan:<name>`` columns) included, unless the choice of the size
    below is within `margin` of it (plans must beat the kernels by more than
    `margin`, at two measured sizes in a row: see :func:`_winner_entry` and
    :func:`_lone_plans_out`); runs of the same winner merge into one entry.
    All-reduce rows with a zero-copy column (``pyccl_sym_2pa_hb``) also give
    the ``all_reduce_symmetric`` entries (kernels and NCCL only)."""
    check_margin(margin)
    tables = dict(tables)
    if any("pyccl_sym_2pa_hb" in r for r in tables.get("all_reduce", ())):
        tables["all_reduce_symmetric"] = tables["all_reduce"]
    collectives = {}
    for collective, rows in tables.items():
        if collective not in CANDIDATES:
            continue  # e.g. send_recv: nothing to choose
        winners: List[tuple] = []  # (bytes, entry, entry without plans) per measured size
        for row in sorted(rows, key=lambda r: r["bytes"]):
            kernels, plans = {}, {}
            for algo in CANDIDATES[collective]:
                column = "nccl" if algo == "nccl" else f"pyccl_{algo}"
                if collective == "all_reduce_symmetric" and algo == "2pa_hb":
                    column = "pyccl_sym_2pa_hb"
                t = row.get(column)
                if t is not None:
                    kernels[algo] = t
            if collective != "all_reduce_symmetric":
                for name in PLANS.get(collective, ()):
                    t = row.get(plan_column(name))
                    if t is not None:
                        plans[plan_column(name)] = t
            best, without_plans = _winner_entry(row, kernels, plans, winners[-1][1] if winners else None, margin)
            if best is not None:
                winners.append((row["bytes"], best, without_plans))
        entries: List[dict] = []
        for n, best in _lone_plans_out(winners):
            if entries and _same_choice(entries[-1], best):
                entries[-1]["max_bytes"] = n
            else:
                entries.append({"max_bytes": n, **best})
        if entries:
            entries[-1]["max_bytes"] = None  # the largest winner goes on beyond the measured range
            collectives[collective] = entries
    return {"version": TABLE_VERSION, "gpu": gpu, "world": world, "dtype": dtype, "date": date,
            "command": command, "collectives": collectives}


def check_table(table: dict, where: str) -> dict:
    """Raises InvalidArgumentError, naming `where`, unless `table` is a valid table."""
    if not isinstance(table, dict) or table.get("version") != TABLE_VERSION:
        raise InvalidArgumentError(f"tuning table {where}: expected version {TABLE_VERSION}, "
                                   f"got {table.get('version') if isinstance(table, dict) else table!r}")
    for collective, entries in table.get("collectives", {}).items():
        if collective not in CANDIDATES:
            raise InvalidArgumentError(f"tuning table {where}: unknown collective {collective!r}")
        last = -1
        for i, e in enumerate(entries):
            if e.get("algorithm") == "plan" and collective in PLANS:
                _check_plan_entry(e, f"tuning table {where}: {collective} entry {i}", PLANS[collective])
                kernel = e.get("kernel")
                if kernel is not None and (kernel not in CANDIDATES[collective] or kernel == "nccl"):
                    raise InvalidArgumentError(f"tuning table {where}: {collective} entry {i} has kernel {kernel!r} "
                                               "(expected one of pyccl's kernels: "
                                               f"{tuple(k for k in CANDIDATES[collective] if k != 'nccl')})")
            elif e.get("algorithm") not in CANDIDATES[collective]:
                raise InvalidArgumentError(f"tuning table {where}: {collective} entry {i} has algorithm "
                                           f"{e.get('algorithm')!r} (expected one of {CANDIDATES[collective]}"
                                           f"{' or plan' if collective in PLANS else ''})")
            limit = e.get("max_bytes")
            if limit is None and i != len(entries) - 1:
                raise InvalidArgumentError(f"tuning table {where}: {collective} entry {i}: only the last "
                                           "entry may have no max_bytes")
            if limit is not None and limit <= last:
                raise InvalidArgumentError(f"tuning table {where}: {collective} entries must grow in max_bytes")
            last = limit if limit is not None else last
    return table


def table_schema() -> dict:
    """The JSON Schema (draft 2020-12) of a tuning table, built from what
    :func:`check_table` accepts (the collectives, each one's algorithms and
    library plans, the launch shapes), so the two cannot drift; published as
    ``pyccl/schemas/tuning-table.schema.json``. The order of the entries
    (growing ``max_bytes``, only the last one unbounded) only
    :func:`check_table` checks."""
    max_bytes = {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "null"}],
                 "description": "the largest message (whole buffer, bytes) the entry covers; null: no limit"}

    def entries(collective: str) -> dict:
        kernel = {"type": "object", "required": ["max_bytes", "algorithm"], "additionalProperties": False,
                  "properties": {"max_bytes": max_bytes, "algorithm": {"enum": list(CANDIDATES[collective])}}}
        choices = [kernel]
        if collective in PLANS:
            choices.append({
                "type": "object", "required": ["max_bytes", "algorithm", "plan", "instances", "threads"],
                "additionalProperties": False,
                "properties": {"max_bytes": max_bytes, "algorithm": {"const": "plan"},
                               "plan": {"enum": list(PLANS[collective])},
                               "instances": {"type": "integer", "minimum": 1, "maximum": _MAX_INSTANCES},
                               "threads": {"type": "integer", "minimum": _MIN_THREADS, "maximum": _MAX_THREADS,
                                           "multipleOf": _MIN_THREADS},
                               "kernel": {"enum": [k for k in CANDIDATES[collective] if k != "nccl"]}}})
        return {"type": "array", "items": {"oneOf": choices}}

    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"urn:pyccl:tuning-table:{TABLE_VERSION}",
        "title": f"pyccl tuning table, version {TABLE_VERSION} (pyccl/tuning.py)",
        "type": "object",
        "required": ["version", "collectives"],
        "properties": {
            "version": {"const": TABLE_VERSION},
            "gpu": {"type": "string", "description": "matched as part of torch.cuda.get_device_name()"},
            "world": {"type": "integer", "minimum": 0},
            "dtype": {"type": "string"},
            "date": {"type": "string"},
            "command": {"type": "string", "description": "how the table was measured"},
            "collectives": {"type": "object", "additionalProperties": False,
                            "properties": {c: entries(c) for c in CANDIDATES}},
        },
    }


def _check_plan_entry(e: dict, where: str, names: tuple) -> None:
    if e.get("plan") in FORMER_NAMES:
        raise InvalidArgumentError(f"{where}: plan {e.get('plan')!r} is now named {FORMER_NAMES[e['plan']]!r}; "
                                   "rename it in the table, or make the table again with python -m pyccl.tune")
    if e.get("plan") not in names:
        raise InvalidArgumentError(f"{where}: plan {e.get('plan')!r} is not a library plan of this collective "
                                   f"(expected one of {', '.join(names)})")
    instances, threads = e.get("instances"), e.get("threads")
    if not isinstance(instances, int) or not 1 <= instances <= _MAX_INSTANCES:
        raise InvalidArgumentError(f"{where}: 'instances' must be an integer in 1..{_MAX_INSTANCES}, got {instances!r}")
    if not isinstance(threads, int) or not _MIN_THREADS <= threads <= _MAX_THREADS or threads % _MIN_THREADS:
        raise InvalidArgumentError(f"{where}: 'threads' must be a multiple of {_MIN_THREADS} in "
                                   f"{_MIN_THREADS}..{_MAX_THREADS}, got {threads!r}")


def select_entry(table: Optional[dict], collective: str, nbytes: int) -> Optional[dict]:
    """The table's entry for a message of `nbytes`, or None (no table, or no
    entry for the collective)."""
    if table is None:
        return None
    for e in table.get("collectives", {}).get(collective, ()):
        if e["max_bytes"] is None or nbytes <= e["max_bytes"]:
            return e
    return None


def select(table: Optional[dict], collective: str, nbytes: int) -> Optional[str]:
    """The table's algorithm for a message of `nbytes` ("plan" for a library
    plan: see :func:`select_entry`), or None."""
    entry = select_entry(table, collective, nbytes)
    return None if entry is None else entry["algorithm"]


def kernel_choices(table: Optional[dict]) -> Dict[str, List[tuple]]:
    """The table's kernel entries per collective, as ``(max_bytes, algorithm)``
    (for a collective engine's automatic choice, e.g. the process group's):
    a plan entry gives its ``"kernel"``; NCCL entries, and plan entries
    without one, are left out, so a size they cover takes the next kernel
    entry (the selector hands NCCL's sizes to NCCL itself). The rule is the
    C++ reader's (``kernelChoicesOf`` in dispatch/tuning_tables.hpp), which
    the NCCL-API library uses too."""
    if not table:
        return {}
    choices = _C.kernel_choices_of(json.dumps(table), "(passed to pyccl.tuning.kernel_choices)")
    return {collective: [tuple(entry) for entry in entries] for collective, entries in choices.items()}


_SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tuning_tables")



def load_table(gpu_name: str, world: int, dtype: Optional[str] = None) -> Optional[dict]:
    """The table for this GPU and world size: ``PYCCL_TUNING_FILE`` if set
    (``none`` for no table), else a shipped one whose "gpu" is part of
    `gpu_name` and whose world size matches (the same dtype preferred), as
    the C++ selector's tables find it (``_C.shipped_table_for``)."""
    path = os.environ.get("PYCCL_TUNING_FILE")
    if path:
        if path.lower() == "none":
            return None
        try:
            with open(path) as f:
                table = json.load(f)
        except OSError as e:
            raise InvalidArgumentError(f"PYCCL_TUNING_FILE {path!r}: {e.strerror}") from e
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InvalidArgumentError(f"PYCCL_TUNING_FILE {path!r}: not a JSON tuning table ({e})") from e
        return check_table(table, path)
    name = _C.shipped_table_for(gpu_name, world, dtype)  # the rule, written once (dispatch/tuning_tables.hpp)
    if name is None:
        return None
    path = os.path.join(_SHIPPED_DIR, name)
    with open(path) as f:
        return check_table(json.load(f), path)
