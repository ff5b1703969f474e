"""The DIME stages on tiny hand-built frames: the paper's worked examples, feedback selection over several
queries, keep_ranking, each estimator's stage, compile() and FeedbackCutoff."""
import warnings

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest
from frames import D1, D2, DC, EX2, Q, assert_vec, flatten, interleaved, one_row_per_query, queries, results

from pyterrier_rdime import (
    EclipseDime,
    KernelDime,
    MagnitudeDime,
    OracleDime,
    PrfDime,
    Rdime,
    SwcDime,
)
from pyterrier_rdime.dime import FeedbackCutoff


def test_worked_example_3_prf_rdime():
    inp = results([('q1', Q, 'd2', D2, 1.0), ('q1', Q, 'd1', D1, 2.0)])
    out = (PrfDime() >> Rdime()).transform(inp)
    assert len(out) == 2 and out['docno'].tolist() == ['d2', 'd1']
    for _, row in out.iterrows():
        assert_vec(row['query_dime'], [0.95, 2.1, 5.7, 6.2])
        assert row['query_eps2'] == pytest.approx(3.7625, abs=1e-6)
        assert row['query_kept'] == 2
        assert row['query_kept_frac'] == pytest.approx(0.5)
        assert not row['query_fallback']
        assert_vec(row['query_vec'], [0, 0, 3, 4])  # S = {2, 3}
    # documents are untouched
    assert_vec(out['doc_vec'].iloc[0], D2)
    assert_vec(out['doc_vec'].iloc[1], D1)


def test_worked_example_4_swc_rdime_uses_fewer_docs_than_num_docs():
    inp = results([('q1', Q, 'd1', D1, 2.0), ('q1', Q, 'd2', D2, 1.0)])
    out = (SwcDime() >> Rdime()).transform(inp)  # num_docs = 10 but only two exist
    row = out.iloc[0]
    assert_vec(row['query_dime'], [1, 0, 3, 12], atol=1e-5)
    assert row['query_eps2'] == pytest.approx(3.5, abs=1e-5)
    assert row['query_kept'] == 1
    assert_vec(row['query_vec'], [0, 0, 0, 4])  # S = {3}


def test_worked_example_1_prf_takes_the_top_scored_document_not_the_first_row():
    inp = results([('q1', Q, 'd2', D2, 1.0), ('q1', Q, 'd1', D1, 2.0)])
    out = (PrfDime(num_docs=1) >> Rdime()).transform(inp)
    row = out.iloc[0]
    assert_vec(row['query_dime'], [0.9, 4.2, 8.4, 0.4])
    assert row['query_eps2'] == pytest.approx(4.025, abs=1e-6)
    assert row['query_kept'] == 2
    assert_vec(row['query_vec'], [0, 2, 3, 0])  # S = {1, 2}


def test_worked_example_2_fallback_full():
    inp = results([('q1', Q, 'd', EX2, 1.0)])
    out = (PrfDime() >> Rdime()).transform(inp)
    row = out.iloc[0]
    assert_vec(row['query_dime'], [0.5, 0.2, 3.0, -4.0])
    assert row['query_eps2'] == pytest.approx(7.575, abs=1e-6)
    assert bool(row['query_fallback']) is True
    assert row['query_kept'] == 4 and row['query_kept_frac'] == pytest.approx(1.0)
    assert_vec(row['query_vec'], Q)  # the unpruned query


def test_worked_example_2_fallback_top1():
    inp = results([('q1', Q, 'd', EX2, 1.0)])
    out = (PrfDime() >> Rdime(fallback='top1')).transform(inp)
    row = out.iloc[0]
    assert bool(row['query_fallback']) is True
    assert row['query_kept'] == 1 and row['query_kept_frac'] == pytest.approx(0.25)
    assert_vec(row['query_vec'], [0, 0, 3, 0])  # the largest u_j is u_2 = 3


