"""The PyTerrier stages on tiny hand-built frames: worked examples, feedback selection, fallbacks, errors, empty
input, compile(), repr / equality / hash and composition."""
import os
import re
import tracemalloc
import warnings

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest

from pyterrier_rdime import (
    EclipseDime,
    KernelDime,
    LlmAnswers,
    LlmDime,
    MagnitudeDime,
    OracleDime,
    PrfDime,
    Rdime,
    SwcDime,
    TopK,
    VectorScorer,
    read_answers_tsv,
)
from pyterrier_rdime.dime import FeedbackCutoff

os.environ.setdefault('PT_TEST_TRANSFORMER_REPORTS', '0')

Q = (1, 2, 3, 4)
D1 = (0.9, 2.1, 2.8, 0.1)
D2 = (1, 0, 1, 3)
EX2 = (0.5, 0.1, 1.0, -1.0)


def vec(values):
    return np.asarray(values, dtype=np.float32)


def results(rows, index=None):
    """A result frame from (qid, query_vec, docno, doc_vec, score) tuples."""
    return pd.DataFrame({
        'qid': [r[0] for r in rows],
        'query': [f'text of {r[0]}' for r in rows],
        'query_vec': [vec(r[1]) for r in rows],
        'docno': [r[2] for r in rows],
        'doc_vec': [vec(r[3]) for r in rows],
        'score': [float(r[4]) for r in rows],
    }, index=index)


def queries(rows, **extra):
    """A query frame from (qid, query_vec) tuples, plus extra per-query columns."""
    frame = pd.DataFrame({'qid': [r[0] for r in rows], 'query': [f'text of {r[0]}' for r in rows],
                          'query_vec': [vec(r[1]) for r in rows]})
    return frame.assign(**extra)


def one_row_per_query(frame, column):
    """{qid: value of column} after checking that every row of a query holds the same value."""
    out = {}
    for qid, group in frame.groupby('qid', sort=False):
        values = group[column].tolist()
        for v in values[1:]:
            np.testing.assert_array_equal(v, values[0])
        out[qid] = values[0]
    return out


def assert_vec(actual, expected, atol=1e-6):
    assert isinstance(actual, np.ndarray) and actual.dtype == np.float32 and actual.ndim == 1
    np.testing.assert_allclose(actual, expected, rtol=0, atol=atol)


@pytest.fixture(autouse=True)
def offline_documentation(monkeypatch):
    """pt.schematic looks classes up in PyTerrier's online documentation index; pretend it is empty."""
    monkeypatch.setattr(pt.documentation, '_cached_objects_inv', {}, raising=False)


# ----------------------------------------------------------------------------------------------------------------
# Worked examples through the stages
# ----------------------------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------------------------
# Several queries, feedback selection, keep_ranking
# ----------------------------------------------------------------------------------------------------------------

Q2 = (1, 0, -1, 2)
E1, E2, E3 = (1, 1, 1, 2), (3, 1, -1, 0), (-50, -50, -50, -50)
DC = (100, 100, 100, 100)
# q1: top-2 by score are D2 (7) and D1 (5), DC (1) is not feedback -> worked example 3
# q2: top-2 are E2 (0.9) and E1 (0.3); mean = [2, 1, 0, 1] -> u = [2, 0, 0, 2]; eps2 = (6 - 4) / 4 = 0.5 -> {0, 3}
INTERLEAVED = [('q2', Q2, 'e3', E3, 0.1), ('q1', Q, 'dC', DC, 1.0), ('q1', Q, 'dA', D1, 5.0),
               ('q2', Q2, 'e1', E1, 0.3), ('q1', Q, 'dB', D2, 7.0), ('q2', Q2, 'e2', E2, 0.9)]


def interleaved():
    return results(INTERLEAVED, index=[10, 3, 7, 0, 5, 1])


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
    assert list(out.columns)[:8] == ['qid', 'query', 'query_vec', 'query_dime', 'query_kept', 'query_kept_frac',
                                     'query_eps2', 'query_fallback']
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


# ----------------------------------------------------------------------------------------------------------------
# Top-k
# ----------------------------------------------------------------------------------------------------------------

def topk_input(dime=(0.9, 4.2, 8.4, 0.4)):
    return queries([('q', Q)], query_dime=[vec(dime)])


@pytest.mark.parametrize('kwargs, expected', [
    ({'fraction': 0.5}, [0, 2, 3, 0]), ({'fraction': 0.6}, [0, 2, 3, 0]), ({}, [0, 2, 3, 0]),
    ({'fraction': 0.7}, [1, 2, 3, 0]), ({'fraction': 1.0}, [1, 2, 3, 4]), ({'fraction': 1}, [1, 2, 3, 4]),
    ({'fraction': 0.01}, [0, 0, 3, 0]),
    ({'count': 1}, [0, 0, 3, 0]), ({'count': 3}, [1, 2, 3, 0]), ({'count': 10}, [1, 2, 3, 4]),
    ({'count': np.int64(2)}, [0, 2, 3, 0]),
])
def test_topk_fraction_and_count(kwargs, expected):
    out = TopK(**kwargs).transform(topk_input())
    assert list(out.columns) == ['qid', 'query', 'query_vec', 'query_dime', 'query_kept', 'query_kept_frac']
    row = out.iloc[0]
    assert_vec(row['query_vec'], expected)
    kept = int(np.count_nonzero(expected))
    assert row['query_kept'] == kept and row['query_kept_frac'] == pytest.approx(kept / 4)


