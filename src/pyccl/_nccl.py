"""NCCL called directly (ctypes), the way vLLM's pynccl and nccl-tests call it:
the baseline "NCCL direct" of pyccl.bench, and the out-of-place all-reduce
hand-off of pyccl.all_reduce (ProcessGroupNCCL's is in place only). Uses the
libnccl that torch loaded."""

from __future__ import annotations

import ctypes
from typing import Optional

import torch

_DTYPES = {torch.int8: 0, torch.uint8: 1, torch.int32: 2, torch.int64: 4, torch.float16: 6, torch.float32: 7,
           torch.float64: 8, torch.bfloat16: 9}
_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}  # ncclRedOp_t


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


def _library() -> ctypes.CDLL:
    for name in ("libnccl.so.2", "libnccl.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError("libnccl.so.2 not found (torch's NCCL is loaded with torch.distributed's NCCL backend)")


class NcclComm:
    """One NCCL communicator over a torch Store; collectives on the current stream."""

    def __init__(self, store, rank: int, world: int, device: int, key: str = "pyccl_nccl_direct") -> None:
        self.lib = _library()
        self.rank, self.world, self.device = rank, world, device
        uid = _UniqueId()
        if rank == 0:
            self._check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
            store.set(key, bytes(uid.internal))
        else:
            raw = store.get(key)
            ctypes.memmove(uid.internal, raw, 128)
        self.comm = ctypes.c_void_p()
        with torch.cuda.device(device):
            self._check(self.lib.ncclCommInitRank(ctypes.byref(self.comm), world, uid, rank), "ncclCommInitRank")

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            self.lib.ncclGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{what} failed: {self.lib.ncclGetErrorString(result).decode()}")

    @staticmethod
    def _stream() -> ctypes.c_void_p:
        return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def all_reduce(self, x: torch.Tensor, out: Optional[torch.Tensor] = None, op: str = "sum") -> None:
        out = x if out is None else out
        self._check(self.lib.ncclAllReduce(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                                           ctypes.c_size_t(x.numel()), _DTYPES[x.dtype], _OPS[op], self.comm,
                                           self._stream()), "ncclAllReduce")

    def all_gather(self, x: torch.Tensor, out: torch.Tensor) -> None:
        self._check(self.lib.ncclAllGather(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                                           ctypes.c_size_t(x.numel()), _DTYPES[x.dtype], self.comm,
                                           self._stream()), "ncclAllGather")

    def reduce_scatter(self, x: torch.Tensor, out: torch.Tensor) -> None:
        self._check(self.lib.ncclReduceScatter(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                                               ctypes.c_size_t(out.numel()), _DTYPES[x.dtype], _OPS["sum"], self.comm,
                                               self._stream()), "ncclReduceScatter")

    def broadcast(self, x: torch.Tensor, out: torch.Tensor, root: int = 0) -> None:
        self._check(self.lib.ncclBroadcast(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                                           ctypes.c_size_t(x.numel()), _DTYPES[x.dtype], root, self.comm,
                                           self._stream()), "ncclBroadcast")

    def all_to_all(self, x: torch.Tensor, out: torch.Tensor) -> None:
        n = x.numel() // self.world
        size = x.element_size()
        transfers = []
        for q in range(self.world):
            transfers.append((True, x.data_ptr() + q * n * size, n, x.dtype, q))
            transfers.append((False, out.data_ptr() + q * n * size, n, x.dtype, q))
        self._grouped(transfers)

    def send_recv(self, x: torch.Tensor, out: torch.Tensor, dst: int, src: int) -> None:
        """Sends `x` to rank `dst` and receives `out` from rank `src`, grouped (nccl-tests' sendrecv)."""
        self._grouped([(True, x.data_ptr(), x.numel(), x.dtype, dst),
                       (False, out.data_ptr(), out.numel(), out.dtype, src)])

    def _grouped(self, transfers) -> None:
        """ncclSend (send True) or ncclRecv of each (send, address, count, dtype, peer), between
        ncclGroupStart and ncclGroupEnd, on the current stream."""
        stream = self._stream()
        self._check(self.lib.ncclGroupStart(), "ncclGroupStart")
        for send, address, count, dtype, peer in transfers:
            call, name = (self.lib.ncclSend, "ncclSend") if send else (self.lib.ncclRecv, "ncclRecv")
            self._check(call(ctypes.c_void_p(address), ctypes.c_size_t(count), _DTYPES[dtype], peer, self.comm,
                             stream), name)
        self._check(self.lib.ncclGroupEnd(), "ncclGroupEnd")

    def close(self) -> None:
        if self.comm:
            self.lib.ncclCommDestroy(self.comm)
            self.comm = ctypes.c_void_p()
