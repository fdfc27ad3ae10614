"""pyccl inside inference engines.

- :mod:`pyccl.integrations.group`: :class:`GroupCommunicator`, pyccl's
  collectives for one torch process group in the shape engines call them
  (out-of-place all-reduce, all-gather and reduce-scatter along a dimension,
  send/recv, ``should_use``, ``destroy``). It needs no engine.
- :mod:`pyccl.integrations.vllm`: vLLM's device communicator with pyccl in
  front, and the ``vllm.general_plugins`` entry point that installs it.
- :mod:`pyccl.integrations.sglang`: SGLang's GroupCoordinator with pyccl as
  its custom all-reduce, and the ``sglang.srt.plugins`` entry point.

The engine modules import their engine only when their classes or hooks are
used, so importing them never fails for want of an engine.
"""

from .group import GroupCommunicator

__all__ = ["GroupCommunicator"]