def test_topk_ties_keep_the_lower_index():
    assert_vec(TopK(count=2).transform(topk_input((1, 1, 1, 1)))['query_vec'].iloc[0], [1, 2, 0, 0])
    assert_vec(TopK(fraction=0.5).transform(topk_input((0, 5, 0, 5)))['query_vec'].iloc[0], [0, 2, 0, 4])


def test_topk_after_prf_on_a_result_frame():
    out = (PrfDime() >> TopK(count=1)).transform(interleaved())
    pruned = one_row_per_query(out, 'query_vec')
    assert_vec(pruned['q1'], [0, 0, 0, 4])  # u = [0.95, 2.1, 5.7, 6.2]
    assert_vec(pruned['q2'], [1, 0, 0, 0])  # u = [2, 0, 0, 2]: tie, lower index
    assert len(out) == 6


# ----------------------------------------------------------------------------------------------------------------
# Scoring and pipelines
# ----------------------------------------------------------------------------------------------------------------

def test_vector_scorer_inner_product_and_ranks():
    inp = interleaved()
    out = VectorScorer().transform(inp)
    q_by_qid = {'q1': np.array(Q, float), 'q2': np.array(Q2, float)}
    for _, row in out.iterrows():
        expected = float(np.dot(q_by_qid[row['qid']], np.asarray(row['doc_vec'], float)))
        assert row['score'] == pytest.approx(expected, rel=1e-6)
    assert out['qid'].tolist() == ['q1'] * 3 + ['q2'] * 3
    # q1: dC = 1000, dB = 1 + 3 + 12 = 16, dA = 0.9 + 4.2 + 8.4 + 0.4 = 13.9; q2: e1 = 1 - 1 + 4 = 4, e2 = 4, e3 = -100
    assert out['docno'].tolist()[:3] == ['dC', 'dB', 'dA']
    assert out['score'].tolist()[:3] == pytest.approx([1000.0, 16.0, 13.9])
    assert out['rank'].tolist() == [0, 1, 2, 0, 1, 2]
    assert out[out.qid == 'q2']['docno'].tolist()[2] == 'e3'
    assert sorted(out.columns) == sorted(list(inp.columns) + ['rank'])


def test_full_pipeline_prf_rdime_scorer():
    out = (PrfDime() >> Rdime() >> VectorScorer()).transform(interleaved())
    # q1* = [0, 0, 3, 4]: dC = 700, dB = 15, dA = 8.8; q2* = [1, 0, 0, 2]: e1 = 5, e2 = 3, e3 = -150
    assert out['docno'].tolist() == ['dC', 'dB', 'dA', 'e1', 'e2', 'e3']
    assert out['score'].tolist() == pytest.approx([700.0, 15.0, 8.8, 5.0, 3.0, -150.0])
    assert out['rank'].tolist() == [0, 1, 2, 0, 1, 2]


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
    parts = _flatten(compiled)
    assert isinstance(parts[0], CutRetriever) and parts[0].num_results == 3
    assert not any(isinstance(t, FeedbackCutoff) for t in parts)


# ----------------------------------------------------------------------------------------------------------------
# LLM DIME and LLM answers
# ----------------------------------------------------------------------------------------------------------------

class FakeEncoder:
    """Stands in for a pyterrier-dr bi-encoder: encode_docs(texts) -> (n, p) array."""
    table = {'answer a': (1, 1, 0, 2), 'answer b': (0, 1, 1, 0)}

    def __init__(self):
        self.calls = []

    def encode_docs(self, texts):
        self.calls.append(list(texts))
        return np.array([self.table[t] for t in texts], dtype=np.float32)

    def __repr__(self):
        return 'FakeEncoder()'


def test_llm_dime_with_answer_vectors():
    inp = queries([('a', Q)], query_answer_vec=[vec((1, 1, 0, 2))])
    out = (LlmDime() >> Rdime()).transform(inp)
    row = out.iloc[0]
    assert_vec(row['query_dime'], [1, 2, 0, 8])
    assert row['query_eps2'] == pytest.approx(4.75)  # (30 - 11) / 4
    assert_vec(row['query_vec'], [0, 0, 0, 4])


def test_llm_dime_encodes_each_answer_once():
    enc = FakeEncoder()
    inp = results([('a', Q, 'd1', D1, 2.0), ('b', Q2, 'x', E1, 1.0), ('a', Q, 'd2', D2, 1.0),
                   ('b', Q2, 'y', E2, 0.5)])
    inp['query_answer'] = inp['qid'].map({'a': 'answer a', 'b': 'answer b'})
    out = LlmDime(encoder=enc).transform(inp)
    assert len(out) == 4
    assert sum(len(c) for c in enc.calls) == 2
    assert sorted(t for c in enc.calls for t in c) == ['answer a', 'answer b']
    dime = one_row_per_query(out, 'query_dime')
    assert_vec(dime['a'], [1, 2, 0, 8])
    assert_vec(dime['b'], [0, 0, -1, 0])


