"""Seeded simulations of the paper's generative model, checked against its theorems.

Model (paper, Section 3): q = theta + eps * z and d_i = theta + sigma_i * z_i with z, z_i ~ N(0, I_p) independent.
Replicates are stacked as a batch of queries, so one call of the package's maths handles all of them.

- Theorem 2: uniform Kernel DIME is unbiased for theta^2 (and so is any kernel with deterministic weights).
- Theorem 1 / Corollary 1: the hard threshold S* = {i : theta_i^2 > eps^2} minimises the l2 risk, and the RDIME
  set {u_i > eps_hat^2} estimates it.
- Appendix: MSE(u_j) = (theta_j^2 + eps^2) sum_i sigma_i^2 w_i^2 + eps^2 theta_j^2, minimised by w_i ∝ 1/sigma_i^2.
"""
import itertools

import numpy as np
import pytest

from pyterrier_rdime import maths

Z = 4.0  # tolerance of the mean checks, in standard errors


def simulate(rng, theta, eps, sigmas, reps):
    """(q (reps, p), d (reps, m, p), mask (reps, m)) drawn from the paper's model."""
    theta = np.asarray(theta, dtype=np.float64)
    sigmas = np.asarray(sigmas, dtype=np.float64)
    q = theta + eps * rng.standard_normal((reps, theta.size))
    d = theta + sigmas[None, :, None] * rng.standard_normal((reps, sigmas.size, theta.size))
    return q, d, np.ones((reps, sigmas.size), dtype=bool)


def kernel_dime(kernel, q, d, mask):
    return maths.kernel_dime(q, d, maths.kernel_weights(kernel, q, d, mask))


def mean_matches(samples, target, z=Z):
    """Per coordinate: is the sample mean within z standard errors (from the sample variance) of the target?"""
    samples = np.asarray(samples, dtype=np.float64)
    se = samples.std(axis=0, ddof=1) / np.sqrt(samples.shape[0])
    return np.abs(samples.mean(axis=0) - target) <= z * se


THETA = np.array([1.5, -1.0, 0.7, 0.3, -0.2, 0.0])


# ----------------------------------------------------------------------------------------------------------------
# Theorem 2: unbiasedness
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('sigmas', [[0.5, 0.5], [0.3, 0.6, 0.9, 1.2, 1.5]], ids=['prf2-homoskedastic', 'hetero'])
def test_uniform_kernel_dime_is_unbiased_for_theta_squared(sigmas):
    rng = np.random.default_rng(2024)
    q, d, mask = simulate(rng, THETA, 0.5, sigmas, 20000)
    u = kernel_dime('uniform', q, d, mask)
    assert mean_matches(u, THETA ** 2).all(), (u.mean(axis=0), THETA ** 2)


def test_the_unbiasedness_check_rejects_a_biased_estimator():
    """The same check applied to q * q (mean theta^2 + eps^2) fails on every coordinate: the check has power."""
    rng = np.random.default_rng(2024)
    eps = 0.5
    q, d, mask = simulate(rng, THETA, eps, [0.5, 0.5], 20000)
    magnitude = maths.magnitude_dime(q)
    assert not mean_matches(magnitude, THETA ** 2).any()
    assert mean_matches(magnitude, THETA ** 2 + eps ** 2).all()  # it is unbiased for theta^2 + eps^2 instead


def test_deterministic_rank_weights_are_unbiased_too():
    """The proof of Theorem 2 only uses E[d_i] = theta and independence: any fixed weights (here 1/rank) work."""
    rng = np.random.default_rng(11)
    sigmas = 0.5 * np.sqrt(np.arange(1, 9))
    q, d, mask = simulate(rng, THETA, 0.5, sigmas, 20000)
    assert mean_matches(kernel_dime('rank', q, d, mask), THETA ** 2).all()


def test_rdime_noise_estimate_is_unbiased_for_eps_squared():
    """E[q_j^2 - u_j] = theta_j^2 + eps^2 - theta_j^2, so eps_hat^2 = mean_j(q_j^2 - u_j) is unbiased for eps^2."""
    rng = np.random.default_rng(5)
    theta = rng.normal(size=64)
    for eps in (0.2, 0.7):
        q, d, mask = simulate(rng, theta, eps, [0.4, 0.4, 0.4], 4000)
        _, eps2 = maths.rdime_threshold(q, kernel_dime('uniform', q, d, mask))
        assert mean_matches(eps2[:, None], eps ** 2).all(), (eps2.mean(), eps ** 2)


