"""The honest comparators on hand-made per-query tables: folds and cross-validated Top-k, the references' test
choice, and the TOST verdicts against statsmodels and scipy called directly."""
import gc
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.weightstats import ttost_paired

from pyterrier_rdime.experiment import parity
from pyterrier_rdime.experiment.parity import choose_test, cv_systems, cv_topk, fold_of, significance


def test_folds_are_balanced_seeded_and_independent_of_the_input_order():
    qids = [f'q{i}' for i in range(11)]
    folds = fold_of(qids, 5, seed=0)
    assert sorted(folds.value_counts()) == [2, 2, 2, 2, 3]
    assert folds.equals(fold_of(list(reversed(qids)), 5, seed=0))
    assert not folds.equals(fold_of(qids, 5, seed=1))


def test_leave_one_out_choice_by_hand():
    """Four queries, two fractions, one query per fold: each held-out query gets the fraction whose mean over the
    other three is higher."""
    table = pd.DataFrame({0.2: [1.0, 0.0, 0.0, 0.6], 0.5: [0.0, 0.4, 0.4, 0.0]}, index=['a', 'b', 'c', 'd'])
    values, choices = cv_topk(table, folds=4)
    # hold out a: means over b, c, d are 0.2 vs 0.267 -> 0.5; b (or c): 0.533 vs 0.133 -> 0.2; d: 0.333 vs 0.267 -> 0.2
    assert values.to_dict() == {'a': 0.0, 'b': 0.0, 'c': 0.0, 'd': 0.6}
    fold = fold_of(table.index, 4)
    chosen = {q: choices.set_index('fold').loc[fold[q], 'fraction'] for q in table.index}
    assert chosen == {'a': 0.5, 'b': 0.2, 'c': 0.2, 'd': 0.2}
    assert choices['queries'].tolist() == [1, 1, 1, 1]


def test_two_folds_choose_on_the_other_fold_and_ties_go_to_the_smaller_fraction():
    qids = [f'q{i}' for i in range(6)]
    fold = fold_of(qids, 2, seed=0)
    first = fold[fold == 0].index
    # fraction 0.3 is best on fold 0, 0.7 on fold 1; 0.5 ties with 0.3 on fold 0
    table = pd.DataFrame({0.3: [0.9 if q in first else 0.1 for q in qids],
                          0.5: [0.9 if q in first else 0.0 for q in qids],
                          0.7: [0.2 if q in first else 0.8 for q in qids]}, index=qids)
    values, choices = cv_topk(table, folds=2, seed=0)
    assert choices.set_index('fold')['fraction'].to_dict() == {0: 0.7, 1: 0.3}
    expected = {q: (0.2 if q in first else 0.1) for q in qids}
    assert values.to_dict() == pytest.approx(expected)


def test_two_queries_with_object_values_get_leave_one_out():
    """pt.Experiment's per-query values can be dtype object; with one query per fold pandas refused to set them
    (TypeError: Invalid value '[0.5]' for dtype float64)."""
    table = pd.DataFrame({0.1: [0.5, 0.2], 0.5: [0.3, 0.4]}, index=['1', '2']).astype(object)
    values, choices = cv_topk(table, folds=5)
    # hold out 1: query 2 prefers 0.5 -> 0.3; hold out 2: query 1 prefers 0.1 -> 0.2
    assert values.to_dict() == {'1': 0.3, '2': 0.2}
    assert choices['queries'].tolist() == [1, 1]


def test_one_fold_is_no_cross_validation():
    table = pd.DataFrame({0.1: [0.5, 0.2], 0.5: [0.3, 0.4]}, index=['1', '2'])
    with pytest.raises(ValueError, match='folds must be >= 2'):
        cv_topk(table, folds=1)