@pytest.mark.parametrize('missing', [None, float('nan'), '', '   '])
def test_llm_dime_missing_answer_text_falls_back_to_magnitude(missing):
    enc = FakeEncoder()
    inp = queries([('a', Q), ('b', Q2)], query_answer=['answer a', missing])
    with pytest.warns(UserWarning, match="'b'"):
        out = LlmDime(encoder=enc).transform(inp)
    by_qid = out.set_index('qid')
    assert_vec(by_qid.loc['a', 'query_dime'], [1, 2, 0, 8])
    assert_vec(by_qid.loc['b', 'query_dime'], [1, 0, 1, 4])  # q * q
    assert [t for c in enc.calls for t in c] == ['answer a']


def test_llm_dime_missing_answer_vector_falls_back_to_magnitude():
    inp = queries([('a', Q), ('b', Q2)], query_answer_vec=[vec((1, 1, 0, 2)), None])
    with pytest.warns(UserWarning, match='magnitude'):
        out = LlmDime().transform(inp)
    by_qid = out.set_index('qid')
    assert_vec(by_qid.loc['a', 'query_dime'], [1, 2, 0, 8])
    assert_vec(by_qid.loc['b', 'query_dime'], [1, 0, 1, 4])


def test_llm_answers_from_dict():
    inp = queries([('1', Q), ('2', Q), ('3', Q)])
    out = LlmAnswers(answers={'1': 'yes', '2': 'no'}).transform(inp)
    assert list(out.columns) == ['qid', 'query', 'query_vec', 'query_answer']
    assert out['query_answer'].tolist() == ['yes', 'no', None]


def test_llm_answers_from_tsv(tmp_path):
    path = tmp_path / 'answers.tsv'
    path.write_text('1\tanswer a\n\n2\tsays "hi"\tand more\n', encoding='utf-8')
    stage = LlmAnswers.from_tsv(path)
    assert stage.answers == {'1': 'answer a', '2': 'says "hi"\tand more'}
    out = stage.transform(queries([('2', Q), ('1', Q)]))
    assert out['query_answer'].tolist() == ['says "hi"\tand more', 'answer a']


def test_llm_answers_missing_error(tmp_path):
    path = tmp_path / 'answers.tsv'
    path.write_text('1\tanswer a\n', encoding='utf-8')
    with pytest.raises(ValueError, match="'7'"):
        LlmAnswers.from_tsv(path, missing='error').transform(queries([('1', Q), ('7', Q)]))


@pytest.mark.parametrize('content', ['1\ta\n1\tb\n', '1\ta\nno-tab-here\n'])
def test_llm_answers_bad_tsv(tmp_path, content):
    path = tmp_path / 'answers.tsv'
    path.write_text(content, encoding='utf-8')
    with pytest.raises(ValueError, match=':2:'):
        LlmAnswers.from_tsv(path)


def test_llm_answers_then_llm_dime_pipeline():
    enc = FakeEncoder()
    pipe = LlmAnswers(answers={'a': 'answer a'}) >> LlmDime(encoder=enc) >> Rdime()
    with pytest.warns(UserWarning, match="'b'"):
        out = pipe.transform(queries([('a', Q), ('b', Q2)]))
    by_qid = out.set_index('qid')
    assert_vec(by_qid.loc['a', 'query_vec'], [0, 0, 0, 4])
    assert_vec(by_qid.loc['b', 'query_dime'], [1, 0, 1, 4])


# ----------------------------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('stage, drop', [
    (PrfDime(), 'doc_vec'), (SwcDime(), 'query_vec'), (KernelDime(), 'score'), (EclipseDime(), 'doc_vec'),
    (MagnitudeDime(), 'query_vec'), (VectorScorer(), 'doc_vec'), (VectorScorer(), 'docno'),
])
def test_missing_columns_raise_pyterrier_validation_error(stage, drop):
    inp = interleaved().drop(columns=[drop])
    with pytest.raises(pt.validate.InputValidationError, match=type(stage).__name__) as info:
        stage.transform(inp)
    assert drop in str(info.value)


@pytest.mark.parametrize('stage', [Rdime(), TopK()])
def test_threshold_without_query_dime(stage):
    with pytest.raises(pt.validate.InputValidationError) as info:
        stage.transform(queries([('q', Q)]))
    assert 'query_dime' in str(info.value)


def test_llm_dime_and_answers_missing_columns():
    with pytest.raises(pt.validate.InputValidationError):
        LlmDime().transform(queries([('q', Q)]))
    with pytest.raises(pt.validate.InputValidationError):
        LlmAnswers(answers={}).transform(pd.DataFrame({'query': ['x']}))
    with pytest.raises(ValueError, match='encoder'):
        LlmDime().transform(queries([('q', Q)], query_answer=['text']))


@pytest.mark.parametrize('stage', [PrfDime(), SwcDime(), EclipseDime(), MagnitudeDime(), VectorScorer()])
@pytest.mark.parametrize('bad', [np.nan, np.inf, -np.inf])
def test_non_finite_query_vec(stage, bad):
    inp = interleaved()
    inp['query_vec'] = [vec((1, bad, 3, 4)) if qid == 'q2' else v for qid, v in zip(inp['qid'], inp['query_vec'])]
    with pytest.raises(ValueError, match="qid='q2'") as info:
        stage.transform(inp)
    assert 'query_vec' in str(info.value) and type(stage).__name__ in str(info.value)


