"""Per-rank bodies of the all-gather, reduce-scatter, all-to-all and broadcast
tests; each runs in host mode or on GPUs."""

from __future__ import annotations

import hashlib
import random

import torch

import pyccl
from ranks_collectives import DTYPES, TOLERANCE, _setup, error_scale, rank_input, reference


MOVEMENT_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.float64,
                   torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2, torch.bool]


EXCHANGES = ["all_gather", "reduce_scatter", "all_to_all", "broadcast"]


def movement_input(seed: int, case: int, rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """Fresh random values of any dtype (bit patterns checked exactly)."""
    gen = torch.Generator().manual_seed(seed * 100_019 + case * 103 + rank)
    if dtype == torch.bool:
        return torch.rand(count, generator=gen) < 0.5
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        return torch.randint(max(info.min, -(1 << 62)), min(info.max, 1 << 62), (count,), generator=gen,
                             dtype=torch.int64).to(dtype)
    return (torch.randn(count, generator=gen, dtype=torch.float64) * 4).to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8) if t.dtype != torch.bool else t.to(torch.uint8)


def exchange_cases_list(seed: int, count: int, max_elems: int):
    """(collective, dtype, op, elements per chunk, algorithm, in_place, root)."""
    rng = random.Random(seed)
    ops = ["sum", "avg", "min", "max", "prod"]
    cases = []
    for i in range(count):
        coll = EXCHANGES[i % len(EXCHANGES)]
        if coll == "reduce_scatter":
            dtype = list(DTYPES.values())[rng.randrange(3)]
        else:
            dtype = MOVEMENT_DTYPES[(i // len(EXCHANGES)) % len(MOVEMENT_DTYPES)]
        n = rng.choice([1, 2, 3, 5, 8, 17, 255, 1000, 4097, rng.randrange(1, max_elems)])
        cases.append((coll, dtype, rng.choice(ops), n, rng.choice([None, "ll", "hb"]), rng.random() < 0.35,
                      rng.randrange(64)))
    return cases


def exchange_cases(rank, world, store, on_gpu, seed, count, max_elems, engine_options=None):
    """Random exchanges: data movement checked bit for bit, reduce-scatter
    against a float64 reference and bitwise across ranks. Returns failures."""
    comm, device = _setup(store, rank, world, on_gpu, engine_options=engine_options)
    bad = []
    for i, (coll, dtype, op, n, algo, in_place, root) in enumerate(exchange_cases_list(seed, count, max_elems)):
        root %= world
        label = (i, coll, str(dtype), op, n, algo, in_place)
        if coll == "all_gather":
            inputs = [movement_input(seed, i, r, n, dtype) for r in range(world)]
            if in_place:
                out = torch.empty(world * n, dtype=dtype, device=device)
                x = out[rank * n:(rank + 1) * n]
                x.copy_(inputs[rank])
            else:
                out, x = None, inputs[rank].to(device, copy=True)
            got = pyccl.all_gather(x, out=out, comm=comm, algorithm=algo).cpu()
            if not torch.equal(_bits(got), _bits(torch.cat(inputs))):
                bad.append(label)
        elif coll == "all_to_all":
            inputs = [movement_input(seed, i, r, world * n, dtype) for r in range(world)]
            x = inputs[rank].to(device, copy=True)
            got = pyccl.all_to_all(x, out=x if in_place else None, comm=comm, algorithm=algo).cpu()
            expect = torch.cat([inputs[q][rank * n:(rank + 1) * n] for q in range(world)])
            if not torch.equal(_bits(got), _bits(expect)):
                bad.append(label)
        elif coll == "broadcast":
            inputs = [movement_input(seed, i, r, n, dtype) for r in range(world)]
            x = inputs[rank].to(device, copy=True)
            got = pyccl.broadcast(x, root, out=x if in_place else None, comm=comm, algorithm=algo).cpu()
            if not torch.equal(_bits(got), _bits(inputs[root])):
                bad.append(label + (f"root {root}",))
        else:
            inputs = [rank_input(seed, i, r, world * n, dtype, op) for r in range(world)]
            x = inputs[rank].to(device, copy=True)
            out = x[rank * n:(rank + 1) * n] if in_place else None
            got = pyccl.reduce_scatter(x, op=op, out=out, comm=comm, algorithm=algo).cpu()
            expect = reference(inputs, op)[rank * n:(rank + 1) * n]
            rtol, atol = TOLERANCE[dtype]
            if not torch.allclose(got.to(torch.float64), expect, rtol=rtol,
                                  atol=atol * error_scale(inputs, slice(rank * n, (rank + 1) * n))):
                err = (got.to(torch.float64) - expect).abs().max().item()
                bad.append(label + (f"max abs error {err:.3g}",))
            # The reduction order is the same on every rank: compare rank 0's chunk as
            # computed by every rank through an all-gather of the results.
            everyone = pyccl.all_gather(got.to(device), comm=comm).cpu()
            digest = hashlib.sha256(_bits(everyone).numpy().tobytes()).digest()
            if any(d != digest for d in comm.all_gather_bytes(digest)):
                bad.append(label + ("gathered results differ across ranks",))
    record = comm.device_error()
    comm.close()
    return bad, record


def mixed_back_to_back(rank, world, store, on_gpu, rounds, window=None):
    """Every collective and protocol in a row with no host synchronization:
    scratch phases and flags shared between them stay consistent. Results are
    checked every `window` rounds (default: all at the end)."""
    comm, device = _setup(store, rank, world, on_gpu)
    results = []
    bad = []
    for r in range(rounds):
        if window and r and r % window == 0:
            bad += _check_mixed(results, rank, r - len(results))
            results = []
        n = [3, 1000, 5000, 17][r % 4]
        algo = ["ll", "hb"][(r // 4) % 2]
        per_rank = [movement_input(5, r, q, world * n, torch.float32) for q in range(world)]
        x = per_rank[rank].to(device, copy=True)
        kind = EXCHANGES[r % len(EXCHANGES)]
        if kind == "all_gather":
            y = pyccl.all_gather(x, comm=comm, algorithm=algo)
            expect = torch.cat(per_rank)
        elif kind == "all_to_all":
            y = pyccl.all_to_all(x, comm=comm, algorithm=algo)
            expect = torch.cat([p[rank * n:(rank + 1) * n] for p in per_rank])
        elif kind == "broadcast":
            y = pyccl.broadcast(x, r % world, comm=comm, algorithm=algo)
            expect = per_rank[r % world]
        else:
            y = pyccl.reduce_scatter(x, comm=comm, algorithm=algo)
            expect = reference(per_rank, "sum")[rank * n:(rank + 1) * n].float()
        z = pyccl.all_reduce(x, comm=comm, algorithm=["1pa_ll", "2pa_hb", "2pa_ll", "1pa_hb"][r % 4])
        results.append((kind, y, expect, z, reference(per_rank, "sum")))
    bad += _check_mixed(results, rank, rounds - len(results))
    comm.close()
    return bad


def _check_mixed(results, rank, first_round):
    bad = []
    for r, (kind, y, expect, z, zref) in enumerate(results, start=first_round):
        ok = torch.allclose(y.cpu().float(), expect, rtol=1e-5, atol=1e-4) if kind == "reduce_scatter" \
            else torch.equal(y.cpu(), expect)
        if not ok or not torch.allclose(z.cpu().to(torch.float64), zref, rtol=1e-5, atol=1e-4):
            bad.append((r, kind))
    return bad


def exchange_bad_arguments(rank, world, store):
    comm, _ = _setup(store, rank, world, False)
    x = torch.randn(16)
    out = {}
    for label, call in [
        ("rs_dtype", lambda: pyccl.reduce_scatter(torch.ones(4 * world, dtype=torch.int16), comm=comm)),
        ("rs_split", lambda: pyccl.reduce_scatter(torch.randn(4 * world + 1), comm=comm)),
        ("rs_out", lambda: pyccl.reduce_scatter(x.repeat(world), out=torch.empty(3), comm=comm)),
        ("ag_out", lambda: pyccl.all_gather(x, out=torch.empty(16), comm=comm)),
        ("ag_dtype_out", lambda: pyccl.all_gather(x, out=torch.empty(16 * world, dtype=torch.float64), comm=comm)),
        ("a2a_split", lambda: pyccl.all_to_all(torch.randn(4 * world + 1), comm=comm)),
        ("bcast_src", lambda: pyccl.broadcast(x, world, comm=comm)),
        ("algorithm", lambda: pyccl.all_gather(x, comm=comm, algorithm="1pa_ll")),
        ("device", lambda: pyccl.all_gather(x.to("meta"), comm=comm)),
    ]:
        try:
            call()
            out[label] = ("accepted", "")
        except (ValueError, TypeError) as e:
            out[label] = (type(e).__name__, str(e))
    comm.close()
    return out
