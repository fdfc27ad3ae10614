"""pyccl's algorithms written in the DSL (:mod:`pyccl.dsl`). Each function
builds a :class:`pyccl.dsl.Program` for a number of ranks; ``.lower()`` gives
its plan.
"""

from .allgather import allgather_allpairs, allgather_ring
from .allreduce import allreduce_allpairs_hb, allreduce_allpairs_ll, allreduce_allpairs_ll2, allreduce_ring
from .reduce_scatter import reduce_scatter_ring

LIBRARY = {
    "allreduce_allpairs_ll": allreduce_allpairs_ll,
    "allreduce_allpairs_ll2": allreduce_allpairs_ll2,
    "allreduce_allpairs_hb": allreduce_allpairs_hb,
    "allreduce_ring": allreduce_ring,
    "allgather_allpairs": allgather_allpairs,
    "allgather_ring": allgather_ring,
    "reduce_scatter_ring": reduce_scatter_ring,
}

__all__ = ["LIBRARY", *LIBRARY]
