"""Execution plans: what lowering produces and the interpreter runs.

A plan is JSON (schema in ``docs/plans.md``, ``"version": 1``)::

    {"version": 1, "name": "...", "protocol": "hb", "instances": 1,
     "collective": {"name": "allreduce", "num_ranks": 4, "chunks": 4, "in_place": true},
     "buffers": {"input": 4, "output": 4, "scratch": 8},
     "channels": [{"id": 0, "type": "memory", "src": 0, "dst": 1}, ...],
     "ranks": [{"rank": 0, "threadblocks": [{"id": 0, "ops": [{"op": "put", ...}]}]}, ...]}

Chunks are ``[rank, buffer, index, count]``. :func:`load_plan` checks every
field and raises :class:`PlanError` naming the first bad one: a malformed
file never reaches the interpreter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from .collectives import collective_from, collective_names
from .plan_format import MAX_OPERANDS
from .program import BUFFER_KINDS, OP_REDUCTIONS, PROTOCOLS, DSLError

__all__ = ["OP_KINDS", "PACKET_READS", "PLAN_VERSION", "Plan", "PlanError", "load_plan", "plan_schema"]

PLAN_VERSION = 1
# op kind -> (has dst, number of srcs (None: one or more), needs a channel)
OP_KINDS: Dict[str, tuple] = {
    "copy": (True, 1, False),
    "reduce": (True, None, False),
    "unpack": (True, 1, False),
    "reduce_packets": (True, None, False),  # several: the packets of several peers at once
    # reduce_packets whose result also goes as packets to "dsts"[k] over "channels"[k]
    "reduce_put_packets": (True, None, False),
    "put": (True, 1, True),
    "put_packets": (True, 1, True),
    "put_with_signal": (True, 1, True),
    "get": (True, 1, True),
    "channel_reduce": (True, 1, True),
    "multi_reduce": (True, None, False),  # srcs[k] read over "channels"[k]
    # the result also to "dsts"[k] over "channels"[k] (more peers) and to "copy_to" (this rank's chunks)
    "reduce_put": (True, None, True),
    # "dsts" and "channels" lists; one source for every dst, or one per dst (pairs)
    "multi_put": (False, None, False),
    "multi_put_packets": (False, None, False),
    "multi_get": (False, None, False),  # pairs: dsts[k] (this rank's) from srcs[k] over channels[k]
    "multi_unpack": (False, None, False),  # pairs: dsts[k] from the packets in srcs[k]
    "multi_copy": (False, None, False),  # pairs: dsts[k] = srcs[k], this rank's chunks
    "signal": (False, 0, True),
    "wait": (False, 0, True),
    "multi_signal": (False, 0, False),  # "channels" list
    "multi_wait": (False, 0, False),
    "flush": (False, 0, True),
    "switch_reduce": (True, None, True),
    "switch_broadcast": (True, 1, True),
    "barrier": (False, 0, False),
    "sync": (False, 0, False),
}
# Op kinds whose sources are LL packets (in the scratch buffer)
PACKET_READS = ("unpack", "multi_unpack", "reduce_packets", "reduce_put_packets")
CHANNEL_TYPES = ("memory", "port", "switch")
# Exclusive upper bounds of a plan's instance count and of a buffer's chunk count (the interpreter's chunk
# fields are int32), read by the checks and the schema.
_INSTANCES_LIMIT = 1 << 16
_CHUNKS_LIMIT = 1 << 31
# The keys of a plan file.
_PLAN_KEYS = ("version", "name", "protocol", "instances", "collective", "buffers", "sizes", "channels", "ranks")


class PlanError(DSLError):
    """A plan file or object is malformed."""


#: The largest plan file load_plan reads.
MAX_PLAN_BYTES = 64 << 20
# What a malformed plan can make the checks raise where no check foresaw its shape.
_MALFORMED = (TypeError, ValueError, KeyError, IndexError, AttributeError, RecursionError)


@dataclass
class Plan:
    """A lowered program: per rank, per thread block, a list of op dicts."""

    name: str
    collective: Dict[str, Any]
    protocol: str
    instances: int
    buffers: Dict[str, int]
    channels: List[Dict[str, Any]]
    ranks: List[Dict[str, Any]]
    sizes: Optional[List[int]] = None  # [min, max] message bytes the plan is meant for

    @property
    def num_ranks(self) -> int:
        return self.collective["num_ranks"]

    def threadblocks(self, rank: int) -> List[Dict[str, Any]]:
        return self.ranks[rank]["threadblocks"]

    def to_dict(self) -> dict:
        return {"version": PLAN_VERSION, "name": self.name, "protocol": self.protocol, "instances": self.instances,
                "collective": self.collective, "buffers": self.buffers, "channels": self.channels,
                "ranks": self.ranks, "sizes": self.sizes}

    def to_json(self, indent=None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            f.write(self.to_json(indent=1))

    @classmethod
    def from_dict(cls, d: Any, where: str = "plan") -> "Plan":
        try:
            _validate(d, where)
            collective = collective_from(d["collective"]).to_dict()  # defaults filled in
        except DSLError:
            raise
        except _MALFORMED as e:  # a shape the checks did not foresee: still the plan's fault, and said so
            raise PlanError(f"{where}: malformed ({type(e).__name__}: {e})") from e
        return cls(d["name"], collective, d["protocol"], d["instances"], d["buffers"], d["channels"],
                   d["ranks"], d.get("sizes"))

    def count_ops(self, kind: str) -> int:
        return sum(1 for r in self.ranks for tb in r["threadblocks"] for op in tb["ops"] if op["op"] == kind)

    def plot(self, path: str) -> None:
        """Draws the op timeline per rank and thread block as a PNG (needs matplotlib)."""
        from .plot import plot_plan

        plot_plan(self, path)


def load_plan(path: str) -> Plan:
    """Reads and checks a plan file (at most MAX_PLAN_BYTES); raises PlanError
    naming what is wrong, and where (rank, thread block, op)."""
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_PLAN_BYTES + 1)  # an endless file (a device, a pipe) stops here
        if len(text) > MAX_PLAN_BYTES:
            raise PlanError(f"plan {path!r}: larger than {MAX_PLAN_BYTES} bytes")
        data = json.loads(text)
    except OSError as e:
        raise PlanError(f"plan {path!r}: {e.strerror}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise PlanError(f"plan {path!r}: not JSON ({e})") from e
    except RecursionError as e:
        raise PlanError(f"plan {path!r}: nested too deeply to be a plan") from e
    return Plan.from_dict(data, where=f"plan {path!r}")


def plan_schema() -> dict:
    """The JSON Schema (draft 2020-12) of a plan file, built from the tables
    the checks below read (op kinds, their fields, buffers, protocols, channel
    types), so the two cannot drift; published as
    ``pyccl/schemas/plan.schema.json``.

    It states the shape: keys, types, ranges, each op kind's fields and source
    count. What needs the whole plan (a chunk inside its buffer, a channel
    used from its own side, ids in order) only :func:`load_plan` checks; it
    names the rank, thread block and op."""
    chunk = {"type": "array", "prefixItems": [{"type": "integer", "minimum": 0}, {"enum": list(BUFFER_KINDS)},
                                              {"type": "integer", "minimum": 0}, {"type": "integer", "minimum": 1}],
             "items": False, "minItems": 4, "description": "[rank, buffer, first chunk, chunk count]"}
    chunks = {"type": "array", "items": {"$ref": "#/$defs/chunk"}}
    ids = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1, "uniqueItems": True}
    field_schemas = {
        "op": {"enum": sorted(OP_KINDS)}, "line": {"type": "string", "description": "the DSL source line"},
        "reduce_op": {"enum": list(OP_REDUCTIONS)}, "srcs": chunks, "dst": {"$ref": "#/$defs/chunk"},
        "dsts": {**chunks, "minItems": 1, "maxItems": MAX_OPERANDS}, "init": {"$ref": "#/$defs/chunk"},
        "copy_to": {**chunks, "minItems": 1, "maxItems": MAX_OPERANDS - 1},
        "channel": {"type": "integer", "minimum": 0}, "channels": ids, "tbs": {**ids, "minItems": 2},
    }
    ops = []
    for kind, (has_dst, nsrcs, needs_channel) in sorted(OP_KINDS.items()):
        fields = _fields_of(kind, has_dst, needs_channel)
        srcs = {"minItems": 1} if nsrcs is None else {"minItems": nsrcs, "maxItems": nsrcs}
        required = ["op"] + [f for f, needed in (("dst", has_dst), ("channel", needs_channel)) if needed]
        required += ["srcs"] if nsrcs != 0 else []
        # reduce_put's dsts and channels are optional (more peers); every other op that takes them needs them.
        required += [f for f in ("dsts", "channels", "tbs") if f in fields and kind != "reduce_put"]
        ops.append({"if": {"properties": {"op": {"const": kind}}, "required": ["op"]},
                    "then": {"required": required, "properties": {"srcs": srcs},
                             "propertyNames": {"enum": sorted(fields)}}})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"urn:pyccl:plan:{PLAN_VERSION}",
        "title": f"pyccl execution plan, version {PLAN_VERSION} (docs/plans.md)",
        "type": "object",
        "required": ["version", "name", "collective", "protocol", "instances", "buffers", "channels", "ranks"],
        "propertyNames": {"enum": list(_PLAN_KEYS)},
        "properties": {
            "version": {"const": PLAN_VERSION},
            "name": {"type": "string"},
            "protocol": {"enum": list(PROTOCOLS)},
            "instances": {"type": "integer", "minimum": 1, "maximum": _INSTANCES_LIMIT - 1},
            "sizes": {"oneOf": [{"type": "null"},
                                {"type": "array", "items": {"type": "integer", "minimum": 0},
                                 "minItems": 2, "maxItems": 2, "description": "[min, max] message bytes"}]},
            "collective": {"type": "object", "required": ["name", "num_ranks"],
                           "properties": {"name": {"enum": list(collective_names())},
                                          "num_ranks": {"type": "integer", "minimum": 1},
                                          "chunks": {"type": "integer", "minimum": 1},
                                          "in_place": {"type": "boolean"}, "shift": {"type": "integer"}}},
            "buffers": {"type": "object", "required": list(BUFFER_KINDS), "additionalProperties": False,
                        "properties": {k: {"type": "integer", "minimum": 0, "maximum": _CHUNKS_LIMIT - 1}
                                       for k in BUFFER_KINDS}},
            "channels": {"type": "array", "items": {"$ref": "#/$defs/channel"}},
            "ranks": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["rank", "threadblocks"], "additionalProperties": False,
                "properties": {"rank": {"type": "integer", "minimum": 0}, "threadblocks": {
                    "type": "array", "items": {
                        "type": "object", "required": ["id", "ops"], "additionalProperties": False,
                        "properties": {"id": {"type": "integer", "minimum": 0},
                                       "ops": {"type": "array", "items": {"$ref": "#/$defs/op"}}}}}}}},
        },
        "$defs": {
            "chunk": chunk,
            "channel": {"type": "object", "required": ["id", "type"],
                        "properties": {"id": {"type": "integer", "minimum": 0}, "type": {"enum": list(CHANNEL_TYPES)},
                                       "src": {"type": "integer", "minimum": 0},
                                       "dst": {"type": "integer", "minimum": 0},
                                       "ranks": {**ids, "minItems": 2}, "buffer": {"enum": list(BUFFER_KINDS)}},
                        "if": {"properties": {"type": {"const": "switch"}}},
                        "then": {"required": ["ranks", "buffer"]}, "else": {"required": ["src", "dst"]}},
            "op": {"type": "object", "required": ["op"], "properties": field_schemas, "allOf": ops},
        },
    }


def _fail(where: str, what: str) -> None:
    raise PlanError(f"{where}: {what}")


def _int(value, where: str, what: str, lo: int = 0, hi: int = 1 << 40) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value < hi:
        _fail(where, f"{what} must be an integer in [{lo}, {hi}), got {value!r}")
    return value


def _int_list(value, where: str, what: str, hi: int, min_len: int) -> list:
    """A list of at least `min_len` distinct integers in [0, hi)."""
    if not isinstance(value, list) or len(value) < min_len:
        _fail(where, f"{what} must be a list of at least {min_len} integers, got {value!r}")
    for x in value:
        _int(x, where, what, 0, hi)
    if len(set(value)) != len(value):
        _fail(where, f"{what} lists a value twice: {value}")
    return value


def _chunk(c, where: str, buffers: Dict[str, int], num_ranks: int) -> None:
    if not isinstance(c, list) or len(c) != 4:
        _fail(where, f"a chunk is [rank, buffer, index, count], got {c!r}")
    rank, buf, index, count = c
    _int(rank, where, "chunk rank", 0, num_ranks)
    if buf not in BUFFER_KINDS:
        _fail(where, f"chunk buffer must be one of {BUFFER_KINDS}, got {buf!r}")
    _int(count, where, "chunk count", 1)
    _int(index, where, "chunk index", 0)
    if index + count > buffers[buf]:
        _fail(where, f"chunks [{index}:{index + count}] are out of range for the {buf} buffer of {buffers[buf]} chunks")


def _validate(d: Any, where: str) -> None:
    if not isinstance(d, dict):
        _fail(where, f"expected a JSON object, got {type(d).__name__}")
    if d.get("version") != PLAN_VERSION:
        _fail(where, f"version must be {PLAN_VERSION}, got {d.get('version')!r}")
    for key in ("name", "collective", "protocol", "instances", "buffers", "channels", "ranks"):
        if key not in d:
            _fail(where, f"missing {key!r}")
    unknown = set(d) - set(_PLAN_KEYS)
    if unknown:  # a misspelt "sizes", say, would otherwise be dropped without a word
        _fail(where, f"unknown key(s) {', '.join(sorted(map(str, unknown)))} (a plan has {', '.join(_PLAN_KEYS)})")
    sizes = d.get("sizes")
    if sizes is not None and (not isinstance(sizes, list) or len(sizes) != 2):
        _fail(where, f"sizes must be [min, max] bytes or null, got {sizes!r}")
    if sizes is not None:
        _int(sizes[0], where, "sizes[0]")
        _int(sizes[1], where, "sizes[1]", sizes[0])
    if not isinstance(d["name"], str):
        _fail(where, "name must be a string")
    if d["protocol"] not in PROTOCOLS:
        _fail(where, f"protocol must be one of {PROTOCOLS}, got {d['protocol']!r}")
    _int(d["instances"], where, "instances", 1, _INSTANCES_LIMIT)
    if not isinstance(d["collective"], dict):
        _fail(where, "collective must be an object")
    try:
        coll = collective_from(d["collective"])
    except DSLError as e:
        _fail(where, f"collective: {e}")
    n = coll.num_ranks
    buffers = d["buffers"]
    if not isinstance(buffers, dict) or set(buffers) != set(BUFFER_KINDS):
        _fail(where, f"buffers must give chunk counts for {BUFFER_KINDS}, got {buffers!r}")
    for k in BUFFER_KINDS:
        _int(buffers[k], where, f"buffers.{k}", 0, _CHUNKS_LIMIT)
    k = d["instances"]
    if buffers["input"] < coll.input_chunks * k or buffers["output"] < coll.output_chunks * k:
        _fail(where, f"buffers {buffers} are smaller than the collective's ({coll.input_chunks * k} input and "
                     f"{coll.output_chunks * k} output chunks for {k} instance(s))")
    channels = d["channels"]
    if not isinstance(channels, list):
        _fail(where, "channels must be a list")
    for i, ch in enumerate(channels):
        w = f"{where}: channel {i}"
        if not isinstance(ch, dict) or ch.get("id") != i:
            _fail(w, "must be an object whose id is its index")
        if ch.get("type") not in CHANNEL_TYPES:
            _fail(w, f"type must be one of {CHANNEL_TYPES}, got {ch.get('type')!r}")
        if ch["type"] == "switch":
            _int_list(ch.get("ranks"), w, "switch channel ranks", n, 2)
            if ch.get("buffer") not in BUFFER_KINDS:
                _fail(w, f"buffer must be one of {BUFFER_KINDS}")
        else:
            src, dst = _int(ch.get("src"), w, "src", 0, n), _int(ch.get("dst"), w, "dst", 0, n)
            if src == dst:
                _fail(w, "src and dst must differ")
    ranks = d["ranks"]
    if not isinstance(ranks, list) or len(ranks) != n:
        _fail(where, f"ranks must list all {n} ranks")
    for r, entry in enumerate(ranks):
        w = f"{where}: rank {r}"
        if not isinstance(entry, dict) or entry.get("rank") != r or not isinstance(entry.get("threadblocks"), list) \
                or len(entry) != 2:
            _fail(w, "must be {'rank': r, 'threadblocks': [...]} in rank order")
        for t, tb in enumerate(entry["threadblocks"]):
            wt = f"{w} thread block {t}"
            if not isinstance(tb, dict) or tb.get("id") != t or not isinstance(tb.get("ops"), list) or len(tb) != 2:
                _fail(wt, "must be {'id': t, 'ops': [...]} in id order")
            for k, op in enumerate(tb["ops"]):
                try:
                    _validate_op(op, f"{wt} op {k}", buffers, n, channels, len(entry["threadblocks"]), r, t)
                except DSLError:
                    raise
                except _MALFORMED as e:
                    _fail(f"{wt} op {k}", f"malformed op ({type(e).__name__}: {e})")


_LOCAL = ("copy", "reduce", "unpack", "multi_unpack", "multi_copy", "reduce_packets")
_PUTS = ("put", "put_packets", "put_with_signal")
_MULTI_PAIRS = ("multi_put", "multi_put_packets", "multi_get", "multi_unpack", "multi_copy")
# Reductions of 16-byte vectors into their destination.
_VECTOR_REDUCTIONS = ("reduce", "channel_reduce", "multi_reduce")
# Reductions that may start from an `init` chunk instead of their destination (reduce_put: srcs[0]).
_INIT_KINDS = _VECTOR_REDUCTIONS + ("reduce_put", "reduce_packets", "reduce_put_packets")


def _fields_of(kind: str, has_dst: bool, needs_channel: bool) -> set:
    """The fields an op of `kind` may have (init and copy_to: any op, as their own checks name the ops that take
    them)."""
    fields = {"op", "line", "reduce_op", "srcs", "init", "copy_to"}
    if has_dst:
        fields.add("dst")
    if needs_channel:
        fields.add("channel")
    if kind in ("multi_put", "multi_put_packets", "multi_get", "multi_signal", "multi_wait", "multi_reduce",
                "reduce_put_packets", "reduce_put"):
        fields.add("channels")
    if kind in _MULTI_PAIRS or kind in ("reduce_put_packets", "reduce_put"):
        fields.add("dsts")
    if kind == "barrier":
        fields.add("tbs")
    return fields


def _chunks_overlap(a: list, b: list) -> bool:
    """Whether chunk ranges `a` and `b` ([rank, buffer, index, count]) share a chunk."""
    return a[:2] == b[:2] and a[2] < b[2] + b[3] and b[2] < a[2] + a[3]


def _destination_sized_local_chunk(c, field: str, op: dict, where: str, buffers, num_ranks: int,
                                   rank: int) -> None:
    """`c`, named by the op's `field`, is a valid chunk of this rank of the op's destination's size."""
    _chunk(c, where, buffers, num_ranks)
    if c[0] != rank or c[3] != op["dst"][3]:
        _fail(where, f"{field} chunk {c} must be rank {rank}'s, of the destination's size")


