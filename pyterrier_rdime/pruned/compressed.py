"""The compressed path of ``PrunedRetriever(strategy='compressed')``: exact top-k from an int8 copy of the
dimension-major matrix (:mod:`.int8_copy`: per dimension ``j`` a scale, codes in ``[-127, 127]`` and the measured
largest quantisation error ``error[j]``), reading a quarter of the bytes of the kept float32 rows for the scan.

A query ``q`` with kept dimensions ``K`` is scored in two steps:

1. the first pass scans the kept int8 rows: ``approx[d] = sum_{j in K} w_j code[j, d]`` with ``w_j = q_j scale[j]``
   in float32; every exact score lies within ``bound`` of it: the quantisation error ``sum_{j in K} |q_j| error[j]``
   plus the rounding of ``w_j`` and of the float32 sum (:func:`error_bound`);
2. the ``k`` best approximate documents are re-scored exactly (float64, from the float32 rows), and so is every
   other document whose ``approx + bound`` reaches their lowest exact score less one float32 step
   (:func:`tie_floor`): the result is the exact top-k of the scores rounded to float32, ties to the lower docid (the
   scores the user sees, as the float32 paths and a merge of shards rank them).

A batch can instead be scored in one pass (``one_pass``): integer weights (:func:`integer_weights`), one exact int8
matrix product per slab of documents (torch's, on the CPU's VNNI / AMX units), each slab pushed into each query's
``k`` best and the documents near them (:func:`integer_candidates`), then the same two steps with
:func:`integer_bound`. The bounds and the scans are one guarantee (exact top-k), kept together.
"""
import importlib.util
import os
import warnings
from typing import Iterator, Optional, Tuple

import numpy as np

from .int8_copy import CODE_MAX, Codes
from .plan import kept_dims
from .topk import Result, best_k, top_k

#: Unit roundoff of float32: each float32 operation is exact to within this relative error.
UNIT_ROUNDOFF = 2.0 ** -24
#: The one pass of a batch scores with integers: each query's weights become integers ``w`` (times a step of the
#: query) written as two int8 parts, ``w = WEIGHT_BASE * high + low`` with ``low`` in ``[-64, 63]``, so that one int8
#: matrix product (int32 sums, exact) of both parts of every query with the codes gives ``sum_j w_j code_j``.
WEIGHT_BASE = 128
#: Documents per int8 matrix product of the one pass: the products of a slab (``2 x queries x SLAB_DOCS`` int32, 8 MiB
#: for 64 queries) are pushed into the queries' best and candidates while they are still in the cache.
SLAB_DOCS = 16384


