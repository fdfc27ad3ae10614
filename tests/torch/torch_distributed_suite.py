"""torch's own distributed test suite on the "pyccl" backend.

torch ships the suite behind its test/distributed/test_distributed_spawn.py
in the wheel: ``DistributedTest`` in
torch/testing/_internal/distributed/distributed_test.py. torch's launcher
takes only gloo, nccl and ucc; this module builds the same test class for
"pyccl" (each test spawns ``WORLD_SIZE`` ranks that call
``init_process_group("pyccl")``). The suite reads its settings from the
environment when it is imported, so set them first::

    WORLD_SIZE=3 python -m pytest tests/torch/torch_distributed_suite.py [-k pattern]

or ``python tests/torch/torch_distributed_suite.py --world 3 [-k pattern]``, which
sets them and runs pytest. Without GPUs every op runs in host mode; with at
least ``WORLD_SIZE`` GPUs the suite's GPU tests run too. Tests of features
the suite reserves for other backends skip, as they do for them; the ones
that pyccl does not take are listed in ``NOT_TAKEN`` with the reason.
It needs torch's test dependency ``expecttest``.
"""

from __future__ import annotations

import os
import sys
import tempfile

os.environ.setdefault("BACKEND", "pyccl")
os.environ.setdefault("WORLD_SIZE", "2")
# The tests' own init is a file of a temporary directory each test makes (TEMP_DIR); the suite reads this only
# to choose tests. Every spawned rank imports this module: nothing here may make a file.
os.environ.setdefault("INIT_METHOD", f"file://{tempfile.gettempdir()}/pyccl-torch-suite-init")

import pyccl  # noqa: E402,F401  (registers the backend in every rank: spawned ranks import this module)
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

_ANY_SOURCE = ("receiving from any source is refused, as ProcessGroupNCCL refuses it (\"Backend pyccl does not "
               "support recvAnysource\"); the suite excuses NCCL from these tests the same way")

#: Tests of the suite that pyccl does not take, and why (they fail by design, not by a defect).
NOT_TAKEN: dict = {
    "test_send_recv_any_source": _ANY_SOURCE,
    "test_send_recv_any_source_autograd_profiler": _ANY_SOURCE,
    "test_send_recv_any_source_torch_profiler": _ANY_SOURCE,
    "test_ddp_logging_data_cpu": "torch's DistributedDataParallel logs every backend registered by a plugin as "
                                 "\"custom\", and the test expects the backend's own name",
}


class TestPycclBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """torch's DistributedTest, every rank a process on the "pyccl" backend."""

    def setUp(self):
        name = self._testMethodName
        if name in NOT_TAKEN:
            self.skipTest(NOT_TAKEN[name])
        super().setUp()
        self._spawn_processes()


def main(argv=None) -> int:
    """Runs the suite under pytest in a fresh interpreter, its settings in the environment."""
    import argparse
    import subprocess

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2, help="ranks per test (WORLD_SIZE)")
    parser.add_argument("-k", default=None, help="pytest's -k: the tests to run")
    args, rest = parser.parse_known_args(argv)
    env = dict(os.environ, WORLD_SIZE=str(args.world))
    cmd = [sys.executable, "-m", "pytest", os.path.abspath(__file__), "-q", "-p", "no:cacheprovider", "-rfE"]
    return subprocess.call(cmd + (["-k", args.k] if args.k else []) + rest, env=env)


if __name__ == "__main__":
    sys.exit(main())
