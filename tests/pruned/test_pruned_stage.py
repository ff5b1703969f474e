"""The PrunedRetriever stage: output columns and the reference top-k on every strategy, the numpy fallback without
numba, a pipeline on a FlexIndex against pyterrier-dr's retriever, pickling, the auto strategy, scores that could
overflow float32 refused, empty input, errors naming the stage, repr / equality / hash, rank cut-off fusion."""
import dataclasses
import pickle
import sys

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest
from pruned_data import DIMS, DOCS, K, flex_index, full_topk, make_corpus, query_frame

from pyterrier_rdime import PrfDime, PrunedRetriever, Rdime
from pyterrier_rdime.pruned import calibration, kept, planner

COMPILED = pytest.mark.skipif(not kept.NUMBA_AVAILABLE,
                              reason='the compiled kernel needs numba: pip install pyterrier-rdime[fast]')


@pytest.fixture(scope='module')
def corpus():
    return make_corpus()


@pytest.mark.parametrize('strategy', ['auto', 'pruned', 'dense'])
def test_stage_output(corpus, strategy):
    docs, query_vecs = corpus
    docnos = [f'doc-{i}' for i in range(DOCS)]
    retriever = PrunedRetriever(index=docs, num_results=K, docnos=docnos, strategy=strategy)
    out = retriever(query_frame(query_vecs))
    assert list(out.columns) == ['qid', 'query', 'query_vec', 'docno', 'docid', 'score', 'rank']
    assert len(out) == K * len(query_vecs)
    for i, (qid, group) in enumerate(out.groupby('qid', sort=False)):
        ref_s, ref_d = full_topk(docs, query_vecs[i], K)
        assert group['docid'].tolist() == ref_d.tolist()
        assert group['docno'].tolist() == [docnos[d] for d in ref_d]
        assert group['rank'].tolist() == list(range(K))
        assert (group['query'] == f'text {i}').all()
        np.testing.assert_allclose(group['score'], ref_s, rtol=1e-5, atol=1e-5)


def test_numpy_fallback_without_numba(corpus, monkeypatch):
    docs, query_vecs = corpus
    monkeypatch.setattr(kept, 'NUMBA_AVAILABLE', False)
    monkeypatch.setitem(sys.modules, 'pyterrier_rdime.pruned._numba', None)  # importing the kernel would fail
    monkeypatch.setattr(planner, 'MIN_PRUNED_BYTES', 0)
    retriever = PrunedRetriever(index=docs, num_results=K, strategy='pruned')
    out = retriever(query_frame(query_vecs))
    for i, (qid, group) in enumerate(out.groupby('qid', sort=False)):
        assert group['docid'].tolist() == full_topk(docs, query_vecs[i], K)[1].tolist()
    assert PrunedRetriever(index=docs).plan(query_vecs[1:2]).strategy == 'dense'  # auto: BLAS is faster then


def test_flex_index_and_pipeline(corpus, tmp_path):
    docs, _ = corpus
    index = flex_index(tmp_path / 'docs.flex', docs)
    rng = np.random.default_rng(1)
    query_vecs = rng.standard_normal((3, DIMS)).astype(np.float32)
    feedback = index.np_retriever(num_results=10) >> index.vec_loader()
    pruned = (feedback >> PrfDime(keep_ranking=False) >> Rdime())(query_frame(query_vecs))
    assert (np.stack(pruned['query_vec']) == 0).any()
    ours = PrunedRetriever(index=index, num_results=K, strategy='pruned')(pruned)
    theirs = index.np_retriever(num_results=K)(pruned)
    assert ours['docno'].tolist() == theirs['docno'].tolist()
    np.testing.assert_allclose(ours['score'], theirs['score'], rtol=1e-5, atol=1e-5)
    assert {'query_kept', 'query_kept_frac', 'query_dime'} <= set(ours.columns)


