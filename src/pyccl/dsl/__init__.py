"""The pyccl DSL: write a collective algorithm with a global view of all
ranks and thread blocks, lower it to a plan, and check it in the simulator.

    from pyccl.dsl import AllReduce, MemoryChannel, Program
    with Program("allpairs", AllReduce(4, chunks=4)) as p:
        ...
    plan = p.lower()
    pyccl.dsl.verify(plan)          # random interleavings: result, deadlocks, races
    plan.save("allpairs.json")      # pyccl.dsl.load_plan reads it back

The DSL knows nothing of CUDA; plans are data (docs/plans.md).
"""

from .channels import (MemoryChannel, PortChannel, SwitchChannel, ThreadBlockGroup, all_pairs_memory_channels,
                       signal_and_wait)
from .collectives import AllGather, AllReduce, AllToAll, ReduceScatter, SendRecv
from .plan import PLAN_VERSION, Plan, PlanError, load_plan
from .program import Buffer, ChunkRange, DSLError, Program
from .simulator import SimulationError, SimulationReport, simulate, verify

__all__ = ["AllGather", "AllReduce", "AllToAll", "Buffer", "ChunkRange", "DSLError", "MemoryChannel", "PLAN_VERSION",
           "Plan", "PlanError", "PortChannel", "Program", "ReduceScatter", "SendRecv", "SimulationError",
           "SimulationReport", "SwitchChannel", "ThreadBlockGroup", "all_pairs_memory_channels", "load_plan",
           "signal_and_wait", "simulate", "verify"]
