"""The compressed one pass's nested rows (:func:`dense.nested_trees`): rows of a batch that keep a subset of one
another's values bit for bit are scored by prefix sums, each row its parent's integer scores plus its own dims. The
trees by hand; their prefix sums against int64 brute force; a batch shaped like the experiment's (Top-k prefixes, an
RDIME-like set, the full query, unrelated subsets, a reweighted row, a zero row, a second query) ranked exactly as
brute-force float64, as the one pass without prefix sums, the numpy one pass and the dense path, on documents with
near-duplicates and exact ties."""
import numpy as np
import pytest
from pruned_data import query_frame

from pyterrier_rdime import PrunedRetriever
from pyterrier_rdime.pruned import compressed, dense, kept, layout

NEEDS_NUMBA = pytest.mark.skipif(not kept.NUMBA_AVAILABLE,
                                 reason='the compiled kernel needs numba: pip install pyterrier-rdime[fast]')
DIMS, K = 96, 30


def prefix(vec, order, count):
    """``vec`` keeping only its first ``count`` dims in ``order``."""
    out = np.zeros_like(vec)
    out[order[:count]] = vec[order[:count]]
    return out


def batch(seed=3):
    """Rows 0-5: one query's Top-k prefixes (of an importance order), an RDIME-like prefix, the full query and a
    duplicate of row 1; 6: an unrelated random subset; 7: the query reweighted; 8: nothing kept; 9-11: a second
    query's prefixes, given out of order."""
    rng = np.random.default_rng(seed)
    first, second = rng.standard_normal((2, DIMS)).astype(np.float32)
    u, v = rng.permutation(DIMS), rng.permutation(DIMS)
    rows = [prefix(first, u, c) for c in (24, 48, 72, 33, DIMS)] + [prefix(first, u, 48)]
    rows += [np.where(rng.random(DIMS) < 0.5, first, 0), first * np.float32(1.5), np.zeros(DIMS)]
    rows += [prefix(second, v, c) for c in (60, 20, 40)]
    return np.stack(rows).astype(np.float32)


def test_nested_trees_by_hand(monkeypatch):
    monkeypatch.setattr(dense, 'NESTED_ADD_COST', 1)
    roots, rows, parents = dense.nested_trees(batch())
    # each row's parent is the largest row it contains (row 5 repeats row 1: its parent, the lower row); rows 6-8
    # extend nothing and nothing extends them: trees of one row; the second query's prefixes form their own tree,
    # smallest first
    assert rows.tolist() == [0, 3, 1, 5, 2, 4, 6, 7, 8, 10, 11, 9]
    assert [rows[p] if p >= 0 else -1 for p in parents] == [-1, 0, 3, 1, 1, 2, -1, -1, -1, -1, 10, 11]
    assert roots.tolist() == [0, 0, 0, 0, 0, 0, 6, 7, 8, 10, 10, 10]
    # a tree is scored by prefix sums only where its row-adds cost less than its int8 product (the second query's:
    # 3 x 21 row-adds against 2 x 3 rows x 96 dims; the first's: 102 against 2 x 6 x 96; the random subset's 49 and
    # the reweighted query's 97 against 2 x 96; the empty row's 1 (a copy) does)
    monkeypatch.setattr(dense, 'NESTED_ADD_COST', 2 * 3 * DIMS / (3 * 21) + 0.01)
    roots, rows, _ = dense.nested_trees(batch())
    assert rows.tolist() == [0, 3, 1, 5, 2, 4, 8] and roots.tolist() == [0] * 6 + list(range(6, 12))


def test_nested_trees_of_a_large_batch_against_brute_force(monkeypatch):
    # 300 rows (children taken 256 at a time): prefixes of 10 vectors in 2 orders each, random subsets, duplicates
    monkeypatch.setattr(dense, 'NESTED_ADD_COST', 0)
    rng = np.random.default_rng(8)
    base = rng.standard_normal((10, DIMS)).astype(np.float32)
    orders = [rng.permutation(DIMS) for _ in range(2)]
    vecs = np.stack([prefix(base[rng.integers(10)], orders[rng.integers(2)], rng.integers(0, DIMS + 1))
                     if rng.random() < 0.8 else np.where(rng.random(DIMS) < 0.5, base[rng.integers(10)], 0)
                     for _ in range(300)]).astype(np.float32)
    vecs[250:] = vecs[rng.integers(0, 250, 50)]
    kept_ = vecs != 0
    sizes = kept_.sum(axis=1)
    expected = {}
    for b in range(300):
        inside = [a for a in range(300) if a != b and 0 < sizes[a] and (sizes[a], a) < (sizes[b], b)
                  and np.all(vecs[b][kept_[a]] == vecs[a][kept_[a]]) and not np.any(kept_[a] & ~kept_[b])]
        if inside:
            expected[b] = max(inside, key=lambda a: (sizes[a], -a))
    roots, rows, parents = dense.nested_trees(vecs)
    found = {int(rows[i]): int(rows[p]) for i, p in enumerate(parents) if p >= 0}
    assert found == expected and len(found) > 200
    assert sorted(rows.tolist()) == list(range(300))  # every tree pays at no cost, one row or many
    for b in range(300):  # a root is its own root; a child shares its parent's
        assert roots[b] == (roots[expected[b]] if b in expected else b)