# ----------------------------------------------------------------------------------------------------------------
# Theorem 1: the hard threshold and its RDIME estimate
# ----------------------------------------------------------------------------------------------------------------

def l2_risk(q, keep, theta):
    """Empirical l2 risk E||q * 1_S - theta||^2 over the replicates."""
    return np.mean(np.sum((maths.modulate(q, keep) - theta) ** 2, axis=1))


def test_oracle_hard_threshold_minimises_l2_risk_over_all_subsets():
    theta = np.array([2.0, -1.3, 0.9, 0.6, -0.4, 0.1])
    eps = 0.75  # theta^2 = [4, 1.69, .81, .36, .16, .01] vs eps^2 = .5625: S* = {0, 1, 2}
    s_star = theta ** 2 > eps ** 2
    rng = np.random.default_rng(3)
    q = theta + eps * rng.standard_normal((20000, theta.size))
    risks = {}
    for subset in itertools.product([False, True], repeat=theta.size):
        keep = np.broadcast_to(np.array(subset), q.shape)
        risks[subset] = l2_risk(q, keep, theta)
    best = min(risks, key=risks.get)
    assert list(best) == s_star.tolist()
    # and the empirical risk of S* matches the proof's |S| eps^2 + sum_{i not in S} theta_i^2
    expected = s_star.sum() * eps ** 2 + np.sum(theta[~s_star] ** 2)
    assert risks[tuple(s_star)] == pytest.approx(expected, rel=0.03)


def test_rdime_set_converges_to_oracle_set_as_noise_vanishes():
    """With many low-noise feedback documents, the RDIME set approaches S* = {theta_i^2 > eps^2} as eps shrinks
    (in the regime eps * sqrt(p) >> rms(theta), where eps_hat^2 is accurate)."""
    rng = np.random.default_rng(42)
    p, reps, m, sigma = 512, 40, 100, 0.1
    theta = rng.normal(size=p) * (rng.random(p) < 0.5)  # half the dimensions carry no signal
    accuracy, jaccard = [], []
    for eps in (0.8, 0.4, 0.2, 0.1):
        q, d, mask = simulate(rng, theta, eps, [sigma] * m, reps)
        keep, _ = maths.rdime_threshold(q, kernel_dime('uniform', q, d, mask))
        s_star = theta ** 2 > eps ** 2
        accuracy.append(np.mean(keep == s_star))
        jaccard.append(np.mean((keep & s_star).sum(axis=1) / (keep | s_star).sum(axis=1)))
    assert np.all(np.diff(accuracy) > 0), accuracy
    assert np.all(np.diff(jaccard) > 0), jaccard
    assert accuracy[-1] > 0.95 and jaccard[-1] > 0.95, (accuracy, jaccard)


def test_more_feedback_documents_give_a_better_rdime_set():
    rng = np.random.default_rng(8)
    p, reps, eps = 512, 40, 0.2
    theta = rng.normal(size=p) * (rng.random(p) < 0.5)
    s_star = theta ** 2 > eps ** 2
    accuracy = []
    for m, sigma in ((1, 1.0), (10, 0.5), (100, 0.1)):
        q, d, mask = simulate(rng, theta, eps, [sigma] * m, reps)
        keep, _ = maths.rdime_threshold(q, kernel_dime('uniform', q, d, mask))
        accuracy.append(np.mean(keep == s_star))
    assert np.all(np.diff(accuracy) > 0), accuracy


def test_hard_threshold_beats_keeping_everything_and_topk_with_a_wrong_k():
    rng = np.random.default_rng(13)
    p, reps, m, sigma, eps = 256, 100, 20, 0.2, 0.3
    theta = rng.normal(size=p) * (rng.random(p) < 0.4)
    s_star = theta ** 2 > eps ** 2
    q, d, mask = simulate(rng, theta, eps, [sigma] * m, reps)
    u = kernel_dime('uniform', q, d, mask)
    rdime_keep, _ = maths.rdime_threshold(q, u)

    risk = {
        'oracle': l2_risk(q, np.broadcast_to(s_star, q.shape), theta),
        'rdime': l2_risk(q, rdime_keep, theta),
        'full': l2_risk(q, np.ones_like(rdime_keep), theta),
    }
    for k in (0.1, 0.9):  # S* holds about a third of the dimensions
        risk[f'top{k}'] = l2_risk(q, maths.topk_threshold(u, maths.topk_count(p, fraction=k)), theta)
    for worse in ('full', 'top0.1', 'top0.9'):
        assert risk['oracle'] < risk[worse], risk
        assert risk['rdime'] < risk[worse], risk
    assert risk['rdime'] < 1.15 * risk['oracle'], risk
    # the oracle risk is |S*| eps^2 + sum of the dropped theta_i^2
    assert risk['oracle'] == pytest.approx(s_star.sum() * eps ** 2 + np.sum(theta[~s_star] ** 2), rel=0.05)


