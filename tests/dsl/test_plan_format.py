"""The plan wire format is defined once (pyccl.dsl.plan_format): the DSL, the
packer and the interpreter's generated header all take it from there."""

import glob
import os

import pytest

import pyccl.plans as plans
from pyccl.dsl import plan, plan_format as fmt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_dsl_checks_plans_against_the_format_limit():
    assert plan.MAX_OPERANDS is fmt.MAX_OPERANDS


def test_an_op_packs_into_the_format_layout():
    words = plans._op_words("reduce_to", "max", srcs=[[1, "scratch", 5, 2], [0, "input", 3, 1]],
                            dsts=[[0, "output", 7, 1]], channels=[4], ordinals=[9])
    assert len(words) == fmt.OP_WORDS == sum(n for _, n in fmt.OP_FIELDS)
    at = fmt.OP_OFFSET
    assert words[at["kind"]] == fmt.OP_CODE["reduce_to"] == [name for name, _ in fmt.OP_KINDS].index("reduce_to")
    assert words[at["reduce_op"]] == fmt.REDUCE_OPS.index("max")
    assert words[at["num_srcs"]:at["num_channels"] + 1] == [2, 1, 1]
    assert words[at["ordinals"]] == 9 and words[at["channels"]] == 4
    second_src = at["srcs"] + fmt.CHUNK_WORDS
    assert words[second_src:second_src + fmt.CHUNK_WORDS] == [0, fmt.BUFFERS.index("input"), 3, 1]
    assert words[at["dsts"]:at["dsts"] + fmt.CHUNK_WORDS] == [0, fmt.BUFFERS.index("output"), 7, 1]
    assert plans._op_words("sync")[at["reduce_op"]] == fmt.CALL_REDUCTION


def test_the_header_names_every_op_kind_with_its_code():
    header = fmt.cpp_header()
    for name, code in fmt.OP_CODE.items():
        camel = "".join(p.capitalize() for p in name.split("_"))
        assert f"  k{camel} = {code}," in header
    assert f"constexpr int kPlanOpWords = {fmt.OP_WORDS};" in header


def test_the_build_wrote_the_header_from_this_format():
    built = glob.glob(os.path.join(ROOT, "build", "*", "generated", "executor", "plan_codes.hpp"))
    if not built:
        pytest.skip("no build tree here (an installed wheel): the build's own header is not at hand")
    newest = max(built, key=os.path.getmtime)  # the build in use
    with open(newest) as f:
        assert f.read() == fmt.cpp_header(), f"{newest} is stale: rebuild pyccl"
