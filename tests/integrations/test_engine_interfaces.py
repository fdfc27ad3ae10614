"""pyccl.integrations against the real engines: vLLM 0.33.0 and SGLang 0.5.23,
installed by scripts/engines.sh (called by scripts/test.sh) into their own
virtual environments under .venv-engines/, over a base environment of the torch
they are built against and pyccl built for host mode against it. Each check runs in its engine's
environment (tests/integrations/engines/check_*.py): the adapter's signatures against the
engine's classes, the engine's plugin loader finding pyccl's entry point, and
the engine's own communicator / GroupCoordinator running pyccl in host mode.

With PYCCL_NO_ENGINES=1 (machines without network) they skip, saying so;
otherwise a missing engine environment is a failure, not a skip."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINES = ROOT / ".venv-engines"


def _run_check(engine: str, pin: str) -> dict:
    python = ENGINES / engine / "bin" / "python"
    marker = ENGINES / engine / ".installed"
    if not marker.exists() or marker.read_text().split()[0] != pin:
        if os.environ.get("PYCCL_NO_ENGINES") == "1":
            pytest.skip(f"PYCCL_NO_ENGINES=1: {pin} is not installed in {ENGINES / engine}")
        pytest.fail(f"{pin} is not installed in {ENGINES / engine}: run scripts/test.sh (scripts/engines.sh "
                    f"installs it), or set PYCCL_NO_ENGINES=1 on a machine without network")
    env = dict(os.environ, PYTHONWARNINGS="ignore", TORCH_DEVICE_BACKEND_AUTOLOAD="1")
    proc = subprocess.run([str(python), str(ROOT / "tests" / "integrations" / "engines" / f"check_{engine}.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"check_{engine}.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_vllm_adapter_against_vllm():
    out = _run_check("vllm", "vllm==0.33.0")
    assert out["problems"] == []
    for res in out["ranks"]:
        assert res["bad"] == [], f"seed {out['seed']}: {res['bad']}"
        assert res["has_pyccl"] and res["pyccl_routed_to_pyccl"] and not res["vllm_routed_to_pyccl"]
        assert res["slot"] == "CustomAllreduceSlot"  # what vLLM's graph_capture enters
        assert res["closed"] and not res["disabled_has_pyccl"]
        # The fusion pass, in vLLM's own pass manager, took all three all-reduces of the traced graph.
        assert res["coordinator_has_pyccl"] and res["fused_ops"] == 3 and res["all_reduces_left"] == 0, res
        assert res["passes"].count("PycclAllReduceRMSNormPass") == 1 and res["cache_key"], res["passes"]
        # pyccl's fused kernel ran all three; with pyccl declining (a 0-byte limit), vLLM's all-reduce and norm.
        assert res["fused_kernel_calls"] == 3 and res["fallback_kernel_calls"] == 0, res


def test_sglang_adapter_against_sglang():
    out = _run_check("sglang", "sglang==0.5.23")
    assert out["problems"] == []
    for res in out["ranks"]:
        assert res["bad"] == [], f"seed {out['seed']}: {res['bad']}"
        assert res["installed"] and res["method"] == "ca" and res["fusion_hook_matches"]


def test_engine_pins_match_the_adapters():
    import pyccl.integrations.sglang as ps
    import pyccl.integrations.vllm as pv

    script = (ROOT / "scripts" / "engines.sh").read_text()
    assert f'"vllm=={pv.VLLM_VERSION}"' in script and f'"sglang=={ps.SGLANG_VERSION}"' in script
    assert sys.version_info >= (3, 10)