def test_fallback_only_applies_to_the_empty_query():
    inp = results([('a', Q, 'd', EX2, 1.0), ('b', Q, 'd1', D1, 2.0), ('b', Q, 'd2', D2, 1.0)])
    out = (PrfDime() >> Rdime(fallback='top1')).transform(inp)
    fallback = one_row_per_query(out, 'query_fallback')
    assert bool(fallback['a']) is True and bool(fallback['b']) is False
    pruned = one_row_per_query(out, 'query_vec')
    assert_vec(pruned['a'], [0, 0, 3, 0])
    assert_vec(pruned['b'], [0, 0, 3, 4])


def test_interleaved_unsorted_queries_keep_ranking():
    inp = interleaved()
    out = PrfDime().transform(inp)
    assert len(out) == 6
    assert out['docno'].tolist() == ['e3', 'dC', 'dA', 'e1', 'dB', 'e2']  # rows pass through in order
    assert list(out.columns) == list(inp.columns) + ['query_dime']
    dime = one_row_per_query(out, 'query_dime')
    assert_vec(dime['q1'], [0.95, 2.1, 5.7, 6.2])
    assert_vec(dime['q2'], [2, 0, 0, 2])
    np.testing.assert_array_equal(out['score'].to_numpy(), inp['score'].to_numpy())


def test_interleaved_unsorted_queries_through_rdime():
    out = (PrfDime() >> Rdime()).transform(interleaved())
    eps2 = one_row_per_query(out, 'query_eps2')
    assert eps2['q1'] == pytest.approx(3.7625, abs=1e-6) and eps2['q2'] == pytest.approx(0.5, abs=1e-6)
    pruned = one_row_per_query(out, 'query_vec')
    assert_vec(pruned['q1'], [0, 0, 3, 4])
    assert_vec(pruned['q2'], [1, 0, 0, 2])
    kept = one_row_per_query(out, 'query_kept')
    assert kept == {'q1': 2, 'q2': 2}


def test_keep_ranking_false_gives_one_row_per_query_with_query_columns():
    out = PrfDime(keep_ranking=False).transform(interleaved())
    assert sorted(out['qid']) == ['q1', 'q2'] and len(out) == 2
    assert list(out.columns) == ['qid', 'query', 'query_vec', 'query_dime']
    by_qid = out.set_index('qid')
    assert_vec(by_qid.loc['q1', 'query_dime'], [0.95, 2.1, 5.7, 6.2])
    assert_vec(by_qid.loc['q2', 'query_dime'], [2, 0, 0, 2])
    assert by_qid.loc['q2', 'query'] == 'text of q2'
    out = (PrfDime(keep_ranking=False) >> Rdime()).transform(interleaved())
    assert list(out.columns)[:9] == ['qid', 'query', 'query_vec', 'query_dime', 'query_vec_full', 'query_kept',
                                     'query_kept_frac', 'query_eps2', 'query_fallback']
    assert_vec(out.set_index('qid').loc['q2', 'query_vec'], [1, 0, 0, 2])


def test_feedback_ties_keep_frame_order():
    x, y = (1, 0, 0, 0), (0, 1, 0, 0)
    inp = results([('q', Q, 'x', x, 1.0), ('q', Q, 'y', y, 1.0), ('q', Q, 'z', (0, 0, 0, 1), 0.0)])
    assert_vec(PrfDime(num_docs=1).transform(inp)['query_dime'].iloc[0], [1, 0, 0, 0])
    assert_vec(PrfDime(num_docs=1).transform(inp.iloc[[1, 0, 2]])['query_dime'].iloc[0], [0, 2, 0, 0])


