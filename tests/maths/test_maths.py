"""Hand-computed checks of the pure numpy maths: kernels, Kernel DIME, RDIME, Top-k, Eclipse, Oracle, Magnitude.

Every expected number here is worked out by hand (or with ``math``/``numpy`` primitives that do not touch the
package), never by calling the package a second time.
"""
import math

import numpy as np
import pytest

from pyterrier_rdime import maths

Q = [1.0, 2.0, 3.0, 4.0]
D1 = [0.9, 2.1, 2.8, 0.1]
D2 = [1.0, 0.0, 1.0, 3.0]


def arr(x):
    return np.asarray(x, dtype=np.float64)


def weights(kernel, q, docs, mask=None, **kw):
    """kernel_weights for a batch given as nested lists (q: (n, p), docs: (n, m, p))."""
    q, docs = arr(q), arr(docs)
    if mask is None:
        mask = np.ones(docs.shape[:2], dtype=bool)
    return maths.kernel_weights(kernel, q, docs, np.asarray(mask, dtype=bool), **kw)


# ----------------------------------------------------------------------------------------------------------------
# The four worked examples of REFERENCE.md
# ----------------------------------------------------------------------------------------------------------------

def test_worked_example_1():
    u = maths.kernel_dime(arr([Q]), arr([[D1]]), arr([[1.0]]))
    np.testing.assert_allclose(u, [[0.9, 4.2, 8.4, 0.4]], rtol=0, atol=1e-12)
    keep, eps2 = maths.rdime_threshold(arr([Q]), u)
    np.testing.assert_allclose(eps2, [4.025], rtol=0, atol=1e-12)
    assert keep.dtype == bool
    assert keep.tolist() == [[False, True, True, False]]  # S = {1, 2}


def test_worked_example_2_keeps_nothing():
    u = maths.kernel_dime(arr([Q]), arr([[[0.5, 0.1, 1.0, -1.0]]]), arr([[1.0]]))
    np.testing.assert_allclose(u, [[0.5, 0.2, 3.0, -4.0]], rtol=0, atol=1e-12)
    keep, eps2 = maths.rdime_threshold(arr([Q]), u)
    np.testing.assert_allclose(eps2, [7.575], rtol=0, atol=1e-12)
    assert keep.tolist() == [[False, False, False, False]]  # S is empty: no clipping, no minimum size


def test_worked_example_3_prf():
    w = weights('uniform', [Q], [[D1, D2]])
    np.testing.assert_allclose(w, [[0.5, 0.5]])
    u = maths.kernel_dime(arr([Q]), arr([[D1, D2]]), w)
    np.testing.assert_allclose(u, [[0.95, 2.1, 5.7, 6.2]], rtol=0, atol=1e-12)
    keep, eps2 = maths.rdime_threshold(arr([Q]), u)
    np.testing.assert_allclose(eps2, [3.7625], rtol=0, atol=1e-12)
    assert keep.tolist() == [[False, False, True, True]]  # S = {2, 3}


def test_worked_example_4_swc():
    w = weights('softmax', [Q], [[D1, D2]], tau=0.1)
    # q.d = [13.9, 16.0]; softmax(./0.1) = [1 / (1 + e^21), e^21 / (1 + e^21)]
    small = math.exp(-21.0) / (1.0 + math.exp(-21.0))
    assert w[0, 0] == pytest.approx(small, rel=1e-6)
    assert w[0, 0] == pytest.approx(7.6e-10, rel=0.01)
    assert w[0, 1] == pytest.approx(1.0, abs=1e-9)
    u = maths.kernel_dime(arr([Q]), arr([[D1, D2]]), w)
    np.testing.assert_allclose(u, [[1.0, 0.0, 3.0, 12.0]], rtol=0, atol=1e-7)
    keep, eps2 = maths.rdime_threshold(arr([Q]), u)
    np.testing.assert_allclose(eps2, [3.5], rtol=0, atol=1e-7)
    assert keep.tolist() == [[False, False, False, True]]  # S = {3}


