"""PrunedRetriever: the same top-k as scoring every dimension with the zeroed query (seeded data, float64 reference)
on every path (compiled kernel one by one and in one pass, numpy fallback, dense BLAS), exact ties, the on-disk
layout of a FlexIndex (shared, built once, atomic, rebuilt when the index changes, NaN documents refused), thread
safety, pickling, the cost model, empty input, errors, repr / equality / hash, rank cut-off fusion."""
import os
import pickle
import threading

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest

from pyterrier_rdime import PrfDime, Rdime
from pyterrier_rdime.pruned import PrunedRetriever, cost, kernels, layout

DOCS, DIMS, K = 3000, 48, 25
COMPILED = pytest.mark.skipif(not kernels.NUMBA_AVAILABLE,
                              reason='the compiled kernel needs numba: pip install pyterrier-rdime[fast]')


@pytest.fixture(scope='module')
def corpus():
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((DOCS, DIMS)).astype(np.float32)
    queries = rng.standard_normal((6, DIMS)).astype(np.float32)
    keep = rng.random(queries.shape) < 0.5
    keep[0] = True  # one query keeps everything
    keep[1, :] = False
    keep[1, [0, 1, 2, 7, DIMS - 1]] = True  # five kept dims: the kernel's rows in a pass of four, then one
    return docs, np.where(keep, queries, 0).astype(np.float32)


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 64 documents: many chunks and several blocks per chunk on a small matrix."""
    monkeypatch.setattr(kernels, 'BLOCK_DOCS', 64)
    monkeypatch.setattr(kernels, 'TILE_DIMS', 8)


def full_topk(docs, query_vec, k):
    scores = docs.astype(np.float64) @ query_vec.astype(np.float64)
    order = np.argsort(-scores, kind='stable')[:k]
    return scores[order], order


def query_frame(query_vecs):
    return pd.DataFrame({'qid': [f'q{i}' for i in range(len(query_vecs))],
                         'query': [f'text {i}' for i in range(len(query_vecs))], 'query_vec': list(query_vecs)})


def flex_index(path, docs, docnos=None):
    from pyterrier_dr import FlexIndex
    index = FlexIndex(str(path), verbose=False)
    docnos = docnos or [f'd{i}' for i in range(len(docs))]
    index.indexer(mode='overwrite').index({'docno': d, 'doc_vec': v} for d, v in zip(docnos, docs))
    return index


def test_kept_dims_and_best_k():
    dims, weights, starts = kernels.kept_dims(np.array([[0, 2, 0], [1, 0, 3], [0, 0, 0]], dtype=np.float32))
    assert dims.tolist() == [1, 0, 2] and weights.tolist() == [2, 1, 3] and starts.tolist() == [0, 1, 3, 3]
    scores = np.array([1, 3, 3, 2], dtype=np.float32)
    assert kernels.best_k(scores, np.array([0, 1, 2, 3]), 2).tolist() == [1, 2]
    assert kernels.best_k(scores, np.array([9, 8, 7, 6]), 2).tolist() == [2, 1]  # the tie goes to the lower docid
    assert kernels.best_k(scores, np.array([9, 8, 7, 6]), 3).tolist() == [2, 1, 3]
    assert kernels.top_k(scores, 9)[1].tolist() == [1, 2, 3, 0]


FUSED = [pytest.param('one by one', marks=COMPILED), pytest.param('one pass', marks=COMPILED)]


@pytest.mark.parametrize('search', FUSED + ['numpy', 'dense', 'dense-gemv'])
def test_same_topk_as_full_scoring(corpus, small_blocks, search):
    docs, query_vecs = corpus
    dim_major = np.ascontiguousarray(docs.T)
    if search in ('one by one', 'one pass'):
        scores, docids = kernels.fused_top_k(dim_major, query_vecs, K, one_pass=search == 'one pass')
    elif search == 'numpy':
        scores, docids = kernels.search_pruned(dim_major, query_vecs, K, use_numba=False)
    elif search == 'dense':  # batches of 4 and 2 queries, blocks of 700 documents
        scores, docids = kernels.search_dense(dim_major, query_vecs, K, batch_size=4, doc_block=700)
    else:  # fewer than 4 queries: one gemv each
        query_vecs = query_vecs[:2]
        scores, docids = kernels.search_dense(dim_major, query_vecs, K)
    assert len(scores) == len(query_vecs)
    for query_vec, s, d in zip(query_vecs, scores, docids):
        ref_s, ref_d = full_topk(docs, query_vec, K)
        assert d.tolist() == ref_d.tolist()  # continuous random data: no ties
        np.testing.assert_allclose(s, ref_s, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('path', FUSED + ['numpy', 'dense'])
def test_exact_ties_go_to_the_lower_docid(small_blocks, path):
    # 500 documents of four distinct vectors (row i has vector i % 4), so every score is tied 125 times; with blocks
    # of 64 the tied documents are spread over chunks and blocks
    base = np.array([[1, 0, 0], [2, 0, 1], [2, 0, -1], [0, 1, 0]], dtype=np.float32)
    dim_major = np.ascontiguousarray(np.tile(base, (125, 1)).T)
    queries = np.array([[1, 0, 0], [1, 0, 1], [0, 0, 0]], dtype=np.float32)
    if path == 'numpy':
        scores, docids = kernels.search_pruned(dim_major, queries, 130, use_numba=False)
    elif path == 'dense':
        scores, docids = kernels.search_dense(dim_major, np.concatenate([queries, queries]), 130, doc_block=100)
    else:
        scores, docids = kernels.fused_top_k(dim_major, queries, 130, one_pass=path == 'one pass')
    # query [1, 0, 0]: scores 1, 2, 2, 0 -> the 130 lowest docids among the 250 tied at 2 (i % 4 in {1, 2})
    assert docids[0].tolist() == [i for i in range(500) if i % 4 in (1, 2)][:130]
    assert scores[0].tolist() == [2.0] * 130
    # query [1, 0, 1]: scores 1, 3, 1, 0 -> all docs i % 4 == 1, then docs 0, 2, 4, 6, 8 (score 1, lower docids)
    assert docids[1].tolist() == list(range(1, 500, 4)) + [0, 2, 4, 6, 8]
    assert docids[2].tolist() == list(range(130))  # an empty kept set: every score 0, the lowest docids


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
    monkeypatch.setattr(kernels, 'NUMBA_AVAILABLE', False)
    monkeypatch.setattr(kernels, 'fused_top_k', None)  # any call to the compiled path would fail
    monkeypatch.setattr(cost, 'MIN_PRUNED_BYTES', 0)
    retriever = PrunedRetriever(index=docs, num_results=K, strategy='pruned')
    out = retriever(query_frame(query_vecs))
    for i, (qid, group) in enumerate(out.groupby('qid', sort=False)):
        assert group['docid'].tolist() == full_topk(docs, query_vecs[i], K)[1].tolist()
    assert PrunedRetriever(index=docs).choose_strategy(query_vecs[1:2]) == 'dense'  # auto: BLAS is faster then


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


@pytest.fixture
def count_builds(monkeypatch):
    calls = []
    real = layout.build_layout

    def counting(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)
    monkeypatch.setattr(layout, 'build_layout', counting)
    return calls


def test_one_layout_per_flex_index(corpus, tmp_path, count_builds):
    from pyterrier_dr import FlexIndex
    docs, query_vecs = corpus
    index = flex_index(tmp_path / 'docs.flex', docs, docnos=[f'doc-{i}' for i in range(DOCS)])
    a = PrunedRetriever(index=index, num_results=K, strategy='pruned')
    b = PrunedRetriever(index=FlexIndex(str(tmp_path / 'docs.flex')), num_results=50, strategy='pruned')
    fused = (a % 5).compile()
    matrix = a.dim_major()
    path = tmp_path / 'docs.flex' / layout.LAYOUT_NAME
    assert isinstance(matrix, np.memmap) and os.path.samefile(matrix.filename, path)
    assert matrix.shape == (DIMS, DOCS) and not matrix.flags.writeable
    np.testing.assert_array_equal(matrix, docs.T)
    assert b.dim_major() is matrix and fused.dim_major() is matrix  # the same map: no second copy
    assert count_builds == [path]  # built once
    mtime = path.stat().st_mtime_ns
    # another process (here: an unpickled copy, whose layout holder is new) opens the same file, without a rebuild
    clone = pickle.loads(pickle.dumps(b))
    assert clone == b and clone.index is not b.index  # equal by index path
    assert os.path.samefile(clone.dim_major().filename, path) and count_builds == [path]
    assert path.stat().st_mtime_ns == mtime
    out = clone(query_frame(query_vecs[:2]))
    assert out[out['qid'] == 'q0']['docno'].tolist() == [f'doc-{i}' for i in full_topk(docs, query_vecs[0], 50)[1]]
    assert not list((tmp_path / 'docs.flex').glob('*.tmp'))


def test_layout_rebuilt_when_the_index_changes(corpus, tmp_path, count_builds):
    docs, query_vecs = corpus
    first = PrunedRetriever(index=flex_index(tmp_path / 'x.flex', docs[:100]), num_results=3)
    assert first.dim_major().shape == (DIMS, 100)
    index = flex_index(tmp_path / 'x.flex', docs[:200])  # overwritten: a newer vector file
    retriever = PrunedRetriever(index=index, num_results=3, strategy='pruned')
    np.testing.assert_array_equal(retriever.dim_major(), docs[:200].T)
    assert len(count_builds) == 2


def test_layout_of_a_read_only_index_goes_to_the_cache(corpus, tmp_path, monkeypatch, count_builds):
    docs, _ = corpus
    index = flex_index(tmp_path / 'ro.flex', docs[:300])
    monkeypatch.setenv('PYTERRIER_RDIME_CACHE', str(tmp_path / 'cache'))
    folder = str(tmp_path / 'ro.flex')
    real_access = os.access
    monkeypatch.setattr(layout.os, 'access', lambda p, mode: False if str(p) == folder else real_access(p, mode))
    matrix = PrunedRetriever(index=index).dim_major()
    assert os.path.dirname(matrix.filename) == str(tmp_path / 'cache' / 'layouts')
    assert os.path.basename(matrix.filename).startswith('ro.flex-')
    assert not (tmp_path / 'ro.flex' / layout.LAYOUT_NAME).exists()
    np.testing.assert_array_equal(matrix, docs[:300].T)


def test_interrupted_or_partial_layouts_are_not_trusted(corpus, tmp_path, monkeypatch, count_builds):
    docs, _ = corpus
    bad = docs[:300].copy()
    bad[170, 5] = np.nan
    index = flex_index(tmp_path / 'nan.flex', bad, docnos=[f'doc-{i}' for i in range(300)])
    monkeypatch.setattr(layout, 'BUILD_BLOCK', 64)  # the NaN document is in the third block: two were written
    with pytest.raises(ValueError, match=r"PrunedRetriever: document 'doc-170' \(docid 170\) of .*nan.flex has NaN"):
        PrunedRetriever(index=index).dim_major()
    assert not (tmp_path / 'nan.flex' / layout.LAYOUT_NAME).exists()
    assert not list((tmp_path / 'nan.flex').glob('.*.tmp'))
    # a build killed mid-way leaves a temporary file (never opened, removed by the next build) or, written by
    # something else, a truncated layout: both are rebuilt
    index = flex_index(tmp_path / 'ok.flex', docs[:300])
    folder = tmp_path / 'ok.flex'
    (folder / f'.{layout.LAYOUT_NAME}.killed.tmp').write_bytes(b'partial')
    with open(folder / layout.LAYOUT_NAME, 'wb') as f:
        np.lib.format.write_array_header_1_0(f, {'descr': '<f4', 'fortran_order': False, 'shape': (DIMS, 300)})
        f.write(b'\0' * 100)
    matrix = PrunedRetriever(index=index).dim_major()
    np.testing.assert_array_equal(matrix, docs[:300].T)
    assert not list(folder.glob('.*.tmp')) and len(count_builds) == 2


def test_nan_in_an_array_index_names_the_docno(corpus):
    docs, query_vecs = corpus
    bad = docs.copy()
    bad[42, 0] = np.inf
    retriever = PrunedRetriever(index=bad, docnos=[f'doc-{i}' for i in range(DOCS)])
    with pytest.raises(ValueError, match=r"document 'doc-42' \(docid 42\) of the array index has NaN or infinite"):
        retriever(query_frame(query_vecs[:1]))
    with pytest.raises(ValueError, match=r"document '42'"):
        PrunedRetriever(index=np.asfortranarray(bad)).dim_major()


def test_lazy_initialisation_is_thread_safe(corpus, tmp_path, count_builds):
    docs, _ = corpus
    index = flex_index(tmp_path / 't.flex', docs[:500])
    for retriever in (PrunedRetriever(index=index), PrunedRetriever(index=docs[:500])):
        barrier, got = threading.Barrier(4), []

        def open_matrix(r=retriever):
            barrier.wait()
            got.append(r.dim_major())
        threads = [threading.Thread(target=open_matrix) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(got) == 4 and all(m is got[0] for m in got)
    assert len(count_builds) == 1  # the FlexIndex's file; the array's copy is built in memory


def _search_in_child(args):
    matrix, queries = args
    return [d.tolist() for d in kernels.search_pruned(matrix, queries, 5)[1]]


@COMPILED
def test_kernel_runs_in_a_child_forked_after_it_ran(corpus):
    # numba's GNU OpenMP layer terminates a child forked after it started; the child then scores on one thread
    import multiprocessing
    docs, query_vecs = corpus
    matrix = np.ascontiguousarray(docs.T)
    expected = [d.tolist() for d in kernels.search_pruned(matrix, query_vecs, 5)[1]]
    with multiprocessing.get_context('fork').Pool(1) as pool:
        assert pool.map_async(_search_in_child, [(matrix, query_vecs)]).get(timeout=120) == [expected]


def test_pickle_travels_without_the_matrix(corpus):
    docs, query_vecs = corpus
    retriever = PrunedRetriever(index=docs, num_results=K)
    expected = retriever(query_frame(query_vecs))
    clone = pickle.loads(pickle.dumps(retriever))
    assert clone._layout._matrix is None and retriever._layout._matrix is not None
    pd.testing.assert_frame_equal(clone(query_frame(query_vecs)), expected)


def test_cost_model(monkeypatch):
    # one unit per dense gemv; constants set to round numbers so that the costs below are computed by hand
    for name, value in (('DENSE_GEMM_FIXED', 2.0), ('DENSE_GEMM_PER_QUERY', 0.1), ('PRUNED_FIXED', 0.1),
                        ('PRUNED_SLOPE', 1.0), ('BATCH_UNION', 2.0), ('BATCH_PER_QUERY', 0.2), ('MARGIN', 0.9)):
        monkeypatch.setattr(cost, name, value)
    half = np.zeros((1, 8), dtype=np.float32)
    half[0, :4] = 1
    assert cost.dense_cost(1) == 1 and cost.dense_cost(3) == 3 and cost.dense_cost(10) == pytest.approx(3.0)
    assert cost.pruned_cost(half) == pytest.approx(0.6)  # 0.1 + 0.5
    assert cost.choose_path(half, 2 ** 30, True) == 'pruned'  # 0.6 < 0.9 x 1
    assert cost.choose_path(np.ones((1, 8)), 2 ** 30, True) == 'dense'  # 1.1 > 0.9
    assert cost.choose_path(half, 2 ** 10, True) == 'dense'  # a matrix in the caches
    assert cost.choose_path(half, 2 ** 30, False) == 'dense'  # no compiled kernel
    ten = np.repeat(half, 10, axis=0)  # same kept set: one by one 6.0, one pass 2 x 0.5 + 0.2 x 5 = 2.0
    assert cost.batch_in_one_pass(ten) and cost.pruned_cost(ten) == pytest.approx(2.0)
    assert cost.choose_path(ten, 2 ** 30, True) == 'pruned'  # 2.0 < 0.9 x 3.0
    full = np.ones((10, 8), dtype=np.float32)  # one pass 2 + 2 = 4.0 > 0.9 x 3.0
    assert cost.choose_path(full, 2 ** 30, True) == 'dense'
    assert not cost.batch_in_one_pass(half)


@COMPILED
def test_auto_strategy_of_the_stage(corpus, monkeypatch):
    docs, query_vecs = corpus
    retriever = PrunedRetriever(index=docs)
    assert retriever.choose_strategy(query_vecs[2:3]) == 'dense'  # a 0.5 MiB matrix sits in the caches
    monkeypatch.setattr(cost, 'MIN_PRUNED_BYTES', 0)
    assert retriever.choose_strategy(query_vecs[2:3]) == 'pruned'  # one query, about half its dimensions
    assert retriever.choose_strategy(query_vecs[:1]) == 'dense'  # a query that keeps every dimension
    assert PrunedRetriever(index=docs, strategy='pruned').choose_strategy(query_vecs[:1]) == 'pruned'
    assert PrunedRetriever(index=docs, strategy='dense').choose_strategy(query_vecs[2:3]) == 'dense'


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
    assert kernels.search_pruned(np.ascontiguousarray(docs.T), np.zeros((0, DIMS)), 3) == ([], [])


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
    with pytest.raises(ValueError, match='C-contiguous float32'):
        kernels.search_pruned(docs.T, query_vecs, 3)  # a Fortran-ordered view
    with pytest.raises(ValueError, match=r'shape \(6, 48\) do not match a matrix of 3000 dimensions'):
        kernels.search_pruned(docs, query_vecs, 3)  # doc-major, not dimension-major


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