def test_fewer_feedback_docs_than_num_docs_uses_what_exists():
    # 'a' has three docs (top-2 used), 'b' a single one (used alone)
    inp = results([('a', Q, 'd1', D1, 3.0), ('b', Q, 'x', (1, 1, 0, 0), 9.0), ('a', Q, 'd2', D2, 2.0),
                   ('a', Q, 'dC', DC, 1.0)])
    dime = one_row_per_query(PrfDime(num_docs=2).transform(inp), 'query_dime')
    assert_vec(dime['a'], [0.95, 2.1, 5.7, 6.2])
    assert_vec(dime['b'], [1, 2, 0, 0])
    dime = one_row_per_query(PrfDime(num_docs=50).transform(inp), 'query_dime')
    # all three docs of 'a': mean = [(0.9 + 1 + 100) / 3, (2.1 + 100) / 3, (2.8 + 1 + 100) / 3, (0.1 + 3 + 100) / 3]
    assert_vec(dime['a'], [101.9 / 3, 2 * 102.1 / 3, 3 * 103.8 / 3, 4 * 103.1 / 3], atol=1e-4)


def test_kernel_dime_rank_kernel_stage():
    # ranks by score: d1 (w = 2/3), d2 (w = 1/3); sum w d = [2.8/3, 4.2/3, 6.6/3, 3.2/3]
    inp = results([('q', Q, 'd2', D2, 1.0), ('q', Q, 'd1', D1, 2.0)])
    dime = KernelDime(kernel='rank').transform(inp)['query_dime'].iloc[0]
    assert_vec(dime, [2.8 / 3, 2 * 4.2 / 3, 3 * 6.6 / 3, 4 * 3.2 / 3])


def test_kernel_dime_callable_kernel_stage():
    def kernel(query_vecs, doc_vecs):
        return np.tile([1.0, 3.0], (query_vecs.shape[0], 1))  # weights 1/4, 3/4 by rank

    inp = results([('q', Q, 'd2', D2, 1.0), ('q', Q, 'd1', D1, 2.0)])
    dime = KernelDime(kernel=kernel).transform(inp)['query_dime'].iloc[0]
    # 0.25 * D1 + 0.75 * D2 = [0.975, 0.525, 1.45, 2.275]
    assert_vec(dime, [0.975, 2 * 0.525, 3 * 1.45, 4 * 2.275])


def test_magnitude_dime_on_a_query_frame():
    inp = queries([('a', (1, 0, 2, 0)), ('b', (1, -2, 3, 4))])
    out = (MagnitudeDime() >> Rdime()).transform(inp)
    by_qid = out.set_index('qid')
    assert_vec(by_qid.loc['a', 'query_dime'], [1, 0, 4, 0])
    # u = q^2 -> eps2 = 0; keep u > 0
    assert by_qid.loc['a', 'query_eps2'] == pytest.approx(0.0)
    assert_vec(by_qid.loc['a', 'query_vec'], [1, 0, 2, 0])
    assert_vec(by_qid.loc['b', 'query_dime'], [1, 4, 9, 16])


def test_eclipse_dime_stage():
    q = (1, 2)
    rows = [('q', q, 'c', (0, 4), 2.0), ('q', q, 'a', (1, 1), 4.0), ('q', q, 'd', (2, 0), 1.0),
            ('q', q, 'b', (3, 1), 3.0)]
    inp = results(rows)
    # positives a, b: mean [2, 1]; negatives (bottom 5 without the positives) c, d: mean [1, 2]
    assert_vec(EclipseDime().transform(inp)['query_dime'].iloc[0], [1.5, 0.0])  # [2, 2] - 0.5 * [1, 4]
    # one negative: d, the lowest scored
    assert_vec(EclipseDime(num_neg=1).transform(inp)['query_dime'].iloc[0], [1.0, 2.0])  # [2, 2] - 0.5 * [2, 0]
    assert_vec(EclipseDime(num_pos=1, alpha=2.0, beta=1.0).transform(inp)['query_dime'].iloc[0],
               [2 * 1 - 5.0 / 3, 2 * 2 - 2 * 5.0 / 3])  # pos a; neg b, c, d: mean [5/3, 5/3]


