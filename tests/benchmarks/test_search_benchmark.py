"""The pure helpers of benchmarks/search.py's split and FAISS rows: the split of the compressed speed-up into int8 and
pruning, recall@k, the exact reference over the first documents, and the HNSW index cached on disk (no timings)."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'benchmarks'))
import faiss_indexes  # noqa: E402
import search  # noqa: E402


def test_the_split_multiplies_to_the_total():
    split = search.speed_split(dense_s=0.095, unpruned_s=0.038, pruned_s=0.0095)
    assert split['total'] == pytest.approx(10.0)
    assert split['int8'] == pytest.approx(2.5)
    assert split['pruning'] == pytest.approx(4.0)
    assert split['int8'] * split['pruning'] == pytest.approx(split['total'])


def test_the_split_sentence_names_each_factor():
    sentence = search.split_sentence('RDIME', 0.36, search.speed_split(0.095, 0.038, 0.0095))
    assert sentence == ('RDIME (36% of the dimensions kept): of the 10.00× over dense, 2.50× comes from int8 '
                        '(compressed, unpruned) and 4.00× from pruning (compressed pruned / compressed unpruned)')


def test_recall_counts_the_exact_documents_found():
    exact = [np.array([1, 2, 3, 4]), np.array([5, 6, 7, 8])]
    assert faiss_indexes.recall_at([np.array([4, 3, 2, 1]), np.array([5, 6, -1, -1])], exact) == pytest.approx(0.75)
    assert faiss_indexes.recall_at([np.array([9, 9, 9, 9]), np.array([8, 7, 6, 5])], exact) == pytest.approx(0.5)
    assert np.isnan(faiss_indexes.recall_at([], []))


def test_the_exact_reference_looks_only_at_the_first_documents():
    rng = np.random.default_rng(3)
    matrix = rng.standard_normal((8, 400)).astype(np.float32)  # dimension-major: (dims, docs)
    query = rng.standard_normal(8).astype(np.float32)
    top = search.exact_top(matrix, query, 250)
    scores = query.astype(np.float64) @ matrix[:, :250].astype(np.float64)
    assert len(top) == search.K and top.max() < 250
    assert np.array_equal(top, np.argsort(-scores, kind='stable')[:search.K])


def test_the_hnsw_index_is_built_once_and_read_back(tmp_path):
    faiss = pytest.importorskip('faiss')
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((300, 8)).astype(np.float32)
    path = faiss_indexes.hnsw_path(tmp_path, '/somewhere/corpus.flex', 200, m=8, ef_construction=20)
    assert path.name == 'corpus.flex.hnsw8-efc20-200.faiss'
    built, record = faiss_indexes.hnsw_index(vecs, path, 200, m=8, ef_construction=20)
    assert not record['cached'] and built.ntotal == 200 and path.is_file()
    assert json.loads(path.with_suffix('.json').read_text())['docs'] == 200
    read, record = faiss_indexes.hnsw_index(vecs, path, 200, m=8, ef_construction=20)
    assert record['cached'] and read.ntotal == 200
    assert np.array_equal(built.search(vecs[:3], 5)[1], read.search(vecs[:3], 5)[1])
    rebuilt, record = faiss_indexes.hnsw_index(vecs, path, 200, m=8, ef_construction=30)  # other parameters
    assert not record['cached'] and isinstance(rebuilt, faiss.IndexHNSWFlat)


def test_sq8_with_refinement_finds_the_exact_top_k():
    pytest.importorskip('faiss')
    rng = np.random.default_rng(1)
    vecs = rng.standard_normal((500, 16)).astype(np.float32)
    index, _ = faiss_indexes.sq8_refine(vecs, threads=1)
    index.k_factor = 4
    queries = rng.standard_normal((3, 16)).astype(np.float32)
    found = index.search(queries, 10)[1]
    exact = np.argsort(-(queries @ vecs.T), axis=1)[:, :10]
    assert faiss_indexes.recall_at(list(found), list(exact)) == 1.0


def test_the_cell_batch_stacks_systems_whose_prefixes_nest():
    # section 2b's batch: system after system, each query's Top-k prefixes and RDIME-like set (of one importance
    # order) and its full query nest in one tree per query; the two random subsets of half the dimensions (here none
    # holds a query's smallest prefix, 6 of 64 dimensions) nest in nothing
    from pyterrier_rdime.pruned import dense
    rng = np.random.default_rng(4)
    raw = rng.standard_normal((3, 64)).astype(np.float32)
    rank = np.argsort(np.argsort(rng.random((3, 64)), axis=1), axis=1)

    def kept(count):
        return np.where(rank < count, raw, 0).astype(np.float32)
    sets = {f'Top-k {f:.2f}': kept(round(f * 64)) for f in search.CELL_FRACTIONS} | {'RDIME': kept(20)}
    batch = search.cell_batch(sets, raw, 2)
    assert batch.shape == (2 * 18, 64)
    assert np.array_equal(batch[:2], kept(16)[:2]) and np.array_equal(batch[30:32], raw[:2])  # 25 %, then the full
    assert all(((batch[i] == 0) | (batch[i] == raw[i % 2])).all() for i in range(32, 36))  # subsets of the query
    roots, rows, _ = dense.nested_trees(batch)
    assert sorted(rows.tolist()) == list(range(32)) and sorted(set(roots[rows].tolist())) == [8, 9]  # 10 % first
