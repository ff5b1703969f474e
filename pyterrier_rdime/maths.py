"""Pure numpy maths of Kernel DIME, RDIME and Top-k, vectorised over ``n`` queries of ``p`` dimensions.

Feedback documents are padded to ``m`` slots per query, ``doc_mask`` (n, m) marking the real ones. Float64 throughout
(float32 makes ``u > eps2`` ties fragile); callers cast to float32 at the edges.
"""
import hashlib
from typing import Callable, Iterable, Optional, Tuple, Union

import numpy as np

from ._config import check_choice, check_topk

#: ``log K(q, d_i)`` (n, m) of each named kernel, from queries (n, p), documents (n, m, p), ``tau`` and ``(n, m)``.
_LOG_KERNELS = {
    'uniform': lambda q, d, tau, nm: np.zeros(nm),
    'softmax': lambda q, d, tau, nm: np.einsum('np,nmp->nm', q, d) / tau,
    'rbf': lambda q, d, tau, nm: -np.sum((d - q[:, None, :]) ** 2, axis=2) / tau,
    'sigmoid': lambda q, d, tau, nm: -np.logaddexp(0.0, -np.einsum('np,nmp->nm', q, d) / tau),
    'rank': lambda q, d, tau, nm: np.broadcast_to(-np.log(np.arange(1, nm[1] + 1, dtype=np.float64)), nm),
}
KERNELS = tuple(_LOG_KERNELS)

#: A user kernel: ``kernel(query_vecs (n, p), doc_vecs (n, m, p)) -> (n, m)`` non-negative similarities.
KernelFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


def kernel_weights(kernel: Union[str, KernelFn], query_vecs: np.ndarray, doc_vecs: np.ndarray, doc_mask: np.ndarray,
                   *, tau: float = 0.1) -> np.ndarray:
    """Normalised Kernel DIME weights ``w_i = K(q, d_i) / sum_j K(q, d_j)`` (n, m) over the real slots (paper, Eq. 3).

    ``kernel``: ``'uniform'`` (1, PRF DIME), ``'softmax'`` (``exp(q.d_i / tau)``, SWC DIME), ``'rbf'``
    (``exp(-||q - d_i||^2 / tau)``), ``'sigmoid'`` (``1 / (1 + exp(-q.d_i / tau))``), ``'rank'`` (``1 / (i + 1)``,
    the appendix's inverse-variance weights when the noise variance grows with the rank), or a callable
    ``kernel(query_vecs, doc_vecs) -> (n, m)`` of finite similarities >= 0. A query with no weight gets all zeros.
    """
    doc_mask = np.asarray(doc_mask, dtype=bool)
    if callable(kernel):
        k = _callable_similarities(kernel, query_vecs, doc_vecs, doc_mask)
    else:
        k = _named_similarities(kernel, query_vecs, doc_vecs, doc_mask, tau)
    total = k.sum(axis=1, keepdims=True)
    return np.divide(k, total, out=np.zeros_like(k), where=total > 0)


def _callable_similarities(kernel: KernelFn, query_vecs: np.ndarray, doc_vecs: np.ndarray,
                           doc_mask: np.ndarray) -> np.ndarray:
    """A user kernel's similarities (n, m), checked, over each query's maximum (1e308 cannot overflow the sum)."""
    n, m = doc_mask.shape
    k = np.asarray(kernel(query_vecs, doc_vecs), dtype=np.float64)
    if k.shape != (n, m):
        raise ValueError(f'kernel {kernel!r} returned shape {k.shape}; expected (n_queries, n_docs) = {(n, m)}')
    if not np.all(np.isfinite(k[doc_mask])) or np.any(k[doc_mask] < 0):
        raise ValueError(f'kernel {kernel!r} returned negative or non-finite similarities; kernels must be >= 0')
    k = np.where(doc_mask, k, 0.0)
    top = k.max(axis=1, keepdims=True) if m else np.zeros((n, 1))
    return np.divide(k, top, out=np.zeros_like(k), where=top > 0)


def _named_similarities(kernel: str, query_vecs: np.ndarray, doc_vecs: np.ndarray, doc_mask: np.ndarray,
                        tau: float) -> np.ndarray:
    """A named kernel's similarities (n, m), in log space relative to each query's maximum (no overflow)."""
    n, m = doc_mask.shape
    check_choice('kernel_weights', 'kernel', kernel, KERNELS, 'or a callable kernel(query_vecs, doc_vecs)')
    with np.errstate(over='ignore'):  # reported below, with the fix
        log_k = _LOG_KERNELS[kernel](query_vecs, doc_vecs, tau, (n, m))
    # +inf/NaN, or -inf in every slot of a query, happen only when the similarities divided by tau overflow
    real = np.where(doc_mask, log_k, 0.0)
    unbounded = np.isnan(real) | (real == np.inf)
    weightless = doc_mask.any(axis=1) & np.all(~doc_mask | np.isneginf(log_k), axis=1)
    if unbounded.any() or weightless.any():
        raise ValueError(f'kernel_weights: the {kernel!r} kernel overflows with tau={tau!r} (the similarities '
                         'divided by tau exceed the float range); use a larger tau')
    log_k = np.where(doc_mask, log_k, -np.inf)
    top = np.max(log_k, axis=1, keepdims=True) if m else np.zeros((n, 1))
    return np.where(doc_mask, np.exp(log_k - np.where(np.isfinite(top), top, 0.0)), 0.0)


