"""Exact dense retrieval that scores only the dimensions a pruned query keeps: the transformer (``stage``), its
exact scoring paths (``kept``: only the kept dimensions, compiled in ``_numba`` or numpy; ``dense``: BLAS over every
dimension; ``compressed``: the kept rows of an int8 copy, then an exact re-scoring of what its error bound cannot rule
out; all select with ``topk``), the on-disk copies of an index (``layout``: the float32 dimension-major one;
``int8_copy``: the int8 codes of the compressed path; both below the shared files of ``pyterrier_rdime._index_files``),
the plan of each call
(``plan``, decided once by ``cost`` and carried out below), the calibration of the cost model on this machine
(``calibration``, re-run with ``python -m pyterrier_rdime.pruned``), the measured choice of ``strategy='auto'``
among the paths the model puts near the cheapest (``measured``), and the same search over a sharded index on Ray
(``sharded``, over ``shard_data``: cutting an index into shards, hashing their docnos, merging their top-k).
Imports go one way: ``stage`` → ``calibration`` → ``cost`` → ``plan``; ``kept`` → ``_numba`` → ``plan``,
``topk``."""
from .shard_data import split_flex_index
from .sharded import ShardedPrunedRetriever
from .stage import PrunedRetriever

__all__ = ['PrunedRetriever', 'ShardedPrunedRetriever', 'split_flex_index']
