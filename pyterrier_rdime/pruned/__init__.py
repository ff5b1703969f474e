"""Exact dense retrieval that scores only the dimensions a pruned query keeps: the transformer (``stage``), its
scoring paths (``kept``/``_numba``, ``dense`` with the top-k selection, ``compressed``), the index copies
(``layout``), the plan (``planner``, ``calibration``) and the sharded search on Ray (``sharded``)."""
from .sharded import ShardedPrunedRetriever, split_flex_index
from .stage import PrunedRetriever

__all__ = ['PrunedRetriever', 'ShardedPrunedRetriever', 'split_flex_index']