@pytest.mark.parametrize('stage', [PrfDime(), SwcDime(), EclipseDime(), VectorScorer()])
@pytest.mark.parametrize('bad', [np.nan, np.inf])
def test_non_finite_doc_vec(stage, bad):
    inp = interleaved()
    inp['doc_vec'] = [vec((bad, 0, 0, 0)) if d == 'dB' else v for d, v in zip(inp['docno'], inp['doc_vec'])]
    with pytest.raises(ValueError, match="docno='dB'") as info:
        stage.transform(inp)
    assert 'doc_vec' in str(info.value)


@pytest.mark.parametrize('stage', [Rdime(), TopK()])
def test_non_finite_query_dime(stage):
    with pytest.raises(ValueError, match="qid='q'"):
        stage.transform(topk_input((1, np.nan, 1, 1)))


@pytest.mark.parametrize('stage', [PrfDime(), SwcDime(), KernelDime(kernel='rbf'), EclipseDime(), VectorScorer()])
def test_query_doc_dimension_mismatch(stage):
    inp = interleaved()
    inp['doc_vec'] = [vec((1, 2, 3)) for _ in range(len(inp))]
    with pytest.raises(ValueError, match='dimensions') as info:
        stage.transform(inp)
    assert '4' in str(info.value) and '3' in str(info.value)


def test_doc_vectors_of_different_sizes():
    inp = interleaved()
    inp['doc_vec'] = [vec((1, 2, 3)) if d == 'dB' else v for d, v in zip(inp['docno'], inp['doc_vec'])]
    with pytest.raises(ValueError, match="docno='dB'"):
        PrfDime().transform(inp)


@pytest.mark.parametrize('stage', [Rdime(), TopK()])
def test_query_dime_dimension_mismatch(stage):
    with pytest.raises(ValueError, match='dimensions'):
        stage.transform(topk_input((1, 2, 3)))


def test_llm_answer_dimension_mismatch():
    with pytest.raises(ValueError, match=r"query_vec has 4 dimensions but query_answer_vec \(qid='q'\) has 2"):
        LlmDime().transform(queries([('q', Q)], query_answer_vec=[vec((1, 2))]))


def every_column():
    """The interleaved frame with the columns of every stage (query_dime, query_answer_vec, query_answer, rank)."""
    inp = interleaved().reset_index(drop=True)
    return inp.assign(query_dime=[vec((1, 4, 9, 16))] * len(inp), query_answer_vec=list(inp['query_vec']),
                      query_answer=['answer a'] * len(inp), rank=[0, 0, 1, 1, 2, 2])


QRELS_Q = pd.DataFrame({'qid': ['q1', 'q1'], 'docno': ['dA', 'dB'], 'label': [1, 0]})
EVERY_STAGE = [PrfDime(), SwcDime(), KernelDime(kernel='rank'), PrfDime(keep_ranking=False), EclipseDime(),
               MagnitudeDime(), OracleDime(qrels=QRELS_Q), LlmDime(), Rdime(), TopK(), VectorScorer(),
               LlmAnswers(answers={'q1': 'a'}), FeedbackCutoff(num_docs=2)]


@pytest.mark.parametrize('stage', EVERY_STAGE, ids=repr)
@pytest.mark.parametrize('missing', [np.nan, None, pd.NA], ids=['nan', 'none', 'pd.NA'])
def test_missing_qid_is_an_error_in_every_stage(stage, missing):
    inp = every_column()
    inp['qid'] = inp['qid'].astype(object)
    inp.loc[4, 'qid'] = missing  # docno dB of q1: a valid q1 row is left around it
    with pytest.raises(ValueError, match=r"column 'qid' is missing .* in 1 row\(s\), first at row 4 \(docno='dB'") \
            as info:
        stage.transform(inp)
    assert str(info.value).startswith(f'{stage}: ') and 'dropna' in str(info.value)


def test_missing_qid_is_an_error_in_a_query_frame():
    inp = queries([('a', Q), ('b', Q2)], query_dime=[vec(Q), vec(Q2)]).astype({'qid': object})
    inp.loc[0, 'qid'] = None
    for stage in (MagnitudeDime(), Rdime(), TopK(count=2)):
        with pytest.raises(ValueError, match=r"first at row 0 \(query='text of a'\)"):
            stage.transform(inp)


@pytest.mark.parametrize('stage', [PrfDime(), SwcDime(), EclipseDime(), OracleDime(qrels=QRELS_Q),
                                   FeedbackCutoff(num_docs=2)], ids=repr)
def test_nan_score_is_an_error_naming_the_candidate(stage):
    inp = interleaved()
    inp.loc[inp['docno'] == 'e1', 'score'] = np.nan
    with pytest.raises(ValueError, match=r"column 'score' is NaN at qid='q2', docno='e1' \(1 row\(s\)\)"):
        stage.transform(inp)


def test_num_docs_far_beyond_the_candidates_costs_memory_of_the_candidates():
    inp = results([('q', Q, 'd1', D1, 4.0), ('q', Q, 'd2', D2, 3.0), ('q', Q, 'd3', EX2, 2.0), ('q', Q, 'd4', DC, 1.0)])
    tracemalloc.start()
    try:
        huge = PrfDime(num_docs=10 ** 8).transform(inp)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 * 2 ** 20, peak  # padding to 10^8 slots would take gigabytes
    # mean of the four documents: [102.4, 102.2, 104.8, 102.1] / 4, times q
    expected = [102.4 / 4, 2 * 102.2 / 4, 3 * 104.8 / 4, 4 * 102.1 / 4]
    assert_vec(huge['query_dime'].iloc[0], expected, atol=1e-4)
    # every candidate is a positive, so no negative is left: only the alpha term
    assert_vec(EclipseDime(num_pos=10 ** 8, num_neg=10 ** 8).transform(inp)['query_dime'].iloc[0], expected, atol=1e-4)


