"""pyccl's algorithms written in the DSL (:mod:`pyccl.dsl`). Each function
builds a :class:`pyccl.dsl.Program` for a number of ranks; ``.lower()`` gives
its plan. The all-reduce plans take the names of the kernels of their
algorithms (``allreduce_1pa_ll`` is the plan of the ``1pa_ll`` kernel);
FORMER_NAMES maps their earlier names.
"""

import warnings

from ..tuning import FORMER_NAMES
from .allgather import allgather_allpairs, allgather_ring
from .allreduce import (allreduce_1pa_hb, allreduce_1pa_ll, allreduce_2pa_hb, allreduce_2pa_hb_pull,
                        allreduce_2pa_ll, allreduce_ring)
from .hierarchical import allgather_hierarchical, allreduce_2ph_hb, allreduce_2ph_ll, reduce_scatter_hierarchical
from .reduce_scatter import reduce_scatter_ring

LIBRARY = {
    "allreduce_1pa_ll": allreduce_1pa_ll,
    "allreduce_2pa_ll": allreduce_2pa_ll,
    "allreduce_1pa_hb": allreduce_1pa_hb,
    "allreduce_2pa_hb_pull": allreduce_2pa_hb_pull,
    "allreduce_2pa_hb": allreduce_2pa_hb,
    "allreduce_ring": allreduce_ring,
    "allgather_allpairs": allgather_allpairs,
    "allgather_ring": allgather_ring,
    "reduce_scatter_ring": reduce_scatter_ring,
}

#: Algorithms for groups that span nodes, built from (num_nodes, gpus_per_node).
HIERARCHICAL = {
    "allreduce_2ph_ll": allreduce_2ph_ll,
    "allreduce_2ph_hb": allreduce_2ph_hb,
    "allgather_hierarchical": allgather_hierarchical,
    "reduce_scatter_hierarchical": reduce_scatter_hierarchical,
}

def __getattr__(name: str):
    """The all-reduce plans' earlier names (FORMER_NAMES), with a DeprecationWarning."""
    if name in FORMER_NAMES:
        warnings.warn(f"pyccl.algorithms.{name} is now pyccl.algorithms.{FORMER_NAMES[name]}", DeprecationWarning,
                      stacklevel=2)
        return LIBRARY[FORMER_NAMES[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FORMER_NAMES", "HIERARCHICAL", "LIBRARY", *LIBRARY, *HIERARCHICAL]
