"""Soft RDIME: the modulators of ``Rdime(modulator=...)`` and ``maths.modulation_weights``.

Hand-computed weights on the worked examples of REFERENCE.md, the risk ordering of the paper's model with the oracle
``theta^2`` and ``eps^2`` (provable, checked by simulation), the plug-in risks measured over seeded draws (asserted
only where a paired confidence bound excludes zero), the ``eps2 <= 0`` and empty-set rules, and the stage contract.

Model (paper, Section 3): q = theta + eps * z and d_i = theta + sigma_i * z_i, z, z_i ~ N(0, I_p) independent.
"""

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest

from pyterrier_rdime import PrfDime, Rdime, VectorScorer, maths

Z = 4.0  # width of every confidence bound below, in standard errors (two-sided level ~ 6e-5 per check)
Q = [1.0, 2.0, 3.0, 4.0]
U1 = [0.9, 4.2, 8.4, 0.4]  # worked example 1: q * [0.9, 2.1, 2.8, 0.1], eps2 = 4.025, S = {1, 2}
U2 = [0.5, 0.2, 3.0, -4.0]  # worked example 2: eps2 = 7.575, S empty


def weights(q, u, modulator):
    w, eps2 = maths.modulation_weights(np.array([q], dtype=np.float64), np.array([u], dtype=np.float64), modulator)
    return w[0], eps2[0]


def vec(values):
    return np.asarray(values, dtype=np.float32)


def frame(q=Q, u=U1, qid='q'):
    return pd.DataFrame({'qid': [qid], 'query': ['text'], 'query_vec': [vec(q)], 'query_dime': [vec(u)]})