def test_one_step_per_tree():
    scale = np.linspace(0.5, 2, DIMS).astype(np.float32)
    copy = layout.Codes(np.zeros((DIMS, 1), dtype=np.int8), scale, np.zeros(DIMS))
    vecs = batch()
    roots = np.array([0, 0, 0, 0, 0, 0, 6, 7, 8, 10, 10, 10])
    steps, weights = compressed.integer_weights(copy, vecs, roots)
    own_steps, _ = compressed.integer_weights(copy, vecs)
    # the largest of each tree's: its top row's
    assert steps.tolist() == [own_steps[4]] * 6 + own_steps[6:9].tolist() + [own_steps[9]] * 3
    assert own_steps[0] < own_steps[4]  # the smallest row takes a larger step than its own
    # so each row's weights are its parent's where the parent keeps a dim: prefix sums give every row's integers
    for row, parent in ((3, 0), (1, 3), (5, 1), (2, 1), (4, 2), (11, 10), (9, 11)):
        assert np.array_equal(weights[row][vecs[parent] != 0], weights[parent][vecs[parent] != 0])


def test_scratch_slots_by_hand():
    # 0 -> (1 -> 3), (2 -> 4); 5 -> 6: a last child adds in place on its parent's slot (2, 3, 4, 6), row 1 takes
    # another while row 0 is still read by row 2; a row without children frees its slot (3 then 4), row 5 re-uses one
    from pyterrier_rdime.pruned import _numba
    slots, n = _numba.scratch_slots(np.array([-1, 0, 0, 1, 2, -1, 5]))
    assert slots.tolist() == [0, 1, 0, 1, 0, 0, 0] and n == 2
    assert _numba.scratch_slots(np.array([-1, -1, -1]))[0].tolist() == [0, 0, 0]


