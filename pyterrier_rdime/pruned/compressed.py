"""The compressed path of ``PrunedRetriever(strategy='compressed')``: exact top-k from an int8 copy of the
dimension-major matrix (:mod:`.layout`), reading a quarter of the bytes of the float32 rows.

1. the first pass scans the kept int8 rows; every exact score lies within ``bound`` of it (:func:`error_bound`);
2. the ``k`` best are re-scored exactly (float64), and so is every document whose ``approx + bound`` reaches their
   lowest exact score less one float32 step (:func:`tie_floor`): the exact top-k of the float32-rounded scores.

With ``one_pass`` a batch is scored in integers by int8 matrix products (:func:`integer_slabs`), then the same
two steps with :func:`integer_bound`; rows that extend one another (:func:`.dense.nested_trees`) by prefix sums
instead (:func:`integer_candidates`).
"""
import warnings
from typing import Iterator, List, Optional, Tuple

import numpy as np

from .._config import fork_guard
from ..store import prefetch_rows
from .dense import INT8_PRODUCT, Result, best_k, kept_dims, nested_trees, top_k
from .layout import CODE_MAX, Codes

#: Unit roundoff of float32: each float32 operation is exact to within this relative error.
UNIT_ROUNDOFF = 2.0 ** -24
#: Integer weights of the one pass split as ``w = WEIGHT_BASE * high + low`` (both int8) for one int8 product.
WEIGHT_BASE = 128
#: Documents per int8 matrix product of the one pass (its products still in the cache when pushed).
SLAB_DOCS = 16384


def error_bound(copy: Codes, dims: np.ndarray, values: np.ndarray, weights: np.ndarray, *,
                float32_sum: bool = True) -> float:
    """The largest gap between any exact score and its first-pass score ``sum_j weights_j code_j``: quantisation
    error, plus weight rounding, plus (``float32_sum``) ``gamma_{n+2} sum_j |weights_j| CODE_MAX`` for a float32 sum
    (Higham 2002, §3.1), widened by ``1e-9`` relative for float64 rounding."""
    values64, weights64 = values.astype(np.float64), weights.astype(np.float64)
    quantisation = float(np.abs(values64) @ copy.error[dims])
    weight_rounding = float(np.abs(values64 * copy.scale[dims].astype(np.float64) - weights64).sum()) * CODE_MAX
    m = (len(dims) + 2) * UNIT_ROUNDOFF
    sum_rounding = m / (1 - m) * float(np.abs(weights64).sum()) * CODE_MAX if float32_sum else 0.0
    return (quantisation + weight_rounding + sum_rounding) * (1 + 1e-9)


def first_pass(copy: Codes, query_vec: np.ndarray, k: int, *,
               use_numba: bool) -> Tuple[np.ndarray, np.ndarray, float]:
    """``(approx, docids, bound)`` of one query: first-pass scores, the ``k`` best docids, :func:`error_bound`."""
    dims, values, _ = kept_dims(np.asarray(query_vec, dtype=np.float32)[None])
    weights = (values * copy.scale[dims]).astype(np.float32)  # the first pass's
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


def exact_scores(dim_major: np.ndarray, query_vecs: np.ndarray, docids: List[np.ndarray],
                 doc_rows: Optional[np.ndarray] = None, *, use_numba: bool) -> List[np.ndarray]:
    """The float64 scores of each query's ``docids``, from ``doc_rows`` where given, else from ``dim_major``. Summed
    dimension after dimension (not by BLAS) so that identical documents score bit for bit the same and ties keep the
    lower docid; with ``use_numba`` in one parallel call for the batch (the same sums, in the same order)."""
    if doc_rows is not None and len(docids):
        prefetch_rows(doc_rows, np.concatenate(docids))
    if use_numba:
        from . import _numba
        return _numba.exact_scores(dim_major.T if doc_rows is None else doc_rows, *kept_dims(query_vecs), docids)
    scores = []
    for query_vec, ids in zip(query_vecs, docids):
        dims = np.flatnonzero(query_vec)
        if not len(dims) or not len(ids):
            scores.append(np.zeros(len(ids)))
            continue
        if doc_rows is not None:
            values = np.ascontiguousarray(np.asarray(doc_rows[ids], dtype=np.float64)[:, dims].T)
        else:
            values = np.asarray(dim_major[np.ix_(dims, ids)], dtype=np.float64)
        # (dims, docs): numpy adds the rows one after the other (along a contiguous axis it would sum pairwise)
        scores.append((values * query_vec[dims, None].astype(np.float64)).sum(axis=0))
    return scores


def tie_floor(score: float) -> float:
    """A float64 below every score that rounds to float32 as high as ``score`` (a document above it may tie)."""
    return float(np.nextafter(np.float32(score), np.float32(-np.inf)))


def float32_below(value: float) -> np.float32:
    """The largest float32 at most ``value``, to compare the first pass's scores in float32."""
    below = np.float32(value)
    return np.nextafter(below, np.float32(-np.inf)) if below > value else below


