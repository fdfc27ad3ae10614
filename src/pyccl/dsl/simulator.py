"""The plan simulator: runs a plan for all ranks in one process, under random
(seeded) interleavings of their thread blocks and proxies, and reports

- a wrong result (against the collective's definition, float64);
- a deadlock: no thread block can go on (a wait whose signal never comes, a
  barrier not every member reaches, packets that never arrive), naming each
  blocked op and its source line;
- a race: a read of data whose write no synchronization orders before it, a
  write over data that another thread block or a proxy may still read
  (vector clocks; signal/wait, barriers, LL packet flags and flush are the
  synchronization), or a write into a rank whose thread blocks have all
  finished (that rank returned without waiting for the data).

Semantics (see :mod:`pyccl.dsl.channels`): MemoryChannel operations complete
within the op; a PortChannel's puts and signals go to its proxy, which runs
them in order at some later point of the interleaving; ``flush`` waits until
the proxy has run them. Ops are atomic at chunk granularity.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import numpy as np

from .collectives import collective_from
from .plan import PACKET_READS, Plan
from .program import DSLError

__all__ = ["SimulationError", "SimulationReport", "simulate", "verify"]


class SimulationError(DSLError):
    """verify() found a wrong result, a deadlock or a race."""


@dataclass
class SimulationReport:
    seed: int
    wrong: List[str] = field(default_factory=list)
    deadlock: List[str] = field(default_factory=list)
    races: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.wrong or self.deadlock or self.races)

    def __str__(self) -> str:
        parts = [f"seed {self.seed}:"]
        for name, items in (("wrong result", self.wrong), ("deadlock", self.deadlock), ("race", self.races)):
            parts += [f"  {name}: {x}" for x in items[:5]]
        return "\n".join(parts) if not self.ok else f"seed {self.seed}: ok"


_REDUCE = {"sum": np.add, "min": np.minimum, "max": np.maximum, "prod": np.multiply}


class _Sim:
    def __init__(self, plan: Plan, seed: int, elements: int, reduce_op: str) -> None:
        self.plan, self.rng, self.reduce_op = plan, random.Random(seed), reduce_op
        self.report = SimulationReport(seed)
        k = plan.instances
        cd = dict(plan.collective)
        cd["chunks"] = cd["chunks"] * k
        self.coll = collective_from(cd)
        n = plan.num_ranks
        gen = np.random.default_rng(seed)
        self.bufs: Dict[Tuple[int, str], np.ndarray] = {}
        self.inputs = []
        for r in range(n):
            x = gen.uniform(0.5, 1.5, (plan.buffers["input"], elements))
            self.inputs.append(x[: self.coll.input_chunks].copy())
            self.bufs[(r, "input")] = x
            self.bufs[(r, "output")] = np.full((plan.buffers["output"], elements), np.nan)
            self.bufs[(r, "scratch")] = np.full((max(plan.buffers["scratch"], 1), elements), np.nan)
        # Threads: every (rank, tb), then one proxy per port channel.
        self.threads = [(r, t) for r in range(n) for t in range(len(plan.threadblocks(r)))]
        self.tid = {rt: i for i, rt in enumerate(self.threads)}
        ports = [c["id"] for c in plan.channels if c["type"] == "port"]
        self.proxy_tid = {cid: len(self.threads) + i for i, cid in enumerate(ports)}
        self.proxy_channel = {tid: cid for cid, tid in self.proxy_tid.items()}
        size = len(self.threads) + len(ports)
        self.clock = [np.zeros(size, dtype=np.int64) for _ in range(size)]
        for i in range(size):
            self.clock[i][i] = 1
        self.pc = [0] * len(self.threads)
        self.unfinished = [0] * n  # per rank: thread blocks with ops left
        for r, t in self.threads:
            self.unfinished[r] += bool(plan.threadblocks(r)[t]["ops"])
        self.signals: Dict[int, List[np.ndarray]] = {}
        self.waited: Dict[int, int] = {}
        self.queues: Dict[int, List[tuple]] = {cid: [] for cid in ports}
        self.barriers: Dict[tuple, List[Tuple[int, np.ndarray]]] = {}
        self.barrier_gen: Dict[Tuple[int, tuple], int] = {}
        self.released: Dict[Tuple[int, tuple, int], np.ndarray] = {}
        self.packets: Dict[Tuple[int, str, int], np.ndarray] = {}
        # Per chunk slot: last write (thread, its clock component) and reads since.
        self.last_write: Dict[Tuple[int, str, int], Tuple[int, int, str]] = {}
        self.reads: Dict[Tuple[int, str, int], Dict[int, Tuple[int, str]]] = {}

    # -- memory with race checks ------------------------------------------------
    def _slots(self, c):
        rank, buf, index, count = c
        if buf == "output" and self.coll.in_place:
            buf = "input"
        return [(rank, buf, i) for i in range(index, index + count)]

    def _read(self, tid: int, c, where: str, acquired: bool = False) -> np.ndarray:
        clock = self.clock[tid]
        for slot in self._slots(c):
            w = self.last_write.get(slot)
            if w is not None and not acquired and clock[w[0]] < w[1]:
                self._race(f"{where} reads {self._name(slot)}, written by {self._who(w[0])} ({w[2]}) with no "
                           "synchronization ordering the write first")
            self.reads.setdefault(slot, {})[tid] = (int(clock[tid]), where)
        rank, buf, index, count = c
        buf = "input" if buf == "output" and self.coll.in_place else buf
        return self.bufs[(rank, buf)][index:index + count].copy()

    def _write(self, tid: int, c, value: np.ndarray, where: str) -> None:
        clock = self.clock[tid]
        if c[0] != self._rank_of(tid) and self.unfinished[c[0]] == 0:
            self._race(f"{where} writes rank {c[0]}'s {c[1]} after every thread block of rank {c[0]} finished: "
                       f"rank {c[0]} returns from the call without waiting for this data")
        for slot in self._slots(c):
            w = self.last_write.get(slot)
            if w is not None and w[0] != tid and clock[w[0]] < w[1]:
                self._race(f"{where} overwrites {self._name(slot)}, written by {self._who(w[0])} ({w[2]}) "
                           "with no synchronization between the writes")
            for reader, (c_read, rwhere) in self.reads.get(slot, {}).items():
                if reader != tid and clock[reader] < c_read:
                    self._race(f"{where} overwrites {self._name(slot)} while {self._who(reader)} ({rwhere}) "
                               "may still read it")
            self.last_write[slot] = (tid, int(clock[tid]), where)
            self.reads[slot] = {}
        rank, buf, index, count = c
        buf = "input" if buf == "output" and self.coll.in_place else buf
        self.bufs[(rank, buf)][index:index + count] = value

    def _rank_of(self, tid: int) -> int:
        if tid < len(self.threads):
            return self.threads[tid][0]
        return self.plan.channels[self.proxy_channel[tid]]["src"]

    def _race(self, text: str) -> None:
        if text not in self.report.races:
            self.report.races.append(text)

    def _name(self, slot) -> str:
        return f"rank {slot[0]} {slot[1]}[{slot[2]}]"

    def _who(self, tid: int) -> str:
        if tid < len(self.threads):
            r, t = self.threads[tid]
            return f"rank {r} tb {t}"
        return f"the proxy of channel {self.proxy_channel[tid]}"

    def _tick(self, tid: int) -> None:
        self.clock[tid][tid] += 1

    def _acquire(self, tid: int, other: np.ndarray) -> None:
        np.maximum(self.clock[tid], other, out=self.clock[tid])

    # -- one op ------------------------------------------------------------------
    def _runnable(self, i: int) -> bool:
        r, t = self.threads[i]
        ops = self.plan.threadblocks(r)[t]["ops"]
        if self.pc[i] >= len(ops):
            return False
        op = ops[self.pc[i]]
        kind = op["op"]
        if kind in ("wait", "multi_wait"):
            chans = op["channels"] if kind == "multi_wait" else [op["channel"]]
            return all(len(self.signals.get(c, [])) > self.waited.get(c, 0) for c in chans)
        if kind == "flush":
            return not self.queues.get(op["channel"])
        if kind in PACKET_READS:
            return all(s in self.packets for src in op["srcs"] for s in self._slots(src))
        if kind == "barrier":
            key = (r, tuple(op["tbs"]))
            gen = self._barrier_generation(i, key)
            return (r, key[1], gen) in self.released or self._barrier_complete(key, gen, i)
        return True

    def _barrier_generation(self, i: int, key) -> int:
        return self.barrier_gen.get((i, key), 0)

    def _barrier_complete(self, key, gen: int, i: int) -> bool:
        arrivals = self.barriers.setdefault((key, gen), [])
        if all(a[0] != i for a in arrivals):
            arrivals.append((i, self.clock[i].copy()))
        return len(arrivals) == len(key[1])

    def _step(self, i: int) -> None:
        r, t = self.threads[i]
        op = self.plan.threadblocks(r)[t]["ops"][self.pc[i]]
        where = f"rank {r} tb {t} op {self.pc[i]} ({op['op']}, {op.get('line', '?')})"
        kind = op["op"]
        self._tick(i)
        red = _REDUCE[op.get("reduce_op", self.reduce_op)]
        if kind == "copy":
            self._write(i, op["dst"], self._read(i, op["srcs"][0], where), where)
        elif kind in ("reduce", "channel_reduce", "multi_reduce", "switch_reduce"):
            start = op.get("init", op["dst"])  # an init: where the reduction starts instead of the destination
            acc = None if kind == "switch_reduce" else self._read(i, start, where)
            for s in op["srcs"]:
                v = self._read(i, s, where)
                acc = v if acc is None else red(acc, v)
            self._write(i, op["dst"], acc, where)
            for c in op.get("copy_to", ()):
                self._write(i, c, acc, where)
        elif kind == "unpack":
            for s in self._slots(op["srcs"][0]):
                self._acquire(i, self.packets[s])
            self._write(i, op["dst"], self._read(i, op["srcs"][0], where), where)
        elif kind in ("reduce_packets", "reduce_put_packets"):
            acc = self._read(i, op.get("init", op["dst"]), where)
            for src in op["srcs"]:
                for s in self._slots(src):
                    self._acquire(i, self.packets[s])
                acc = red(acc, self._read(i, src, where))
            self._write(i, op["dst"], acc, where)
            for d in op.get("dsts", ()):  # reduce_put_packets: the result, from registers, as packets
                self._write(i, d, acc, where)
                for s in self._slots(d):
                    self.packets[s] = self.clock[i].copy()
        elif kind in ("put", "get", "put_with_signal", "put_packets", "switch_broadcast"):
            if op.get("channel") in self.queues:  # a port channel: the proxy does it later
                self.queues[op["channel"]].append(("put", op, self.clock[i].copy(), where))
                if kind == "put_with_signal":
                    self.queues[op["channel"]].append(("signal", op, self.clock[i].copy(), where))
            else:
                self._write(i, op["dst"], self._read(i, op["srcs"][0], where), where)
                if kind == "put_packets":
                    for s in self._slots(op["dst"]):
                        self.packets[s] = self.clock[i].copy()
                if kind == "put_with_signal":
                    self.signals.setdefault(op["channel"], []).append(self.clock[i].copy())
        elif kind in ("multi_put", "multi_put_packets", "multi_get", "multi_unpack", "multi_copy"):
            # Pairs (or one source for every dst): every read happens before any write.
            srcs = op["srcs"] * len(op["dsts"]) if len(op["srcs"]) == 1 else op["srcs"]
            if kind == "multi_unpack":
                for src in srcs:
                    for s in self._slots(src):
                        self._acquire(i, self.packets[s])
            values = [self._read(i, src, where) for src in srcs]
            for d, v in zip(op["dsts"], values):
                self._write(i, d, v, where)
                if kind == "multi_put_packets":
                    for s in self._slots(d):
                        self.packets[s] = self.clock[i].copy()
        elif kind == "reduce_put":
            acc = None
            # srcs[0] gets the result; with an init the reduction starts there instead of reading srcs[0].
            for s in ([op["init"], *op["srcs"][1:]] if "init" in op else op["srcs"]):
                v = self._read(i, s, where)
                acc = v if acc is None else red(acc, v)
            self._write(i, op["srcs"][0], acc, where)
            for c in [op["dst"], *op.get("dsts", ()), *op.get("copy_to", ())]:
                self._write(i, c, acc, where)
        elif kind in ("signal", "multi_signal"):
            for c in (op["channels"] if kind == "multi_signal" else [op["channel"]]):
                if c in self.queues:
                    self.queues[c].append(("signal", op, self.clock[i].copy(), where))
                else:
                    self.signals.setdefault(c, []).append(self.clock[i].copy())
        elif kind in ("wait", "multi_wait"):
            for c in (op["channels"] if kind == "multi_wait" else [op["channel"]]):
                n = self.waited.get(c, 0)
                self._acquire(i, self.signals[c][n])
                self.waited[c] = n + 1
        elif kind == "flush":
            if op["channel"] in self.proxy_tid:  # a memory channel's puts are complete already
                self._acquire(i, self.clock[self.proxy_tid[op["channel"]]])
        elif kind == "barrier":
            key = (r, tuple(op["tbs"]))
            gen = self._barrier_generation(i, key)
            rel = self.released.get((r, key[1], gen))
            if rel is None:
                rel = np.max(np.stack([c for _, c in self.barriers[(key, gen)]]), axis=0)
                self.released[(r, key[1], gen)] = rel
            self._acquire(i, rel)
            self.barrier_gen[(i, key)] = gen + 1
        self._tick(i)
        self.pc[i] += 1
        if self.pc[i] == len(self.plan.threadblocks(r)[t]["ops"]):
            self.unfinished[r] -= 1

    def _proxy_step(self, cid: int) -> None:
        p = self.proxy_tid[cid]
        what, op, issue_clock, where = self.queues[cid].pop(0)
        self._acquire(p, issue_clock)
        self._tick(p)
        if what == "put":
            self._write(p, op["dst"], self._read(p, op["srcs"][0], f"{where} (proxy)"), f"{where} (proxy)")
        else:
            self.signals.setdefault(cid, []).append(self.clock[p].copy())
        self._tick(p)

    def run(self) -> SimulationReport:
        while True:
            choices = [("t", i) for i in range(len(self.threads)) if self._runnable(i)]
            choices += [("p", c) for c, q in self.queues.items() if q]
            if not choices:
                break
            what, x = self.rng.choice(choices)
            if what == "t":
                self._step(x)
            else:
                self._proxy_step(x)
        for i, (r, t) in enumerate(self.threads):
            ops = self.plan.threadblocks(r)[t]["ops"]
            if self.pc[i] < len(ops):
                op = ops[self.pc[i]]
                self.report.deadlock.append(f"rank {r} tb {t} blocked at op {self.pc[i]} ({op['op']}"
                                            f"{' on channel %d' % op['channel'] if 'channel' in op else ''}, "
                                            f"{op.get('line', '?')})")
        if not self.report.deadlock:
            self._check_result()
        return self.report

    def _check_result(self) -> None:
        expect = self.coll.reference(self.inputs, self.reduce_op)
        kind = "input" if self.coll.in_place else "output"
        for r, want in enumerate(expect):
            got = self.bufs[(r, kind)][: len(want)]
            bad = ~np.isclose(got, want, rtol=1e-9, atol=1e-9)
            if bad.any():
                rows = sorted(set(np.nonzero(bad)[0].tolist()))
                self.report.wrong.append(f"rank {r} {kind} chunks {rows[:8]} differ from the "
                                         f"{self.coll.name} definition")


def _count(value, name: str, lo: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise DSLError(f"invalid argument '{name}': expected an integer >= {lo}, got {value!r}")


def _check_arguments(plan, seed, reduce_op: str) -> None:
    if not isinstance(plan, Plan):
        hint = " (lower it first: program.lower())" if hasattr(plan, "lower") else ""
        raise DSLError(f"invalid argument 'plan': expected a pyccl.dsl.Plan{hint}, got {type(plan).__name__}")
    _count(seed, "seed", 0)
    if reduce_op not in _REDUCE:
        raise DSLError(f"invalid argument 'reduce_op': {reduce_op!r} is not one of {', '.join(_REDUCE)}")


def simulate(plan: Plan, seed: int = 0, elements: int = 2, reduce_op: str = "sum") -> SimulationReport:
    """One run of `plan` under the interleaving that `seed` picks."""
    _check_arguments(plan, seed, reduce_op)
    _count(elements, "elements", 1)
    return _Sim(plan, seed, elements, reduce_op).run()


def verify(plan: Plan, interleavings: int = 50, seed: int = 0, reduce_op: str = "sum") -> None:
    """Runs `plan` under `interleavings` random interleavings; raises
    SimulationError with the first failing one's report."""
    _check_arguments(plan, seed, reduce_op)
    _count(interleavings, "interleavings", 1)
    for k in range(interleavings):
        report = simulate(plan, seed + k, reduce_op=reduce_op)
        if not report.ok:
            raise SimulationError(f"plan {plan.name!r} failed in the simulator, {report}")
