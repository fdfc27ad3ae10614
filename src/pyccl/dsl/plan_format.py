"""The interpreter's binary form of a plan: the one definition of it.

A plan (:class:`pyccl.dsl.Plan`) is packed per rank (``pyccl.plans.pack_plan``)
into fixed-size ops of int32 words, which the interpreter
(``csrc/executor/interpreter.hpp``) runs. The op kinds, buffer and reduction
codes, operand limits and the word layout of one op are defined here, once:
``pyccl.plans`` packs by them, the DSL checks plans against the same limits,
and the build writes the C++ header the interpreter reads them by
(``executor/plan_codes.hpp``) from this file, run as a script::

    python plan_format.py OUT.hpp

This module imports only the standard library, so the build can run it
before pyccl is built.
"""

from __future__ import annotations

import sys
from typing import Dict, Tuple

#: Sources, destinations or channels of one op.
MAX_OPERANDS = 8
#: Ranks of a plan, across nodes.
MAX_RANKS = 64
#: Ranks of a plan on one node (their memory is mapped into each other's).
MAX_LOCAL_RANKS = 8

#: The interpreter's op kinds, in code order, each with what it does. A plan
#: op of the DSL packs into one or two of these (``pyccl.plans``).
OP_KINDS: Tuple[Tuple[str, str], ...] = (
    ("copy", ""),
    ("reduce", "into dsts[0] from every src; every other dst gets the result too"),
    ("unpack", ""),
    ("reduce_packets", "dsts[0] reduced with the packets of every src; a dsts[1] is where it starts instead"),
    ("put", "to every dst (multi_put too); port puts complete in the op here"),
    ("put_packets", "to every dst (multi_put_packets too)"),
    ("channel_reduce", ""),
    ("reduce_put", "srcs[0] = reduce(srcs); to srcs[0] and every dst"),
    ("signal", "one signal per channel (multi_signal too)"),
    ("wait", "one wait per channel (multi_wait too)"),
    ("flush", ""),
    ("switch_reduce", ""),
    ("barrier", ""),
    ("sync", ""),
    ("reduce_put_packets", "srcs[0] (where the reduction starts) reduced with the packets of srcs[1..]; the result "
                           "to dsts[0] and as packets to every dsts[1..]"),
    ("reduce_to", "every dst = reduce(srcs), srcs[0] where the reduction starts; no dst is read (a reduce or "
                  "reduce_put with an init: the copy it replaced is never made)"),
)

#: A rank's buffers, in code order.
BUFFERS: Tuple[str, ...] = ("input", "output", "scratch")

#: An op's own reduction, in code order (the collectives' ReduceOp); an op
#: without one (code -1) takes the call's.
REDUCE_OPS: Tuple[str, ...] = ("sum", "avg", "min", "max", "prod")
CALL_REDUCTION = -1

#: Words of one chunk: rank, buffer code, first chunk index, chunk count.
CHUNK_WORDS = 4

#: One op's fields in word order, each with its length in words.
OP_FIELDS: Tuple[Tuple[str, int], ...] = (
    ("kind", 1),
    ("reduce_op", 1),
    ("num_srcs", 1),
    ("num_dsts", 1),
    ("num_channels", 1),
    # signal and wait: the semaphore count to add or reach in this call, per
    # channel (the ordinal of the signal or wait within one call, plus one);
    # barrier: [group, ordinal + 1, group size]
    ("ordinals", MAX_OPERANDS),
    ("channels", MAX_OPERANDS),
    # signal: the rank whose counter each channel's signal adds to; wait: the
    # rank that signals it (named when the wait gives up). Set by the executor.
    ("peers", MAX_OPERANDS),
    # signal and wait: signals per call on each channel; barrier: [0] arrivals
    # per call. Set by the executor.
    ("per_call", MAX_OPERANDS),
    ("srcs", CHUNK_WORDS * MAX_OPERANDS),
    ("dsts", CHUNK_WORDS * MAX_OPERANDS),
)

OP_CODE: Dict[str, int] = {name: i for i, (name, _) in enumerate(OP_KINDS)}
BUFFER_CODE: Dict[str, int] = {name: i for i, name in enumerate(BUFFERS)}
REDUCE_CODE: Dict[object, int] = {None: CALL_REDUCTION, **{name: i for i, name in enumerate(REDUCE_OPS)}}
#: The first word of each field of an op.
OP_OFFSET: Dict[str, int] = {}
_at = 0
for _name, _words in OP_FIELDS:
    OP_OFFSET[_name] = _at
    _at += _words
#: Words of one op.
OP_WORDS = _at
del _at, _name, _words


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def cpp_header() -> str:
    """The C++ header of these definitions (``executor/plan_codes.hpp``)."""
    lines = [
        "// Generated at build time from src/pyccl/dsl/plan_format.py; edit that file, not this one.",
        "#pragma once",
        "",
        "#include <cstdint>",
        "",
        "namespace pyccl {",
        "",
        f"constexpr int kPlanMaxOperands = {MAX_OPERANDS};    ///< sources, destinations or channels of one op",
        f"constexpr int kPlanMaxRanks = {MAX_RANKS};        ///< ranks of a plan, across nodes",
        f"constexpr int kPlanMaxLocalRanks = {MAX_LOCAL_RANKS};   ///< ranks of a plan on one node",
        f"constexpr int kPlanChunkWords = {CHUNK_WORDS};      ///< words of one chunk",
        f"constexpr int kPlanOpWords = {OP_WORDS};        ///< words of one op",
        f"constexpr int kPlanCallReduction = {CALL_REDUCTION};  ///< an op's reduce_op: the call's reduction",
        "",
        "/// Op kinds, in plan_format.py's order.",
        "enum class PlanOpKind : int32_t {",
    ]
    for name, doc in OP_KINDS:
        lines.append(f"  k{_camel(name)} = {OP_CODE[name]},{'  ///< ' + doc if doc else ''}")
    lines += ["  kCount", "};", "", "/// Buffers of a rank, in plan order.", "enum class PlanBuffer : int32_t {"]
    lines += [f"  k{_camel(name)} = {code}," for name, code in BUFFER_CODE.items()]
    lines += ["};", "", "/// Op fields' first words, in word order."]
    lines += [f"constexpr int kPlanOp{_camel(name)}Word = {OP_OFFSET[name]};" for name, _ in OP_FIELDS]
    lines += ["", "/// Reductions' codes (the collectives' ReduceOp must match them)."]
    lines += [f"constexpr int kPlanReduce{_camel(name)} = {i};" for i, name in enumerate(REDUCE_OPS)]
    lines += ["", "}  // namespace pyccl", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python plan_format.py OUT.hpp")
    text = cpp_header()
    try:
        with open(sys.argv[1]) as f:
            unchanged = f.read() == text
    except OSError:
        unchanged = False
    if not unchanged:  # an unchanged header keeps its time stamp: nothing rebuilds
        with open(sys.argv[1], "w") as f:
            f.write(text)