def test_cv_systems_from_a_pool_of_topk_systems():
    pool = pd.DataFrame([{'system': f'prf/k={k}', 'qid': q, 'measure': 'AP', 'value': v}
                         for k, column in ((0.2, [1.0, 0.0, 0.0, 0.6]), (0.5, [0.0, 0.4, 0.4, 0.0]))
                         for q, v in zip('abcd', column)])
    perquery, choices = cv_systems(pool, ['prf'], folds=4)
    assert set(perquery['system']) == {'prf/CV Top-k'}
    assert perquery.set_index('qid')['value'].to_dict() == {'a': 0.0, 'b': 0.0, 'c': 0.0, 'd': 0.6}
    assert list(choices.columns) == ['dime', 'measure', 'fold', 'fraction', 'queries'] and len(choices) == 4


def _one_comparison(differences, baseline_mean=0.5, margin=0.04, test='t', alternative='two-sided'):
    """A per-query table where RDIME = Baseline + differences; the only comparison is RDIME vs Baseline."""
    rng = np.random.default_rng(7)
    base = baseline_mean + rng.normal(0, 0.05, len(differences))
    base += baseline_mean - base.mean()
    qids = [str(i) for i in range(len(differences))]
    perquery = pd.DataFrame({'system': ['Baseline'] * len(qids) + ['prf/RDIME'] * len(qids), 'qid': qids * 2,
                             'measure': 'nDCG@10', 'value': np.r_[base, base + differences]})
    aggregate = perquery.groupby(['system', 'measure'], sort=False)['value'].mean().reset_index()
    row = significance(aggregate, perquery, ['prf'], ['RDIME'], test, alternative, margin).iloc[0]
    return row, base + differences, base


@pytest.mark.parametrize('name, differences, expected', [
    ('equivalent', np.random.default_rng(1).normal(0.001, 0.005, 50), 'equivalent'),
    ('different', np.random.default_rng(2).normal(0.1, 0.02, 30), 'different'),
    ('inconclusive', np.random.default_rng(3).normal(0.0, 0.2, 8), 'inconclusive'),
])
def test_tost_verdicts_against_statsmodels(name, differences, expected):
    row, rdime, base = _one_comparison(differences)
    margin_abs = 0.04 * 0.5  # the fraction of the Baseline's mean, in the measure's units
    assert row['margin_abs'] == pytest.approx(margin_abs)
    assert row['tost_p'] == pytest.approx(ttost_paired(rdime, base, -margin_abs, margin_abs)[0], rel=1e-9)
    assert row['tost_p_holm'] == pytest.approx(row['tost_p'])  # one comparison: Holm changes nothing
    reference = stats.ttest_rel(rdime, base)
    interval = reference.confidence_interval(0.95)
    assert (row['ci_low'], row['ci_high']) == pytest.approx((interval.low, interval.high), rel=1e-9)
    assert row['p_value'] == pytest.approx(reference.pvalue, rel=1e-9)
    assert row['mean_diff'] == pytest.approx(np.mean(rdime - base))
    assert row['verdict'] == expected, name


def test_without_topk_only_baseline_is_compared_and_object_values_are_accepted():
    """--ks '' --no-sweep: no Top-k comparator; per-query values of dtype object reach scipy as floats."""
    qids = [str(i) for i in range(5)]
    base = np.linspace(0.1, 0.5, 5)
    perquery = pd.DataFrame({'system': ['Baseline'] * 5 + ['prf/RDIME'] * 5, 'qid': qids * 2, 'measure': 'AP',
                             'value': np.r_[base, base + [0.01, 0.02, 0.0, 0.03, 0.01]]}).astype({'value': object})
    aggregate = perquery.groupby(['system', 'measure'], sort=False)['value'].mean().reset_index()
    result = significance(aggregate, perquery, ['prf'], ['RDIME'])
    assert result['comparison'].tolist() == ['Baseline']
    expected = stats.ttest_rel(base + [0.01, 0.02, 0.0, 0.03, 0.01], base).pvalue
    assert result['p_value'].iloc[0] == pytest.approx(expected, rel=1e-9)