@pytest.mark.parametrize('stage', [PrfDime(), SwcDime(), EclipseDime(), MagnitudeDime()], ids=repr)
def test_vectors_that_overflow_float32_importance_are_blamed_where_it_happens(stage):
    inp = interleaved()
    inp['query_vec'] = [v * np.float32(1e20) if qid == 'q2' else v for qid, v in zip(inp['qid'], inp['query_vec'])]
    inp['doc_vec'] = [v * np.float32(1e20) for v in inp['doc_vec']]
    assert all(np.isfinite(v).all() for v in inp['query_vec'])  # finite float32 input
    with pytest.raises(ValueError, match=r"query_dime of qid='q2' reaches \d\.?\d*e\+4\d, beyond float32 .*"
                                         r'values up to 2e\+20\. Normalise') as info:
        (stage >> Rdime()).transform(inp)
    assert str(info.value).startswith(f'{stage}: ')


def test_vector_scorer_overflow_names_the_candidate():
    inp = interleaved()
    inp['query_vec'] = [v * np.float32(1e20) for v in inp['query_vec']]
    inp['doc_vec'] = [v * np.float32(1e20) if d == 'dC' else v for d, v in zip(inp['docno'], inp['doc_vec'])]
    with pytest.raises(ValueError, match=r"qid='q1' and docno='dC' overflows float32 \(vector values up to 4e\+20 "
                                         r'and 1e\+22\); normalise'):
        VectorScorer().transform(inp)


@pytest.mark.parametrize('bad, message', [
    (np.array([[1, 1, 0, 2]], dtype=np.float32), r"query_answer_vec' at qid='b' holds ndarray of shape \(1, 4\)"),
    (vec((1, 1)), r"query_answer_vec' holds vectors of different sizes \(qid='b' has 2, qid='a' has 4\)"),
    (vec((1, np.nan, 0, 2)), r"query_answer_vec' holds NaN or inf at qid='b'"),
    (vec(()), r"query_answer_vec' at qid='b' holds ndarray of shape \(0,\)"),
    (np.float32(3.0), r"query_answer_vec' at qid='b' holds float32 of shape \(\)"),
    ('an answer', r"query_answer_vec' at qid='b' holds str"),
])
def test_malformed_answer_vector_is_an_error_naming_the_qid(bad, message):
    inp = queries([('a', Q), ('b', Q2)], query_answer_vec=[vec(Q), bad])
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # not the silent "no LLM answer" fallback
        with pytest.raises(ValueError, match=message):
            LlmDime().transform(inp)


@pytest.mark.parametrize('missing', [None, np.nan, pd.NA], ids=['none', 'nan', 'pd.NA'])
def test_missing_answer_vector_falls_back_with_a_warning(missing):
    inp = queries([('a', Q), ('b', Q2)], query_answer_vec=[vec((1, 1, 0, 2)), missing])
    with pytest.warns(UserWarning, match=r"no LLM answer for 1 query \('b'\); using magnitude"):
        out = LlmDime().transform(inp).set_index('qid')
    assert_vec(out.loc['a', 'query_dime'], [1, 2, 0, 8])
    assert_vec(out.loc['b', 'query_dime'], [1, 0, 1, 4])


class BadEncoder:
    def __init__(self, output):
        self.output = output

    def encode_docs(self, texts):
        return self.output

    def __repr__(self):
        return 'BadEncoder()'


@pytest.mark.parametrize('output, message', [
    (np.array([[1, 1, 0, 2], [0, np.nan, 1, 0]], dtype=np.float32),
     r"encode_docs returned NaN or inf for the query_answer of qid='b'"),
    (np.ones((1, 4), dtype=np.float32), r'encode_docs returned shape \(1, 4\) for 2 answer texts; .*\(2, 4\)'),
    (np.ones((3, 4), dtype=np.float32), r'encode_docs returned shape \(3, 4\) for 2 answer texts'),
    (np.ones(8, dtype=np.float32), r'encode_docs returned shape \(8,\) for 2 answer texts'),
    (np.ones((2, 3), dtype=np.float32), r'query_vec has 4 dimensions but the encoded query_answer has 3'),
])
def test_bad_encoder_output_is_an_error(output, message):
    inp = queries([('a', Q), ('b', Q2)], query_answer=['answer a', 'answer b'])
    with pytest.raises(ValueError, match=message) as info:
        LlmDime(encoder=BadEncoder(output)).transform(inp)
    assert str(info.value).startswith('LlmDime(encoder=BadEncoder()): ')


def test_answer_text_that_is_not_text_is_an_error():
    inp = queries([('a', Q), ('b', Q2)], query_answer=['answer a', 5])
    with pytest.raises(ValueError, match=r"query_answer of qid='b' is 5 \(int\), not text"):
        LlmDime(encoder=FakeEncoder()).transform(inp)