def test_oracle_dime_stage():
    qrels = pd.DataFrame({'qid': ['1', '1', '1', '1', '2', '2'], 'docno': ['a', 'b', 'c', 'zz', 'a', 'b'],
                          'label': [1, 0, 1, 2, 0, 0]})
    inp = results([('1', (1, 2), 'a', (1, 0), 4.0), ('2', (1, -1), 'a', (1, 0), 1.0), ('1', (1, 2), 'b', (0, 1), 3.0),
                   ('1', (1, 2), 'unjudged', (7, 7), 2.5), ('1', (1, 2), 'c', (1, 1), 2.0),
                   ('2', (1, -1), 'b', (0, 1), 0.5)])
    with pytest.warns(UserWarning, match="'2'"):
        out = OracleDime(qrels=qrels).transform(inp)
    dime = one_row_per_query(out, 'query_dime')
    # query 1: Pearson over judged a, b, c (see test_maths): [1, -0.5]
    assert_vec(dime['1'], [1.0, -0.5])
    # query 2: a single label -> u = q * q
    assert_vec(dime['2'], [1.0, 1.0])


def test_oracle_dime_matches_integer_qids_in_qrels():
    qrels = pd.DataFrame({'qid': [1, 1, 1], 'docno': ['a', 'b', 'c'], 'label': [1, 0, 1]})
    inp = results([('1', (1, 2), 'a', (1, 0), 3.0), ('1', (1, 2), 'b', (0, 1), 2.0), ('1', (1, 2), 'c', (1, 1), 1.0)])
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        out = OracleDime(qrels=qrels).transform(inp)
    assert_vec(out['query_dime'].iloc[0], [1.0, -0.5])


def test_compile():
    assert PrfDime(keep_ranking=False).compile() == (FeedbackCutoff(num_docs=2) >> PrfDime(keep_ranking=False))
    assert SwcDime(num_docs=3, keep_ranking=False).compile() == (
        FeedbackCutoff(num_docs=3) >> SwcDime(num_docs=3, keep_ranking=False))
    assert KernelDime(kernel='rank', num_docs=7, keep_ranking=False).compile() == (
        FeedbackCutoff(num_docs=7) >> KernelDime(kernel='rank', num_docs=7, keep_ranking=False))
    for stage in (PrfDime(), SwcDime(), KernelDime(kernel='rbf'), EclipseDime(), EclipseDime(keep_ranking=False)):
        assert stage.compile() is stage


@pytest.mark.parametrize('first_rank', [0, 1])
def test_compiled_stage_uses_the_same_feedback_with_0_or_1_based_ranks(first_rank):
    # ranks disagree with the scores on purpose: the feedback is the top-2 by score (dB, dA: worked example 3)
    inp = interleaved().reset_index(drop=True).assign(rank=[first_rank + r for r in (0, 0, 1, 1, 2, 2)])
    stage = PrfDime(keep_ranking=False)
    for pipe in (stage, stage.compile()):
        dime = pipe.transform(inp).set_index('qid')['query_dime']
        assert_vec(dime['q1'], [0.95, 2.1, 5.7, 6.2])
        assert_vec(dime['q2'], [2, 0, 0, 2])


def test_feedback_cutoff_keeps_the_top_scored_rows_in_input_order():
    out = FeedbackCutoff(num_docs=2).transform(interleaved())
    assert out['docno'].tolist() == ['dA', 'e1', 'dB', 'e2']
    assert list(out.columns) == list(interleaved().columns)
    assert len(FeedbackCutoff(num_docs=2).transform(interleaved().iloc[:0])) == 0


class CutRetriever(pt.Transformer):
    """A first stage that can cut its own ranking, as PyTerrier's retrievers do (fuse_rank_cutoff)."""

    def __init__(self, num_results=1000):
        self.num_results = num_results

    def transform(self, inp):
        return interleaved()

    def fuse_rank_cutoff(self, k):
        return CutRetriever(num_results=k)


def test_compile_fuses_the_feedback_cut_into_the_retriever():
    compiled = (CutRetriever() >> PrfDime(num_docs=3, keep_ranking=False) >> Rdime()).compile()
    parts = flatten(compiled)
    assert isinstance(parts[0], CutRetriever) and parts[0].num_results == 3
    assert not any(isinstance(t, FeedbackCutoff) for t in parts)