# ----------------------------------------------------------------------------------------------------------------
# Appendix: MSE under heteroskedastic noise and inverse-variance weights
# ----------------------------------------------------------------------------------------------------------------

EPS = 0.5
M = 8
SIGMAS = 0.5 * np.sqrt(np.arange(1, M + 1))  # sigma_i^2 = 0.25 * rank: noise variance grows linearly with rank


def closed_form_mse(w):
    return (THETA ** 2 + EPS ** 2) * np.sum(SIGMAS ** 2 * w ** 2) + EPS ** 2 * THETA ** 2


@pytest.fixture(scope='module')
def hetero_sample():
    rng = np.random.default_rng(99)
    return simulate(rng, THETA, EPS, SIGMAS, 40000)


def inverse_variance_kernel(query_vecs, doc_vecs):
    return np.broadcast_to(1.0 / SIGMAS ** 2, doc_vecs.shape[:2])


@pytest.mark.parametrize('kernel, hand_weights', [
    ('uniform', np.full(M, 1 / M)),
    ('rank', (1 / np.arange(1, M + 1)) / np.sum(1 / np.arange(1, M + 1))),
    (inverse_variance_kernel, (1 / SIGMAS ** 2) / np.sum(1 / SIGMAS ** 2)),
], ids=['uniform', 'rank', 'callable-inverse-variance'])
def test_empirical_mse_matches_closed_form(hetero_sample, kernel, hand_weights):
    q, d, mask = hetero_sample
    w = maths.kernel_weights(kernel, q, d, mask)
    np.testing.assert_allclose(w, np.broadcast_to(hand_weights, w.shape), rtol=1e-12)
    sq_err = (maths.kernel_dime(q, d, w) - THETA ** 2) ** 2
    expected = closed_form_mse(hand_weights)
    assert mean_matches(sq_err, expected).all(), (sq_err.mean(axis=0), expected)
    np.testing.assert_allclose(sq_err.mean(axis=0), expected, rtol=0.06)


def test_inverse_variance_weights_beat_uniform(hetero_sample):
    q, d, mask = hetero_sample
    err_uniform = (kernel_dime('uniform', q, d, mask) - THETA ** 2) ** 2
    err_rank = (kernel_dime('rank', q, d, mask) - THETA ** 2) ** 2
    err_callable = (kernel_dime(inverse_variance_kernel, q, d, mask) - THETA ** 2) ** 2
    np.testing.assert_allclose(err_rank, err_callable, rtol=1e-9, atol=1e-12)  # 1/rank = inverse variance here
    # paired difference on the same draws: uniform minus inverse-variance is significantly positive everywhere
    diff = err_uniform - err_rank
    se = diff.std(axis=0, ddof=1) / np.sqrt(diff.shape[0])
    assert np.all(diff.mean(axis=0) > Z * se), (diff.mean(axis=0), se)


def test_inverse_variance_weights_are_the_best_fixed_weights(hetero_sample):
    """Perturbing the inverse-variance weights (on the simplex) never lowers the empirical MSE by more than noise."""
    q, d, mask = hetero_sample
    best = (1 / SIGMAS ** 2) / np.sum(1 / SIGMAS ** 2)
    base = np.mean((maths.kernel_dime(q, d, np.broadcast_to(best, mask.shape)) - THETA ** 2) ** 2, axis=0)
    rng = np.random.default_rng(0)
    for _ in range(5):
        other = np.abs(best + 0.05 * rng.normal(size=M))
        other /= other.sum()
        mse = np.mean((maths.kernel_dime(q, d, np.broadcast_to(other, mask.shape)) - THETA ** 2) ** 2, axis=0)
        assert np.sum(mse) > np.sum(base)
