"""python -m pyccl.info: what the build was made from and what it sees."""

import json
import re
import subprocess
import sys

import torch

import pyccl
from pyccl import _C


def test_build_info_names_the_torch_it_was_built_with():
    build = _C.build_info()
    assert set(build) == {"git", "torch", "cuda", "archs", "rdma"}, build
    assert build["torch"] == torch.__version__, "pyccl must be built against the torch that runs it"
    assert (build["cuda"] != "none") == _C.cuda_built(), build
    assert build["git"] == "unknown" or re.fullmatch(r"[0-9a-f]{12}(-dirty)?", build["git"]), build
    assert isinstance(build["rdma"], bool)


def test_info_prints_build_runtime_gpus_and_tables():
    out = subprocess.run([sys.executable, "-m", "pyccl.info"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.startswith(f"pyccl {pyccl.__version__} (commit "), text
    assert f"built with: torch {torch.__version__}" in text and f"running:    torch {torch.__version__}" in text
    assert "not the torch it was built with" not in text, text
    assert "RDMA:" in text, text
    if torch.cuda.device_count() == 0:
        assert "GPUs:       none visible" in text, text
    else:
        assert "GPU 0:" in text, text

    out = subprocess.run([sys.executable, "-m", "pyccl.info", "--json"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["pyccl"] == pyccl.__version__ and info["torch_matches_build"] is True, info
    assert info["build"] == _C.build_info() and len(info["gpus"]) == torch.cuda.device_count(), info
    for world, table in info["tuning_tables"].items():
        assert 2 <= int(world) <= torch.cuda.device_count() and (table is None or "x" in table), info


def test_info_reports_a_torch_that_is_not_the_builds(monkeypatch, capsys):
    from pyccl import info

    monkeypatch.setattr(torch, "__version__", "0.0.1")
    assert info.main([]) == 0
    printed = capsys.readouterr().out
    assert "running:    torch 0.0.1" in printed and "not the torch it was built with: rebuild pyccl" in printed
    assert info.collect()["torch_matches_build"] is False
