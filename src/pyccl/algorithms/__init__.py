"""pyccl's algorithms written in the DSL (:mod:`pyccl.dsl`). Each function
builds a :class:`pyccl.dsl.Program` for a number of ranks; ``.lower()`` gives
its plan.
"""

from .allgather import allgather_allpairs, allgather_ring
from .allreduce import (allreduce_allpairs_hb, allreduce_allpairs_hb1, allreduce_allpairs_hb_push,
                        allreduce_allpairs_ll, allreduce_allpairs_ll2, allreduce_ring)
from .hierarchical import allgather_hierarchical, allreduce_2ph_hb, allreduce_2ph_ll, reduce_scatter_hierarchical
from .reduce_scatter import reduce_scatter_ring

LIBRARY = {
    "allreduce_allpairs_ll": allreduce_allpairs_ll,
    "allreduce_allpairs_ll2": allreduce_allpairs_ll2,
    "allreduce_allpairs_hb1": allreduce_allpairs_hb1,
    "allreduce_allpairs_hb": allreduce_allpairs_hb,
    "allreduce_allpairs_hb_push": allreduce_allpairs_hb_push,
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

__all__ = ["HIERARCHICAL", "LIBRARY", *LIBRARY, *HIERARCHICAL]
