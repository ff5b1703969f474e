"""Exact dense retrieval that scores only the dimensions a pruned query keeps: the transformer (``stage``), its
two exact scoring paths (``kept``: only the kept dimensions, compiled in ``_numba`` or numpy; ``dense``: BLAS over
every dimension; both select with ``topk``), the on-disk dimension-major copy of an index (``layout``) and the choice
between the two paths (``cost``, re-calibrated with ``python -m pyterrier_rdime.pruned``), and the same search
over a sharded index on Ray (``sharded``)."""
from .sharded import ShardedPrunedRetriever, split_flex_index
from .stage import PrunedRetriever

__all__ = ['PrunedRetriever', 'ShardedPrunedRetriever', 'split_flex_index']