def test_the_paper_pipeline_with_compressed_feedback_prunes_as_with_dense_feedback(corpus, tmp_path):
    """pruned.rst's recipe: the feedback top-10 on the compressed path gives the same documents as pyterrier-dr's
    dense top-10, so the same pruned queries and the same final ranking."""
    docs, _ = corpus
    index = flex_index(tmp_path / 'docs.flex', docs)
    queries = query_frame(np.random.default_rng(2).standard_normal((4, DIMS)).astype(np.float32))
    rdime = index.vec_loader() >> PrfDime(keep_ranking=False) >> Rdime()
    dense_fed = (index.np_retriever(num_results=10) >> rdime)(queries)
    fast = PrunedRetriever(index=index, num_results=10, strategy='compressed') >> rdime
    fast_fed = fast(queries)
    np.testing.assert_array_equal(np.stack(fast_fed['query_vec']), np.stack(dense_fed['query_vec']))
    second = PrunedRetriever(index=index, num_results=K)
    assert second(fast_fed)['docno'].tolist() == second(dense_fed)['docno'].tolist()


def test_pickle_travels_without_the_matrix(corpus):
    docs, query_vecs = corpus
    retriever = PrunedRetriever(index=docs, num_results=K)
    expected = retriever(query_frame(query_vecs))
    clone = pickle.loads(pickle.dumps(retriever))
    assert clone._layout._in_memory is None and retriever._layout._in_memory is not None
    pd.testing.assert_frame_equal(clone(query_frame(query_vecs)), expected)


@COMPILED
def test_auto_strategy_of_the_stage(corpus, monkeypatch):
    docs, query_vecs = corpus
    retriever = PrunedRetriever(index=docs)
    assert retriever.plan(query_vecs[2:3]).strategy == 'dense'  # a 0.5 MiB matrix sits in the caches
    monkeypatch.setattr(planner, 'MIN_PRUNED_BYTES', 0)
    # a given model (no calibration in the tests: it would time this machine): one query costs 0.4 + 0.7 x kept
    # pruned, 2 for the compressed scan
    model = planner.CostModel(dense_gemm_fixed=3.0, dense_gemm_per_query=0.3, pruned_fixed=0.4, pruned_slope=0.7,
                              batch_per_query=0.05, batch_union=1.0, batch_per_kept=0.4, compressed_fixed=2.0,
                              compressed_slope=0.0, compressed_call_seconds=0.0, compressed_pass_fixed=2.0,
                              compressed_pass_per_query=0.0, compressed_pass_call_seconds=0.0, rescore_seconds=1e-8,
                              gemv_seconds_per_byte=1e-9)
    monkeypatch.setattr(calibration, '_MODELS', {calibration.machine_key(): model})
    assert retriever.plan(query_vecs[2:3]).strategy == 'pruned'  # about half kept: 0.75 < 1
    assert retriever.plan(query_vecs[:1]).strategy == 'dense'  # every dimension kept: 1.1 > 1
    assert PrunedRetriever(index=docs, strategy='pruned').plan(query_vecs[:1]).strategy == 'pruned'
    assert PrunedRetriever(index=docs, strategy='dense').plan(query_vecs[2:3]).strategy == 'dense'
    # a cheap scan (0.05 + 0.1 x kept): the compressed path wins while its re-scoring is small against a gemv over
    # the 576 kB matrix (0.58 ms): 25 results re-score ~37 documents x ~24 dims, 9 us; 3000 (every document), 1 ms
    cheap = planner.CostModel(**{**dataclasses.asdict(model), 'compressed_fixed': 0.05, 'compressed_slope': 0.1})
    monkeypatch.setattr(calibration, '_MODELS', {calibration.machine_key(): cheap})
    few = PrunedRetriever(index=docs, num_results=K)
    assert few.plan(query_vecs[2:3]).strategy == 'compressed'
    assert PrunedRetriever(index=docs, num_results=5000).plan(query_vecs[2:3]).strategy == 'pruned'
    out = few(query_frame(query_vecs[2:3]))
    assert out['docid'].tolist() == full_topk(docs, query_vecs[2], K)[1].tolist()


def test_more_results_than_documents_and_empty_kept_set(corpus):
    docs, _ = corpus
    small = docs[:10]
    query_vecs = np.zeros((2, DIMS), dtype=np.float32)
    query_vecs[0, 3] = 1.0
    for strategy in ('pruned', 'dense'):
        out = PrunedRetriever(index=small, num_results=50, strategy=strategy)(query_frame(query_vecs))
        assert out.groupby('qid').size().tolist() == [10, 10]
        first = out[out['qid'] == 'q0']
        assert first['docid'].tolist() == np.argsort(-small[:, 3], kind='stable').tolist()
        assert (out[out['qid'] == 'q1']['score'] == 0).all()


