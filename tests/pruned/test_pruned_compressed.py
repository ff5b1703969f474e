"""The compressed path of PrunedRetriever (strategy='compressed'): quantisation by hand; both error bounds (the scan's
and the one pass's integer one) against float64 scores for every document; the exact top-k against a float64
reference and the float32 pruned path on random and adversarial data (exact ties, documents the first pass cannot
tell apart, maximal quantisation errors, constant columns, every count of kept dimensions from one), query after query
and in one pass (integer weights by hand, exact int32 slabs, candidates against brute force, overflowing candidates),
re-scored from document rows or from the matrix; the int8 copy of a FlexIndex built once beside the layout, and
rebuilt with a warning when stale or damaged."""
import os
import pickle
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pruned_data import DIMS, K, flex_index, make_corpus, query_frame

from pyterrier_rdime import PrunedRetriever, store
from pyterrier_rdime.pruned import compressed, dense, kept, layout, sharded

NEEDS_NUMBA = pytest.mark.skipif(not kept.NUMBA_AVAILABLE,
                                 reason='the compiled kernel needs numba: pip install pyterrier-rdime[fast]')
NEEDS_TORCH = pytest.mark.skipif(compressed._torch() is None, reason="the int8 product needs torch's _int_mm")
FIRST_PASS = [pytest.param(True, id='numba', marks=NEEDS_NUMBA), pytest.param(False, id='numpy')]
#: How a batch is searched: query after query (numba or numpy), or in one pass with each int8 product and each
#: selection of the integer scores (numba or numpy), or with every tree of nested rows by prefix sums.
MODES = [pytest.param(('query after query', True, None), id='numba', marks=NEEDS_NUMBA),
         pytest.param(('query after query', False, None), id='numpy'),
         pytest.param(('one pass', True, 'torch'), id='one-pass-torch-numba', marks=[NEEDS_NUMBA, NEEDS_TORCH]),
         pytest.param(('one pass', True, 'float64'), id='one-pass-float64-numba', marks=NEEDS_NUMBA),
         pytest.param(('one pass nested', True, 'float64'), id='one-pass-nested', marks=NEEDS_NUMBA)]


