"""The scoring paths of PrunedRetriever, below the stage: the same top-k as scoring every dimension with the zeroed
query (seeded data, float64 reference) on the compiled kernel one by one and in one pass, the numpy fallback and the
dense BLAS path; exact ties to the lower docid; the helpers (kept dims, top-k); the kernel in a forked child; numba
imported only when the kernel runs."""
import subprocess
import sys

import numpy as np
import pytest
from pruned_data import DIMS, K, full_topk, make_corpus

from pyterrier_rdime.pruned import dense, kept

COMPILED = pytest.mark.skipif(not kept.NUMBA_AVAILABLE,
                              reason='the compiled kernel needs numba: pip install pyterrier-rdime[fast]')
FUSED = [pytest.param('one by one', marks=COMPILED), pytest.param('one pass', marks=COMPILED)]


@pytest.fixture(scope='module')
def corpus():
    return make_corpus()


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 64 documents: many chunks and several blocks per chunk on a small matrix."""
    from pyterrier_rdime.pruned import _numba
    monkeypatch.setattr(_numba, 'BLOCK_DOCS', 64)
    monkeypatch.setattr(_numba, 'TILE_DIMS', 8)


def fused(dim_major, query_vecs, k, path):
    from pyterrier_rdime.pruned import _numba
    return _numba.fused_top_k(dim_major, query_vecs, k, one_pass=path == 'one pass')


def test_kept_dims_and_best_k():
    dims, weights, starts = dense.kept_dims(np.array([[0, 2, 0], [1, 0, 3], [0, 0, 0]], dtype=np.float32))
    assert dims.tolist() == [1, 0, 2] and weights.tolist() == [2, 1, 3] and starts.tolist() == [0, 1, 3, 3]
    scores = np.array([1, 3, 3, 2], dtype=np.float32)
    assert dense.best_k(scores, np.array([0, 1, 2, 3]), 2).tolist() == [1, 2]
    assert dense.best_k(scores, np.array([9, 8, 7, 6]), 2).tolist() == [2, 1]  # the tie goes to the lower docid
    assert dense.best_k(scores, np.array([9, 8, 7, 6]), 3).tolist() == [2, 1, 3]
    assert dense.top_k(scores, 9)[1].tolist() == [1, 2, 3, 0]
    # two chunks' heaps of two slots for one query, one slot unfilled (docid -1)
    heap_s = np.array([[[5, 1]], [[5, 0]]], dtype=np.float32)
    heap_i = np.array([[[7, 2]], [[3, -1]]])
    scores, docids = dense.merge_heaps(heap_s, heap_i, 2)
    assert scores[0].tolist() == [5, 5] and docids[0].tolist() == [3, 7]


@pytest.mark.parametrize('search', FUSED + ['numpy', 'dense', 'dense-gemv', 'dense-rows-file'])
def test_same_topk_as_full_scoring(corpus, small_blocks, search, tmp_path):
    docs, query_vecs = corpus
    dim_major = np.ascontiguousarray(docs.T)
    if search in ('one by one', 'one pass'):
        scores, docids = fused(dim_major, query_vecs, K, search)
    elif search == 'numpy':
        scores, docids = kept.search_pruned(dim_major, query_vecs, K, use_numba=False)
    elif search == 'dense':  # batches of 4 and 2 queries, blocks of 700 documents
        scores, docids = dense.search_dense(dim_major, query_vecs, K, batch_size=4, doc_block=700)
    elif search == 'dense-rows-file':  # the rows of a vecs.f4 memory map, read block by block from the file
        docs.astype(np.float32).tofile(tmp_path / 'vecs.f4')
        rows = np.memmap(tmp_path / 'vecs.f4', dtype=np.float32, mode='r', shape=docs.shape)
        scores, docids = dense.search_dense(rows, query_vecs, K, batch_size=4, doc_block=700, rows=True)
    else:  # fewer than 4 queries: one gemv each
        query_vecs = query_vecs[:2]
        scores, docids = dense.search_dense(dim_major, query_vecs, K)
    assert len(scores) == len(query_vecs)
    for query_vec, s, d in zip(query_vecs, scores, docids):
        ref_s, ref_d = full_topk(docs, query_vec, K)
        assert d.tolist() == ref_d.tolist()  # continuous random data: no ties
        np.testing.assert_allclose(s, ref_s, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('path', FUSED)
def test_every_count_of_kept_rows(corpus, small_blocks, path):
    # 1 to 20 kept dimensions: every remainder after the passes of eight rows (0-7 rows: none, a pass of 4, of 3, 2
    # or 1, or 4 then 3/2/1), with whole queries one by one and with tiles of 8 dimensions in one pass
    docs, _ = corpus
    rng = np.random.default_rng(5)
    query_vecs = np.zeros((20, DIMS), dtype=np.float32)
    for count in range(1, 21):
        query_vecs[count - 1, rng.choice(DIMS, count, replace=False)] = rng.standard_normal(count)
    scores, docids = fused(np.ascontiguousarray(docs.T), query_vecs, K, path)
    for query_vec, s, d in zip(query_vecs, scores, docids):
        ref_s, ref_d = full_topk(docs, query_vec, K)
        assert d.tolist() == ref_d.tolist()
        np.testing.assert_allclose(s, ref_s, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('path', FUSED + ['numpy', 'dense'])
def test_exact_ties_go_to_the_lower_docid(small_blocks, path):
    # 500 documents of four distinct vectors (row i has vector i % 4), so every score is tied 125 times; with blocks
    # of 64 the tied documents are spread over chunks and blocks
    base = np.array([[1, 0, 0], [2, 0, 1], [2, 0, -1], [0, 1, 0]], dtype=np.float32)
    dim_major = np.ascontiguousarray(np.tile(base, (125, 1)).T)
    queries = np.array([[1, 0, 0], [1, 0, 1], [0, 0, 0]], dtype=np.float32)
    if path == 'numpy':
        scores, docids = kept.search_pruned(dim_major, queries, 130, use_numba=False)
    elif path == 'dense':
        scores, docids = dense.search_dense(dim_major, np.concatenate([queries, queries]), 130, doc_block=100)
    else:
        scores, docids = fused(dim_major, queries, 130, path)
    # query [1, 0, 0]: scores 1, 2, 2, 0 -> the 130 lowest docids among the 250 tied at 2 (i % 4 in {1, 2})
    assert docids[0].tolist() == [i for i in range(500) if i % 4 in (1, 2)][:130]
    assert scores[0].tolist() == [2.0] * 130
    # query [1, 0, 1]: scores 1, 3, 1, 0 -> all docs i % 4 == 1, then docs 0, 2, 4, 6, 8 (score 1, lower docids)
    assert docids[1].tolist() == list(range(1, 500, 4)) + [0, 2, 4, 6, 8]
    assert docids[2].tolist() == list(range(130))  # an empty kept set: every score 0, the lowest docids


def _search_in_child(args):
    matrix, queries = args
    return [d.tolist() for d in kept.search_pruned(matrix, queries, 5)[1]]


@COMPILED
def test_kernel_runs_in_a_child_forked_after_it_ran(corpus):
    # numba's GNU OpenMP layer terminates a child forked after it started; the child then scores on one thread
    import multiprocessing
    docs, query_vecs = corpus
    matrix = np.ascontiguousarray(docs.T)
    expected = [d.tolist() for d in kept.search_pruned(matrix, query_vecs, 5)[1]]
    with multiprocessing.get_context('fork').Pool(1) as pool:
        assert pool.map_async(_search_in_child, [(matrix, query_vecs)]).get(timeout=900) == [expected]


def test_numba_is_imported_only_when_the_kernel_runs():
    code = ('import sys, numpy as np, pyterrier_rdime\n'
            'from pyterrier_rdime.pruned import kept\n'
            'print("numba" in sys.modules)\n'
            'kept.search_pruned(np.ones((2, 300), np.float32), np.ones((1, 2), np.float32), 3)\n'
            'print("numba" in sys.modules)\n')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ['False', str(kept.NUMBA_AVAILABLE)]


def test_empty_input_and_errors(corpus):
    docs, query_vecs = corpus
    assert kept.search_pruned(np.ascontiguousarray(docs.T), np.zeros((0, DIMS)), 3) == ([], [])
    with pytest.raises(ValueError, match='C-contiguous float32'):
        kept.search_pruned(docs.T, query_vecs, 3)  # a Fortran-ordered view
    with pytest.raises(ValueError, match=r'shape \(6, 48\) do not match a matrix of 3000 dimensions'):
        kept.search_pruned(docs, query_vecs, 3)  # doc-major, not dimension-major


def test_numpy_top_k_of_a_matrix_without_documents():
    # every query gets an empty ranking (a block-by-block merge must not assume one block)
    scores, docids = kept.numpy_top_k(np.zeros((4, 0), dtype=np.float32), np.ones((2, 4), dtype=np.float32), 5)
    assert [len(s) for s in scores] == [0, 0] and [len(d) for d in docids] == [0, 0]