def kernel_dime(query_vecs: np.ndarray, doc_vecs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Kernel DIME importance ``u = q * sum_i w_i d_i`` (n, p)."""
    return query_vecs * np.einsum('nm,nmp->np', weights, doc_vecs)


def magnitude_dime(query_vecs: np.ndarray) -> np.ndarray:
    """Magnitude DIME ``u = q * q``: needs no feedback; the fallback when a query has no feedback signal."""
    return query_vecs * query_vecs


def eclipse_dime(query_vecs: np.ndarray, pos_vecs: np.ndarray, pos_mask: np.ndarray, neg_vecs: np.ndarray,
                 neg_mask: np.ndarray, *, alpha: float = 1.0, beta: float = 0.5) -> np.ndarray:
    """Eclipse DIME ``u = alpha * q * mean(positives) - beta * q * mean(negatives)``."""
    pos = kernel_dime(query_vecs, pos_vecs, kernel_weights('uniform', query_vecs, pos_vecs, pos_mask))
    neg = kernel_dime(query_vecs, neg_vecs, kernel_weights('uniform', query_vecs, neg_vecs, neg_mask))
    return alpha * pos - beta * neg


def oracle_dime(query_vecs: np.ndarray, doc_vecs: np.ndarray, labels: np.ndarray, doc_mask: np.ndarray) -> np.ndarray:
    """Oracle DIME: per dimension ``j``, the Pearson correlation of the labels with ``q_j * d_j`` over the judged
    documents; NaN rows where undefined (fewer than two documents, constant labels), 0 for a constant ``q_j * d_j``."""
    mask = np.asarray(doc_mask, dtype=bool)
    count = mask.sum(axis=1)
    x = query_vecs[:, None, :] * doc_vecs
    x_mean = np.einsum('nm,nmp->np', mask, x) / np.maximum(count, 1)[:, None]
    y = np.where(mask, labels, 0.0)
    y_mean = y.sum(axis=1) / np.maximum(count, 1)
    xc = np.where(mask[:, :, None], x - x_mean[:, None, :], 0.0)
    yc = np.where(mask, y - y_mean[:, None], 0.0)
    cov = np.einsum('nm,nmp->np', yc, xc)
    x_norm = np.sqrt(np.einsum('nmp,nmp->np', xc, xc))
    y_norm = np.sqrt(np.einsum('nm,nm->n', yc, yc))
    denom = x_norm * y_norm[:, None]
    corr = np.divide(cov, denom, out=np.zeros_like(cov), where=denom > 0)
    corr[(count < 2) | (y_norm == 0)] = np.nan
    return corr


def noise_variance(query_vecs: np.ndarray, importance: np.ndarray) -> np.ndarray:
    """RDIME's plug-in noise variance ``eps2 = mean_j(q_j^2 - u_j)`` (n,), since ``E[q_j^2] = theta_j^2 + eps^2``
    (paper, Corollary 1); can be <= 0."""
    return np.mean(query_vecs * query_vecs - importance, axis=1)


def rdime_threshold(query_vecs: np.ndarray, importance: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """RDIME's kept set ``u_j > eps2`` (strict): ``(keep (n, p) bool, eps2 (n,))``; a row may keep nothing."""
    eps2 = noise_variance(query_vecs, importance)
    return importance > eps2[:, None], eps2


def topk_count(dims: int, *, fraction: Optional[float] = None, count: Optional[int] = None) -> int:
    """Dimensions Top-k keeps out of ``dims``: ``round(fraction * dims)`` (at least 1) or ``min(count, dims)``."""
    check_topk('topk_count', fraction, count)
    if count is not None:
        return int(min(count, dims))
    return int(max(1, min(dims, round(fraction * dims))))


def topk_threshold(importance: np.ndarray, count: int) -> np.ndarray:
    """Top-k: keep the ``count`` dimensions of largest importance per query; among ties the lower index wins."""
    return keep_counts(importance, np.full(len(importance), count))


MODULATOR_NAMES = ('hard', 'james-stein', 'wiener')


def modulator_weights(theta2: np.ndarray, eps2: np.ndarray, modulator: str) -> np.ndarray:
    """Weights ``f`` (n, p) in [0, 1] of a modulation estimator ``theta_hat = f * q`` (Beran 1998) from ``theta^2``
    (n, p) and ``eps^2`` (n,), true or estimated; the risks are in pt_docs/theory.rst.

    - ``'hard'``: ``f_j = 1{theta_j^2 > eps^2}``, the best 0/1 weights (paper, Theorem 1; RDIME).
    - ``'james-stein'``: ``f_j = (theta_j^2 - eps^2) / theta_j^2`` on the hard set, 0 elsewhere.
    - ``'wiener'``: ``f_j = theta_j^2+ / (theta_j^2+ + eps^2)``, the risk minimiser; keeps every ``theta_j^2 > 0``.

    The soft modulators read an ``eps^2 <= 0`` as no noise (James-Stein is then hard, Wiener 1 on every
    ``theta_j^2 > 0``); the hard set stays ``theta_j^2 > eps^2``. A row may keep nothing.
    """
    check_choice('modulator_weights', 'modulator', modulator, MODULATOR_NAMES)
    theta2 = np.asarray(theta2, dtype=np.float64)
    eps2 = np.asarray(eps2, dtype=np.float64)[:, None]
    if modulator == 'wiener':
        signal = np.maximum(theta2, 0.0)
        denom = signal + np.maximum(eps2, 0.0)
        return np.divide(signal, denom, out=np.zeros_like(signal), where=denom > 0)
    keep = theta2 > eps2
    if modulator == 'hard':
        return keep.astype(np.float64)
    shrink = np.divide(theta2 - eps2, theta2, out=np.ones_like(theta2), where=keep & (eps2 > 0))
    return np.where(keep, shrink, 0.0)


def modulation_weights(query_vecs: np.ndarray, importance: np.ndarray, modulator: str = 'hard'
                       ) -> Tuple[np.ndarray, np.ndarray]:
    """:func:`modulator_weights` with RDIME's plug-in estimates ``u`` (unbiased for ``theta^2``: Theorem 2) and
    :func:`noise_variance`: ``(weights (n, p), eps2 (n,) unclipped)``."""
    eps2 = noise_variance(query_vecs, importance)
    return modulator_weights(importance, eps2, modulator), eps2


def modulate(query_vecs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The modulated (or, for a 0/1 mask, pruned) query ``f * q``; exactly 0 (never -0) where ``f = 0``."""
    return np.where(weights != 0, weights * query_vecs, 0.0)


def score_mass_threshold(importance: np.ndarray, mass: float) -> np.ndarray:
    """Score mass: keep the most important dimensions (ties: lower index) until their share of the positive mass
    ``sum_j max(u_j, 0)`` reaches ``mass`` in (0, 1], with a relative tolerance of 1e-9 (so 7/10 reaches 0.7).
    Returns ``keep`` (n, p) bool; no positive importance keeps nothing."""
    importance = np.asarray(importance, dtype=np.float64)
    order = np.argsort(-importance, axis=1, kind='stable')
    positive = np.maximum(np.take_along_axis(importance, order, axis=1), 0.0)
    total = positive.sum(axis=1, keepdims=True)
    before = np.cumsum(positive, axis=1) - positive  # the mass ranked above each dimension
    kept_sorted = (before < mass * total * (1 - 1e-9)) & (positive > 0)
    return np.take_along_axis(kept_sorted, np.argsort(order, axis=1), axis=1)  # back to dimension order


def keep_counts(order_key: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Keep the ``counts[i]`` dimensions of largest ``order_key[i]`` (or one shared ``(p,)`` key) per row; ties:
    lower index."""
    counts = np.asarray(counts, dtype=np.int64)
    order_key = np.broadcast_to(np.asarray(order_key, dtype=np.float64), (len(counts), np.shape(order_key)[-1]))
    ranks = np.argsort(np.argsort(-order_key, axis=1, kind='stable'), axis=1)  # a permutation's argsort inverts it
    return ranks < counts[:, None]


def query_rng(seed: int, key: str) -> np.random.Generator:
    """A generator fixed by ``seed`` and a query's ``key`` (a SHA-256, not the salted ``hash``): the same draws in
    every process, whatever the batch."""
    digest = hashlib.sha256(str(key).encode('utf-8')).digest()
    return np.random.default_rng(np.random.SeedSequence([int(seed), int.from_bytes(digest[:8], 'little')]))


def random_ranks(seeds: Iterable[Tuple[int, str]], dims: int) -> np.ndarray:
    """Per ``(seed, key)``, the rank of each dimension (n, p) in a uniform random order: ranks below ``k`` are a
    uniform draw of ``k`` dimensions, nested in ``k``."""
    perms = [query_rng(seed, key).permutation(dims) for seed, key in seeds]
    return np.argsort(np.array(perms, dtype=np.int64).reshape(len(perms), dims), axis=1)  # the inverse permutations


def column_variance(blocks: Iterable[np.ndarray]) -> Tuple[np.ndarray, int]:
    """``(variance (p,), rows)``: each column's population variance over the ``(rows, p)`` blocks, in one pass
    (Chan et al.'s pairwise update, stable where ``E[x^2] - E[x]^2`` cancels)."""
    count, mean, m2 = 0, 0.0, 0.0  # the first block's update gives its own mean and m2, exactly
    for block in blocks:
        block = np.asarray(block, dtype=np.float64)
        if not len(block):
            continue
        b_count, b_mean = len(block), block.mean(axis=0)
        b_m2 = ((block - b_mean) ** 2).sum(axis=0)
        total = count + b_count
        delta = b_mean - mean
        mean = mean + delta * (b_count / total)
        m2 = m2 + b_m2 + delta ** 2 * (count * b_count / total)
        count = total
    return (m2 / count, count) if count else (np.zeros(0), 0)