def _validate_op(op, where: str, buffers, num_ranks: int, channels: list, num_tbs: int, rank: int,
                 tb: int) -> None:
    num_channels = len(channels)
    if not isinstance(op, dict) or not isinstance(op.get("op"), str) or op.get("op") not in OP_KINDS:
        _fail(where, f"op must be one of {sorted(OP_KINDS)}, got {op.get('op') if isinstance(op, dict) else op!r}")
    has_dst, nsrcs, needs_channel = OP_KINDS[op["op"]]
    unknown = set(op) - _fields_of(op["op"], has_dst, needs_channel)
    if unknown:  # a field the op does not take would be read by nothing here, and misread later
        _fail(where, f"{op['op']} takes no {', '.join(sorted(map(str, unknown)))}")
    if "line" in op and not isinstance(op["line"], str):
        _fail(where, f"line must be a string (the DSL source line), got {op['line']!r}")
    if has_dst:
        _chunk(op.get("dst"), where, buffers, num_ranks)
    srcs = op.get("srcs", [])
    if not isinstance(srcs, list) or (nsrcs is not None and len(srcs) != nsrcs) or (nsrcs is None and not srcs):
        _fail(where, f"{op['op']} takes {nsrcs if nsrcs is not None else 'one or more'} source chunk(s)")
    for s in srcs:
        _chunk(s, where, buffers, num_ranks)
    if needs_channel:
        _int(op.get("channel"), where, "channel", 0, num_channels)
    if op["op"] == "reduce_put" and ("dsts" in op or "channels" in op):
        chans = _int_list(op.get("channels"), where, "reduce_put channels", num_channels, 1)
        if op.get("channel") in chans:
            _fail(where, f"reduce_put names channel {op.get('channel')} twice")
        dsts = op.get("dsts")
        if not isinstance(dsts, list) or len(dsts) != len(chans):
            _fail(where, "reduce_put needs one dst per channel")
        for c in dsts:
            _chunk(c, where, buffers, num_ranks)
    if op["op"] in ("multi_put", "multi_put_packets", "multi_get", "multi_signal", "multi_wait", "multi_reduce",
                    "reduce_put_packets"):
        chans = _int_list(op.get("channels"), where, f"{op['op']} channels", num_channels, 1)
        if op["op"] in ("multi_reduce", "multi_get") and len(srcs) != len(chans):
            _fail(where, f"{op['op']} needs one source chunk per channel")
        if op["op"] in ("multi_put", "multi_put_packets", "multi_get", "reduce_put_packets"):
            dsts = op.get("dsts")
            if not isinstance(dsts, list) or len(dsts) != len(chans):
                _fail(where, f"{op['op']} needs one dst per channel")
    if op["op"] in _MULTI_PAIRS:
        dsts = op.get("dsts")
        if not isinstance(dsts, list) or not 1 <= len(dsts) <= MAX_OPERANDS:
            _fail(where, f"{op['op']} needs a list of 1 to {MAX_OPERANDS} dsts")
        if len(srcs) != len(dsts) and not (len(srcs) == 1 and op["op"] in ("multi_put", "multi_put_packets")):
            _fail(where, f"{op['op']} takes one source chunk per dst" +
                  (" (or one for all)" if op["op"] in ("multi_put", "multi_put_packets") else ""))
        for c in dsts:
            _chunk(c, where, buffers, num_ranks)
        # The pairs are done at once: none may write what another reads or writes.
        for k, d in enumerate(dsts):
            for other in dsts[k + 1:] + srcs:
                if _chunks_overlap(d, other):
                    _fail(where, f"{op['op']} destination {d} overlaps {other}")
    if "copy_to" in op:
        copies = op["copy_to"]
        if op["op"] not in ("reduce", "channel_reduce", "multi_reduce", "reduce_put") or \
                not isinstance(copies, list) or not 1 <= len(copies) <= MAX_OPERANDS - 1:
            _fail(where, f"copy_to (1 to {MAX_OPERANDS - 1} chunks) belongs to reduce, channel_reduce, "
                         f"multi_reduce and reduce_put, got {copies!r} on {op['op']}")
        for c in copies:
            _destination_sized_local_chunk(c, "copy_to", op, where, buffers, num_ranks, rank)
    if op["op"] == "reduce_put_packets":  # the interpreter's op also holds the start and the destination
        if len(op["dsts"]) > MAX_OPERANDS - 1 or len(srcs) > MAX_OPERANDS - 1:
            _fail(where, f"reduce_put_packets takes up to {MAX_OPERANDS - 1} source chunks and as many dsts")
        for c in op["dsts"]:
            _chunk(c, where, buffers, num_ranks)
    if "init" in op:
        if op["op"] not in _INIT_KINDS:
            _fail(where, f"init belongs to {', '.join(_INIT_KINDS)}, got it on {op['op']}")
        init = op["init"]
        _destination_sized_local_chunk(init, "init", op, where, buffers, num_ranks, rank)
        # Where the result is stored on this rank (reduce_put: srcs[0]); an init
        # that partly overlaps it would race with its stores.
        result = srcs[0] if op["op"] == "reduce_put" else op["dst"]
        if init != result and _chunks_overlap(init, result):
            _fail(where, f"init chunk {init} partly overlaps the result's chunk {result}")
        if op["op"] in _VECTOR_REDUCTIONS and len(srcs) > MAX_OPERANDS - 1:
            _fail(where, f"{op['op']} with an init reduces up to {MAX_OPERANDS - 1} source chunks")
    if op["op"] == "reduce_put":  # the interpreter's op holds srcs[0] among the result's chunks beside an init
        if 1 + len(op.get("dsts", [])) + len(op.get("copy_to", [])) + ("init" in op) > MAX_OPERANDS:
            _fail(where, f"reduce_put stores its result to at most {MAX_OPERANDS} chunks (dst, dsts and copy_to, "
                         "and srcs[0] beside an init)")
    if op["op"] == "barrier":
        tbs = _int_list(op.get("tbs"), where, "barrier thread blocks", num_tbs, 2)
        if tb not in tbs:
            _fail(where, f"barrier thread blocks {tbs} must include thread block {tb}")
    reduce_op = op.get("reduce_op")
    if reduce_op is not None and (not isinstance(reduce_op, str) or reduce_op not in OP_REDUCTIONS):
        _fail(where, f"reduce_op must be sum, min, max or prod, got {reduce_op!r}")
    _validate_endpoints(op, where, channels, rank)


