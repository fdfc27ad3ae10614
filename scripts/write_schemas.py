"""Writes the published JSON Schemas of plans and tuning tables
(``src/pyccl/schemas/``) from the code that checks them: run it after
changing what ``pyccl.dsl.load_plan`` or ``pyccl.tuning.check_table``
accepts; ``tests/dsl/test_schemas.py`` fails while a file differs.

    python scripts/write_schemas.py
"""

from __future__ import annotations

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMAS = os.path.join(ROOT, "src", "pyccl", "schemas")


def schemas() -> dict:
    """File name -> schema, as the code builds them now."""
    from pyccl.dsl.plan import plan_schema
    from pyccl.tuning import table_schema

    return {"plan.schema.json": plan_schema(), "tuning-table.schema.json": table_schema()}


def text(schema: dict) -> str:
    return json.dumps(schema, indent=1) + "\n"


def main() -> int:
    for name, schema in schemas().items():
        with open(os.path.join(SCHEMAS, name), "w") as f:
            f.write(text(schema))
        print(f"wrote src/pyccl/schemas/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
