"""Rank bodies of test_nccl_api.py: libpyccl_nccl.so loaded by path with ctypes, as vLLM's and SGLang's pynccl
load libnccl.so.2, on torch tensors (CPU tensors in host mode, cuda:rank on GPUs)."""

import ctypes
import os

import torch

import pyccl

NCCL_DTYPES = {torch.float32: 7, torch.float16: 6, torch.bfloat16: 9, torch.int32: 2}
NCCL_SUM = 0


def library_path() -> str:
    return os.path.join(os.path.dirname(pyccl._C.__file__), "libpyccl_nccl.so")


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


def _load():
    lib = ctypes.CDLL(library_path())
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    lib.ncclGetLastError.restype = ctypes.c_char_p
    lib.pycclNcclDescribe.restype = ctypes.c_char_p
    return lib


def _check(lib, result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"{what}: {result} {lib.ncclGetLastError(None).decode()}")


def all_reduce_by_path(rank, world, store, on_gpu, seed, counts):
    """Rank 0 makes the unique id and hands it over torch's store; every rank makes a communicator and
    all-reduces fresh random tensors of each dtype and count on the current stream, against a float64
    reference. Returns the mismatches, the trace, and the version the library reports."""
    lib = _load()
    if on_gpu:
        torch.cuda.set_device(rank)
    uid = UniqueId()
    if rank == 0:
        _check(lib, lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        store.set("nccl-id", bytes(uid.internal))
    else:
        ctypes.memmove(ctypes.byref(uid), store.get("nccl-id"), 128)
    comm = ctypes.c_void_p()
    _check(lib, lib.ncclCommInitRank(ctypes.byref(comm), world, uid, rank), "ncclCommInitRank")
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    stream = torch.cuda.current_stream().cuda_stream if on_gpu else 0
    bad = []
    for case, (dtype, count) in enumerate((d, c) for d in (torch.float32, torch.float16, torch.bfloat16)
                                           for c in counts):
        gen = torch.Generator().manual_seed(seed * 1000 + case)
        inputs = [torch.randn(count, generator=gen).to(dtype) for _ in range(world)]
        want = torch.stack([x.double() for x in inputs]).sum(0)
        x = inputs[rank].to(device)
        out = torch.empty_like(x)
        _check(lib, lib.ncclAllReduce(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                                      ctypes.c_size_t(count), NCCL_DTYPES[dtype], NCCL_SUM, comm,
                                      ctypes.c_void_p(stream)), "ncclAllReduce")
        tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
        if not torch.allclose(out.cpu().double(), want, rtol=tol, atol=tol * world):
            bad.append(f"{dtype} x {count}: max error {(out.cpu().double() - want).abs().max().item():.3g}")
    # An integer reduction: pyccl's kernels reduce every NCCL data type, in host mode too.
    ints = torch.arange(64, dtype=torch.int32, device=device) * (rank + 1)
    r = lib.ncclAllReduce(ctypes.c_void_p(ints.data_ptr()), ctypes.c_void_p(ints.data_ptr()), ctypes.c_size_t(64),
                          NCCL_DTYPES[torch.int32], NCCL_SUM, comm, ctypes.c_void_p(stream))
    int_outcome = "ok" if r == 0 else lib.ncclGetLastError(comm).decode()
    if r == 0 and not torch.equal(ints.cpu(), torch.arange(64, dtype=torch.int32) * (world * (world + 1) // 2)):
        bad.append("int32 sum is wrong")
    if on_gpu:
        torch.cuda.synchronize()
    version = ctypes.c_int()
    _check(lib, lib.ncclGetVersion(ctypes.byref(version)), "ncclGetVersion")
    trace = lib.pycclNcclDescribe(comm).decode()
    _check(lib, lib.ncclCommDestroy(comm), "ncclCommDestroy")
    return {"bad": bad, "trace": trace, "version": version.value, "int32": int_outcome}
