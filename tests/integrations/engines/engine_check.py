"""What the engine checks (check_vllm.py, check_sglang.py) share: the path to
tests/integrations/ (ranks_integrations) and tests/, signatures as comparable lists, and the main
that prints the interface problems and the per-rank results as one JSON line."""

import inspect
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.dirname(os.path.dirname(HERE))]  # ranks_integrations; tests/


def params(fn) -> list:
    """(name, default or "<required>") of every parameter of ``fn`` (a
    function, or a torch custom op: its schema's arguments)."""
    overload = getattr(fn, "default", None)
    if overload is not None and hasattr(overload, "_schema"):
        return [(a.name, a.default_value if a.has_default_value() else "<required>")
                for a in overload._schema.arguments]
    return [(p.name, p.default if p.default is not inspect.Parameter.empty else "<required>")
            for p in inspect.signature(fn).parameters.values()]


def main(interface_problems, rank_fn, world: int = 2) -> None:
    """Prints {"problems": [...], "seed": s, "ranks": [rank_fn's result per rank]}."""
    from pyccl._spawn import run_ranks

    seed = random.randrange(1 << 20)
    out = {"problems": interface_problems(), "seed": seed}
    out["ranks"] = run_ranks(rank_fn, world, args=(seed,), timeout=300)
    print(json.dumps(out))