def test_worked_examples_1_to_3_batched_with_padding():
    """Three queries in one batch, the single-document ones padded to two slots with a garbage vector."""
    garbage = [1e6, -1e6, 1e6, -1e6]
    docs = [[D1, garbage], [[0.5, 0.1, 1.0, -1.0], garbage], [D1, D2]]
    mask = [[True, False], [True, False], [True, True]]
    w = weights('uniform', [Q, Q, Q], docs, mask)
    np.testing.assert_allclose(w, [[1.0, 0.0], [1.0, 0.0], [0.5, 0.5]])
    u = maths.kernel_dime(arr([Q, Q, Q]), arr(docs), w)
    np.testing.assert_allclose(u, [[0.9, 4.2, 8.4, 0.4], [0.5, 0.2, 3.0, -4.0], [0.95, 2.1, 5.7, 6.2]], atol=1e-9)
    keep, eps2 = maths.rdime_threshold(arr([Q, Q, Q]), u)
    np.testing.assert_allclose(eps2, [4.025, 7.575, 3.7625], atol=1e-9)
    assert keep.tolist() == [[False, True, True, False], [False] * 4, [False, False, True, True]]


# ----------------------------------------------------------------------------------------------------------------
# RDIME threshold details
# ----------------------------------------------------------------------------------------------------------------

def test_rdime_threshold_is_strict():
    # eps2 = mean(1 - 0.5) = 0.5 exactly and every u_j = 0.5: nothing is strictly above
    keep, eps2 = maths.rdime_threshold(arr([[1.0, 1.0, 1.0, 1.0]]), arr([[0.5, 0.5, 0.5, 0.5]]))
    assert eps2.tolist() == [0.5]
    assert keep.tolist() == [[False, False, False, False]]


def test_rdime_threshold_does_not_clip_a_negative_noise_estimate():
    # eps2 = mean([1 - 3, 1 - 0]) = -0.5: not clipped to 0, so u = 0 is kept
    keep, eps2 = maths.rdime_threshold(arr([[1.0, 1.0]]), arr([[3.0, 0.0]]))
    assert eps2.tolist() == [-0.5]
    assert keep.tolist() == [[True, True]]