def _topk_table(best_fraction):
    """Six queries: Baseline, RDIME, and Top-k at 0.5 and 1.0 (k=1.0 keeps every dimension: Baseline's values); the
    better of the two Top-k by the mean is ``best_fraction``."""
    qids = [str(i) for i in range(6)]
    base = np.array([0.30, 0.42, 0.51, 0.25, 0.60, 0.33])
    half = base + (0.05 if best_fraction == 0.5 else -0.05) + np.array([0.01, -0.02, 0.0, 0.02, -0.01, 0.0])
    systems = {'Baseline': base, 'prf/RDIME': base + [0.02, 0.01, 0.03, -0.01, 0.02, 0.01],
               'prf/k=0.5': half, 'prf/k=1.0': base}
    perquery = pd.DataFrame([{'system': name, 'qid': q, 'measure': 'AP', 'value': v}
                             for name, values in systems.items() for q, v in zip(qids, values)])
    aggregate = perquery.groupby(['system', 'measure'], sort=False)['value'].mean().reset_index()
    return significance(aggregate, perquery, ['prf'], ['RDIME'])


def test_a_test_best_topk_of_one_is_baseline_compared_once():
    """k=1.0 is Baseline: the same comparison must not enter Holm's family twice (twice, Holm would multiply the
    other comparisons' p-values by one more); it is labelled as Baseline."""
    result = _topk_table(best_fraction=1.0)
    assert result['comparison'].tolist() == [parity.BEST_IS_BASELINE]
    assert result['other'].tolist() == ['Baseline']
    assert result['p_holm'].iloc[0] == pytest.approx(result['p_value'].iloc[0])  # a family of one
    other = _topk_table(best_fraction=0.5)
    assert other['comparison'].tolist() == ['best Top-k (k=0.5, tuned on the test queries)', 'Baseline']


def test_holm_is_statsmodels_and_its_collection_skips_existing_objects(monkeypatch):
    """multipletests calls gc.collect() for Holm (0.1-1 s in a process holding torch): it must find the existing
    objects frozen, and leave nothing frozen after."""
    frozen = []
    collect = gc.collect
    monkeypatch.setattr(gc, 'collect', lambda *args: frozen.append(gc.get_freeze_count()) or collect(*args))
    p_values = pd.Series([0.01, 0.04, np.nan, 0.03])
    expected = multipletests([0.01, 0.04, 1.0, 0.03], alpha=0.05, method='holm')[1]
    frozen.clear()
    assert parity._holm(p_values) == pytest.approx(expected)
    assert frozen and min(frozen) > 0 and gc.get_freeze_count() == 0


def test_identical_systems_are_equivalent_and_not_significant():
    row, _, _ = _one_comparison(np.zeros(10))
    assert row['verdict'] == 'equivalent' and not row['significant'] and np.isnan(row['p_value'])


def test_auto_picks_t_on_normal_and_wilcoxon_on_heavy_tailed_differences():
    normal = np.random.default_rng(4).normal(0.01, 0.05, 40)
    heavy = np.random.default_rng(5).standard_cauchy(40) * 0.01
    assert stats.shapiro(normal).pvalue >= 0.05 and stats.shapiro(heavy).pvalue < 0.05
    assert choose_test(normal, 'auto') == 't' and choose_test(heavy, 'auto') == 'wilcoxon'
    assert choose_test(heavy, 't') == 't'
    row, rdime, base = _one_comparison(heavy, test='auto', alternative='greater')
    assert (row['test'], row['alternative']) == ('wilcoxon', 'greater')
    assert row['p_value'] == pytest.approx(stats.wilcoxon(rdime, base, alternative='greater').pvalue, rel=1e-9)
    row, rdime, base = _one_comparison(normal, test='auto', alternative='less')
    assert (row['test'], row['alternative']) == ('t', 'less')
    assert row['p_value'] == pytest.approx(stats.ttest_rel(rdime, base, alternative='less').pvalue, rel=1e-9)


