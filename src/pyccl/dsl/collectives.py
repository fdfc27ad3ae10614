"""The collectives a DSL program implements: buffer sizes in chunks and the
definition each plan is checked against (the simulator's reference).

Inputs and outputs are per-rank numpy arrays of shape (chunks, elements).
"""

from __future__ import annotations

from typing import List

import numpy as np

from .program import DSLError

__all__ = ["AllGather", "AllReduce", "AllToAll", "Collective", "ReduceScatter", "SendRecv", "collective_from"]


def _check(num_ranks, chunks) -> None:
    if not isinstance(num_ranks, int) or not 2 <= num_ranks <= 64:
        raise DSLError(f"invalid argument 'num_ranks': expected an integer from 2 to 64, got {num_ranks!r}")
    if not isinstance(chunks, int) or chunks < 1:
        raise DSLError(f"invalid argument 'chunks': expected a positive integer, got {chunks!r}")


class Collective:
    name = ""

    def __init__(self, num_ranks: int, chunks: int, in_place: bool = False) -> None:
        _check(num_ranks, chunks)
        self.num_ranks, self.chunks, self.in_place = num_ranks, chunks, bool(in_place)

    input_chunks = property(lambda self: self.chunks)
    output_chunks = property(lambda self: self.chunks)

    def reference(self, inputs: List[np.ndarray], reduce_op: str = "sum") -> List[np.ndarray]:
        raise NotImplementedError

    def to_dict(self) -> dict:
        return {"name": self.name, "num_ranks": self.num_ranks, "chunks": self.chunks, "in_place": self.in_place}


_REDUCE = {"sum": np.sum, "min": np.min, "max": np.max, "prod": np.prod}


class AllReduce(Collective):
    """Every rank ends with the reduction of every rank's input (`chunks` chunks)."""

    name = "allreduce"

    def __init__(self, num_ranks: int, chunks: int = None, in_place: bool = True) -> None:
        super().__init__(num_ranks, num_ranks if chunks is None else chunks, in_place)

    def reference(self, inputs, reduce_op="sum"):
        total = _REDUCE[reduce_op](np.stack(inputs), axis=0)
        return [total.copy() for _ in inputs]


class AllGather(Collective):
    """Rank r's input (`chunks` chunks) lands at chunks [r*chunks, (r+1)*chunks) of every output."""

    name = "allgather"

    def __init__(self, num_ranks: int, chunks: int = 1) -> None:
        super().__init__(num_ranks, chunks)

    output_chunks = property(lambda self: self.chunks * self.num_ranks)

    def reference(self, inputs, reduce_op="sum"):
        whole = np.concatenate(inputs, axis=0)
        return [whole.copy() for _ in inputs]


class ReduceScatter(Collective):
    """Rank r ends with the reduction of chunks [r*chunks, (r+1)*chunks) of every input."""

    name = "reducescatter"

    def __init__(self, num_ranks: int, chunks: int = 1) -> None:
        super().__init__(num_ranks, chunks)

    input_chunks = property(lambda self: self.chunks * self.num_ranks)

    def reference(self, inputs, reduce_op="sum"):
        total = _REDUCE[reduce_op](np.stack(inputs), axis=0)
        c = self.chunks
        return [total[r * c:(r + 1) * c].copy() for r in range(self.num_ranks)]


class AllToAll(Collective):
    """Chunks [q*chunks, (q+1)*chunks) of rank r's input land at [r*chunks, ...) of rank q's output."""

    name = "alltoall"

    def __init__(self, num_ranks: int, chunks: int = 1) -> None:
        super().__init__(num_ranks, chunks)

    input_chunks = property(lambda self: self.chunks * self.num_ranks)
    output_chunks = property(lambda self: self.chunks * self.num_ranks)

    def reference(self, inputs, reduce_op="sum"):
        c = self.chunks
        return [np.concatenate([inputs[r][q * c:(q + 1) * c] for r in range(self.num_ranks)], axis=0)
                for q in range(self.num_ranks)]


class SendRecv(Collective):
    """Rank r's input (`chunks` chunks) lands in the output of rank (r + shift) mod N."""

    name = "sendrecv"

    def __init__(self, num_ranks: int, chunks: int = 1, shift: int = 1) -> None:
        super().__init__(num_ranks, chunks)
        if not isinstance(shift, int) or shift % num_ranks == 0:
            raise DSLError(f"invalid argument 'shift': a non-zero rank offset, got {shift!r}")
        self.shift = shift

    def reference(self, inputs, reduce_op="sum"):
        n = self.num_ranks
        return [inputs[(r - self.shift) % n].copy() for r in range(n)]

    def to_dict(self) -> dict:
        return {**super().to_dict(), "shift": self.shift}


_BY_NAME = {c.name: c for c in (AllReduce, AllGather, ReduceScatter, AllToAll, SendRecv)}


def collective_names() -> tuple:
    """The collectives a plan's "collective" entry may name."""
    return tuple(_BY_NAME)


def collective_from(d: dict) -> Collective:
    """The collective a plan's "collective" entry describes."""
    name = d.get("name")
    if not isinstance(name, str) or name not in _BY_NAME:
        raise DSLError(f"unknown collective {name!r} (expected one of {', '.join(_BY_NAME)})")
    cls = _BY_NAME[name]
    kwargs = {"chunks": d.get("chunks")}
    if cls is AllReduce:
        kwargs["in_place"] = d.get("in_place", True)
    if cls is SendRecv:
        kwargs["shift"] = d.get("shift", 1)
    return cls(d.get("num_ranks"), **kwargs)
