"""What every scoring path shares: the kept dimensions of the queries, and top-k selection (higher score first, exact
ties to the lower docid). Pure numpy."""
from typing import Iterable, List, Tuple

import numpy as np

Result = Tuple[List[np.ndarray], List[np.ndarray]]


def kept_dims(query_vecs: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The non-zero entries of each query, concatenated: ``(dims, weights, starts)`` with query ``i``'s kept dims
    (ascending) and values at ``starts[i]:starts[i + 1]``."""
    rows, dims = np.nonzero(query_vecs)
    starts = np.zeros(len(query_vecs) + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=len(query_vecs)), out=starts[1:])
    return dims.astype(np.int64), query_vecs[rows, dims].astype(np.float32), starts


def top_k(scores: np.ndarray, k: int, offset: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """The ``k`` highest of a 1-D score array, descending, ties by lower index: ``(scores, indices + offset)``."""
    idx = best_k(scores, np.arange(len(scores)), k)
    return scores[idx], idx + offset


def best_k(scores: np.ndarray, docids: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` best ``(score, docid)`` pairs (higher score, then lower docid), in that order."""
    n = len(scores)
    if n > k:
        kth = np.partition(scores, n - k)[n - k]
        above = np.flatnonzero(scores > kth)
        ties = np.flatnonzero(scores == kth)
        keep = np.concatenate([above, ties[np.argsort(docids[ties], kind='stable')[:k - len(above)]]])
    else:
        keep = np.arange(n)
    return keep[np.lexsort((docids[keep], -scores[keep]))]


def ranked(found: Iterable[Tuple[np.ndarray, np.ndarray]], k: int) -> Result:
    """The best ``k`` of each query's ``(scores, docids)``, in the order of :func:`best_k`."""
    scores, docids = [], []
    for s, i in found:
        order = best_k(s, i, k)
        scores.append(s[order])
        docids.append(i[order])
    return scores, docids


def merge_heaps(heap_s: np.ndarray, heap_i: np.ndarray, k: int) -> Result:
    """The best ``k`` of each query over the chunks' heaps ``(chunks, queries, k)`` (unfilled slots have docid -1),
    descending, ties by lower docid."""
    heaps = [(heap_s[:, q].ravel(), heap_i[:, q].ravel()) for q in range(heap_s.shape[1])]
    return ranked([(s[i >= 0], i[i >= 0]) for s, i in heaps], k)
