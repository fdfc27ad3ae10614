"""The Primitive API from Python: channels, and a small op runner to drive them.

Kernels written in C++/CUDA use the device handles of ``pyccl.get_include()``
(``channels/memory_channel_device.hpp``, ``channels/port_channel_device.hpp``).
From Python, :func:`run` executes a short program of channel ops, the same
body as a CUDA kernel on GPUs and as CPU threads in host mode, which is how
the tests and benchmarks exercise the channels::

    ch = comm.memory_channel(peer, comm.register(buf))
    run(comm, [Op.put(0, dst_offset, src_offset, nbytes), Op.signal(0)], memory=[ch])
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Sequence

from . import _C

#: Bytes of packet buffer per data byte: LL8 carries 4 data bytes in 8, LL16 8 in 16.
LL_EXPANSION = 2


class Code(enum.IntEnum):
    PUT = 1
    GET = 2
    SIGNAL = 3
    WAIT = 4
    PUT_PACKETS8 = 5
    PUT_PACKETS16 = 6
    READ_PACKETS8 = 7
    READ_PACKETS16 = 8
    PORT_PUT = 9
    PORT_SIGNAL = 10
    PORT_PUT_WITH_SIGNAL = 11
    PORT_FLUSH = 12
    PORT_WAIT = 13
    RELAXED_SIGNAL = 14
    RELAXED_WAIT = 15


@dataclasses.dataclass(frozen=True)
class Op:
    """One step of a channel program (offsets and sizes in bytes)."""

    code: Code
    channel: int = 0
    a: int = 0
    b: int = 0
    c: int = 0
    flag: int = 0

    @staticmethod
    def put(channel: int, dst_offset: int, src_offset: int, nbytes: int) -> "Op":
        return Op(Code.PUT, channel, dst_offset, src_offset, nbytes)

    @staticmethod
    def get(channel: int, dst_offset: int, src_offset: int, nbytes: int) -> "Op":
        """Copies the peer's bytes at dst_offset into this rank's buffer at src_offset."""
        return Op(Code.GET, channel, dst_offset, src_offset, nbytes)

    @staticmethod
    def signal(channel: int) -> "Op":
        return Op(Code.SIGNAL, channel)

    @staticmethod
    def wait(channel: int) -> "Op":
        return Op(Code.WAIT, channel)

    @staticmethod
    def put_packets(channel: int, packet_offset: int, src_offset: int, nbytes: int, flag: int,
                    packet: int = 16) -> "Op":
        return Op(Code.PUT_PACKETS16 if packet == 16 else Code.PUT_PACKETS8, channel,
                  packet_offset, src_offset, nbytes, flag)

    @staticmethod
    def read_packets(channel: int, dst_offset: int, packet_offset: int, nbytes: int, flag: int,
                     packet: int = 16) -> "Op":
        return Op(Code.READ_PACKETS16 if packet == 16 else Code.READ_PACKETS8, channel,
                  dst_offset, packet_offset, nbytes, flag)

    @staticmethod
    def port_put(channel: int, dst_offset: int, src_offset: int, nbytes: int,
                 signal: bool = False) -> "Op":
        return Op(Code.PORT_PUT_WITH_SIGNAL if signal else Code.PORT_PUT, channel,
                  dst_offset, src_offset, nbytes)

    @staticmethod
    def port_signal(channel: int) -> "Op":
        return Op(Code.PORT_SIGNAL, channel)

    @staticmethod
    def port_flush(channel: int) -> "Op":
        return Op(Code.PORT_FLUSH, channel)

    @staticmethod
    def port_wait(channel: int) -> "Op":
        return Op(Code.PORT_WAIT, channel)


@dataclasses.dataclass
class RunResult:
    failures: int        #: waits that gave up (timeout or abort)
    elapsed_ns: int      #: measured inside the kernel (block 0, first op to last)
    wall_us: float       #: host side, launch to completion


def run(comm, ops: Sequence[Op], memory: Sequence = (), port: Sequence = (), repeat: int = 1,
        blocks: int = 1, threads: int = 512) -> RunResult:
    """Runs ``ops`` ``repeat`` times on ``blocks`` blocks (CPU threads in host mode).

    LL flags advance by one per repetition, so a repeated program never reads
    a packet from an earlier round.
    """
    raw = [(int(o.code), o.channel, o.a, o.b, o.c, o.flag) for o in ops]
    comm_c = getattr(comm, "_comm", comm)
    failures, elapsed, wall = _C._run_channel_ops(comm_c, list(memory), list(port), raw, repeat,
                                                  blocks, threads)
    return RunResult(int(failures), int(elapsed), float(wall))


#: Ping-pong modes (see ``csrc/diagnostics/pingpong.hpp``).
PINGPONG_MODES = {"signal": 0, "relaxed_signal": 1, "ll8": 2, "ll16": 3, "port_signal": 4}


@dataclasses.dataclass
class PingPongResult:
    failures: int      #: 1 if a wait gave up (the loop stops there), else 0
    mismatches: int    #: messages whose payload was not the current round's
    elapsed_ns: int    #: this rank's loop, first to last message
    rounds_done: int   #: round trips completed

    @property
    def round_trip_ns(self) -> float:
        return self.elapsed_ns / max(1, self.rounds_done)


def pingpong(comm, memory_channel, mode: str, rounds: int, initiator: bool, port_channel=None,
             flag_base: int = 1, check: bool = False) -> PingPongResult:
    """Round trips with the peer of ``memory_channel`` on one thread per rank.

    Both ranks call it at the same time with the same ``mode``, ``rounds`` and
    ``flag_base``, one of them as ``initiator``. ``mode`` is one of
    :data:`PINGPONG_MODES`. With ``check`` every message carries its round
    number and the receiver verifies it, counting lost and early wake-ups.
    """
    if mode not in PINGPONG_MODES:
        raise ValueError(f"mode must be one of {sorted(PINGPONG_MODES)}, got {mode!r}")
    comm_c = getattr(comm, "_comm", comm)
    failures, mismatches, elapsed, done = _C._run_pingpong(
        comm_c, memory_channel, port_channel, PINGPONG_MODES[mode], int(rounds), bool(initiator),
        int(flag_base), bool(check))
    return PingPongResult(int(failures), int(mismatches), int(elapsed), int(done))