@pytest.fixture(scope='module')
def corpus():
    return make_corpus()


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 64 documents: many chunks and several blocks per chunk on a small matrix."""
    if kept.NUMBA_AVAILABLE:
        from pyterrier_rdime.pruned import _numba
        monkeypatch.setattr(_numba, 'BLOCK_DOCS', 64)


@pytest.fixture(params=MODES)
def search(request, small_blocks, monkeypatch):
    """``search(docs, query_vecs, k)`` in one of the :data:`MODES`; one pass in slabs of 1024 documents (not a
    divisor of the corpus's) with candidate buffers of 64 documents (compacted often)."""
    mode, use_numba, product = request.param
    if mode == 'one pass nested':
        monkeypatch.setattr(dense, 'NESTED_ADD_COST', 0)
    if mode.startswith('one pass'):
        monkeypatch.setattr(compressed, 'INT8_PRODUCT', product)
        monkeypatch.setattr(compressed, 'SLAB_DOCS', 1024)
        if use_numba:
            from pyterrier_rdime.pruned import _numba
            monkeypatch.setattr(_numba, 'MIN_CANDIDATES', 64)
            monkeypatch.setattr(_numba, 'CANDIDATES_PER_RESULT', 1)

    return lambda docs, query_vecs, k: search_with(docs, query_vecs, k, use_numba, one_pass=mode != 'query after query')


def search_with(docs, query_vecs, k, use_numba, one_pass=False, rows=True):
    """The compressed path over ``docs``, re-scoring from their rows (``rows``) or from the dimension-major matrix."""
    dim_major = np.ascontiguousarray(docs.T)
    return compressed.search_compressed(layout.quantise(dim_major), dim_major, query_vecs, k,
                                        use_numba=use_numba, one_pass=one_pass,
                                        doc_rows=np.ascontiguousarray(docs) if rows else None)


def assert_reference(docs, query_vecs, result, k):
    """The exact top-k of the scores the user sees: the float64 scores rounded to float32, ties to the lower docid."""
    for query_vec, s, d in zip(query_vecs, *result):
        rounded = (docs.astype(np.float64) @ query_vec.astype(np.float64)).astype(np.float32)
        ref_d = np.lexsort((np.arange(len(docs)), -rounded))[:k]
        assert d.tolist() == ref_d.tolist()
        np.testing.assert_array_equal(s, rounded[ref_d])


def test_quantisation_by_hand():
    rows = np.array([[0.5, -1.27, 0.0], [0, 0, 0], [2, 2, 2], [0.01, 0.015, -0.0149]], dtype=np.float32)
    codes, scale, error = layout.quantise_rows(rows)
    assert scale[0] == np.float32(1.27) / 127 and scale[1] == 1 and scale[2] == np.float32(2) / 127
    assert codes.dtype == np.int8 and codes[:3].tolist() == [[50, -127, 0], [0, 0, 0], [127, 127, 127]]
    # 0.01 / (0.015 / 127) = 84.67 -> 85, error 0.33 steps; -0.0149 -> -126.2 -> -126, error 0.15 steps
    assert codes[3].tolist() == [85, 127, -126]
    assert error[3] == pytest.approx(abs(np.float32(0.01) - 85 * np.float64(scale[3])), rel=1e-6)
    assert error[3] <= scale[3] / 2 and error[1] == 0 and error[2] < 1e-7
    copy = layout.quantise(np.ascontiguousarray(rows))
    assert copy.codes.tolist() == codes.tolist() and copy.scale.tolist() == scale.tolist()


def test_float32_below():
    for value in (1.0, 0.1, -0.1, 1 + 2 ** -30, -1 - 2 ** -30, 3e38, 0.0):
        below = compressed.float32_below(value)
        assert below.dtype == np.float32 and below <= value < np.nextafter(below, np.float32(np.inf))


@pytest.mark.parametrize('use_numba', FIRST_PASS)
def test_the_bound_holds_for_every_document(corpus, small_blocks, use_numba):
    docs, query_vecs = corpus
    rng = np.random.default_rng(3)
    # and a matrix of maximal quantisation errors: every value half a step from two codes (nudged either way)
    steps = rng.integers(-126, 126, size=docs.shape) + 0.5 + rng.choice([-1e-3, 1e-3], size=docs.shape)
    halfway = (steps * 0.01).astype(np.float32)
    halfway[0] = 1.27  # the largest value: scale 0.01
    for matrix in (docs, halfway):
        copy = layout.quantise(np.ascontiguousarray(matrix.T))
        for query_vec in query_vecs:
            approx, best, bound = compressed.first_pass(copy, query_vec, K, use_numba=use_numba)
            exact = matrix.astype(np.float64) @ query_vec.astype(np.float64)
            assert np.abs(exact - approx).max() <= bound
            # not vacuous: within 1 % of the quantisation error alone (the rounding terms are ~1e-5 of it)
            assert bound <= 1.01 * float(np.abs(query_vec.astype(np.float64)) @ copy.error)
            assert sorted(best.tolist()) == sorted(np.argsort(-approx, kind='stable')[:K].tolist())
    assert np.abs(copy.error - 0.01 * 0.499).max() < 2e-6  # halfway: every dimension's error is half a step


def test_integer_weights_by_hand():
    scale = np.array([0.5, 0.25, 2.0], dtype=np.float32)
    copy = layout.Codes(np.zeros((3, 2), dtype=np.int8), scale, np.zeros(3))
    queries = np.array([[1, 0, -1], [0, 0, 0], [0, 1e-3, 0]], dtype=np.float32)
    steps, weights = compressed.integer_weights(copy, queries)
    # the largest |value x scale| is the largest weight, 127 x 128 = 16256; the others to the nearest step
    assert steps.tolist() == [2 / 16256, 1, np.float64(np.float32(1e-3)) * 0.25 / 16256]
    assert weights.tolist() == [[4064, 0, -16256], [0, 0, 0], [0, 16256, 0]]
    # so many dimensions that 16256 x 127 x dims would overflow an int32: smaller weights
    wide = layout.Codes(np.zeros((20000, 1), dtype=np.int8), np.ones(20000, dtype=np.float32), np.zeros(20000))
    _, weights = compressed.integer_weights(wide, np.ones((1, 20000), dtype=np.float32))
    assert weights.max() == (2 ** 31 - 1) // (127 * 20000) == 845


@pytest.mark.parametrize('product', [pytest.param('torch', marks=NEEDS_TORCH), 'float64'])
def test_integer_slabs_are_exact(monkeypatch, product):
    monkeypatch.setattr(compressed, 'INT8_PRODUCT', product)
    monkeypatch.setattr(compressed, 'SLAB_DOCS', 1000)
    rng = np.random.default_rng(9)
    codes = rng.integers(-127, 128, size=(768, 2500)).astype(np.int8)
    codes[:, 0] = 127  # the largest sum: every weight and code at its extreme
    weights = rng.integers(-16256, 16257, size=(5, 768))
    weights[0] = 16256
    slabs = list(compressed.integer_slabs(codes, weights))
    assert [d0 for d0, _ in slabs] == [0, 1000, 2000] and all(parts.dtype == np.int32 for _, parts in slabs)
    got = np.concatenate([compressed.WEIGHT_BASE * parts[:5].astype(np.int64) + parts[5:] for _, parts in slabs],
                         axis=1)
    assert got.tolist() == (weights @ codes.astype(np.int64)).tolist()
    assert got[0, 0] == 16256 * 127 * 768


@NEEDS_NUMBA
@pytest.mark.parametrize('few', [32, 1])
@pytest.mark.parametrize('limit, overflowed', [(2 ** 24, []), (1024, [2])])
def test_integer_candidates_are_the_documents_near_the_kth_best(monkeypatch, limit, overflowed, few):
    # against brute force: the k best integer scores (ties to the lower docid) and every document within slack of
    # the k-th best, from slabs of 700 documents and buffers of 64 compacted as the k-th best rises and doubled when
    # still full; a query scoring 0 everywhere keeps every document (5,000), more than a pool of 1,024 holds: it
    # overflows and stops, with no results (it runs on its own). Keys enter the top-k by selection (k // 32 = 0),
    # or one by one when at most k // 1
    from pyterrier_rdime.pruned import _numba
    monkeypatch.setattr(_numba, 'FEW_ENTER', few)
    monkeypatch.setattr(compressed, 'INT8_PRODUCT', 'float64')
    monkeypatch.setattr(compressed, 'SLAB_DOCS', 700)
    monkeypatch.setattr(_numba, 'MIN_CANDIDATES', 64)
    monkeypatch.setattr(_numba, 'CANDIDATES_PER_RESULT', 1)
    monkeypatch.setattr(_numba, 'MAX_CANDIDATES', limit)
    rng = np.random.default_rng(21)
    codes = rng.integers(-127, 128, size=(50, 5000)).astype(np.int8)
    codes[:, 4000:4100] = codes[:, 100:200]  # duplicates: tied scores across slabs
    weights = rng.integers(-16256, 16257, size=(6, 50))
    weights[2] = 0
    slack = np.array([0, 3000, 10, 20000, 1, 500])
    k = 20
    best, candidates, overflow = compressed.integer_candidates(codes, weights, slack, k)
    totals = weights @ codes.astype(np.int64)
    assert np.flatnonzero(overflow).tolist() == overflowed
    for q in range(len(weights)):
        if overflow[q]:
            assert len(best[q]) == len(candidates[q][0]) == 0
            continue
        order = np.lexsort((np.arange(5000), -totals[q]))
        assert sorted(best[q].tolist()) == sorted(order[:k].tolist())
        expected = np.flatnonzero(totals[q] >= totals[q, order[k - 1]] - slack[q])
        ids, scores = candidates[q]
        assert ids.tolist() == expected.tolist() and scores.tolist() == totals[q, expected].tolist()


def summed_rows(scores):
    """``(codes, prefix_sums)`` of lone rows scored by prefix sums whose int32 scores are ``scores``: two balanced
    base-128 digits times weights 1 and 128, the rest (at most 2^17) spread over 1,033 codes times 2^14 (the weights
    are int16)."""
    spread = 1033
    digits, rest = [], np.asarray(scores, dtype=np.int64)
    for _ in range(2):
        digits.append((rest + 64) % 128 - 64)
        rest = (rest - digits[-1]) // 128
    share = rest // spread
    digits += [share + (j < rest - share * spread) for j in range(spread)]
    codes = np.concatenate(digits).astype(np.int8)  # row j * rows + r: digit j of row r
    assert (np.concatenate(digits) == codes).all()
    rows, width = len(scores), spread + 2
    dims = np.arange(width * rows).reshape(width, rows).T.ravel()
    weights = np.tile(np.array([1, 128] + [2 ** 14] * spread, dtype=np.int32), rows)
    return codes, (dims, weights, np.arange(0, width * rows + 1, width), np.full(rows, -1))


@NEEDS_NUMBA
def test_integer_candidates_rank_the_extreme_int32_scores_with_ties_to_the_lower_docid():
    # one int64 key per document (score, then docid): the largest and smallest int32 scores, ties across slabs, in
    # product rows (base * high + low) and rows scored by prefix sums alike; k = 3, slack 0 and 1
    from pyterrier_rdime.pruned import _numba
    top, bottom = 2 ** 31 - 1, -2 ** 31 + 1
    scores = np.array([[bottom, top, 5, top, bottom, 5, 5, 4, top - 1, 0],
                       [bottom] * 10,
                       [7, 7, 6, 7, 7, 6, 6, 7, 5, 7]], dtype=np.int64)
    base = 128
    low = (scores + base // 2) % base - base // 2
    high = (scores - low) // base
    slabs = [(d0, np.concatenate([high[:, d0:d0 + 4], low[:, d0:d0 + 4]]).astype(np.int32)) for d0 in range(0, 10, 4)]
    codes, prefix_sums = summed_rows(scores)
    for slack in (0, 1):
        best, candidates, overflow = _numba.integer_candidates(codes, iter(slabs), prefix_sums, base, np.arange(6),
                                                               3, np.full(6, slack))
        assert not overflow.any()
        for q in range(6):
            order = np.lexsort((np.arange(10), -scores[q % 3]))
            assert sorted(best[q].tolist()) == sorted(order[:3].tolist())
            near = np.flatnonzero(scores[q % 3] >= scores[q % 3, order[2]] - slack)
            assert candidates[q][0].tolist() == near.tolist()
            assert candidates[q][1].tolist() == scores[q % 3, near].tolist()


@NEEDS_NUMBA
def test_integer_candidates_with_fewer_documents_than_k_return_them_all():
    # k = 5 over 3 documents: every document is among the best, and a candidate, none of the empty slots is
    from pyterrier_rdime.pruned import _numba
    codes, prefix_sums = summed_rows(np.array([[4, -2, 4]]))
    best, candidates, overflow = _numba.integer_candidates(codes, iter([(0, np.empty((0, 3), dtype=np.int32))]),
                                                           prefix_sums, 128, np.array([0]), 5, np.array([0]))
    assert sorted(best[0].tolist()) == [0, 1, 2] and not overflow[0]
    assert candidates[0][0].tolist() == [0, 1, 2] and candidates[0][1].tolist() == [4, -2, 4]


@pytest.mark.parametrize('copies, alone', [(500, 3), (30, 0)])
def test_full_candidate_buffers_grow_and_queries_beyond_the_limit_run_on_their_own(monkeypatch, copies, alone):
    # every score tied: buffers of 8 double in the one pass; a pool of 512 holds the 3 x 2 x 30 copies (3 x (8 + 16 +
    # 32 + 64) slots), not 3 x 2 x 500: then each of those queries runs on its own
    if not kept.NUMBA_AVAILABLE:
        pytest.skip('only the compiled first pass has a bounded buffer')
    from pyterrier_rdime.pruned import _numba
    monkeypatch.setattr(_numba, 'MIN_CANDIDATES', 8)
    monkeypatch.setattr(_numba, 'CANDIDATES_PER_RESULT', 1)
    monkeypatch.setattr(_numba, 'MAX_CANDIDATES', 512)
    docs = np.tile(np.array([[1, 0.5], [1, -0.5]], dtype=np.float32), (copies, 1))
    queries = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.float32)
    calls, passes = [], []
    original, original_candidates = compressed.search_compressed, compressed.integer_candidates

    def spy(copy, dim_major, query_vecs, k, **kwargs):
        calls.append((len(query_vecs), kwargs.get('one_pass', False)))
        return original(copy, dim_major, query_vecs, k, **kwargs)

    def spy_candidates(*args, **kwargs):
        passes.append(len(args[1]))
        return original_candidates(*args, **kwargs)
    monkeypatch.setattr(compressed, 'search_compressed', spy)
    monkeypatch.setattr(compressed, 'integer_candidates', spy_candidates)
    result = search_with(docs, queries, 10, True, one_pass=True)
    assert_reference(docs, queries, result, 10)
    assert result[1][0].tolist() == list(range(10))  # every score tied: the lowest docids
    assert passes == [3]  # one pass, never again
    assert calls[0] == (3, True) and calls.count((1, False)) == alone


@NEEDS_NUMBA
def test_exact_scores_are_summed_dimension_after_dimension_on_every_path():
    # each document's float64 products summed in order from 0, bit for bit: compiled (rows or dimension-major
    # matrix, one batch) and numpy alike; 1 to 768 kept dimensions, a query without any, no documents, no query
    rng = np.random.default_rng(5)
    docs = rng.standard_normal((300, 768)).astype(np.float32)
    query_vecs = np.zeros((7, 768), dtype=np.float32)
    for q, kept_count in enumerate([1, 7, 8, 129, 500, 768]):
        dims = rng.choice(768, kept_count, replace=False)
        query_vecs[q, dims] = rng.standard_normal(kept_count)
    docids = [np.sort(rng.choice(300, n, replace=False)) for n in (5, 300, 17, 0, 64, 100, 9)]
    expected = []
    for query_vec, ids in zip(query_vecs, docids):
        sums = []
        for d in ids:
            total = 0.0
            for j in np.flatnonzero(query_vec):
                total += float(docs[d, j]) * float(query_vec[j])
            sums.append(total)
        expected.append(sums)
    dim_major = np.ascontiguousarray(docs.T)
    for rows, use_numba in [(docs, True), (None, True), (docs, False), (None, False)]:
        got = compressed.exact_scores(dim_major, query_vecs, docids, rows, use_numba=use_numba)
        assert [g.tolist() for g in got] == expected
        assert compressed.exact_scores(dim_major, query_vecs[:0], [], rows, use_numba=use_numba) == []


def test_the_integer_bound_holds_for_every_document(corpus):
    docs, query_vecs = corpus
    rng = np.random.default_rng(3)
    steps_ = rng.integers(-126, 126, size=docs.shape) + 0.5 + rng.choice([-1e-3, 1e-3], size=docs.shape)
    halfway = (steps_ * 0.01).astype(np.float32)
    halfway[0] = 1.27
    for matrix in (docs, halfway):
        copy = layout.quantise(np.ascontiguousarray(matrix.T))
        steps, weights = compressed.integer_weights(copy, query_vecs)
        totals = weights @ copy.codes.astype(np.int64)
        for query_vec, step, w, total in zip(query_vecs, steps, weights, totals):
            bound = compressed.integer_bound(copy, query_vec, step, w)
            exact = matrix.astype(np.float64) @ query_vec.astype(np.float64)
            assert np.abs(exact - step * total).max() <= bound
            # not vacuous: within 5 % of the quantisation error alone (the weights' rounding, half of 1/16256 of
            # the largest weight x 127 per kept dimension, adds ~1-3 % here)
            assert bound <= 1.05 * float(np.abs(query_vec.astype(np.float64)) @ copy.error)


@pytest.mark.parametrize('batch', [1, 2, 7, 64])
def test_batches_of_every_size_in_one_pass(corpus, search, batch):
    docs, _ = corpus
    rng = np.random.default_rng(batch)
    query_vecs = rng.standard_normal((batch, DIMS)).astype(np.float32)
    query_vecs[rng.random(query_vecs.shape) < rng.random((batch, 1))] = 0  # kept fractions from 0 to 1
    query_vecs[batch // 2] = 0  # a query that keeps nothing
    assert_reference(docs, query_vecs, search(docs, query_vecs, K), K)


def test_same_topk_as_full_scoring_and_the_float32_path(corpus, search):
    docs, query_vecs = corpus
    result = search(docs, query_vecs, K)
    assert_reference(docs, query_vecs, result, K)
    pruned = kept.search_pruned(np.ascontiguousarray(docs.T), query_vecs, K, use_numba=False)
    for ours, theirs in zip(result[1], pruned[1]):
        assert ours.tolist() == theirs.tolist()


@pytest.mark.parametrize('use_numba', FIRST_PASS)
def test_re_scored_from_the_matrix_without_document_rows(corpus, use_numba):
    docs, query_vecs = corpus
    for one_pass in (False, True)[:1 + use_numba]:  # the one pass runs compiled only
        result = search_with(docs, query_vecs, K, use_numba, one_pass=one_pass, rows=False)
        assert_reference(docs, query_vecs, result, K)
        with_rows = search_with(docs, query_vecs, K, use_numba, one_pass=one_pass)
        assert [d.tolist() for d in result[1]] == [d.tolist() for d in with_rows[1]]
        np.testing.assert_allclose(np.concatenate(result[0]), np.concatenate(with_rows[0]), rtol=1e-6)


def test_every_count_of_kept_dimensions(corpus, search):
    docs, _ = corpus
    rng = np.random.default_rng(5)
    query_vecs = np.zeros((21, DIMS), dtype=np.float32)
    for count in range(1, 21):  # from one kept dimension up, every remainder of the eight-row passes
        query_vecs[count - 1, rng.choice(DIMS, count, replace=False)] = rng.standard_normal(count)
    query_vecs[20, 7] = -1e-30  # one tiny negative weight
    assert_reference(docs, query_vecs, search(docs, query_vecs, K), K)


def test_exact_ties_go_to_the_lower_docid(search):
    # as test_pruned_search: 500 documents of four distinct vectors, every score tied 125 times
    base = np.array([[1, 0, 0], [2, 0, 1], [2, 0, -1], [0, 1, 0]], dtype=np.float32)
    docs = np.tile(base, (125, 1))
    queries = np.array([[1, 0, 0], [1, 0, 1], [0, 0, 0], [0, 0.5, 0]], dtype=np.float32)
    scores, docids = search(docs, queries, 130)
    assert docids[0].tolist() == [i for i in range(500) if i % 4 in (1, 2)][:130] and scores[0].tolist() == [2] * 130
    assert docids[1].tolist() == list(range(1, 500, 4)) + [0, 2, 4, 6, 8]
    assert docids[2].tolist() == list(range(130)) and scores[2].tolist() == [0] * 130  # nothing kept
    assert docids[3].tolist() == list(range(3, 500, 4)) + [0, 1, 2, 4, 5]  # one kept dimension of codes 0 and 127


@pytest.mark.parametrize('k', [1, 2, 5])
def test_float32_ties_go_to_the_lower_docid_on_one_index_and_its_shards(search, k):
    # twins whose float64 scores differ below float32's resolution (float32 values, summed exactly in float64): the
    # higher one at the higher docid; the user sees two equal float32 scores, so the lower docid comes first, on one
    # index and merged from its shards alike, also where k cuts between them
    rng = np.random.default_rng(7)
    docs = rng.uniform(-0.3, 0.3, size=(300, 6)).astype(np.float32)
    docs[40], docs[250] = (1, 2.0 ** -30, 0, 0, 0, 0), (1, 2.0 ** -29, 0, 0, 0, 0)
    queries = np.array([[1, 1, 0, 0, 0, 0],  # 1 + 2^-30 and 1 + 2^-29, both 1.0 in float32
                        [2, 2, 1, 0, 0, 0],  # 2 + 2^-29 and 2 + 2^-28, both 2.0
                        [1, 1, 0, 0, 0, 0.5]], dtype=np.float32)
    scores, docids = search(docs, queries, k)
    bounds = [0, 100, 300]
    per_shard = []
    for start, stop in zip(bounds, bounds[1:]):
        shard_s, shard_d = search(docs[start:stop], queries, k)
        counts = np.cumsum([0] + [len(d) for d in shard_d])
        per_shard.append((counts, np.concatenate(shard_s), np.concatenate(shard_d) + start,
                          np.concatenate(shard_d) + start))
    merged_s, merged_d, _ = sharded.merge_shards(per_shard, len(queries), k)
    for q in range(len(queries)):
        assert docids[q].tolist() == [40, 250][:k] + docids[q].tolist()[2:]
        assert scores[q][0] == scores[q][min(1, k - 1)] == np.float32(1 if q != 1 else 2)
        assert docids[q].tolist() == merged_d[q].tolist() and scores[q].tolist() == merged_s[q].tolist()


@pytest.mark.parametrize('rows', [True, False])
def test_identical_rows_with_real_valued_scores_come_in_docid_order(search, rows):
    # 2,000 copies of one real-valued vector among others: summed by a BLAS product, identical rows of one call may
    # score an ulp apart by their position in it; each row summed on its own, they tie exactly, lower docid first
    rng = np.random.default_rng(5)
    twin = rng.standard_normal(96).astype(np.float32)
    docs = rng.standard_normal((3000, 96)).astype(np.float32) * 0.1
    docs[::3] = docs[1::3] = twin
    query = rng.standard_normal((2, 96)).astype(np.float32)
    query[1, ::2] = 0
    query *= np.sign(query @ twin)[:, None]  # the twins score highest
    scores, docids = search(docs, query, 150) if rows else \
        search_with(docs, query, 150, kept.NUMBA_AVAILABLE, rows=False)
    twins = [i for i in range(3000) if i % 3 in (0, 1)]
    for q in range(2):
        assert docids[q].tolist() == twins[:150] and len(set(scores[q].tolist())) == 1


def test_documents_the_first_pass_cannot_tell_apart(search):
    # column 0 rises by 1e-5 from document to document, less than a step (1/127): the first pass sees the same
    # code for runs of ~800 documents and its k best are the lowest docids of the highest run, not the best ones;
    # with column 1 constant (every code 127) and column 2 maximal errors, a near-tie at the bound in every query
    n = 3000
    rng = np.random.default_rng(11)
    docs = np.zeros((n, 3), dtype=np.float32)
    docs[:, 0] = 1 - 1e-5 * np.arange(n)[::-1]
    docs[:, 1] = 0.25
    docs[:, 2] = (rng.integers(-126, 126, size=n) + 0.5 + rng.choice([-1e-4, 1e-4], size=n)) / 127
    queries = np.array([[1, 0, 0], [1, 1, 0], [0.3, 0, 1], [0, 1, 0], [0, 2, 1e-3]], dtype=np.float32)
    result = search(docs, queries, 20)
    assert_reference(docs, queries, result, 20)
    assert result[1][0].tolist() == list(range(n - 1, n - 21, -1))
    assert result[1][3].tolist() == list(range(20))  # constant column: every score tied


def _search_in_child(args):
    docs, queries, one_pass = args
    return [d.tolist() for d in search_with(docs, queries, 5, True, one_pass)[1]]


@NEEDS_NUMBA
@pytest.mark.parametrize('one_pass', [False, pytest.param(True, marks=NEEDS_TORCH)])
def test_first_pass_runs_in_a_child_forked_after_it_ran(corpus, one_pass):
    # as the float32 kernel: a child forked after the parallel first pass (or torch's product) ran scores on one
    # thread
    import multiprocessing
    docs, query_vecs = corpus
    expected = [d.tolist() for d in search_with(docs, query_vecs, 5, True, one_pass)[1]]
    with multiprocessing.get_context('fork').Pool(1) as pool:
        assert pool.map_async(_search_in_child, [(docs, query_vecs, one_pass)]).get(timeout=900) == [expected]


@NEEDS_NUMBA
def test_a_child_forked_after_the_one_pass_alone_ran(tmp_path):
    # in a fresh process whose first parallel kernel is the one pass's (the float64 product: numba alone), a forked
    # child must know the parallel kernels ran, or it waits forever on GNU OpenMP
    script = tmp_path / 'fork.py'
    script.write_text(textwrap.dedent(f"""
        import multiprocessing, sys
        import numpy as np
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        from pruned_data import make_corpus
        from pyterrier_rdime.pruned import compressed, layout
        docs, queries = make_corpus()
        matrix = np.ascontiguousarray(docs.T)
        copy = layout.quantise(matrix)
        compressed.INT8_PRODUCT = 'float64'

        def run(_):
            result = compressed.search_compressed(copy, matrix, queries, 5, use_numba=True, one_pass=True)
            return [d.tolist() for d in result[1]]

        if __name__ == '__main__':
            first = run(0)
            with multiprocessing.get_context('fork').Pool(1) as pool:
                print(pool.map_async(run, [0]).get(timeout=300) == [first])
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == 'True'


def test_the_stage_on_an_array_index(corpus):
    docs, query_vecs = corpus
    retriever = PrunedRetriever(index=docs, num_results=K, strategy='compressed')
    out = retriever(query_frame(query_vecs))
    expected = PrunedRetriever(index=docs, num_results=K, strategy='pruned')(query_frame(query_vecs))
    assert out['docid'].tolist() == expected['docid'].tolist()
    np.testing.assert_allclose(out['score'], expected['score'], rtol=1e-5, atol=1e-5)
    assert repr(retriever).endswith("strategy='compressed')") and retriever.plan(query_vecs).strategy == 'compressed'
    clone = pickle.loads(pickle.dumps(retriever))
    assert clone._layout._codes is None and retriever._layout._codes is not None
    pd.testing.assert_frame_equal(clone(query_frame(query_vecs)), out)
    cut = (retriever % 5).compile()
    assert cut._layout is retriever._layout and len(cut(query_frame(query_vecs[:1]))) == 5


@pytest.fixture
def count_builds(monkeypatch):
    built = []
    original = layout.build_compressed

    def counting(*args, **kwargs):
        built.append(args[1])
        return original(*args, **kwargs)
    monkeypatch.setattr(layout, 'build_compressed', counting)
    return built


def test_one_copy_per_flex_index_rebuilt_when_stale_or_damaged(corpus, tmp_path, count_builds):
    from pyterrier_dr import FlexIndex
    docs, query_vecs = corpus
    index = flex_index(tmp_path / 'docs.flex', docs)
    frame = query_frame(query_vecs)
    expected = PrunedRetriever(index=docs, num_results=K, strategy='pruned')(frame)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # the first build warns nothing
        out = PrunedRetriever(index=index, num_results=K, strategy='compressed')(frame)
    assert out['docid'].tolist() == expected['docid'].tolist()
    np.testing.assert_allclose(out['score'], expected['score'], rtol=1e-5, atol=1e-6)
    folder = tmp_path / 'docs.flex'
    path = folder / 'rdime.dim_major.i8.npy'
    # streamed from vecs.f4: no float32 dimension-major copy is written for the compressed path
    assert not (folder / 'rdime.dim_major.npy').exists() and not list(folder.glob('.rdime.dim_major.npy.*'))
    assert count_builds == [path] and np.load(path).shape == (DIMS, len(docs))
    np.testing.assert_array_equal(np.load(path), layout.quantise(np.ascontiguousarray(docs.T)).codes)
    assert path.with_suffix('.json').is_file() and path.stat().st_size < docs.nbytes / 3
    PrunedRetriever(index=FlexIndex(str(folder)), num_results=K, strategy='compressed')(frame)
    assert len(count_builds) == 1  # opened, not rebuilt

    def rebuilt(match):
        before = len(count_builds)
        with pytest.warns(UserWarning, match=match):
            again = PrunedRetriever(index=FlexIndex(str(folder)), num_results=K, strategy='compressed')(frame)
        assert len(count_builds) == before + 1 and again['docid'].tolist() == expected['docid'].tolist()
        assert store.read_json(path.with_suffix('.json'), 'int8-copy')['data'][0] == path.stat().st_size

    with open(path, 'r+b') as f:  # damaged: cut short
        f.truncate(path.stat().st_size - 10)
    rebuilt('incomplete')
    path.with_suffix('.json').write_text('{"scale": [1.0]}')  # damaged record
    rebuilt('record')
    with open(path, 'r+b') as f:  # damaged in place, same size: the record no longer describes the file
        f.seek(200)
        f.write(b'\x7f' * 16)
    rebuilt('not the file its record describes')
    # stale: other vectors written in place (same shape, old times put back): the content's hash tells
    source = folder / 'vecs.f4'
    stat = source.stat()
    with open(source, 'r+b') as f:
        f.write(docs[::-1].tobytes())
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    store._OPENED.clear()  # a new process: nothing opened yet
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        moved = PrunedRetriever(index=FlexIndex(str(folder)), num_results=K, strategy='compressed')(frame)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2 and all('SHA-256' in message for message in messages)  # each derived file says so
    assert 'rebuilding the vector statistics' in messages[0] and 'rebuilding the compressed copy' in messages[1]
    assert moved['docid'].tolist() == [len(docs) - 1 - d for d in expected['docid']]
    assert not (folder / 'rdime.dim_major.npy').exists()


def test_the_one_pass_without_the_compiled_kernels_says_what_to_install():
    docs, queries = make_corpus()
    with pytest.raises(ValueError, match='install numba'):
        search_with(docs, queries, 5, use_numba=False, one_pass=True)