def test_importing_the_runner_loads_neither_scipy_nor_statsmodels():
    code = ('import sys, pyterrier_rdime.experiment; '
            "print(sorted(m for m in ('scipy', 'statsmodels', 'matplotlib') if m in sys.modules))")
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == '[]'


def test_sweep_measures_equal_ir_measures_reading_the_frames_themselves():
    """evaluate_runs hands ir_measures each run as a dict (built query by query): the same per-query values as the
    frame read row by row, with tied scores (row order decides), a repeated docno (its last score) and a query of the
    qrels without results (0)."""
    import ir_measures
    rng = np.random.default_rng(3)
    qrels = pd.DataFrame({'qid': np.repeat(['q1', 'q2', 'q3'], 6), 'docno': [f'd{i}' for i in range(18)],
                          'label': rng.integers(0, 3, 18)})
    rows = [(q, f'd{d}', float(rng.integers(0, 4))) for q in ('q2', 'q1') for d in rng.permutation(18)[:12]]
    run = pd.DataFrame(rows + [('q1', rows[12][1], 9.0)], columns=['qid', 'docno', 'score'])
    run = run.astype({'qid': 'string', 'docno': 'string'})  # the extension dtype a retriever's frame may carry
    measures = [ir_measures.parse_measure(m) for m in ('nDCG@10', 'AP', 'RR@10', 'R@5')]
    swept = parity.evaluate_runs({('prf', 0.5): run}, qrels, measures)
    evaluator = ir_measures.evaluator(measures, qrels.rename(columns={'qid': 'query_id', 'docno': 'doc_id',
                                                                      'label': 'relevance'}))
    expected = {(m.query_id, str(m.measure)): m.value
                for m in evaluator.iter_calc(run.rename(columns={'qid': 'query_id', 'docno': 'doc_id'}))}
    assert len(expected) == 12 and ('q3', 'AP') in expected
    assert {(q, m): v for q, m, v in zip(swept['qid'], swept['measure'], swept['value'])} == expected
    assert parity.run_dict(run)['q1'][rows[12][1]] == 9.0 and list(parity.run_dict(run)) == ['q2', 'q1']


def test_reciprocal_ranks_with_a_cutoff_read_each_querys_top_only_with_the_same_values():
    """The evaluator scoring RR@k alone (ir_measures' MS MARCO provider) gets each query's documents scoring at least
    its k-th best: the very metrics, in order, that ir_measures gives reading the whole frame, with a tie across rank
    k holding the first relevant document, a repeated docno whose last score is lower, a query shorter than k; RR
    judged-only (which reads below the cutoff) or beside another measure would read the whole run."""
    import ir_measures
    qrels = pd.DataFrame({'qid': ['q1', 'q1', 'q2', 'q2', 'q3'], 'docno': ['d5', 'd9', 'd0', 'd3', 'd1'],
                          'label': [1, 2, 1, 0, 1]})
    scores = {'q1': [9, 8, 7, 7, 7, 7, 1, 0, 0, 0], 'q2': [5, 4, 3, 2, 1, 0, 0, 0], 'q3': [2, 1]}
    rows = [(q, f'd{d}', float(s)) for q, row in scores.items() for d, s in enumerate(row)]
    run = pd.DataFrame(rows + [('q2', 'd0', -1.0)], columns=['qid', 'docno', 'score'])  # d0 of q2 drops to the end
    assert parity.top_of({'a': 3.0, 'b': 2.0, 'c': 2.0, 'd': 1.0}, 2) == {'a': 3.0, 'b': 2.0, 'c': 2.0}
    with_nan = {'a': 3.0, 'b': float('nan'), 'c': 1.0}
    assert parity.top_of(with_nan, 1) is with_nan  # left whole: how a provider ranks NaN is its own affair
    values = {}
    for names in [('nDCG@10', 'AP', 'RR@3', 'RR@6'), ('RR@4',), ('RR@2', 'R@5')]:
        measures = [ir_measures.parse_measure(m) for m in names]
        ours = parity.measured(parity.qrels_evaluator(qrels, measures), run)
        assert ours == [(m.query_id, str(m.measure), m.value) for m in ir_measures.evaluator(measures, qrels.rename(
            columns={'qid': 'query_id', 'docno': 'doc_id', 'label': 'relevance'})).iter_calc(
            run.rename(columns={'qid': 'query_id', 'docno': 'doc_id'}))]
        values.update({(q, m): v for q, m, v in ours})
    # by hand: q1's relevant d5 sixth (ties by docno), q2's d0 last (its last score), q3's d1 second
    assert values['q1', 'RR@6'] == pytest.approx(1 / 6) and values['q1', 'RR@3'] == 0
    assert values['q2', 'RR@4'] == 0 and values['q3', 'RR@2'] == 0.5
    assert parity._top_depth([ir_measures.parse_measure('RR(judged_only=True)@2')]) is None
    assert parity._top_depth([ir_measures.parse_measure(m) for m in ('RR@2', 'RR@7')]) == 7
    assert parity._top_depth([ir_measures.parse_measure(m) for m in ('RR@2', 'AP')]) is None