def search_compressed(copy: Codes, dim_major: np.ndarray, query_vecs: np.ndarray, k: int, *,
                      use_numba: bool, one_pass: bool = False, doc_rows: Optional[np.ndarray] = None) -> Result:
    """Exact top-``k`` ``(scores, docids)`` of each query, as the module describes; scores rounded to float32, ties
    to the lower docid. Query after query, or with ``one_pass`` (compiled kernels only) in integers over the whole
    copy."""
    if one_pass:
        if not use_numba:
            raise ValueError('the compressed one pass runs on the compiled kernels: install numba')
        return _search_one_pass(copy, dim_major, query_vecs, k, doc_rows=doc_rows)
    found = []  # (scores, docids) of each query
    none = np.empty(0, dtype=np.int64)
    for query_vec in query_vecs:
        if not query_vec.any():
            found.append(_ranked(query_vec, none, none, none, none, k, n_docs=copy.codes.shape[1]))
            continue
        approx, best, bound = first_pass(copy, query_vec, k, use_numba=use_numba)
        best = np.sort(best)
        best_scores, = exact_scores(dim_major, query_vec[None], [best], doc_rows, use_numba=use_numba)
        # every document of the exact top-k (in float32, ties included) scores above tie_floor of the k-th best of
        # any k exact scores, so its first-pass score is at least that minus the bound
        others = _others(np.flatnonzero(approx >= float32_below(tie_floor(best_scores.min()) - bound)), best)
        others_scores, = exact_scores(dim_major, query_vec[None], [others], doc_rows, use_numba=use_numba)
        found.append(_ranked(query_vec, best, best_scores, others, others_scores, k, n_docs=copy.codes.shape[1]))
    return [s for s, _ in found], [d for _, d in found]


def _search_one_pass(copy: Codes, dim_major: np.ndarray, query_vecs: np.ndarray, k: int, *,
                     doc_rows: Optional[np.ndarray]) -> Result:
    """:func:`search_compressed` of a batch in one pass (:func:`integer_candidates`); a query whose candidates
    overflow every buffer the pass may hold (a great many documents near its k-th best) is scored on its own."""
    k = min(k, copy.codes.shape[1])
    roots, *nested = nested_trees(query_vecs)
    steps, weights, bounds, slack = one_pass_weights(copy, query_vecs, roots)
    slack[~query_vecs.any(axis=1)] = -1  # a query without dimensions ties everywhere: its heap only, no candidates
    best, candidates, overflow = integer_candidates(copy.codes, weights, slack, k, nested=nested)
    found = {q: (s[0], d[0]) for q in np.flatnonzero(overflow) for s, d in [search_compressed(
        copy, dim_major, query_vecs[q][None], k, use_numba=True, doc_rows=doc_rows)]}  # (scores, docids) by query
    done = np.flatnonzero(~overflow)
    best, rows = [np.sort(best[q]) for q in done], query_vecs[done]
    best_scores = exact_scores(dim_major, rows, best, doc_rows, use_numba=True)
    others = []
    for q, ids, ids_scores in zip(done, best, best_scores):
        cand_ids, cand_scores = candidates[q]
        if query_vecs[q].any():
            # every document of the exact top-k (in float32, ties included) scores above tie_floor of the lowest of
            # any k exact scores, so its integer score times the step is at least that minus the bound (one less: the
            # float64 rounding)
            threshold = np.floor((tie_floor(ids_scores.min()) - bounds[q]) / steps[q]) - 1
            cand_ids = cand_ids[cand_scores >= threshold]
        others.append(_others(cand_ids, ids))
    others_scores = exact_scores(dim_major, rows, others, doc_rows, use_numba=True)
    for q, *ranked in zip(done, best, best_scores, others, others_scores):
        found[q] = _ranked(query_vecs[q], *ranked, k, n_docs=copy.codes.shape[1])
    return [found[q][0] for q in range(len(query_vecs))], [found[q][1] for q in range(len(query_vecs))]


def one_pass_weights(copy: Codes, query_vecs: np.ndarray, roots: Optional[np.ndarray] = None):
    """``(steps, weights, bounds, slack)`` of a batch: :func:`integer_weights`, :func:`integer_bound`, the slack."""
    steps, weights = integer_weights(copy, query_vecs, roots)
    bounds = np.array([integer_bound(copy, q, step, w) if q.any() else 0.0
                       for q, step, w in zip(query_vecs, steps, weights)])
    # every document of the exact top-k has an integer score of at least the k-th best one less twice the bound
    # (in steps) less 2 (the floor of the threshold and the float64 rounding), less what tie_floor takes off: under
    # 2^-22 of the largest score, sum_j |w_j| CODE_MAX steps plus the bound, and one step for its ceiling
    reach = np.abs(weights).sum(axis=1) * CODE_MAX + bounds / steps
    return steps, weights, bounds, (np.ceil(2 * bounds / steps) + np.ceil(reach * 2.0 ** -22)).astype(np.int64) + 3


def _others(candidates: np.ndarray, best: np.ndarray) -> np.ndarray:
    """The ``candidates`` not among the ``best`` (both without repeats)."""
    return candidates[~np.isin(candidates, best, assume_unique=True)]


