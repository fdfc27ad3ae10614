"""The published JSON Schemas of plans and tuning tables (src/pyccl/schemas/):
built from the code that checks the files, valid, met by every plan and table
pyccl makes or ships, and refusing what the loaders refuse."""

import copy
import glob
import json
import os
import sys

import pytest

jsonschema = pytest.importorskip("jsonschema", reason="the schema tests validate with jsonschema "
                                                      "(pip install jsonschema; scripts/setup.sh installs it)")

from pyccl import tuning  # noqa: E402
from pyccl.algorithms import HIERARCHICAL, LIBRARY  # noqa: E402
from pyccl.dsl import Plan, PlanError  # noqa: E402
from pyccl.errors import InvalidArgumentError  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import write_schemas  # noqa: E402

SCHEMAS = os.path.join(ROOT, "src", "pyccl", "schemas")


def _validator(name: str):
    with open(os.path.join(SCHEMAS, name)) as f:
        schema = json.load(f)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


PLAN = _validator("plan.schema.json")
TABLE = _validator("tuning-table.schema.json")


def test_the_published_files_are_what_the_checking_code_builds():
    for name, schema in write_schemas.schemas().items():
        with open(os.path.join(SCHEMAS, name)) as f:
            assert f.read() == write_schemas.text(schema), f"{name} is stale: run python scripts/write_schemas.py"


def _library_plans():
    for name, build in LIBRARY.items():
        for world in (2, 3, 4, 8):
            try:
                yield f"{name} w{world}", build(world).lower()
            except Exception as e:  # a world size the algorithm does not take
                if "world" not in str(e) and "rank" not in str(e):
                    raise
    for name, build in HIERARCHICAL.items():
        yield f"{name} 2x2", build(2, 2).lower()


def test_every_library_plan_meets_the_plan_schema():
    seen = 0
    for label, plan in _library_plans():
        errors = [e.message for e in PLAN.iter_errors(json.loads(plan.to_json()))]
        assert not errors, f"{label}: {errors[:3]}"
        seen += 1
    assert seen >= len(LIBRARY) * 3


def test_every_shipped_table_meets_the_table_schema():
    paths = glob.glob(os.path.join(ROOT, "src", "pyccl", "tuning_tables", "*.json"))
    assert paths
    for path in paths:
        with open(path) as f:
            table = json.load(f)
        errors = [e.message for e in TABLE.iter_errors(table)]
        assert not errors, f"{os.path.basename(path)}: {errors[:3]}"


def _a_plan() -> dict:
    return json.loads(LIBRARY["allreduce_2pa_hb_pull"](2).lower().to_json())


def _first_op(d: dict) -> dict:
    return d["ranks"][0]["threadblocks"][0]["ops"][0]


def _set(path, value):
    def change(d):
        *parents, last = path
        for key in parents:
            d = d[key]
        d[last] = value
    return change


def _edit_op(**fields):
    def change(d):
        _first_op(d).update(fields)
    return change


# Plans broken in their shape: the schema and load_plan's checks both refuse each.
BAD_PLANS = {
    "an unknown op kind": _edit_op(op="teleport"),
    "a field the op does not take": _edit_op(tbs=[0, 1]),
    "a chunk of three fields": _edit_op(dst=[0, "output", 0]),
    "a chunk in an unknown buffer": _edit_op(dst=[0, "registers", 0, 1]),
    "an empty chunk": _edit_op(dst=[0, "output", 0, 0]),
    "a reduce_op torch has no name for": _edit_op(reduce_op="xor"),
    "no ranks": lambda d: d.pop("ranks"),
    "an unknown protocol": _set(["protocol"], "simple"),
    "no instances": _set(["instances"], 0),
    "a fractional instance count": _set(["instances"], 1.5),
    "a version from the future": _set(["version"], 2),
    "a buffer count that is negative": _set(["buffers", "scratch"], -1),
    "an unknown collective": _set(["collective", "name"], "allsort"),
    "a channel of an unknown type": _set(["channels", 0, "type"], "pigeon"),
    "a memory channel without a destination": lambda d: d["channels"][0].pop("dst"),
    "a key no plan has": _set(["owner"], "me"),
    "a key no thread block has": _set(["ranks", 0, "threadblocks", 0, "name"], "tb0"),
}


@pytest.mark.parametrize("what", sorted(BAD_PLANS))
def test_the_schema_and_the_loader_both_refuse_a_misshapen_plan(what):
    d = _a_plan()
    assert not list(PLAN.iter_errors(d)) and Plan.from_dict(copy.deepcopy(d))  # the plan before the change
    BAD_PLANS[what](d)
    assert list(PLAN.iter_errors(d)), f"the schema took a plan with {what}"
    with pytest.raises(PlanError):
        Plan.from_dict(d)


def _a_table() -> dict:
    return {"version": 1, "gpu": "NVIDIA H200", "world": 2, "dtype": "bfloat16", "date": "d", "command": "c",
            "collectives": {"all_reduce": [
                {"max_bytes": 65536, "algorithm": "plan", "plan": "allreduce_1pa_ll", "instances": 8,
                 "threads": 512, "kernel": "1pa_ll"},
                {"max_bytes": None, "algorithm": "2pa_hb"}]}}


BAD_TABLES = {
    "an unknown algorithm": _set(["collectives", "all_reduce", 1, "algorithm"], "3pa_hb"),
    "an unknown collective": _set(["collectives", "all_sort"], [{"max_bytes": None, "algorithm": "hb"}]),
    "a plan of another collective": _set(["collectives", "all_reduce", 0, "plan"], "allgather_ring"),
    "threads not a multiple of 32": _set(["collectives", "all_reduce", 0, "threads"], 48),
    "no instances": _set(["collectives", "all_reduce", 0, "instances"], 0),
    "NCCL as a plan's kernel": _set(["collectives", "all_reduce", 0, "kernel"], "nccl"),
    "a version from the future": _set(["version"], 2),
}


@pytest.mark.parametrize("what", sorted(BAD_TABLES))
def test_the_schema_and_check_table_both_refuse_a_misshapen_table(what):
    table = _a_table()
    assert not list(TABLE.iter_errors(table)) and tuning.check_table(copy.deepcopy(table), "t")
    BAD_TABLES[what](table)
    assert list(TABLE.iter_errors(table)), f"the schema took a table with {what}"
    with pytest.raises(InvalidArgumentError):
        tuning.check_table(table, "t")