def test_empty_input(corpus):
    docs, _ = corpus
    empty = query_frame(np.zeros((0, DIMS), dtype=np.float32))
    out = PrunedRetriever(index=docs)(empty)
    assert len(out) == 0 and list(out.columns) == ['qid', 'query', 'query_vec', 'docno', 'docid', 'score', 'rank']
    out = PrunedRetriever(index=docs, drop_query_vec=True)(empty)
    assert 'query_vec' not in out.columns


def test_drop_query_vec(corpus):
    docs, query_vecs = corpus
    out = PrunedRetriever(index=docs, num_results=3, drop_query_vec=True)(query_frame(query_vecs[:2]))
    assert list(out.columns) == ['qid', 'query', 'docno', 'docid', 'score', 'rank']


def test_errors(corpus):
    docs, query_vecs = corpus
    with pytest.raises(ValueError, match='strategy'):
        PrunedRetriever(index=docs, strategy='fast')
    with pytest.raises(ValueError, match='num_results'):
        PrunedRetriever(index=docs, num_results=0)
    with pytest.raises(ValueError, match='FlexIndex'):
        PrunedRetriever(index=[[1.0, 2.0]])
    with pytest.raises(ValueError, match='docnos'):
        PrunedRetriever(index=docs, docnos=['a'])
    with pytest.raises(ValueError, match='48-dimensional'):
        PrunedRetriever(index=docs)(query_frame(np.ones((1, 5), dtype=np.float32)))
    bad = query_vecs[:1].copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="qid='q0' holds NaN"):
        PrunedRetriever(index=docs)(query_frame(bad))
    with pytest.raises(pt.validate.InputValidationError, match='PrunedRetriever'):
        PrunedRetriever(index=docs)(pd.DataFrame({'qid': ['q'], 'query': ['x']}))
    from pyterrier_dr import FlexIndex
    with pytest.raises(ValueError, match=r"PrunedRetriever: FlexIndex\('/nonexistent/x.flex'\) is not built"):
        PrunedRetriever(index=FlexIndex('/nonexistent/x.flex'))(query_frame(query_vecs))


def test_repr_equality_and_cutoff(corpus):
    docs, query_vecs = corpus
    a = PrunedRetriever(index=docs, num_results=10)
    assert repr(a) == f'PrunedRetriever(index=<ndarray {DOCS}x{DIMS} float32>, num_results=10)'
    assert a == PrunedRetriever(index=docs, num_results=10) and hash(a) == hash(PrunedRetriever(index=docs,
                                                                                              num_results=10))
    assert a != PrunedRetriever(index=docs, num_results=10, strategy='dense')
    assert a != PrunedRetriever(index=docs.copy(), num_results=10)
    assert PrunedRetriever(index=docs, strategy='dense').schematic['label'] == 'PrunedRetriever'
    fused = (a % 3).compile()
    assert isinstance(fused, PrunedRetriever) and fused.num_results == 3
    assert fused(query_frame(query_vecs[:1]))['docid'].tolist() == a(query_frame(query_vecs[:1]))['docid'][:3].tolist()
    assert fused.dim_major() is a.dim_major()  # the array's in-memory copy is shared, not rebuilt


@pytest.mark.parametrize('strategy', ['pruned', 'dense'])
def test_scores_that_could_overflow_float32_are_refused(corpus, strategy):
    docs, query_vecs = corpus
    retriever = PrunedRetriever(index=docs, num_results=3, strategy=strategy)
    huge = query_vecs[:2].copy()
    huge[1] *= 1e38 / np.abs(huge[1]).max()  # finite float32, but its products with the documents are not
    with pytest.raises(ValueError, match=r"PrunedRetriever: query_vec of qid='q1' \(values up to 1e\+38\) can score "
                                         r'beyond float32 .* normalise the query vectors'):
        retriever(query_frame(huge))
    # the bound is sum |q_j| max |d_j| < float32 max / 2: a query just under it is scored, with finite scores
    limit = float(np.finfo(np.float32).max) / 2
    under = query_vecs[2:3] * np.float32(0.9 * limit / (np.abs(query_vecs[2]) @ np.abs(docs).max(axis=0)))
    out = retriever(query_frame(under))
    assert np.isfinite(out['score']).all() and len(out) == 3
