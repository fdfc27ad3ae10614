"""What this pyccl is and what it sees, for bug reports: ``python -m pyccl.info``.

Prints the version and the commit it was built from; the torch, CUDA and GPU
architectures of the build against the torch running now; whether the RDMA
transport is compiled in and which RDMA devices libibverbs finds; the GPUs,
which pairs reach each other by P2P, and NVLink (``nvidia-smi topo -m``, where
``nvidia-smi`` is found); and the tuning table each world size would use.
``--json`` prints the same as one JSON object.

    python -m pyccl.info [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
from typing import Optional

import torch

from . import _C, __version__, dispatch
from .errors import PycclError


def _rdma(built: bool) -> dict:
    if not built:
        return {"built": False, "devices": [], "note": "built without rdma-core's headers (libibverbs-dev)"}
    try:
        return {"built": True, "devices": [str(d) for d in _C.rdma_devices()]}
    except PycclError as e:  # no libibverbs at run time
        return {"built": True, "devices": [], "note": str(e)}


def _gpus() -> list:
    if not torch.cuda.is_available():
        return []
    gpus = []
    count = torch.cuda.device_count()
    for i in range(count):
        p = torch.cuda.get_device_properties(i)
        gpus.append({"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2 ** 30, 1),
                     "capability": f"{p.major}.{p.minor}", "sms": p.multi_processor_count,
                     "p2p": [j for j in range(count) if j != i and torch.cuda.can_device_access_peer(i, j)]})
    return gpus


def _topology() -> Optional[str]:
    """`nvidia-smi topo -m` (NVLink and PCIe paths), where nvidia-smi is found and answers."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "topo", "-m"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _tables(gpus: list) -> dict:
    """The bf16 tuning table a communicator on GPU 0 takes at each world size
    from 2 to the GPUs here (or None), as the dispatcher looks it up."""
    if len(gpus) < 2:
        return {}
    tables = {}
    for world in range(2, len(gpus) + 1):
        try:
            table = dispatch.table_for(torch.device("cuda", 0), world, torch.bfloat16)
        except PycclError as e:  # a bad PYCCL_TUNING_FILE
            tables[world] = f"error: {e}"
            continue
        tables[world] = None if table is None else f"{table['gpu']} x {table['world']}, {table['dtype']}, " \
                                                   f"{table.get('date', '?')}"
    return tables


def collect() -> dict:
    """Everything ``python -m pyccl.info`` reports, as a dict."""
    build = dict(_C.build_info())
    gpus = _gpus()
    return {
        "pyccl": __version__,
        "build": build,
        "runtime": {"python": platform.python_version(), "torch": torch.__version__,
                    "torch_cuda": torch.version.cuda or "none",
                    "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
                    "platform": platform.platform()},
        "torch_matches_build": torch.__version__ == build["torch"],
        "rdma": _rdma(bool(build["rdma"])),
        "gpus": gpus,
        "topology": _topology() if gpus else None,
        "tuning_tables": _tables(gpus),
    }


def _print(info: dict) -> None:
    build, run = info["build"], info["runtime"]
    print(f"pyccl {info['pyccl']} (commit {build['git']})")
    archs = f", GPU architectures {build['archs']}" if build["cuda"] != "none" else " (CPU only: host mode)"
    print(f"built with: torch {build['torch']}, CUDA {build['cuda']}{archs}")
    match = "" if info["torch_matches_build"] else "  <- not the torch it was built with: rebuild pyccl"
    print(f"running:    torch {run['torch']} (CUDA {run['torch_cuda']}, NCCL {run['nccl'] or '-'}), "
          f"Python {run['python']}, {run['platform']}{match}")
    rdma = info["rdma"]
    devices = ", ".join(rdma["devices"]) or "none found"
    print(f"RDMA:       {'compiled in' if rdma['built'] else 'not compiled in'}; devices: {devices}"
          + (f" ({rdma['note']})" if rdma.get("note") else ""))
    if not info["gpus"]:
        print("GPUs:       none visible (host mode: collectives run in processes on the CPU)")
    for g in info["gpus"]:
        print(f"GPU {g['index']}:      {g['name']}, {g['memory_gib']} GiB, sm_{g['capability'].replace('.', '')}, "
              f"{g['sms']} SMs; P2P to {', '.join(map(str, g['p2p'])) or 'none'}")
    if info["topology"]:
        print(info["topology"])
    for world, table in info["tuning_tables"].items():
        print(f"tuning table at {world} GPUs: {table or 'none (the built-in defaults)'}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    info = collect()
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        _print(info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
