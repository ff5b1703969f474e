"""Exact dense retrieval that scores only the dimensions a pruned query keeps: the transformer (``stage``), its
compiled and numpy kernels (``kernels``), the on-disk dimension-major copy of an index (``layout``) and the choice
between the pruned and the dense path (``cost``)."""
from .stage import PrunedRetriever

__all__ = ['PrunedRetriever']