def test_runner_evaluation_equals_pt_experiment_per_query():
    """The runner scores every system with one evaluator and dict runs: the very frame pt.Experiment(perquery=True)
    gives (rows, order, index), with ties, a repeated docno, a query of the qrels one system did not answer (0), a
    topic without qrels (NaN, with a warning), a 'string' dtype frame and qrels of a query outside the topics."""
    import ir_measures
    import pyterrier as pt

    from pyterrier_rdime.experiment.runner import evaluate
    rng = np.random.default_rng(5)
    qrels = pd.DataFrame({'qid': np.repeat(['q1', 'q2', 'q3', 'q9'], 8), 'docno': [f'd{i % 20}' for i in range(32)],
                          'label': rng.integers(0, 3, 32)})
    topics = pd.DataFrame({'qid': ['q2', 'q1', 'q3', 'q4'], 'query': 'x'})
    frames = {}
    for system, answered in [('b', ('q1', 'q2', 'q3', 'q4')), ('a', ('q2', 'q1')), ('c/k=0.5', ('q3', 'q1', 'q9'))]:
        rows = [(q, f'd{d}', float(rng.integers(0, 4))) for q in answered for d in rng.permutation(20)[:15]]
        frames[system] = pd.DataFrame(rows + [(answered[0], rows[3][1], 7.0)], columns=['qid', 'docno', 'score'])
    frames['a'] = frames['a'].astype({'qid': 'string', 'docno': 'string'})
    measures = [ir_measures.parse_measure(m) for m in ('nDCG@10', 'AP', 'RR@10', 'R@5')]
    with pytest.warns(UserWarning, match='1 topic'):
        ours = evaluate(frames, topics, qrels, measures)
    with pytest.warns(UserWarning, match='1 topic'):
        expected = pt.Experiment([f.astype({'qid': object, 'docno': object}) for f in frames.values()], topics,
                                 qrels, measures, names=list(frames), perquery=True).rename(columns={'name': 'system'})
    pd.testing.assert_frame_equal(ours, expected)
    assert ours.loc[(ours['system'] == 'a') & (ours['qid'] == 'q3'), 'value'].eq(0).all()
    assert ours.loc[ours['qid'] == 'q4', 'value'].isna().all() and 'q9' not in set(ours['qid'])
    with pytest.raises(ValueError, match='a: no results for any of the 4 queries'):
        evaluate({'a': frames['a'].iloc[:0]}, topics, qrels, measures)
    with pytest.raises(ValueError, match='none of the 1 queries has qrels'):
        evaluate(frames, topics.iloc[3:], qrels, measures)
