"""libpyccl_nccl.so, NCCL's C API on pyccl (csrc/nccl/, docs/nccl.md): what it exports, a C program of the API
across processes in host mode (tests/integrations/nccl_api_check.c), and the library loaded by path with ctypes, as vLLM's
pynccl loads NCCL, in host mode and on GPUs."""

import os
import random
import shutil
import subprocess

import pytest

import ranks_nccl_api as rn
from conftest import gpu_worlds, requires_gpus
from pyccl._spawn import run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIBRARY = rn.library_path()
#: The NCCL API the library implements (nccl_abi.h).
EXPORTED = {
    "ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitAll",
    "ncclCommSplit", "ncclCommFinalize", "ncclCommDestroy", "ncclCommAbort", "ncclCommGetAsyncError",
    "ncclCommCount", "ncclCommCuDevice", "ncclCommUserRank", "ncclGetErrorString", "ncclGetLastError",
    "ncclMemAlloc", "ncclMemFree", "ncclCommRegister", "ncclCommDeregister", "ncclRedOpCreatePreMulSum",
    "ncclRedOpDestroy", "ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclBcast",
    "ncclReduce", "ncclSend", "ncclRecv", "ncclGroupStart", "ncclGroupEnd", "pycclNcclDescribe",
    # Newer NCCLs' calls, which torch 2.11's ProcessGroupNCCL links and vLLM 0.33's pynccl requires.
    "ncclCommInitRankScalable", "ncclCommShrink", "ncclCommSuspend", "ncclCommResume", "ncclCommWindowRegister",
    "ncclCommWindowDeregister", "ncclDevCommCreate", "ncclDevCommDestroy", "ncclAlltoAll", "ncclGather",
    "ncclScatter", "ncclGroupSimulateEnd",
}


def test_the_library_exports_nccls_api_and_nothing_else():
    assert os.path.exists(LIBRARY), f"{LIBRARY} was not built"
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    out = subprocess.run([nm, "-D", "--defined-only", LIBRARY], capture_output=True, text=True, check=True).stdout
    defined = {line.split()[-1] for line in out.splitlines() if line.split()}
    assert defined == EXPORTED, (f"missing: {sorted(EXPORTED - defined)}; "
                                 f"exported beyond the API: {sorted(defined - EXPORTED)[:10]}")


def test_every_nccl_call_torch_links_is_exported():
    # Preloaded under torch's ProcessGroupNCCL, a call this library lacked would reach the real NCCL with one of
    # this library's communicators.
    import torch

    torch_cuda = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cuda.so")
    nm = shutil.which("nm")
    if nm is None or not os.path.exists(torch_cuda):
        pytest.skip("needs nm (binutils) and a CUDA build of torch (libtorch_cuda.so)")
    out = subprocess.run([nm, "-D", "--undefined-only", torch_cuda], capture_output=True, text=True,
                         check=True).stdout
    needed = {line.split()[-1] for line in out.splitlines() if line.split() and line.split()[-1].startswith("nccl")}
    assert needed, "torch links no NCCL call: this check would prove nothing"
    assert needed <= EXPORTED, f"torch calls {sorted(needed - EXPORTED)}, which this library does not export"


@pytest.fixture(scope="module")
def c_program(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build tests/integrations/nccl_api_check.c")
    exe = str(tmp_path_factory.mktemp("nccl") / "nccl_api_check")
    lib_dir = os.path.dirname(LIBRARY)
    subprocess.run([cc, "-O1", "-std=c11", "-Wall", "-Werror", "-I", os.path.join(ROOT, "csrc", "nccl"),
                    os.path.join(ROOT, "tests", "integrations", "nccl_api_check.c"), "-L", lib_dir, "-lpyccl_nccl",
                    f"-Wl,-rpath,{lib_dir}", "-lm", "-o", exe], check=True)
    return exe


@pytest.mark.parametrize("world", [2, 3, 4])
def test_a_c_program_runs_every_collective_across_processes_in_host_mode(c_program, world):
    seed = random.randrange(1 << 20)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYCCL_LOG_LEVEL="ERROR")
    p = subprocess.run([c_program, str(world), str(seed)], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, f"seed {seed}\n{p.stdout}\n{p.stderr}"
    for r in range(world):
        assert f"ok rank {r}" in p.stdout, p.stdout
    assert "ok errors without a communicator" in p.stdout


def test_loaded_by_path_in_host_mode():
    seed = random.randrange(1 << 20)
    env = {"CUDA_VISIBLE_DEVICES": "", "PYCCL_LOG_LEVEL": "ERROR"}
    for r in run_ranks(rn.all_reduce_by_path, 2, args=(False, seed, (1, 3000, 50_000)), timeout=180, env=env):
        assert r["bad"] == [], f"seed {seed}: {r['bad']}"
        assert "all_reduce kernel" in r["trace"]
        assert r["int32"] == "ok", r["int32"]  # reduced by the kernels: host mode has no real NCCL


@requires_gpus(2, own=True)  # rank r on cuda:r, and torch's NCCL (which refuses ranks that share a GPU)
@pytest.mark.parametrize("world", gpu_worlds(2, 4))
def test_loaded_by_path_on_gpus(world):
    seed = random.randrange(1 << 20)
    for r in run_ranks(rn.all_reduce_by_path, world, args=(True, seed, (1, 3000, 1 << 20, 9 << 20)), timeout=300):
        assert r["bad"] == [], f"seed {seed}: {r['bad']}"
        # The tables' kernels ran the floating-point all-reduces; the int32 one too (the "other" dtypes' table).
        assert "all_reduce kernel" in r["trace"] and "(table)" in r["trace"], r["trace"]
        assert r["int32"] == "ok", r["int32"]
        assert r["version"] >= 21900


def test_the_library_reads_pyccl_tuning_file(tmp_path):
    # The C++ reader of tuning tables (dispatch/tuning_tables.hpp): the table's kernel runs, and its choice is
    # traced as the table's.
    import json

    table = {"version": 1, "gpu": "host", "world": 2, "dtype": "float32", "date": "d", "command": "c",
             "collectives": {"all_reduce": [{"max_bytes": None, "algorithm": "2pa_ll"}]}}
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    env = {"CUDA_VISIBLE_DEVICES": "", "PYCCL_LOG_LEVEL": "ERROR", "PYCCL_TUNING_FILE": str(path)}
    for r in run_ranks(rn.all_reduce_by_path, 2, args=(False, 1, (1000,)), timeout=180, env=env):
        assert r["bad"] == []
        # The three float all-reduces and the int32 one (the file's table serves the dtypes without a table).
        assert "all_reduce kernel 2pa_ll (table)=4" in r["trace"], r["trace"]


def test_a_bad_tuning_file_fails_the_init_naming_it(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"version": 1, "gpu": "host", "world": 2, "collectives": {"all_reduce": '
                    '[{"max_bytes": null, "algorithm": "zzz"}]}}')
    env = {"CUDA_VISIBLE_DEVICES": "", "PYCCL_LOG_LEVEL": "OFF", "PYCCL_TUNING_FILE": str(path)}
    for outcome in run_ranks(rn.all_reduce_by_path, 2, args=(False, 1, (1000,)), timeout=180, env=env,
                             expect_failure=True):
        status, message = outcome
        assert status == "error" and "ncclCommInitRank" in message, outcome
        assert "bad.json" in message and "'zzz'" in message, message