def test_llm_answers_file_with_a_byte_order_mark(tmp_path):
    path = tmp_path / 'answers.tsv'
    path.write_bytes('q1\tfirst answer\nq2\tsecond é\n'.encode('utf-8-sig'))
    assert read_answers_tsv(path) == {'q1': 'first answer', 'q2': 'second é'}


def test_llm_answers_file_not_in_utf8_names_the_file_line_and_fix(tmp_path):
    path = tmp_path / 'answers.tsv'
    path.write_bytes('q1\tfirst answer\nq2\tcaf\xe9 au lait\n'.encode('latin-1'))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:2: not UTF-8 .*iconv -f latin1 -t utf-8"):
        read_answers_tsv(path)


def test_llm_answers_file_with_an_empty_qid(tmp_path):
    path = tmp_path / 'answers.tsv'
    path.write_text('q1\ta\n\tb\n', encoding='utf-8')
    with pytest.raises(ValueError, match=":2: qid '' is empty or holds whitespace"):
        read_answers_tsv(path)


def test_llm_answers_nan_value_is_a_missing_answer():
    out = LlmAnswers(answers={'1': 'yes', '2': np.nan}).transform(queries([('1', Q), ('2', Q)]))
    assert out['query_answer'].tolist() == ['yes', None]
    with pytest.raises(ValueError, match="no answer for qid '2'"):
        LlmAnswers(answers={'1': 'yes', '2': np.nan}, missing='error').transform(queries([('1', Q), ('2', Q)]))


@pytest.mark.parametrize('make', [
    lambda: TopK(fraction=0), lambda: TopK(fraction=1.5), lambda: TopK(fraction=300), lambda: TopK(fraction=0.0),
    lambda: TopK(fraction=-0.5), lambda: TopK(fraction=True), lambda: TopK(fraction='0.5'),
    lambda: TopK(fraction=float('nan')), lambda: TopK(count=0), lambda: TopK(count=-1), lambda: TopK(count=0.5),
    lambda: TopK(count=3.0), lambda: TopK(count=True), lambda: TopK(fraction=0.5, count=3),
    lambda: PrfDime(keep_ranking=1), lambda: MagnitudeDime(keep_ranking='no'),
    lambda: LlmAnswers(answers=None), lambda: LlmAnswers(answers=[('1', 'a')]), lambda: LlmAnswers(answers={1: 'a'}),
    lambda: LlmAnswers(answers={'1': 3}),
    lambda: PrfDime(num_docs=0), lambda: SwcDime(num_docs=0), lambda: KernelDime(num_docs=-1),
    lambda: KernelDime(num_docs=2.5), lambda: PrfDime(num_docs=True),
    lambda: SwcDime(tau=0), lambda: SwcDime(tau=-1), lambda: KernelDime(tau=float('nan')),
    lambda: KernelDime(tau=float('inf')),
    lambda: KernelDime(kernel='cosine'), lambda: KernelDime(kernel=None),
    lambda: Rdime(fallback='zero'), lambda: Rdime(fallback=None),
    lambda: EclipseDime(num_pos=0), lambda: EclipseDime(num_neg=0), lambda: EclipseDime(beta=-0.5),
    lambda: EclipseDime(alpha=float('nan')),
    lambda: LlmAnswers(answers={}, missing='ignore'), lambda: LlmDime(encoder=object()),
    lambda: OracleDime(qrels=pd.DataFrame({'qid': ['1'], 'docno': ['a']})),
])
def test_invalid_parameters_fail_at_construction(make):
    with pytest.raises(ValueError):
        make()