def query_weights(copy: Codes, query_vec: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dims, values, weights)`` of one query: its kept dimensions, their float32 values and the float32 weights
    ``values * scale`` of the first pass."""
    dims, values, _ = kept_dims(np.asarray(query_vec, dtype=np.float32)[None])
    return dims, values, (values * copy.scale[dims]).astype(np.float32)


def error_bound(copy: Codes, dims: np.ndarray, values: np.ndarray, weights: np.ndarray) -> float:
    """The largest difference between any document's exact score ``sum_j values_j x_j`` (real arithmetic) and its
    first-pass score, a float32 sum of ``weights_j code_j``: the quantisation error ``sum_j |values_j| error_j``, plus
    the rounding of the weights ``sum_j |values_j scale_j - weights_j| CODE_MAX``, plus the rounding of a float32 sum
    of ``n`` products in any order, ``gamma_{n+2} sum_j |weights_j| CODE_MAX`` with ``gamma_m = m u / (1 - m u)``
    (Higham, Accuracy and Stability of Numerical Algorithms, 2002, §3.1; two more terms than needed cover the
    conversion of each block's sum to float32). Computed in float64 and widened by ``1e-9`` relative, which is far
    beyond the float64 rounding of these few sums."""
    values64, weights64 = values.astype(np.float64), weights.astype(np.float64)
    quantisation = float(np.abs(values64) @ copy.error[dims])
    weight_rounding = float(np.abs(values64 * copy.scale[dims].astype(np.float64) - weights64).sum()) * CODE_MAX
    m = (len(dims) + 2) * UNIT_ROUNDOFF
    sum_rounding = m / (1 - m) * float(np.abs(weights64).sum()) * CODE_MAX
    return (quantisation + weight_rounding + sum_rounding) * (1 + 1e-9)


def first_pass(copy: Codes, query_vec: np.ndarray, k: int, *,
               use_numba: bool) -> Tuple[np.ndarray, np.ndarray, float]:
    """``(approx, docids, bound)`` of one query: the first-pass score of every document, the docids of the ``k``
    best of them, and the bound of :func:`error_bound` (compiled with numba, else numpy by blocks of documents)."""
    dims, values, weights = query_weights(copy, query_vec)
    k = min(k, copy.codes.shape[1])
    if use_numba:
        from . import _numba
        approx, docids = _numba.approximate_top_k(copy.codes, dims, weights, k)
    else:
        approx = np.empty(copy.codes.shape[1], dtype=np.float32)
        for d0 in range(0, len(approx), 32768):
            approx[d0:d0 + 32768] = weights @ copy.codes[dims, d0:d0 + 32768].astype(np.float32)
        docids = top_k(approx, k)[1]
    return approx, docids, error_bound(copy, dims, values, weights)


def exact_scores(dim_major: np.ndarray, query_vec: np.ndarray, docids: np.ndarray,
                 doc_rows: Optional[np.ndarray] = None) -> np.ndarray:
    """The float64 scores of these documents on the query's kept dimensions: from their rows in ``doc_rows``, the
    ``(docs, dims)`` float32 vectors the matrix was made from, where given (one contiguous read per document), else
    from the float32 matrix (one read per document and kept dimension). Each document's products are summed along its
    own contiguous row, so two identical documents get the same score bit for bit wherever they sit among the docids
    (a BLAS product may sum rows of one call in different orders), and exact ties keep the lower docid."""
    dims = np.flatnonzero(query_vec)
    if not len(dims) or not len(docids):
        return np.zeros(len(docids))
    if doc_rows is not None:
        values = np.asarray(doc_rows[docids], dtype=np.float64)[:, dims]
    else:
        values = np.ascontiguousarray(np.asarray(dim_major[np.ix_(dims, docids)], dtype=np.float64).T)
    return (values * query_vec[dims].astype(np.float64)).sum(axis=1)


def tie_floor(score: float) -> float:
    """A float64 below every score that rounds to float32 as high as ``score`` does: a document above it may tie the
    k-th best float32 score, and win the tie by a lower docid."""
    return float(np.nextafter(np.float32(score), np.float32(-np.inf)))


def float32_below(value: float) -> np.float32:
    """The largest float32 at most ``value``: a float32 score is ``>= value`` exactly when it is ``>=`` this one
    (compared in float32, twice as fast over the first pass's scores as in float64)."""
    below = np.float32(value)
    return np.nextafter(below, np.float32(-np.inf)) if below > value else below


def search_compressed(copy: Codes, dim_major: np.ndarray, query_vecs: np.ndarray, k: int, *,
                      use_numba: bool, one_pass: bool = False, doc_rows: Optional[np.ndarray] = None) -> Result:
    """Top-``k`` ``(scores, docids)`` of each query, exact: the first pass over ``copy``, then the documents whose
    bound reaches the k-th best exact score re-scored from ``doc_rows``, else from ``dim_major`` (see the module's
    description and :func:`exact_scores`; ``dim_major`` may be None where ``doc_rows`` is given). Scores are
    the float64 exact scores rounded to float32, ranked as rounded (ties to the lower docid). A batch is scored query
    after query over each one's kept rows, or with ``one_pass`` in integers over the whole copy
    (:func:`integer_slabs`), worth it where an int8 matrix product runs fast (:data:`INT8_PRODUCT`). The documents
    are re-scored from ``doc_rows`` where given (see :func:`exact_scores`)."""
    if one_pass:
        return _search_one_pass(copy, dim_major, query_vecs, k, use_numba=use_numba, doc_rows=doc_rows)
    scores, docids = [], []
    none = np.empty(0, dtype=np.int64)
    for query_vec in query_vecs:
        if not query_vec.any():
            s, d = _rescored(dim_major, query_vec, none, none, none, k, doc_rows)
            scores.append(s)
            docids.append(d)
            continue
        approx, best, bound = first_pass(copy, query_vec, k, use_numba=use_numba)
        best = np.sort(best)
        best_scores = exact_scores(dim_major, query_vec, best, doc_rows)
        # every document of the exact top-k (in float32, ties included) scores above tie_floor of the k-th best of
        # any k exact scores, so its first-pass score is at least that minus the bound
        s, d = _rescored(dim_major, query_vec, best, best_scores,
                         np.flatnonzero(approx >= float32_below(tie_floor(best_scores.min()) - bound)), k, doc_rows)
        scores.append(s)
        docids.append(d)
    return scores, docids


def _search_one_pass(copy: Codes, dim_major: np.ndarray, query_vecs: np.ndarray, k: int, *,
                     use_numba: bool, doc_rows: Optional[np.ndarray]) -> Result:
    """:func:`search_compressed` of a batch in one pass: the integer scores of every query and document, slab by slab
    (:func:`integer_slabs`), each slab pushed at once into each query's ``k`` best and its candidates (every document
    within ``slack`` of the running k-th best integer score, :func:`integer_candidates`); the ``k`` best re-scored
    exactly, then the candidates the bound of :func:`integer_bound` cannot rule out. A query whose candidates overflow
    (many documents within its bound of one another: duplicates) is scored on its own, as query after query."""
    k = min(k, copy.codes.shape[1])
    steps, weights, bounds, slack = one_pass_weights(copy, query_vecs)
    best, candidates, overflow = integer_candidates(copy.codes, weights, slack, k, use_numba=use_numba)
    scores, docids = [], []
    for q, query_vec in enumerate(query_vecs):
        if overflow[q] and query_vec.any():
            s, d = search_compressed(copy, dim_major, query_vec[None], k, use_numba=use_numba, doc_rows=doc_rows)
            scores.append(s[0])
            docids.append(d[0])
            continue
        ids = np.sort(best[q])
        ids_scores = exact_scores(dim_major, query_vec, ids, doc_rows)
        cand_ids, cand_scores = candidates[q]
        if query_vec.any():
            # every document of the exact top-k (in float32, ties included) scores above tie_floor of the lowest of
            # any k exact scores, so its integer score times the step is at least that minus the bound (one less: the
            # float64 rounding)
            threshold = np.floor((tie_floor(ids_scores.min()) - bounds[q]) / steps[q]) - 1
            cand_ids = cand_ids[cand_scores >= threshold]
        s, d = _rescored(dim_major, query_vec, ids, ids_scores, cand_ids, k, doc_rows)
        scores.append(s)
        docids.append(d)
    return scores, docids


def one_pass_weights(copy: Codes, query_vecs: np.ndarray):
    """``(steps, weights, bounds, slack)`` of a batch in one pass: :func:`integer_weights`, each query's
    :func:`integer_bound` (0 for a query that keeps nothing) and the slack of its candidates in integer units."""
    steps, weights = integer_weights(copy, query_vecs)
    bounds = np.array([integer_bound(copy, q, step, w) if q.any() else 0.0
                       for q, step, w in zip(query_vecs, steps, weights)])
    # every document of the exact top-k has an integer score of at least the k-th best one less twice the bound
    # (in steps) less 2 (the floor of the threshold and the float64 rounding), less what tie_floor takes off: under
    # 2^-22 of the largest score, sum_j |w_j| CODE_MAX steps plus the bound, and one step for its ceiling
    reach = np.abs(weights).sum(axis=1) * CODE_MAX + bounds / steps
    return steps, weights, bounds, (np.ceil(2 * bounds / steps) + np.ceil(reach * 2.0 ** -22)).astype(np.int64) + 3


def _rescored(dim_major: np.ndarray, query_vec: np.ndarray, best: np.ndarray, best_scores: np.ndarray,
              candidates: np.ndarray, k: int, doc_rows: Optional[np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """The exact top-``k`` of one query from its ``best`` documents (ascending, exact scores known) and the other
    ``candidates`` (ascending) its bound could not rule out; a query that keeps nothing scores 0 everywhere, its
    top-k the lowest docids, as on the other paths."""
    k = min(k, len(doc_rows) if doc_rows is not None else dim_major.shape[1])
    if not query_vec.any():
        return np.zeros(k, dtype=np.float32), np.arange(k)
    others = candidates[~np.isin(candidates, best, assume_unique=True)]
    ids = np.concatenate([best, others])
    s = np.concatenate([best_scores, exact_scores(dim_major, query_vec, others, doc_rows)]).astype(np.float32)
    order = best_k(s, ids, k)  # ranked as the user sees the scores: ties in float32 to the lower docid
    return s[order], ids[order]


def integer_weights(copy: Codes, query_vecs: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``(steps, weights)`` of the one pass: per query a step (float64) and integer weights (int64, ``(queries,
    dims)``, zero where the query is) with ``steps[q] * weights[q, j]`` within half a step of ``values_j scale_j``
    (exact in float64). The largest weight is ``CODE_MAX * WEIGHT_BASE``, less where the matrix has so many
    dimensions that ``sum_j |w_j| CODE_MAX`` would not fit in an int32."""
    weight_max = min(CODE_MAX * WEIGHT_BASE, (2 ** 31 - 1) // (CODE_MAX * copy.codes.shape[0]))
    exact = np.asarray(query_vecs, dtype=np.float32).astype(np.float64) * copy.scale.astype(np.float64)
    steps = np.abs(exact).max(axis=1, initial=0) / weight_max
    steps[steps == 0] = 1
    return steps, np.rint(exact / steps[:, None]).astype(np.int64)


def integer_bound(copy: Codes, query_vec: np.ndarray, step: float, weights: np.ndarray) -> float:
    """The largest difference between any document's exact score ``sum_j values_j x_j`` (real arithmetic) and
    ``step * sum_j weights_j code_j`` (an exact integer sum) for one query of :func:`integer_weights`: the
    quantisation error ``sum_j |values_j| error_j`` plus the rounding of the weights
    ``sum_j |values_j scale_j - step weights_j| CODE_MAX``. Computed in float64 and widened by ``1e-9`` relative, far
    beyond the float64 rounding of these few sums."""
    dims = np.flatnonzero(query_vec)
    values = query_vec[dims].astype(np.float64)
    quantisation = float(np.abs(values) @ copy.error[dims])
    rounding = float(np.abs(values * copy.scale[dims].astype(np.float64) - step * weights[dims]).sum()) * CODE_MAX
    return (quantisation + rounding) * (1 + 1e-9)


# torch's OpenMP threads cannot serve a process forked after they ran (the child would wait for them forever): a
# child forked after the int8 product ran (multiprocessing's default on Linux) multiplies in float64 instead.
_TORCH_STATE = {'ran': False, 'forked': False}


def _after_fork_in_child() -> None:
    if _TORCH_STATE['ran']:
        _TORCH_STATE['forked'] = True


if hasattr(os, 'register_at_fork'):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if hasattr(torch, '_int_mm') else None


#: How :func:`integer_slabs` multiplies int8 matrices: ``'torch'`` (its int8 product, on the VNNI / AMX units where
#: the CPU has them) when torch is installed, else ``'float64'`` (BLAS in float64, exact for these integer sums but
#: slower than the float32 paths: the one pass is then not worth taking).
INT8_PRODUCT = 'torch' if importlib.util.find_spec('torch') is not None else 'float64'


def integer_slabs(codes: np.ndarray, weights: np.ndarray) -> Iterator[Tuple[int, np.ndarray]]:
    """``(d0, parts)`` of each slab of ``SLAB_DOCS`` documents from ``d0``: the exact int32 products ``(2 x queries,
    width)`` of both int8 parts of the weights (``high`` rows first, then ``low``, see :data:`WEIGHT_BASE`) with the
    slab's codes, so that ``WEIGHT_BASE * high + low`` is ``sum_j weights[q, j] codes[j, d]``
    (:func:`integer_weights` keeps it below ``2 ** 31``): one int8 matrix product per slab with torch, else two float64
    products (exact for these integer sums)."""
    n_docs = codes.shape[1]
    low = (weights + WEIGHT_BASE // 2) % WEIGHT_BASE - WEIGHT_BASE // 2
    parts = np.concatenate([(weights - low) // WEIGHT_BASE, low]).astype(np.int8)
    torch = _torch() if INT8_PRODUCT == 'torch' and not _TORCH_STATE['forked'] else None
    if torch is None:
        for d0 in range(0, n_docs, SLAB_DOCS):
            yield d0, (parts.astype(np.float64) @ codes[:, d0:d0 + SLAB_DOCS].astype(np.float64)).astype(np.int32)
        return
    _TORCH_STATE['ran'] = True
    parts = torch.from_numpy(parts)
    with warnings.catch_warnings():  # a read-only memory map: torch warns that it could write it; it does not
        warnings.simplefilter('ignore', UserWarning)
        for d0 in range(0, n_docs, SLAB_DOCS):
            yield d0, torch._int_mm(parts, torch.from_numpy(codes[:, d0:d0 + SLAB_DOCS])).numpy()


def integer_candidates(codes: np.ndarray, weights: np.ndarray, slack: np.ndarray, k: int, *, use_numba: bool):
    """The first pass of the one pass, slab by slab: ``(best, candidates, overflow)``, per query the docids of its
    ``k`` highest integer scores (ties to the lower docid), its candidates ``(docids, integer scores)``, ascending:
    every document whose integer score reaches the k-th best one less ``slack[q]`` (the documents kept while they
    were within ``slack`` of the running k-th best, a superset), and whether they overflowed the compiled kernel's
    buffer (then incomplete)."""
    n_queries = len(weights)
    if use_numba:
        from . import _numba
        state = _numba.IntegerCandidates(n_queries, k, slack)
        for d0, parts in integer_slabs(codes, weights):
            state.push(parts, WEIGHT_BASE, d0)
        return state.result()
    best_s = [np.empty(0, dtype=np.int64)] * n_queries
    best_i = [np.empty(0, dtype=np.int64)] * n_queries
    near: list = [[] for _ in range(n_queries)]  # per query, (docids, scores) kept from each slab
    for d0, parts in integer_slabs(codes, weights):
        totals = WEIGHT_BASE * parts[:n_queries].astype(np.int64) + parts[n_queries:]
        for q in range(n_queries):
            s = np.concatenate([best_s[q], totals[q]])
            i = np.concatenate([best_i[q], d0 + np.arange(totals.shape[1])])
            keep = best_k(s, i, k)
            best_s[q], best_i[q] = s[keep], i[keep]
            floor = best_s[q].min() - slack[q] if len(keep) == k else np.iinfo(np.int64).min
            near[q] = [(ids[scores >= floor], scores[scores >= floor]) for ids, scores in near[q]]
            near[q].append((d0 + np.flatnonzero(totals[q] >= floor), totals[q][totals[q] >= floor]))
    candidates = [(np.concatenate([ids for ids, _ in kept]), np.concatenate([scores for _, scores in kept]))
                  for kept in near]
    return best_i, candidates, np.zeros(n_queries, dtype=bool)