@NEEDS_NUMBA
def test_prefix_sums_hit_the_documents_reaching_each_floor_with_their_exact_integer_scores(monkeypatch):
    # a chain, a branch and a lone row, slabs of 1,000 in blocks of 96 (the last one short), against int64 brute
    # force: every document with its score under the lowest floor, those reaching a floor in ascending order, none
    # above every int32 score
    from pyterrier_rdime.pruned import _numba
    monkeypatch.setattr(_numba, 'NESTED_BLOCK_DOCS', 96)
    rng = np.random.default_rng(9)
    codes = rng.integers(-127, 128, size=(768, 2500)).astype(np.int8)
    codes[:, 0] = 127  # the largest sum: every weight and code at its extreme
    top = np.full(768, 16256)
    order = rng.permutation(768)
    branch = prefix(top, order, 100) + prefix(rng.integers(-16256, 16257, 768), order[100:], 50)
    weights = np.stack([prefix(top, order, 100), prefix(top, order, 300), branch, prefix(top, order, 500), top,
                        rng.integers(-16256, 16257, 768)])
    parents = np.array([-1, 0, 0, 1, 3, -1])
    own = weights * ((parents < 0)[:, None] | (weights[parents] == 0))
    dims, own_weights, starts = dense.kept_dims(own)
    summed = _numba.PrefixSums(codes, dims, own_weights.astype(np.int32), starts, parents)
    expected = weights @ codes.astype(np.int64)
    assert expected[4, 0] == 16256 * 127 * 768 < 2 ** 31

    def hits(floors):
        found = [([], []) for _ in parents]
        for d0 in range(0, 2500, 1000):
            width = min(1000, 2500 - d0)
            docs, scores, counts, block = summed.hits(floors, d0, width)
            assert block <= 96 and counts.shape == (6, -(-width // block))  # several blocks, the last one short
            for r in range(6):
                listed = np.concatenate([np.arange(b * block, b * block + c) for b, c in enumerate(counts[r])])
                found[r][0].extend((d0 + docs[r, listed]).tolist())
                found[r][1].extend(scores[r, listed].tolist())
        return found

    assert hits(np.full(6, -2 ** 63)) == [(list(range(2500)), row.tolist()) for row in expected]
    floors = np.append(np.quantile(expected[:5], 0.9, axis=1).astype(np.int64), 2 ** 31)
    for row, floor, (ids, scores) in zip(expected, floors, hits(floors)):
        assert ids == np.flatnonzero(row >= floor).tolist() and scores == row[row >= floor].tolist()
    assert len(hits(floors)[5][0]) == 0


@NEEDS_NUMBA
@pytest.mark.parametrize('rows', [1, 2, 3, 7, 8, 9, 17])
def test_code_rows_add_in_groups_of_sixteen_documents_exactly(rows):
    # eight rows per pass, then pairs, an odd row paired with itself; 0-40 documents from an offset (groups of 16 and
    # a shorter tail); codes and int16 weights at their extremes: each document's sum equals int64 brute force, found
    # where _position puts it; a weight beyond an int16 is refused
    from pyterrier_rdime.pruned import _numba
    rng = np.random.default_rng(rows)
    codes = rng.integers(-127, 128, size=(40, 100)).astype(np.int8)
    codes[:, 5] = -127
    dims = rng.permutation(40)[:rows].astype(np.int64)
    weights = rng.integers(-2 ** 15 + 1, 2 ** 15, rows).astype(np.int32)
    weights[0] = 2 ** 15 - 1
    for n in range(41):
        positions = np.array([_numba._position(t, n // 16 * 16) for t in range(n)], dtype=np.int64)
        acc = (positions * 1000).astype(np.int32)  # added to, as a parent's scores are: document t's is 1000 t
        expected = np.arange(n) * 1000 + weights.astype(np.int64) @ codes[dims, 3:3 + n].astype(np.int64)
        _numba._add_code_rows(acc, codes, dims, weights, 0, rows, 3, n)
        assert acc[positions].tolist() == expected.tolist()
    with pytest.raises(ValueError, match='int16'):
        _numba.PrefixSums(codes, dims, weights * 2, np.array([0, rows]), np.array([-1]))


@pytest.fixture(scope='module')
def near_duplicates():
    """1,500 documents: runs of twins (identical rows, exact ties), near-twins an ulp apart and random rows."""
    rng = np.random.default_rng(11)
    docs = rng.standard_normal((1500, DIMS)).astype(np.float32) * 0.3
    docs[500:700] = docs[300:500]  # exact twins
    docs[700:800] = np.nextafter(docs[300:400], np.float32(np.inf))  # near-twins
    docs[1400:] = docs[0]  # a run of 100 copies of one document
    return docs


def brute_force(docs, query_vecs, k):
    """The exact top-k of the scores the user sees: float64 rounded to float32, ties to the lower docid."""
    out = []
    for query_vec in query_vecs:
        rounded = (docs.astype(np.float64) @ query_vec.astype(np.float64)).astype(np.float32)
        ids = np.lexsort((np.arange(len(docs)), -rounded))[:k]
        out.append((rounded[ids].tolist(), ids.tolist()))
    return out


def one_pass(docs, query_vecs, k):
    dim_major = np.ascontiguousarray(docs.T)
    s, d = compressed.search_compressed(layout.quantise(dim_major), dim_major, query_vecs, k, use_numba=True,
                                        one_pass=True, doc_rows=docs)
    return [(si.tolist(), di.tolist()) for si, di in zip(s, d)]


@NEEDS_NUMBA
@pytest.mark.parametrize('k', [1, K, 150])
def test_nested_one_pass_is_exact(near_duplicates, monkeypatch, k):
    from pyterrier_rdime.pruned import _numba
    docs = near_duplicates
    vecs = batch()
    vecs[:, :4] = np.where(vecs[:, :4] != 0, 0.5, 0)  # equal values: more exact ties
    monkeypatch.setattr(compressed, 'SLAB_DOCS', 512)
    monkeypatch.setattr(_numba, 'NESTED_BLOCK_DOCS', 200)
    monkeypatch.setattr(dense, 'NESTED_ADD_COST', 1)
    calls = []
    hits = _numba.PrefixSums.hits
    monkeypatch.setattr(_numba.PrefixSums, 'hits', lambda self, *args: (calls.append(self.rows), hits(self, *args))[1])
    nested = one_pass(docs, vecs, k)
    assert calls == [12, 12, 12]  # prefix sums scored every row (nine in trees, three alone), slab after slab
    assert nested == brute_force(docs, vecs, k)
    monkeypatch.setattr(dense, 'NESTED_ADD_COST', 1e9)
    assert one_pass(docs, vecs, k) == nested and calls == [12, 12, 12, 0, 0, 0]  # the int8 product alone
    by_dense = PrunedRetriever(index=docs, num_results=k, strategy='dense')(query_frame(vecs))
    for q, (scores, docids) in enumerate(nested):
        found = by_dense[by_dense['qid'] == f'q{q}']
        assert found['docid'].tolist() == docids and found['score'].astype(np.float32).tolist() == scores