@pytest.mark.parametrize('make, message', [
    (lambda: TopK(fraction=300), r"^TopK: fraction must be a fraction in \(0, 1\], got 300; .*use count=\.\.\."),
    (lambda: TopK(count=0.5), r"^TopK: count must be an integer >= 1, got 0\.5; .*use fraction=\.\.\."),
    (lambda: TopK(fraction=0.5, count=3), r'^TopK: give fraction=.* or count=.*not both'),
    (lambda: KernelDime(num_docs=0), r'^KernelDime: num_docs must be an integer >= 1, got 0'),
    (lambda: KernelDime(kernel='cosine'), r"^KernelDime: kernel must be one of 'uniform', .*got 'cosine'; .*callable"),
    (lambda: EclipseDime(beta=-0.5), r'^EclipseDime: beta must be a non-negative number, got -0\.5'),
    (lambda: PrfDime(keep_ranking=1), r'^PrfDime: keep_ranking must be True or False, got 1'),
    (lambda: LlmAnswers(answers=None), r'^LlmAnswers: answers must be a mapping .*got NoneType; .*from_tsv'),
    (lambda: LlmAnswers(answers={1: 'a'}), r"^LlmAnswers: answers has the qid 1 \(int\), but qids are strings"),
    (lambda: Rdime(fallback='zero'), r"^Rdime: .*'zero'"),
])
def test_invalid_parameter_messages_name_the_stage_value_and_fix(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# ----------------------------------------------------------------------------------------------------------------
# Empty input
# ----------------------------------------------------------------------------------------------------------------

RESULT_COLUMNS = ['qid', 'query', 'query_vec', 'docno', 'doc_vec', 'score']


@pytest.mark.parametrize('stage, expected', [
    (PrfDime(), RESULT_COLUMNS + ['query_dime']),
    (SwcDime(), RESULT_COLUMNS + ['query_dime']),
    (KernelDime(kernel='sigmoid'), RESULT_COLUMNS + ['query_dime']),
    (EclipseDime(), RESULT_COLUMNS + ['query_dime']),
    (MagnitudeDime(), RESULT_COLUMNS + ['query_dime']),
    (OracleDime(qrels=pd.DataFrame({'qid': ['1'], 'docno': ['a'], 'label': [1]})), RESULT_COLUMNS + ['query_dime']),
    (PrfDime(keep_ranking=False), ['qid', 'query', 'query_vec', 'query_dime']),
    (EclipseDime(keep_ranking=False), ['qid', 'query', 'query_vec', 'query_dime']),
    (VectorScorer(), RESULT_COLUMNS + ['rank']),
    (LlmAnswers(answers={'1': 'a'}), RESULT_COLUMNS + ['query_answer']),
    (PrfDime() >> TopK() >> VectorScorer(), RESULT_COLUMNS + ['query_dime', 'query_kept', 'query_kept_frac', 'rank']),
])
def test_empty_result_frame(stage, expected):
    out = stage.transform(interleaved().iloc[:0])
    assert isinstance(out, pd.DataFrame) and len(out) == 0
    assert list(out.columns) == expected


@pytest.mark.parametrize('stage, expected', [
    (Rdime(), ['query_kept', 'query_kept_frac', 'query_eps2', 'query_fallback']),
    (TopK(), ['query_kept', 'query_kept_frac']),
])
def test_empty_threshold_input(stage, expected):
    out = stage.transform(topk_input().iloc[:0])
    assert len(out) == 0
    assert list(out.columns)[:4 + len(expected)] == ['qid', 'query', 'query_vec', 'query_dime'] + expected


def test_empty_llm_dime_input():
    out = LlmDime().transform(queries([('q', Q)], query_answer_vec=[vec(Q)]).iloc[:0])
    assert len(out) == 0 and list(out.columns) == ['qid', 'query', 'query_vec', 'query_answer_vec', 'query_dime']
    out = LlmDime(encoder=FakeEncoder()).transform(queries([('q', Q)], query_answer=['answer a']).iloc[:0])
    assert len(out) == 0 and list(out.columns) == ['qid', 'query', 'query_vec', 'query_answer', 'query_dime']


# ----------------------------------------------------------------------------------------------------------------
# repr, equality, hash
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('stage, text', [
    (PrfDime(), 'PrfDime()'), (PrfDime(num_docs=2), 'PrfDime()'), (PrfDime(num_docs=3), 'PrfDime(num_docs=3)'),
    (PrfDime(keep_ranking=False), 'PrfDime(keep_ranking=False)'),
    (SwcDime(), 'SwcDime()'), (SwcDime(tau=0.5), 'SwcDime(tau=0.5)'),
    (SwcDime(num_docs=5, tau=0.2), 'SwcDime(num_docs=5, tau=0.2)'),
    (KernelDime(), 'KernelDime()'), (KernelDime(kernel='rank', num_docs=5), "KernelDime(kernel='rank', num_docs=5)"),
    (MagnitudeDime(), 'MagnitudeDime()'), (LlmDime(), 'LlmDime()'),
    (LlmDime(encoder=FakeEncoder()), 'LlmDime(encoder=FakeEncoder())'),
    (EclipseDime(), 'EclipseDime()'), (EclipseDime(beta=0.25), 'EclipseDime(beta=0.25)'),
    (Rdime(), 'Rdime()'), (Rdime(fallback='top1'), "Rdime(fallback='top1')"),
    (TopK(), 'TopK(fraction=0.6)'), (TopK(fraction=0.4), 'TopK(fraction=0.4)'), (TopK(count=10), 'TopK(count=10)'),
    (VectorScorer(), 'VectorScorer()'),
])
def test_repr_lists_only_non_default_args(stage, text):
    assert repr(stage) == text


def test_repr_of_a_pipeline():
    assert repr(PrfDime() >> Rdime(fallback='top1') >> VectorScorer()) == \
        "(PrfDime() >> Rdime(fallback='top1') >> VectorScorer())"


def test_repr_is_short_with_real_sized_qrels():
    qrels = pd.DataFrame({'qid': [str(i // 10) for i in range(1000)], 'docno': [f'd{i}' for i in range(1000)],
                          'label': [i % 3 for i in range(1000)]})
    text = repr(OracleDime(qrels=qrels))
    assert '\n' not in text and len(text) <= 120, text


def test_repr_is_short_with_real_sized_answers():
    answers = {str(i): 'A generated answer of a few sentences about the query. ' * 4 for i in range(43)}
    text = repr(LlmAnswers(answers=answers))
    assert '\n' not in text and len(text) <= 120, text[:300]


def _kernel(query_vecs, doc_vecs):
    return np.ones(doc_vecs.shape[:2])


QRELS = pd.DataFrame({'qid': ['1'], 'docno': ['a'], 'label': [1]})
ANSWERS = {'1': 'an answer'}
ENCODER = FakeEncoder()


@pytest.mark.parametrize('a, b', [
    (PrfDime(), PrfDime(num_docs=2, keep_ranking=True)),
    (SwcDime(), SwcDime(num_docs=10, tau=0.1)),
    (KernelDime(kernel='softmax', tau=0.3), KernelDime(kernel='softmax', tau=0.3)),
    (KernelDime(kernel=_kernel), KernelDime(kernel=_kernel)),
    (MagnitudeDime(), MagnitudeDime(keep_ranking=True)),
    (LlmDime(encoder=ENCODER), LlmDime(encoder=ENCODER)),
    (EclipseDime(), EclipseDime(num_pos=2, num_neg=5, alpha=1.0, beta=0.5)),
    (OracleDime(qrels=QRELS), OracleDime(qrels=QRELS)),
    (Rdime(), Rdime(fallback='full')),
    (TopK(), TopK(fraction=0.6)),
    (TopK(fraction=1), TopK(fraction=1.0)),
    (TopK(count=5), TopK(count=np.int64(5))),
    (VectorScorer(), VectorScorer()),
    (LlmAnswers(answers=ANSWERS), LlmAnswers(answers=ANSWERS, missing='fallback')),
    (PrfDime() >> Rdime() >> VectorScorer(), PrfDime(num_docs=2) >> Rdime(fallback='full') >> VectorScorer()),
])
def test_equal_configurations_are_equal_and_hash_equal(a, b):
    assert a is not b
    assert a == b and not (a != b)
    assert hash(a) == hash(b)
    assert len({a, b}) == 1


@pytest.mark.parametrize('a, b', [
    (PrfDime(), PrfDime(num_docs=3)),
    (PrfDime(), PrfDime(keep_ranking=False)),
    (PrfDime(), KernelDime()),
    (PrfDime(), SwcDime()),
    (SwcDime(), SwcDime(tau=0.2)),
    (KernelDime(kernel='rank'), KernelDime(kernel='rbf')),
    (KernelDime(kernel=_kernel), KernelDime(kernel=lambda q, d: np.ones(d.shape[:2]))),
    (LlmDime(), LlmDime(encoder=ENCODER)),
    (EclipseDime(), EclipseDime(beta=0.25)),
    (OracleDime(qrels=QRELS), OracleDime(qrels=QRELS.assign(label=[0]))),
    (Rdime(), Rdime(fallback='top1')),
    (TopK(fraction=0.6), TopK(fraction=0.4)),
    (TopK(count=1), TopK(fraction=1.0)),  # one dimension vs all of them
    (Rdime(), TopK()),
    (MagnitudeDime(), MagnitudeDime(keep_ranking=False)),
    (LlmAnswers(answers=ANSWERS), LlmAnswers(answers=ANSWERS, missing='error')),
    (PrfDime() >> Rdime(), PrfDime() >> TopK()),
])
def test_different_configurations_differ(a, b):
    assert a != b and not (a == b)
    assert len({a, b}) == 2


def test_schematic_labels_are_short():
    stages = [PrfDime(), SwcDime(), KernelDime(), MagnitudeDime(), LlmDime(), EclipseDime(), OracleDime(qrels=QRELS),
              Rdime(), TopK(), VectorScorer(), LlmAnswers(answers=ANSWERS), FeedbackCutoff(num_docs=2)]
    for stage in stages:
        assert 0 < len(stage.schematic['label']) <= 20


def test_pipeline_compile_cuts_only_in_the_full_retrieval_setting():
    full = (PrfDime(keep_ranking=False) >> Rdime()).compile()
    assert FeedbackCutoff(num_docs=2) in _flatten(full)
    rerank = (PrfDime() >> Rdime() >> VectorScorer()).compile()
    assert not any(isinstance(t, FeedbackCutoff) for t in _flatten(rerank))
    eclipse = (EclipseDime(keep_ranking=False) >> Rdime()).compile()
    assert not any(isinstance(t, FeedbackCutoff) for t in _flatten(eclipse))


def _flatten(transformer):
    parts = getattr(transformer, '_transformers', None)
    if parts is None:
        return [transformer]
    return [t for part in parts for t in _flatten(part)]


# ----------------------------------------------------------------------------------------------------------------
# PyTerrier's own transformer checks (inspect input/output columns, schematic)
# ----------------------------------------------------------------------------------------------------------------

TestPrfDimeInspect = pt.testing.transformer_test_class(lambda: PrfDime())
TestSwcDimeInspect = pt.testing.transformer_test_class(lambda: SwcDime())
TestKernelDimeInspect = pt.testing.transformer_test_class(lambda: KernelDime(kernel='rank', keep_ranking=False))
TestMagnitudeDimeInspect = pt.testing.transformer_test_class(lambda: MagnitudeDime())
TestLlmDimeInspect = pt.testing.transformer_test_class(lambda: LlmDime(encoder=FakeEncoder()))
TestEclipseDimeInspect = pt.testing.transformer_test_class(lambda: EclipseDime())
TestOracleDimeInspect = pt.testing.transformer_test_class(lambda: OracleDime(qrels=QRELS))
TestRdimeInspect = pt.testing.transformer_test_class(lambda: Rdime())
TestTopKInspect = pt.testing.transformer_test_class(lambda: TopK(count=3))
TestVectorScorerInspect = pt.testing.transformer_test_class(lambda: VectorScorer())
TestLlmAnswersInspect = pt.testing.transformer_test_class(lambda: LlmAnswers(answers=ANSWERS))
