"""PrunedRetriever: the same top-k as scoring every dimension with the zeroed query (seeded data), on both paths,
from an array and from a FlexIndex; empty input, errors, repr / equality / hash, rank cut-off fusion."""
import numpy as np
import pandas as pd
import pyterrier as pt
import pytest

from pyterrier_rdime import PrfDime, Rdime
from pyterrier_rdime import pruned as pruned_module
from pyterrier_rdime.pruned import PrunedRetriever, kept_runs, pruned_scores, search_dense, search_pruned

DOCS, DIMS, K = 3000, 48, 25


@pytest.fixture(scope='module')
def corpus():
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((DOCS, DIMS)).astype(np.float32)
    queries = rng.standard_normal((6, DIMS)).astype(np.float32)
    keep = rng.random(queries.shape) < 0.5
    keep[0] = True  # one query keeps everything
    keep[1, :] = False
    keep[1, [0, 1, 2, 7, DIMS - 1]] = True  # runs at both ends
    return docs, np.where(keep, queries, 0).astype(np.float32)


def full_topk(docs, query_vec, k):
    scores = docs.astype(np.float64) @ query_vec.astype(np.float64)
    order = np.argsort(-scores, kind='stable')[:k]
    return scores[order], order


def query_frame(query_vecs):
    return pd.DataFrame({'qid': [f'q{i}' for i in range(len(query_vecs))],
                         'query': [f'text {i}' for i in range(len(query_vecs))], 'query_vec': list(query_vecs)})


def test_kept_runs():
    starts, ends = kept_runs(np.array([1, 1, 0, 1, 0, 0, 1, 1, 1], dtype=bool))
    assert starts.tolist() == [0, 3, 6] and ends.tolist() == [2, 4, 9]
    assert [len(x) for x in kept_runs(np.zeros(4, dtype=bool))] == [0, 0]


def test_pruned_scores_equal_full_scores(corpus):
    docs, query_vecs = corpus
    for query_vec in query_vecs:
        got = pruned_scores(np.ascontiguousarray(docs.T), query_vec)
        np.testing.assert_allclose(got, docs @ query_vec, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('search', ['pruned', 'dense', 'dense-gemv'])
def test_same_topk_as_full_scoring(corpus, search):
    docs, query_vecs = corpus
    dim_major = np.ascontiguousarray(docs.T)
    if search == 'pruned':
        scores, docids = search_pruned(dim_major, query_vecs, K)
    elif search == 'dense':  # batches of 4 and 2 queries, blocks of 700 documents
        scores, docids = search_dense(dim_major, query_vecs, K, batch_size=4, doc_block=700)
    else:  # fewer than GEMV_BELOW queries: one gemv each
        query_vecs = query_vecs[:2]
        scores, docids = search_dense(dim_major, query_vecs, K)
    for query_vec, s, d in zip(query_vecs, scores, docids):
        ref_s, ref_d = full_topk(docs, query_vec, K)
        assert d.tolist() == ref_d.tolist()  # continuous random data: no ties
        np.testing.assert_allclose(s, ref_s, rtol=1e-5, atol=1e-5)


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


def test_flex_index_and_pipeline(corpus, tmp_path):
    from pyterrier_dr import FlexIndex
    docs, _ = corpus
    index = FlexIndex(str(tmp_path / 'docs.flex'), verbose=False)
    index.indexer(mode='overwrite').index({'docno': f'd{i}', 'doc_vec': v} for i, v in enumerate(docs))
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


def test_auto_strategy(corpus, monkeypatch):
    docs, query_vecs = corpus
    retriever = PrunedRetriever(index=docs)
    assert retriever.choose_strategy(query_vecs[2:3]) == 'dense'  # a small matrix sits in the caches
    monkeypatch.setattr(pruned_module, 'MIN_PRUNED_BYTES', 0)
    monkeypatch.setattr(pruned_module, 'blas_threads', lambda: 1)
    assert retriever.choose_strategy(query_vecs[2:3]) == 'pruned'  # one query, about half its dimensions
    assert retriever.choose_strategy(query_vecs[:1]) == 'dense'  # a query that keeps every dimension
    assert retriever.choose_strategy(query_vecs) == 'dense'  # a batch: one GEMM reads the matrix once
    assert retriever.choose_strategy(query_vecs[2:4]) == 'pruned'  # two queries: two passes on the dense path
    assert PrunedRetriever(index=docs, strategy='pruned').choose_strategy(query_vecs) == 'pruned'
    monkeypatch.setattr(pruned_module, 'blas_threads', lambda: 2)  # the dense path reads ~1.8x faster
    assert retriever.choose_strategy(query_vecs[2:3]) == 'dense'  # half the dimensions: not enough then
    assert pruned_module.dense_cost(1, threads=2) < 0.6 < pruned_module.pruned_cost(query_vecs[2:3])


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
    with pytest.raises(ValueError, match='NaN'):
        PrunedRetriever(index=docs)(query_frame(bad))
    with pytest.raises(pt.validate.InputValidationError, match='PrunedRetriever'):
        PrunedRetriever(index=docs)(pd.DataFrame({'qid': ['q'], 'query': ['x']}))


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