# ----------------------------------------------------------------------------------------------------------------
# Hand-computed weights
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('modulator, expected', [
    ('hard', [0.0, 1.0, 1.0, 0.0]),
    # 1 - 4.025 / 4.2 = 0.175 / 4.2, 1 - 4.025 / 8.4 = 4.375 / 8.4
    ('james-stein', [0.0, 0.175 / 4.2, 4.375 / 8.4, 0.0]),
    ('wiener', [0.9 / 4.925, 4.2 / 8.225, 8.4 / 12.425, 0.4 / 4.425]),
])
def test_worked_example_1_weights(modulator, expected):
    w, eps2 = weights(Q, U1, modulator)
    assert eps2 == pytest.approx(4.025, abs=1e-12)
    np.testing.assert_allclose(w, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize('modulator, expected', [
    ('hard', [0.0, 0.0, 0.0, 0.0]),
    ('james-stein', [0.0, 0.0, 0.0, 0.0]),
    # Wiener keeps every u > 0 even when no u exceeds eps2 = 7.575
    ('wiener', [0.5 / 8.075, 0.2 / 7.775, 3.0 / 10.575, 0.0]),
])
def test_worked_example_2_weights(modulator, expected):
    w, eps2 = weights(Q, U2, modulator)
    assert eps2 == pytest.approx(7.575, abs=1e-12)
    np.testing.assert_allclose(w, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize('u, eps2, expected', [
    # q = [1, 2, 2]: mean q^2 = 3. u = [-0.1, 4, 6]: eps2 = 3 - 3.3 = -0.3 < 0; hard keeps u > -0.3 (all three)
    ([-0.1, 4.0, 6.0], -0.3, {'hard': [1, 1, 1], 'james-stein': [1, 1, 1], 'wiener': [0, 1, 1]}),
    # u = [0, 4, 6]: eps2 = -1/3; a zero u is kept by hard, and by James-Stein with weight 1 (no 0/0)
    ([0.0, 4.0, 6.0], -1 / 3, {'hard': [1, 1, 1], 'james-stein': [1, 1, 1], 'wiener': [0, 1, 1]}),
    # u = [1, 4, 4]: eps2 = 0 exactly; no noise, so no shrinkage
    ([1.0, 4.0, 4.0], 0.0, {'hard': [1, 1, 1], 'james-stein': [1, 1, 1], 'wiener': [1, 1, 1]}),
    # u = [0, 4.5, 4.5]: eps2 = 0 exactly; u = 0 is neither above eps2 nor a signal
    ([0.0, 4.5, 4.5], 0.0, {'hard': [0, 1, 1], 'james-stein': [0, 1, 1], 'wiener': [0, 1, 1]}),
])
@pytest.mark.parametrize('modulator', maths.MODULATOR_NAMES)
def test_non_positive_noise_estimate_means_no_shrinkage(u, eps2, expected, modulator):
    w, got_eps2 = weights([1.0, 2.0, 2.0], u, modulator)
    assert got_eps2 == pytest.approx(eps2, abs=1e-12)  # reported as estimated, not clipped
    np.testing.assert_array_equal(w, expected[modulator])


def test_james_stein_keeps_exactly_the_hard_set_and_shrinks_it():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((200, 64))
    u = q * (0.5 * q + rng.standard_normal((200, 64)))  # E[q^2 - u] = q^2 / 2: eps2 > 0 (James-Stein shrinks)
    hard, _ = maths.modulation_weights(q, u, 'hard')
    js, eps2 = maths.modulation_weights(q, u, 'james-stein')
    keep = u > eps2[:, None]  # RDIME's set, straight from its definition
    np.testing.assert_array_equal(hard, keep)
    np.testing.assert_array_equal(js != 0, keep)
    assert np.all((js[keep] > 0) & (js[keep] < 1)) and (eps2 > 0).all()


def test_james_stein_weight_of_a_dimension_just_above_the_threshold_is_not_rounded_to_zero():
    theta2 = np.array([[np.nextafter(1e8, np.inf), 2e8]])
    w = maths.modulator_weights(theta2, np.array([1e8]), 'james-stein')
    assert w[0, 0] > 0 and w[0, 1] == 0.5


def test_weights_of_a_batch_are_the_weights_of_each_query():
    w, eps2 = maths.modulation_weights(np.array([Q, Q]), np.array([U1, U2]), 'wiener')
    np.testing.assert_allclose(eps2, [4.025, 7.575], rtol=0, atol=1e-12)
    np.testing.assert_allclose(w[1], [0.5 / 8.075, 0.2 / 7.775, 3.0 / 10.575, 0.0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(w[0, 0], 0.9 / 4.925, rtol=0, atol=1e-12)


def test_modulate_writes_positive_zeros():
    out = maths.modulate(np.array([[-1.0, -2.0]]), np.array([[0.0, 0.5]]))
    assert out.tolist() == [[0.0, -1.0]] and not np.signbit(out[0, 0])


def test_unknown_modulator_in_maths():
    with pytest.raises(ValueError, match="^modulator_weights: modulator must be one of 'hard', .*, got 'soft'$"):
        maths.modulation_weights(np.array([Q]), np.array([U1]), 'soft')


# ----------------------------------------------------------------------------------------------------------------
# Theory with the oracle theta^2 and eps^2
# ----------------------------------------------------------------------------------------------------------------
#
# For a fixed weight f, q_j = theta_j + eps z_j gives E[(f q_j - theta_j)^2] = (1 - f)^2 theta_j^2 + f^2 eps^2, a
# quadratic in f minimised at the Wiener weight theta_j^2 / (theta_j^2 + eps^2): with the oracle values the Wiener
# risk is the smallest of all fixed weights, James-Stein's and hard's included. James-Stein vs hard: both are 0 (risk
# theta_j^2) where theta_j^2 <= eps^2; elsewhere, with r = eps^2 / theta_j^2 in (0, 1) and 1 - f = r, James-Stein's
# risk is r^2 theta_j^2 + (1 - r)^2 eps^2 = eps^2 (1 - r + r^2) <= eps^2 = hard's risk, since r^2 <= r. Summing,
# Wiener <= James-Stein <= hard, with equality only when no dimension has 0 < theta_j^2 (and eps^2 > 0).

THETA = np.array([2.0, -1.3, 0.9, 0.6, -0.4, 0.1, 0.0, 1.1])
EPS = 0.75


def oracle_risks(theta, eps):
    """Closed-form risks per dimension, written out from the argument above (not from the package)."""
    t2, e2 = theta ** 2, eps ** 2
    r = np.divide(e2, t2, out=np.zeros_like(t2), where=t2 > e2)  # used only where t2 > e2
    return {
        'hard': np.minimum(t2, e2),
        'james-stein': np.where(t2 > e2, e2 * (1 - r + r ** 2), t2),
        'wiener': t2 * e2 / (t2 + e2),
    }


def test_oracle_closed_form_risks_are_ordered_in_every_dimension():
    risks = oracle_risks(THETA, EPS)
    assert np.all(risks['wiener'] <= risks['james-stein']) and np.all(risks['james-stein'] <= risks['hard'])
    # strict where the shrinkage acts: kept dimensions (James-Stein < hard) and any signal (Wiener < James-Stein)
    kept = THETA ** 2 > EPS ** 2
    assert np.all(risks['james-stein'][kept] < risks['hard'][kept])
    assert np.all(risks['wiener'][THETA != 0] < risks['james-stein'][THETA != 0])


def test_oracle_risks_simulated_match_the_closed_form_and_are_ordered():
    reps = 20000
    rng = np.random.default_rng(12)
    q = THETA + EPS * rng.standard_normal((reps, THETA.size))
    theta2 = np.broadcast_to(THETA ** 2, q.shape)
    loss = {m: np.sum((maths.modulator_weights(theta2, np.full(reps, EPS ** 2), m) * q - THETA) ** 2, axis=1)
            for m in maths.MODULATOR_NAMES}
    expected = {m: r.sum() for m, r in oracle_risks(THETA, EPS).items()}
    for m in maths.MODULATOR_NAMES:
        se = loss[m].std(ddof=1) / np.sqrt(reps)
        assert abs(loss[m].mean() - expected[m]) <= Z * se, (m, loss[m].mean(), expected[m], se)
    # paired differences over the same draws: centred on the closed-form gap, and bounded away from 0
    for worse, better in (('hard', 'james-stein'), ('james-stein', 'wiener')):
        diff = loss[worse] - loss[better]
        se = diff.std(ddof=1) / np.sqrt(reps)
        assert abs(diff.mean() - (expected[worse] - expected[better])) <= Z * se
        assert diff.mean() - Z * se > 0, (worse, better, diff.mean(), se)


# ----------------------------------------------------------------------------------------------------------------
# Theory with the plug-in estimates u and eps2
# ----------------------------------------------------------------------------------------------------------------
#
# With u (PRF DIME) for theta^2 and eps2 = mean(q^2 - u) for eps^2 the weights are random and correlated with q, so
# nothing orders the risks in general. Each replicate draws its own theta (Laplace, scale 1) and noise, so the
# per-replicate losses are i.i.d.; a claim is asserted only when the Z-standard-error bound of the paired mean
# difference excludes zero.

def plug_in_losses(seed, eps, sigma, m, p=256, reps=300):
    rng = np.random.default_rng(seed)
    theta = rng.laplace(0.0, 1.0, (reps, p))
    q = theta + eps * rng.standard_normal((reps, p))
    d = theta[:, None, :] + sigma * rng.standard_normal((reps, m, p))
    u = maths.kernel_dime(q, d, maths.kernel_weights('uniform', q, d, np.ones((reps, m), dtype=bool)))
    return {mod: np.sum((maths.modulation_weights(q, u, mod)[0] * q - theta) ** 2, axis=1)
            for mod in maths.MODULATOR_NAMES}


def paired_bounds(a, b):
    """(lower, upper) Z-standard-error bounds of mean(a - b)."""
    diff = a - b
    se = diff.std(ddof=1) / np.sqrt(len(diff))
    return diff.mean() - Z * se, diff.mean() + Z * se


def test_plug_in_soft_modulators_beat_hard_when_the_query_is_as_noisy_as_its_feedback():
    """eps = sigma = 1, M = 10: the oracle ordering carries over (measured over seeds 0-5: James-Stein 17-18% below
    hard, 45-49 standard errors; Wiener 14-15% below James-Stein, 65-75 standard errors)."""
    loss = plug_in_losses(seed=1, eps=1.0, sigma=1.0, m=10)
    assert paired_bounds(loss['james-stein'], loss['hard'])[1] < 0
    assert paired_bounds(loss['wiener'], loss['james-stein'])[1] < 0


def test_plug_in_soft_modulators_lose_to_hard_when_the_query_is_much_cleaner_than_its_feedback():
    """eps = 0.1, sigma = 1, M = 2: u carries the documents' noise, so the shrinkage eps2 / u of a clean query's
    dimensions is noisy and too strong (measured over seeds 0-5: James-Stein 9-10% above hard, 11-12 standard
    errors; Wiener 4-5% above hard, 6.5-7.6 standard errors): the oracle ordering is not a property of the
    plug-in."""
    loss = plug_in_losses(seed=2, eps=0.1, sigma=1.0, m=2)
    assert paired_bounds(loss['james-stein'], loss['hard'])[0] > 0
    assert paired_bounds(loss['wiener'], loss['hard'])[0] > 0


# ----------------------------------------------------------------------------------------------------------------
# The stage
# ----------------------------------------------------------------------------------------------------------------

OUTPUT = ['qid', 'query', 'query_vec', 'query_dime', 'query_vec_full', 'query_kept', 'query_kept_frac', 'query_eps2',
          'query_fallback', 'query_mean_weight']


@pytest.mark.parametrize('modulator, query_vec, kept, mean_weight', [
    ('hard', [0, 2, 3, 0], 2, 1.0),
    # f * q with f = [0, 0.175/4.2, 4.375/8.4, 0]; mean weight (0.175/4.2 + 4.375/8.4) / 2 = 0.28125
    ('james-stein', [0, 0.35 / 4.2, 13.125 / 8.4, 0], 2, 0.28125),
    ('wiener', [0.9 / 4.925, 8.4 / 8.225, 25.2 / 12.425, 1.6 / 4.425], 4,
     (0.9 / 4.925 + 4.2 / 8.225 + 8.4 / 12.425 + 0.4 / 4.425) / 4),
])
def test_stage_on_worked_example_1(modulator, query_vec, kept, mean_weight):
    out = Rdime(modulator=modulator).transform(frame())
    assert list(out.columns) == OUTPUT
    row = out.iloc[0]
    assert row['query_vec'].dtype == np.float32
    np.testing.assert_allclose(row['query_vec'], query_vec, rtol=0, atol=1e-6)
    assert row['query_kept'] == kept and row['query_kept_frac'] == kept / 4
    assert row['query_eps2'] == pytest.approx(4.025, abs=1e-6)
    assert not row['query_fallback']
    assert row['query_mean_weight'] == pytest.approx(mean_weight, abs=1e-6)


@pytest.mark.parametrize('modulator, fallback, query_vec, kept, is_fallback, mean_weight', [
    ('hard', 'full', [1, 2, 3, 4], 4, True, 1.0),
    ('james-stein', 'full', [1, 2, 3, 4], 4, True, 1.0),
    ('james-stein', 'top1', [0, 0, 3, 0], 1, True, 1.0),
    # Wiener's set {u > 0} is not empty here: no fallback
    ('wiener', 'full', [0.5 / 8.075, 0.4 / 7.775, 9.0 / 10.575, 0], 3, False,
     (0.5 / 8.075 + 0.2 / 7.775 + 3.0 / 10.575) / 3),
])
def test_stage_on_worked_example_2_empty_set(modulator, fallback, query_vec, kept, is_fallback, mean_weight):
    row = Rdime(modulator=modulator, fallback=fallback).transform(frame(u=U2)).iloc[0]
    np.testing.assert_allclose(row['query_vec'], query_vec, rtol=0, atol=1e-6)
    assert row['query_kept'] == kept and row['query_fallback'] == is_fallback
    assert row['query_mean_weight'] == pytest.approx(mean_weight, abs=1e-6)


@pytest.mark.parametrize('fallback, query_vec', [('full', [1, 2]), ('top1', [0, 2])])
def test_wiener_falls_back_when_no_importance_is_positive(fallback, query_vec):
    # q = [1, 2], u = [-1, 0]: eps2 = 2.5 + 0.5 = 3; no u > 0; 'top1' takes the larger u (dimension 1)
    row = Rdime(modulator='wiener', fallback=fallback).transform(frame(q=[1, 2], u=[-1, 0])).iloc[0]
    np.testing.assert_array_equal(row['query_vec'], query_vec)
    assert row['query_fallback'] and row['query_mean_weight'] == 1.0 and row['query_eps2'] == pytest.approx(3.0)


def test_stage_in_a_pipeline_rescores_with_the_modulated_query():
    """Worked example 3 (PRF, M = 2): u = [0.95, 2.1, 5.7, 6.2], eps2 = 3.7625; James-Stein keeps dims 2, 3 with
    f = [1.9375 / 5.7, 2.4375 / 6.2]. Scores are f * q . d by hand."""
    d1, d2, d3 = [0.9, 2.1, 2.8, 0.1], [1.0, 0.0, 1.0, 3.0], [0.0, 0.0, 1.0, -1.0]
    inp = pd.DataFrame({'qid': ['q'] * 3, 'query': ['text'] * 3, 'query_vec': [vec(Q)] * 3,
                        'docno': ['d1', 'd2', 'd3'], 'doc_vec': [vec(d1), vec(d2), vec(d3)],
                        'score': [3.0, 2.0, 1.0]})
    out = (PrfDime() >> Rdime(modulator='james-stein') >> VectorScorer()).transform(inp)
    f2, f3 = 1.9375 / 5.7, 2.4375 / 6.2
    expected = {'d1': 3 * f2 * 2.8 + 4 * f3 * 0.1, 'd2': 3 * f2 * 1.0 + 4 * f3 * 3.0, 'd3': 3 * f2 - 4 * f3}
    assert out['docno'].tolist() == ['d2', 'd1', 'd3']  # 5.74, 3.01, -0.55
    for docno, score in zip(out['docno'], out['score']):
        assert score == pytest.approx(expected[docno], abs=1e-5)
    assert (out['query_kept'] == 2).all() and out['query_mean_weight'].iloc[0] == pytest.approx((f2 + f3) / 2)


def test_hard_modulator_is_rdime_unchanged():
    out = Rdime(modulator='hard').transform(frame())
    np.testing.assert_array_equal(out.iloc[0]['query_vec'], [0, 2, 3, 0])
    assert out.iloc[0]['query_mean_weight'] == 1.0


@pytest.mark.parametrize('modulator', maths.MODULATOR_NAMES)
def test_empty_input_has_every_output_column(modulator):
    out = Rdime(modulator=modulator).transform(frame().iloc[:0])
    assert len(out) == 0 and list(out.columns) == OUTPUT


@pytest.mark.parametrize('modulator', ['soft', 'Wiener', None, 1, ''])
def test_unknown_modulator_fails_at_construction(modulator):
    with pytest.raises(ValueError, match=r"Rdime: modulator must be one of 'hard', 'james-stein', 'wiener', got"):
        Rdime(modulator=modulator)


@pytest.mark.parametrize('column', ['query_vec', 'query_dime'])
def test_nan_vectors_name_the_stage_column_and_qid(column):
    inp = pd.concat([frame(qid='ok'), frame(qid='bad')], ignore_index=True)
    inp.at[1, column] = vec([1, np.nan, 3, 4])
    with pytest.raises(ValueError, match=f"Rdime.*{column}.*qid='bad'"):
        Rdime(modulator='wiener').transform(inp)


def test_missing_query_dime_is_a_validation_error():
    with pytest.raises(pt.validate.InputValidationError, match='query_dime'):
        Rdime(modulator='james-stein').transform(frame().drop(columns=['query_dime']))


def test_repr_equality_and_hash():
    assert repr(Rdime(modulator='hard')) == 'Rdime()'
    assert repr(Rdime(modulator='wiener')) == "Rdime(modulator='wiener')"
    assert repr(Rdime(fallback='top1', modulator='james-stein')) == "Rdime(fallback='top1', modulator='james-stein')"
    assert Rdime() == Rdime(modulator='hard') and hash(Rdime()) == hash(Rdime(modulator='hard'))
    assert Rdime(modulator='wiener') != Rdime(modulator='james-stein') and Rdime(modulator='wiener') != Rdime()