def _validate_endpoints(op, where: str, channels: list, rank: int) -> None:
    """Chunks on the ranks the op can reach, of matching sizes."""
    kind = op["op"]
    dst, srcs = op.get("dst"), op.get("srcs", [])
    counts = {c[3] for c in srcs} | ({dst[3]} if dst else set())
    if kind in _MULTI_PAIRS or kind in ("reduce_put_packets", "reduce_put"):
        counts |= {c[3] for c in op.get("dsts", [])}
    if len(counts) > 1:
        _fail(where, f"{kind} moves chunks of different sizes {sorted(counts)}")
    if kind in _LOCAL:
        if any(c[0] != rank for c in srcs + ([dst] if dst else []) + op.get("dsts", [])):
            _fail(where, f"{kind} on rank {rank} may only touch rank {rank}'s chunks")
        if kind in PACKET_READS and any(c[1] != "scratch" for c in srcs):
            _fail(where, f"{kind} reads packets from scratch buffers, got {srcs}")
        return
    chans = [op["channel"]] if "channel" in op else op.get("channels", [])
    for cid in chans:
        ch = channels[cid]
        if ch["type"] == "switch":
            if kind not in ("switch_reduce", "switch_broadcast") or rank not in ch["ranks"]:
                _fail(where, f"{kind} on rank {rank} cannot use switch channel {cid}")
            continue
        if kind in ("switch_reduce", "switch_broadcast"):
            _fail(where, f"{kind} needs a switch channel, channel {cid} is {ch['type']}")
        side = ch["dst"] if kind in ("wait", "multi_wait") else ch["src"]
        if side != rank:
            _fail(where, f"{kind} on rank {rank} uses channel {cid} ({ch['src']} -> {ch['dst']}) from the wrong side")
    if kind in _PUTS or kind == "reduce_put":
        if dst[0] != channels[op["channel"]]["dst"] or any(c[0] != rank for c in srcs):
            _fail(where, f"{kind} must read rank {rank}'s chunks and write the channel's destination")
    if kind == "reduce_put" and channels[op["channel"]]["type"] != "memory":
        _fail(where, f"{kind} needs a memory channel")
    if kind in ("channel_reduce", "get"):
        if dst[0] != rank or srcs[0][0] != channels[op["channel"]]["dst"]:
            _fail(where, f"{kind} must write this rank's chunks and read the channel's destination")
        if channels[op["channel"]]["type"] != "memory":
            _fail(where, f"{kind} needs a memory channel")
    if kind == "multi_reduce":
        if dst[0] != rank:
            _fail(where, "multi_reduce must write this rank's chunks")
        for cid, s in zip(op["channels"], srcs):
            if channels[cid]["type"] != "memory" or s[0] != channels[cid]["dst"]:
                _fail(where, f"multi_reduce source {s} does not match memory channel {cid}")
    if kind == "multi_get":
        for cid, d, src in zip(op["channels"], op["dsts"], srcs):
            if channels[cid]["type"] != "memory" or d[0] != rank or src[0] != channels[cid]["dst"]:
                _fail(where, f"{kind} must write this rank's chunks and read source {src} over memory channel "
                             f"{cid}'s destination")
    if kind == "reduce_put_packets":
        if any(c[0] != rank or c[1] != "scratch" for c in srcs) or dst[0] != rank:
            _fail(where, f"{kind} must reduce packets in rank {rank}'s scratch into rank {rank}'s chunks")
    if kind in ("multi_put", "multi_put_packets", "reduce_put_packets", "reduce_put"):
        if any(c[0] != rank for c in srcs):
            _fail(where, f"{kind} must read this rank's chunks")
        for cid, d in zip(op.get("channels", []), op.get("dsts", [])):
            if channels[cid]["type"] != "memory" or d[0] != channels[cid]["dst"]:
                _fail(where, f"{kind} destination {d} does not match memory channel {cid}")
            if kind not in ("multi_put", "reduce_put") and d[1] != "scratch":
                _fail(where, f"{kind} lands in scratch buffers, got {d}")
    if kind == "put_packets" and dst[1] != "scratch":
        _fail(where, f"{kind} lands in scratch buffers, got {dst}")
    if kind in ("multi_signal", "multi_wait") and any(channels[c]["type"] != "memory" for c in chans):
        _fail(where, f"{kind} takes memory channels")
    if kind == "switch_reduce":
        ch = channels[op["channel"]]
        if dst[0] != rank or sorted(c[0] for c in srcs) != sorted(ch["ranks"]):
            _fail(where, "switch_reduce reads every member rank's chunks into this rank's")
    if kind == "switch_broadcast" and (srcs[0][0] != rank or dst[0] not in channels[op["channel"]]["ranks"]):
        _fail(where, "switch_broadcast writes a member rank's chunks from this rank's")