def test_rdime_threshold_per_query():
    q = arr([[2.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    u = arr([[2.0, 0.5, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    keep, eps2 = maths.rdime_threshold(q, u)
    # query 0: mean([4 - 2, -0.5, 0, 0]) = 0.375; query 1: mean([0, 0, 1, 1]) = 0.5
    np.testing.assert_allclose(eps2, [0.375, 0.5])
    assert keep.tolist() == [[True, True, False, False], [True, True, False, False]]


def test_a_mask_prunes_dropped_dimensions():
    out = maths.modulate(arr([[1.0, -2.0, 3.0]]), np.array([[True, False, True]]))
    assert out.tolist() == [[1.0, 0.0, 3.0]]


def test_magnitude_dime():
    np.testing.assert_array_equal(maths.magnitude_dime(arr([[1.0, -2.0, 3.0], [0.5, 0.0, -1.0]])),
                                  [[1.0, 4.0, 9.0], [0.25, 0.0, 1.0]])


def test_kernel_dime_weighted_sum():
    # sum_i w_i d_i = 0.25 * [1, 1] + 0.75 * [3, 1] = [2.5, 1]; u = [1, 2] * [2.5, 1]
    u = maths.kernel_dime(arr([[1.0, 2.0]]), arr([[[1.0, 1.0], [3.0, 1.0]]]), arr([[0.25, 0.75]]))
    np.testing.assert_allclose(u, [[2.5, 2.0]])


# ----------------------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------------------

# q = [1, 0]; d_1 = [1, 0] (q.d = 1, ||q - d||^2 = 0); d_2 = [0, 1] (q.d = 0, ||q - d||^2 = 2)
KQ = [[1.0, 0.0]]
KD = [[[1.0, 0.0], [0.0, 1.0]]]
E = math.e


def test_uniform_kernel():
    np.testing.assert_allclose(weights('uniform', KQ, KD), [[0.5, 0.5]])
    np.testing.assert_allclose(weights('uniform', [[1, 0]], [[[1, 0], [0, 1], [5, 5], [9, 9]]]), [[0.25] * 4])


def test_softmax_kernel():
    np.testing.assert_allclose(weights('softmax', KQ, KD, tau=1.0), [[E / (1 + E), 1 / (1 + E)]], rtol=1e-12)
    np.testing.assert_allclose(weights('softmax', KQ, KD, tau=1.0), [[0.7310585786300049, 0.2689414213699951]])
    # tau = 0.5 doubles the scores: e^2 / (1 + e^2)
    np.testing.assert_allclose(weights('softmax', KQ, KD, tau=0.5), [[0.8807970779778823, 0.11920292202211755]])


def test_rbf_kernel():
    # K = exp(-||q - d||^2 / tau) = [1, e^-2] for tau = 1, [1, e^-1] for tau = 2
    np.testing.assert_allclose(weights('rbf', KQ, KD, tau=1.0), [[1 / (1 + E ** -2), E ** -2 / (1 + E ** -2)]])
    np.testing.assert_allclose(weights('rbf', KQ, KD, tau=2.0), [[0.7310585786300049, 0.2689414213699951]])


def test_sigmoid_kernel():
    s1 = 1 / (1 + math.exp(-1.0))  # sigmoid(1); sigmoid(0) = 0.5
    np.testing.assert_allclose(weights('sigmoid', KQ, KD, tau=1.0), [[s1 / (s1 + 0.5), 0.5 / (s1 + 0.5)]])
    s2 = 1 / (1 + math.exp(-2.0))  # tau = 0.5
    np.testing.assert_allclose(weights('sigmoid', KQ, KD, tau=0.5), [[s2 / (s2 + 0.5), 0.5 / (s2 + 0.5)]])


def test_rank_kernel_is_inverse_rank():
    docs = [[[1, 0], [0, 1], [3, 3]]]
    np.testing.assert_allclose(weights('rank', KQ, docs), [[6 / 11, 3 / 11, 2 / 11]])  # [1, 1/2, 1/3] / (11/6)
    np.testing.assert_allclose(weights('rank', KQ, docs, [[True, True, False]]), [[2 / 3, 1 / 3, 0.0]])
    # the rank weights ignore the vectors entirely
    np.testing.assert_allclose(weights('rank', [[5, -5]], [[[9, 9], [-9, 1], [0, 0]]]), [[6 / 11, 3 / 11, 2 / 11]])


def test_callable_kernel():
    seen = {}

    def kernel(query_vecs, doc_vecs):
        seen['shapes'] = (query_vecs.shape, doc_vecs.shape)
        return np.array([[1.0, 3.0, 100.0], [2.0, 2.0, 4.0]])

    w = weights(kernel, [[1, 0], [0, 1]], [[[1, 0], [0, 1], [1, 1]]] * 2, [[True, True, False], [True, True, True]])
    assert seen['shapes'] == ((2, 2), (2, 3, 2))
    np.testing.assert_allclose(w, [[0.25, 0.75, 0.0], [0.25, 0.25, 0.5]])


@pytest.mark.parametrize('bad', [np.array([[1.0, -1.0]]), np.array([[1.0, np.nan]]), np.array([[1.0, np.inf]]),
                                 np.array([[1.0, 1.0, 1.0]]), np.array([1.0, 1.0])])
def test_callable_kernel_bad_output_is_an_error(bad):
    with pytest.raises(ValueError, match='kernel'):
        weights(lambda q, d: bad, KQ, KD)


def test_unknown_kernel_name():
    with pytest.raises(ValueError, match="kernel_weights: kernel must be one of .*, got 'cosine'"):
        weights('cosine', KQ, KD)


@pytest.mark.parametrize('kernel', ['uniform', 'softmax', 'rbf', 'sigmoid', 'rank', lambda q, d: np.ones(d.shape[:2])])
def test_masked_slots_get_zero_weight(kernel):
    # the padded slot holds a vector that would dominate every similarity kernel if it were not masked
    q = [[1.0, 0.0], [1.0, 0.0]]
    docs = [[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]]
    mask = [[True, False, True], [False, True, False]]
    w = weights(kernel, q, docs, mask, tau=0.01)
    assert w[0, 1] == 0.0 and w[1, 0] == 0.0 and w[1, 2] == 0.0
    np.testing.assert_allclose(w.sum(axis=1), [1.0, 1.0])
    if kernel == 'rank':  # slots 0 and 2 are ranks 1 and 3: weights 1 and 1/3, normalised
        np.testing.assert_allclose(w[0, [0, 2]], [0.75, 0.25])
    else:  # two identical documents share the weight
        np.testing.assert_allclose(w[0, [0, 2]], [0.5, 0.5])
    assert w[1, 1] == 1.0


@pytest.mark.parametrize('kernel', ['uniform', 'softmax', 'rbf', 'sigmoid', 'rank', lambda q, d: np.ones(d.shape[:2])])
def test_query_without_feedback_gets_zero_weights(kernel):
    with np.errstate(over='raise', invalid='raise'):
        w = weights(kernel, [[1.0, 0.0], [1.0, 0.0]], [[[1.0, 0.0], [0.0, 1.0]]] * 2, [[False, False], [True, True]])
    assert np.isfinite(w).all()
    assert w[0].tolist() == [0.0, 0.0]
    np.testing.assert_allclose(w[1].sum(), 1.0)


def test_softmax_with_tiny_tau_does_not_overflow():
    with np.errstate(over='raise', invalid='raise'):
        w = weights('softmax', [Q], [[D1, D2]], tau=1e-8)  # scores / tau ~ 1.6e9: exp would overflow naively
        w_big = weights('softmax', [[1e3, 1e3]], [[[1e3, 1e3], [1e3, 999.0]]], tau=1e-6)
    assert np.isfinite(w).all() and np.isfinite(w_big).all()
    np.testing.assert_allclose(w, [[0.0, 1.0]], atol=1e-300)
    np.testing.assert_allclose(w_big, [[1.0, 0.0]], atol=1e-300)


def test_sigmoid_and_rbf_with_tiny_tau_stay_finite():
    with np.errstate(over='raise', invalid='raise'):
        ws = weights('sigmoid', [[1.0, 0.0]], [[[-1.0, 0.0], [-2.0, 0.0]]], tau=1e-6)
        wr = weights('rbf', [[0.0, 0.0]], [[[1.0, 0.0], [2.0, 0.0]]], tau=1e-6)
    # sigmoid(-1e6) / sigmoid(-2e6) = e^1e6: the closer document takes all the weight; same for rbf
    np.testing.assert_allclose(ws, [[1.0, 0.0]], atol=1e-300)
    np.testing.assert_allclose(wr, [[1.0, 0.0]], atol=1e-300)


def test_kernel_weights_with_no_slots():
    w = maths.kernel_weights('softmax', np.ones((2, 3)), np.zeros((2, 0, 3)), np.zeros((2, 0), dtype=bool))
    assert w.shape == (2, 0)


# ----------------------------------------------------------------------------------------------------------------
# Top-k
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('kwargs, dims, expected', [
    ({'fraction': 0.4}, 768, 307), ({'fraction': 0.6}, 768, 461), ({'fraction': 0.8}, 768, 614),  # the paper's
    ({'fraction': 0.5}, 4, 2), ({'fraction': 0.6}, 4, 2), ({'fraction': 0.7}, 4, 3), ({'fraction': 1.0}, 4, 4),
    ({'fraction': 0.01}, 4, 1), ({'fraction': 1e-9}, 768, 1),  # at least one
    ({'count': 1}, 4, 1), ({'count': 3}, 4, 3), ({'count': 10}, 4, 4), ({'count': np.int64(2)}, 4, 2),  # capped
])
def test_topk_count(kwargs, dims, expected):
    count = maths.topk_count(dims, **kwargs)
    assert count == expected
    assert type(count) is int


@pytest.mark.parametrize('kwargs', [{}, {'fraction': 0.5, 'count': 2}, {'fraction': 0.0}, {'fraction': 1.5},
                                    {'count': 0}])
def test_topk_count_needs_one_valid_size(kwargs):
    with pytest.raises(ValueError, match='topk_count'):
        maths.topk_count(4, **kwargs)


def test_noise_variance_is_the_one_eps2_of_rdime_and_the_modulators():
    q, u = arr([[1, 2, 3, 4]]), arr([[0.95, 2.1, 5.7, 6.2]])  # worked example 3
    eps2 = maths.noise_variance(q, u)
    np.testing.assert_allclose(eps2, [(30 - 14.95) / 4])  # mean(q^2) = 30 / 4, mean(u) = 14.95 / 4
    np.testing.assert_array_equal(maths.rdime_threshold(q, u)[1], eps2)
    for modulator in maths.MODULATOR_NAMES:
        np.testing.assert_array_equal(maths.modulation_weights(q, u, modulator)[1], eps2)


def test_topk_threshold_largest_first():
    keep = maths.topk_threshold(arr([[0.9, 4.2, 8.4, 0.4], [4.0, 3.0, 2.0, 1.0]]), 2)
    assert keep.dtype == bool
    assert keep.tolist() == [[False, True, True, False], [True, True, False, False]]


def test_topk_threshold_ties_lower_index_wins():
    u = arr([[3.0, 1.0, 3.0, 2.0], [1.0, 1.0, 1.0, 1.0], [-1.0, 5.0, -1.0, -1.0]])
    assert maths.topk_threshold(u, 1).tolist() == [[True, False, False, False], [True, False, False, False],
                                                   [False, True, False, False]]
    assert maths.topk_threshold(u, 2).tolist() == [[True, False, True, False], [True, True, False, False],
                                                   [True, True, False, False]]
    assert maths.topk_threshold(u, 3).tolist() == [[True, False, True, True], [True, True, True, False],
                                                   [True, True, True, False]]


def test_topk_threshold_count_equal_to_dims_keeps_all():
    assert maths.topk_threshold(arr([[1.0, -1.0, 0.0]]), 3).tolist() == [[True, True, True]]


# ----------------------------------------------------------------------------------------------------------------
# Eclipse and Oracle
# ----------------------------------------------------------------------------------------------------------------

def test_eclipse_dime_hand_computed():
    q = arr([[1.0, 2.0]])
    pos, pos_mask = arr([[[1.0, 1.0], [3.0, 1.0]]]), np.array([[True, True]])
    neg, neg_mask = arr([[[0.0, 4.0], [2.0, 0.0], [9.0, 9.0]]]), np.array([[True, True, False]])
    # mean(pos) = [2, 1] -> q * . = [2, 2]; mean(neg) = [1, 2] -> q * . = [1, 4]
    np.testing.assert_allclose(maths.eclipse_dime(q, pos, pos_mask, neg, neg_mask), [[1.5, 0.0]])  # 1*[2,2]-.5*[1,4]
    np.testing.assert_allclose(maths.eclipse_dime(q, pos, pos_mask, neg, neg_mask, alpha=2.0, beta=1.0), [[3.0, 0.0]])
    np.testing.assert_allclose(maths.eclipse_dime(q, pos, pos_mask, neg, neg_mask, alpha=1.0, beta=0.0), [[2.0, 2.0]])
    # no negatives at all: only the positive term
    no_neg = np.array([[False, False, False]])
    np.testing.assert_allclose(maths.eclipse_dime(q, pos, pos_mask, neg, no_neg), [[2.0, 2.0]])


def test_oracle_dime_hand_computed():
    # query 0: q = [1, 2]; judged docs [1, 0] (rel), [0, 1] (non-rel), [1, 1] (rel); a 4th padded slot.
    #   x = q * d: dim 0 = [1, 0, 1] equals the labels -> r = 1
    #   dim 1 = [0, 2, 2]: xc = [-4/3, 2/3, 2/3], yc = [1/3, -2/3, 1/3], cov = -2/3, |xc||yc| = 4/3 -> r = -0.5
    # query 1: constant labels -> NaN row
    # query 2: a single judged document -> NaN row
    # query 3: q = [1, 0] so q_1 * d_1 is constant -> 0 for that dimension
    docs = arr([
        [[1, 0], [0, 1], [1, 1], [7, 7]],
        [[1, 0], [0, 1], [1, 1], [0, 0]],
        [[1, 0], [0, 1], [1, 1], [0, 0]],
        [[1, 5], [0, 1], [1, 2], [0, 0]],
    ])
    labels = arr([[1, 0, 1, 0], [2, 2, 2, 0], [1, 0, 0, 0], [1, 0, 1, 0]])
    mask = np.array([[True, True, True, False], [True, True, True, False], [True, False, False, False],
                     [True, True, True, False]])
    u = maths.oracle_dime(arr([[1, 2], [1, 2], [1, 2], [1, 0]]), docs, labels, mask)
    np.testing.assert_allclose(u[0], [1.0, -0.5], atol=1e-12)
    assert np.isnan(u[1]).all()
    assert np.isnan(u[2]).all()
    np.testing.assert_allclose(u[3], [1.0, 0.0], atol=1e-12)


def test_oracle_dime_matches_numpy_pearson():
    rng = np.random.default_rng(7)
    q = rng.normal(size=(1, 5))
    docs = rng.normal(size=(1, 9, 5))
    labels = rng.integers(0, 3, size=(1, 9)).astype(float)
    labels[0, :2] = [0, 2]  # not constant
    mask = np.ones((1, 9), dtype=bool)
    mask[0, 7:] = False
    u = maths.oracle_dime(q, docs, labels, mask)
    x = q[0] * docs[0, :7]
    expected = [np.corrcoef(labels[0, :7], x[:, j])[0, 1] for j in range(5)]
    np.testing.assert_allclose(u[0], expected, atol=1e-12)