def _ranked(query_vec: np.ndarray, best: np.ndarray, best_scores: np.ndarray, others: np.ndarray,
            others_scores: np.ndarray, k: int, n_docs: int) -> Tuple[np.ndarray, np.ndarray]:
    """One query's exact top-``k`` of ``n_docs`` from its ``best`` and ``others`` documents, their exact scores."""
    k = min(k, n_docs)
    if not query_vec.any():
        return np.zeros(k, dtype=np.float32), np.arange(k)
    ids = np.concatenate([best, others])
    s = np.concatenate([best_scores, others_scores]).astype(np.float32)
    order = best_k(s, ids, k)  # ranked as the user sees the scores: ties in float32 to the lower docid
    return s[order], ids[order]


def integer_weights(copy: Codes, query_vecs: np.ndarray,
                    roots: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
    """``(steps, weights)``: per query a float64 step and int64 weights with ``steps[q] * weights[q, j]`` within half
    a step of ``values_j scale_j``, small enough that the sums fit in an int32; one step for the rows of each root."""
    weight_max = min(CODE_MAX * WEIGHT_BASE, (2 ** 31 - 1) // (CODE_MAX * copy.codes.shape[0]))
    exact = np.asarray(query_vecs, dtype=np.float32).astype(np.float64) * copy.scale.astype(np.float64)
    steps = np.abs(exact).max(axis=1, initial=0) / weight_max
    if roots is not None:
        np.maximum.at(steps, roots, steps.copy())
        steps = steps[roots]
    steps[steps == 0] = 1
    return steps, np.rint(exact / steps[:, None]).astype(np.int64)


def integer_bound(copy: Codes, query_vec: np.ndarray, step: float, weights: np.ndarray) -> float:
    """:func:`error_bound` of the exact integer sum ``step * sum_j weights_j code_j``."""
    dims = np.flatnonzero(query_vec)
    return error_bound(copy, dims, query_vec[dims], step * weights[dims], float32_sum=False)


# torch's OpenMP threads cannot serve a process forked after they ran (the child would wait for them forever): a
# child forked after the int8 product ran (multiprocessing's default on Linux) multiplies in float64 instead.
_TORCH_STATE = {'ran': False}
_TORCH_FORKED = fork_guard(lambda: _TORCH_STATE['ran'])


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if hasattr(torch, '_int_mm') else None


def integer_slabs(codes: np.ndarray, weights: np.ndarray) -> Iterator[Tuple[int, np.ndarray]]:
    """``(d0, parts)`` per slab of ``SLAB_DOCS`` documents: the exact int32 products of the ``high`` then ``low``
    weight rows (see :data:`WEIGHT_BASE`) with the slab's codes."""
    low = (weights + WEIGHT_BASE // 2) % WEIGHT_BASE - WEIGHT_BASE // 2
    parts = np.concatenate([(weights - low) // WEIGHT_BASE, low]).astype(np.int8)
    torch = _torch() if INT8_PRODUCT == 'torch' and len(parts) and not _TORCH_FORKED['forked'] else None
    if torch is not None:
        _TORCH_STATE['ran'] = True
        parts = torch.from_numpy(parts)
    with warnings.catch_warnings():  # a read-only memory map: torch warns that it could write it; it does not
        warnings.simplefilter('ignore', UserWarning)
        for d0 in range(0, codes.shape[1], SLAB_DOCS):
            slab = codes[:, d0:d0 + SLAB_DOCS]
            if torch is not None:
                yield d0, torch._int_mm(parts, torch.from_numpy(slab)).numpy()
            elif len(parts):  # exact but slow
                yield d0, (parts.astype(np.float64) @ slab.astype(np.float64)).astype(np.int32)
            else:
                yield d0, np.empty((0, slab.shape[1]), dtype=np.int32)


def integer_candidates(codes: np.ndarray, weights: np.ndarray, slack: np.ndarray, k: int, nested=None):
    """``(best, candidates, overflow)`` per query by the compiled kernels: its ``k`` best docids, ``(docids, integer
    scores)`` within ``slack[q]`` of the k-th best, and whether those overflowed the kernel's buffers (then both are
    empty). The rows ``nested`` (``(rows, parents)`` of :func:`.dense.nested_trees`) are scored by prefix sums (each
    its parent's scores plus its own dims'), the others by :func:`integer_slabs`."""
    from . import _numba
    rows, parents = nested if nested is not None else (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
    own = weights[rows] * ((parents < 0)[:, None] | (weights[rows[parents]] == 0))  # the dims its parent lacks
    dims, own_weights, starts = kept_dims(own)
    prefix_sums = (dims, own_weights.astype(np.int32), starts, parents)  # |weight| <= CODE_MAX * WEIGHT_BASE < 2^15
    source = np.argsort(np.concatenate([np.delete(np.arange(len(weights)), rows), rows]))  # its row in a slab's scores
    return _numba.integer_candidates(codes, integer_slabs(codes, np.delete(weights, rows, axis=0)), prefix_sums,
                                     WEIGHT_BASE, source, k, slack)
