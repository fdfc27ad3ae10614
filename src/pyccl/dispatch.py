"""What a communicator's selector and collective engine are made from.

The selector (``csrc/dispatch/selector.hpp``) alone chooses what runs each
collective call, for every entry point: a forced algorithm (``algorithm=``
or ``PYCCL_ALGO``), a plan registered with :func:`pyccl.register_algorithm`,
the collectives run across nodes, the tuning table of the call's dtype, or
the defaults (a kernel by size, or NCCL from ``NCCL_MIN_BYTES`` where the
caller has it). It reads the environment and the tables once, when the
communicator is made, as NCCL reads its environment at ``ncclCommInitRank``.

This module builds its config (:func:`selector_config`): the tuning tables
of the device and world size per dtype (``pyccl.tuning``), with the input
chunks of the library plans they name, and the NCCL thresholds.
"""

from __future__ import annotations

import threading
from typing import Dict, Optional, Tuple

import torch

from . import _C, _env, registry, tuning

__all__ = ["ALGORITHMS", "NCCL_MIN_BYTES", "REDUCIBLE_DTYPES", "new_engine", "new_selector", "selector_config",
           "table_for"]

#: The algorithms each collective can be forced to (algorithm= or PYCCL_ALGO) and tuned to: the selector's.
ALGORITHMS: Dict[str, Tuple[str, ...]] = {c: tuning.CANDIDATES[c] for c in tuning.COLLECTIVES}

#: The dtypes pyccl's plans, fused all-reduce + RMSNorm and collectives across nodes reduce (data movement takes
#: any dtype). The kernels' all-reduce and reduce-scatter also reduce float64, float8 and the integers NCCL
#: reduces, and bool (docs/collectives.md, "Reduction dtypes").
REDUCIBLE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: Where no tuning table decides: from these sizes (bytes of the whole buffer) the torch group's NCCL runs. The
#: selector's own defaults (``defaultNcclMinBytes`` in csrc/dispatch/selector.hpp says where they come from).
NCCL_MIN_BYTES: Dict[str, int] = dict(zip(tuning.COLLECTIVES, _C.default_nccl_min_bytes()))

#: What a selector reads from the environment when it is made (with the tables PYCCL_TUNING_FILE names). Ranks
#: that differ would run different algorithms and wait on each other: new engines check that they agree.
SHARED_ENV = ("PYCCL_ALGO", "PYCCL_NCCL_MIN_BYTES", "PYCCL_TUNING_FILE")

_tables: Dict[Tuple[torch.device, int, Optional[torch.dtype]], Optional[dict]] = {}
_tables_lock = threading.Lock()


def table_for(device: torch.device, world: int, dtype: Optional[torch.dtype]) -> Optional[dict]:
    """The tuning table the selector of a communicator on `device` with
    `world` ranks uses for `dtype` (None: data movement of any other dtype),
    or None where no table matches (see pyccl.tuning). In host mode, only the
    one ``PYCCL_TUNING_FILE`` names: the shipped tables are measured on GPUs.
    Looked up once per key."""
    if device.type != "cuda" and not _env.get("PYCCL_TUNING_FILE"):
        return None
    key = (device, world, dtype)
    with _tables_lock:
        if key not in _tables:
            gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "host"
            _tables[key] = tuning.load_table(gpu, world, None if dtype is None else str(dtype).split(".")[-1])
        return _tables[key]


def new_engine(native: "_C.Communicator", device: torch.device, world: int,
               options: Optional[dict] = None) -> "_C.CollectiveEngine":
    """A collective engine for `native` whose own choice by size (the one the
    fused all-reduce + RMSNorm and the selector's defaults use) follows the
    bf16 tuning table's kernel entries where a table matches; `options`
    (CollectiveEngine keywords) override its settings. The environment
    variables that steer the choice of every call must be the same on every
    rank: the engine checks them with its options (else ValueError naming one)."""
    settings = {f"{name} (environment)": _env.get(name) or "" for name in SHARED_ENV}
    if options:
        return _C.CollectiveEngine(native, agreed_settings=settings, **options)
    return _C.CollectiveEngine(native, kernel_choices=tuning.kernel_choices(table_for(device, world, torch.bfloat16)),
                               agreed_settings=settings)


# The dtypes a selector keeps a table for, in the order of its TableDtype; "other" (data movement of any other
# dtype) takes the table load_table finds without a dtype.
_TABLE_DTYPES = (("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16),
                 ("other", None))

#: The selector's table dtype (TableDtype, in _TABLE_DTYPES' order) by torch dtype; every other dtype: OTHER_DTYPE.
TABLE_DTYPE = {dtype: i for i, (_, dtype) in enumerate(_TABLE_DTYPES) if dtype is not None}
OTHER_DTYPE = len(_TABLE_DTYPES) - 1


def _route_entry(entry: dict, world: int) -> tuple:
    """A table entry as the selector takes it: (max_bytes, route, algorithm, instances, threads, input_chunks,
    fallback): a plan entry's fallback is the kernel (or "nccl") the tuner measured fastest at its sizes."""
    algorithm = entry["algorithm"]
    if algorithm == "plan":
        # The selector gives a library plan only the inputs it splits into whole chunks.
        plan = registry.library_plan(entry["plan"], world, entry["instances"])
        return (entry["max_bytes"], "plan", entry["plan"], entry["instances"], entry["threads"],
                plan.buffers["input"], entry.get("kernel"))
    return (entry["max_bytes"], "nccl" if algorithm == "nccl" else "kernel", algorithm, 0, 0, 1, None)


def selector_config(device: torch.device, world: int, across: bool = False) -> dict:
    """What a selector of a communicator on `device` with `world` ranks is
    made from: the tuning tables of the device and world size (per dtype;
    host mode: only ``PYCCL_TUNING_FILE``'s), the NCCL thresholds where no
    table decides (``NCCL_MIN_BYTES``), and whether the ranks span nodes."""
    tables = {}
    for name, dtype in _TABLE_DTYPES:
        table = table_for(device, world, dtype)
        if table:
            tables[name] = {c: [_route_entry(e, world) for e in entries]
                            for c, entries in table.get("collectives", {}).items()}
    return {"world": world, "across_nodes": across, "tables": tables,
            "nccl_min_bytes": [NCCL_MIN_BYTES[c] for c in tuning.COLLECTIVES]}


def new_selector(device: torch.device, world: int, across: bool,
                 engine: Optional["_C.CollectiveEngine"]) -> "_C.Selector":
    """The selector of a communicator made in Python (the "pyccl" process
    group's lanes have theirs, made in C++ from the same config). Reads
    PYCCL_ALGO and PYCCL_NCCL_MIN_BYTES now (a bad value raises here)."""
    return _C.Selector(selector_config(device, world, across), engine)
