"""Exact dense retrieval that scores only the dimensions a pruned query keeps: the transformer (``stage``), its
scoring paths (``kept``/``_numba``, ``dense``, ``compressed``; ``topk``), the index copies (``layout``), the plan
(``planner``, ``calibration``) and the sharded search on Ray (``sharded``, ``shard_data``)."""
from .shard_data import split_flex_index
from .sharded import ShardedPrunedRetriever
from .stage import PrunedRetriever

__all__ = ['PrunedRetriever', 'ShardedPrunedRetriever', 'split_flex_index']
