"""Same-budget controls (``SameBudget``): the count of the threshold before them per query, which dimensions each
rule chooses (hand-made vectors, numpy as the reference), the seeded random draw, the cached variance order of a
FlexIndex and its invalidation, the columns kept true, errors, empty input and configuration."""
import hashlib
import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest
from frames import assert_vec, interleaved, one_row_per_query, vec
from pruned_data import flex_index

from pyterrier_rdime import PrfDime, Rdime, SameBudget, ScoreMass, TopK, VectorScorer, maths, store, threshold
from pyterrier_rdime._config import default_cache_dir

P = 12
RNG = np.random.default_rng(7)
QUERIES = {f'q{i}': RNG.standard_normal(P).astype(np.float32) for i in range(5)}
DIMES = {qid: RNG.standard_normal(P).astype(np.float32) for qid in QUERIES}
DOCS = RNG.standard_normal((40, P)).astype(np.float32) * np.linspace(0.5, 3, P).astype(np.float32)


def thresholded(threshold=None, qids=None):
    """A two-rows-per-query result frame after ``threshold`` (Rdime by default)."""
    rows = []
    for qid in qids or QUERIES:
        for d in range(2):
            rows.append({'qid': qid, 'query': f'text {qid}', 'query_vec': QUERIES[qid], 'query_dime': DIMES[qid],
                         'docno': f'{qid}-d{d}', 'doc_vec': DOCS[d], 'score': float(-d)})
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        return (threshold or Rdime()).transform(pd.DataFrame(rows))


def kept_dims(frame):
    return {qid: set(np.flatnonzero(v)) for qid, v in one_row_per_query(frame, 'query_vec').items()}


def check_original_on_kept(out):
    """Each control's query is the ORIGINAL q on its dimensions, 0 elsewhere, and keeps query_kept of them."""
    budgets = one_row_per_query(out, 'query_kept')
    for qid, v in one_row_per_query(out, 'query_vec').items():
        kept = np.flatnonzero(v)
        assert len(kept) == budgets[qid]
        np.testing.assert_array_equal(v[kept], QUERIES[qid][kept])
        assert v.dtype == np.float32


@pytest.mark.parametrize('threshold', [Rdime(), TopK(count=5), TopK(fraction=0.25), Rdime(modulator='wiener'),
                                       Rdime(modulator='james-stein'), ScoreMass(mass=0.5)])
@pytest.mark.parametrize('control', [dict(control='random'), dict(control='random', seed=3), dict(control='magnitude'),
                                     dict(control='prefix'), dict(control='variance', index=DOCS)])
def test_a_control_keeps_the_count_of_the_threshold_before_it(threshold, control):
    before = thresholded(threshold)
    out = SameBudget(**control).transform(before)
    weights = one_row_per_query(before, 'query_vec')
    # after a soft modulator the budget is the number of non-zero weights, which is what query_kept is
    assert one_row_per_query(before, 'query_kept') == {q: np.count_nonzero(w) for q, w in weights.items()}
    check_original_on_kept(out)
    assert out['query_kept'].tolist() == before['query_kept'].tolist()
    assert out['query_kept_frac'].tolist() == before['query_kept_frac'].tolist()
    assert len(out) == len(before) and list(out.columns) == list(before.columns)


def test_magnitude_keeps_the_largest_squares_of_the_original_query():
    q = vec([1, -3, 2, 0.5, -2, 0])
    frame = pd.DataFrame({'qid': ['a', 'b'], 'query_vec': [vec([0] * 6)] * 2, 'query_vec_full': [q, q],
                          'query_kept': [3, 2]})
    out = SameBudget(control='magnitude').transform(frame)
    assert_vec(out['query_vec'][0], [0, -3, 2, 0, -2, 0])  # q^2 = 1, 9, 4, 0.25, 4, 0
    assert_vec(out['query_vec'][1], [0, -3, 2, 0, 0, 0])  # 4 and 4 tie: the lower index
    reference = np.argsort(-(q.astype(np.float64) ** 2), kind='stable')[:3]
    assert set(np.flatnonzero(out['query_vec'][0])) == set(reference)


def test_magnitude_ignores_the_importance():
    out = SameBudget(control='magnitude').transform(thresholded(TopK(count=4)))
    for qid, dims in kept_dims(out).items():
        assert dims == set(np.argsort(-QUERIES[qid].astype(np.float64) ** 2, kind='stable')[:4])


def test_variance_keeps_the_dimensions_of_largest_document_variance():
    docs = np.array([[0, 1, 5, 2], [0, 3, 5, -2], [0, 5, 5, 0]], dtype=np.float32)  # variances 0, 8/3, 0, 8/3
    frame = pd.DataFrame({'qid': ['a', 'b'], 'query_vec': [vec([0] * 4)] * 2,
                          'query_vec_full': [vec([1, 2, 3, 4])] * 2, 'query_kept': [1, 3]})
    out = SameBudget(control='variance', index=docs).transform(frame)
    assert_vec(out['query_vec'][0], [0, 2, 0, 0])  # a tie of 8/3: the lower index
    assert_vec(out['query_vec'][1], [1, 2, 0, 4])  # then 0 and 0: the lower index again
    np.testing.assert_allclose(threshold.document_variance(docs), [0, 8 / 3, 0, 8 / 3])
    out = SameBudget(control='variance', index=DOCS).transform(thresholded(TopK(count=4)))
    expected = set(np.argsort(-DOCS.astype(np.float64).var(axis=0), kind='stable')[:4])
    assert all(dims == expected for dims in kept_dims(out).values())


def test_prefix_keeps_the_first_dimensions():
    out = SameBudget(control='prefix').transform(thresholded(TopK(count=3)))
    assert all(dims == {0, 1, 2} for dims in kept_dims(out).values())


def test_random_repeats_with_a_seed_and_changes_with_another():
    before = thresholded(TopK(count=6))
    first = kept_dims(SameBudget(control='random', seed=0).transform(before))
    assert kept_dims(SameBudget(control='random', seed=0).transform(before)) == first
    other = kept_dims(SameBudget(control='random', seed=1).transform(before))
    assert other != first  # 5 queries, 924 draws each: equal by chance with probability ~1e-15
    assert {len(d) for d in first.values()} == {6}
    # a query's draw does not depend on the other queries of the batch, nor on the row order
    alone = kept_dims(SameBudget(control='random', seed=0).transform(thresholded(TopK(count=6), qids=['q3'])))
    assert alone == {'q3': first['q3']}
    shuffled = before.sample(frac=1, random_state=1)
    assert kept_dims(SameBudget(control='random', seed=0).transform(shuffled)) == first


def test_random_draw_is_fixed_by_seed_and_qid_text():
    """Pinned: the SHA-256 of the qid with the seed, through numpy's SeedSequence (not Python's salted hash), so a
    run repeats in another process; the draw for k dimensions is inside the draw for k + 1."""
    key = int.from_bytes(hashlib.sha256(b'q1').digest()[:8], 'little')
    order = np.random.default_rng(np.random.SeedSequence([4, key])).permutation(P)
    frame = pd.DataFrame({'qid': ['q1'], 'query_vec': [vec([0] * P)], 'query_vec_full': [vec(np.arange(1, P + 1))],
                          'query_kept': [5]})
    kept = np.flatnonzero(SameBudget(control='random', seed=4).transform(frame)['query_vec'][0])
    assert set(kept) == set(order[:5])
    ranks = maths.random_ranks([(4, 'q1')], P)[0]
    assert all(set(np.flatnonzero(ranks < k)) <= set(np.flatnonzero(ranks < k + 1)) for k in range(P))


def test_controls_after_soft_rdime_keep_its_columns_true():
    before = thresholded(Rdime(modulator='james-stein'))
    assert (before['query_mean_weight'] < 1).any()
    out = SameBudget(control='magnitude').transform(before)
    assert (out['query_mean_weight'] == 1.0).all()  # a control is a hard 0/1 selection
    for column in ('query_eps2', 'query_fallback', 'query_kept', 'score', 'docno'):
        pd.testing.assert_series_equal(out[column], before[column])  # how the budget was set: unchanged
    check_original_on_kept(out)


def test_a_fallback_to_the_full_query_keeps_every_dimension():
    frame = pd.DataFrame({'qid': ['q'], 'query': ['t'], 'query_vec': [vec([1, 2, 3, 4])],
                          'query_dime': [vec([0.5, 0.2, 3.0, -4.0])]})  # worked example 2: empty kept set
    before = Rdime().transform(frame)
    out = SameBudget(control='random').transform(before)
    assert bool(out['query_fallback'][0]) and out['query_kept'][0] == 4
    assert_vec(out['query_vec'][0], [1, 2, 3, 4])


def test_in_a_pipeline_before_the_scorer():
    pipe = PrfDime() >> Rdime() >> SameBudget(control='prefix') >> VectorScorer()
    out = pipe.transform(interleaved())
    q1 = out[out['qid'] == 'q1']
    kept = int(q1['query_kept'].iloc[0])  # worked example 3: two dimensions
    assert kept == 2
    expected = {docno: float(np.dot(np.r_[1, 2, 0, 0], v)) for docno, v in zip(q1['docno'], q1['doc_vec'])}
    assert dict(zip(q1['docno'], q1['score'])) == pytest.approx(expected)


def test_the_variance_order_of_a_flex_index_is_cached_and_invalidated(tmp_path, monkeypatch):
    passes, hashed = [], []
    compute, real_hash = store._stats_pass, store.fingerprint
    monkeypatch.setattr(store, '_stats_pass', lambda *a, **k: passes.append(1) or compute(*a, **k))
    monkeypatch.setattr(store, 'fingerprint', lambda source: hashed.append(source.name) or real_hash(source))
    index = flex_index(tmp_path / 'docs.flex', DOCS)
    np.testing.assert_allclose(threshold.document_variance(index), DOCS.astype(np.float64).var(axis=0))
    assert passes == [1] and hashed == ['vecs.f4'] and (tmp_path / 'docs.flex' / 'rdime.dim_major.stats.json').is_file()
    stage = SameBudget(control='variance', index=index)
    stage.transform(thresholded(TopK(count=3)))
    monkeypatch.setattr(store, '_OPENED', {})  # a new process: from the record beside the index
    opened = []
    real_open = open

    def counting_open(file, *args, **kwargs):
        opened.append(Path(file).name)
        return real_open(file, *args, **kwargs)
    monkeypatch.setattr('builtins.open', counting_open)
    np.testing.assert_allclose(threshold.document_variance(index), DOCS.astype(np.float64).var(axis=0))
    stage.transform(thresholded(TopK(count=3)))
    monkeypatch.setattr('builtins.open', real_open)
    # neither a later call nor a new process reads the vectors (no pass, no hash, vecs.f4 never opened)
    assert passes == [1] and hashed == ['vecs.f4'] and 'vecs.f4' not in opened
    reversed_docs = DOCS[:, ::-1].copy()
    flex_index(tmp_path / 'docs.flex', reversed_docs)  # the index changes under the same path
    out = stage.transform(thresholded(TopK(count=3)))
    assert len(passes) == 2
    expected = set(np.argsort(-reversed_docs.astype(np.float64).var(axis=0), kind='stable')[:3])
    assert all(dims == expected for dims in kept_dims(out).values())


def test_an_in_place_edit_of_the_vectors_is_seen_by_the_variance_control(tmp_path):
    index = flex_index(tmp_path / 'docs.flex', DOCS)
    threshold.document_variance(index)
    source = tmp_path / 'docs.flex' / 'vecs.f4'
    stat = source.stat()
    edited = DOCS.copy()
    edited[0] *= 50  # the same size; the old mtime put back: only the ctime and the content tell
    with open(source, 'r+b') as f:
        f.write(edited.tobytes())
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    np.testing.assert_allclose(threshold.document_variance(index), edited.astype(np.float64).var(axis=0))


def test_a_read_only_index_folder_caches_under_the_package_cache(tmp_path, monkeypatch):
    index = flex_index(tmp_path / 'docs.flex', DOCS)
    monkeypatch.setattr(os, 'access', lambda *a: False)  # as flex_layout_path sees a read-only folder
    monkeypatch.setattr(store, '_OPENED', {})
    threshold.document_variance(index)
    assert not (tmp_path / 'docs.flex' / 'rdime.dim_major.stats.json').exists()
    assert list((default_cache_dir() / 'layouts').glob('docs.flex-*.stats.json'))


@pytest.mark.parametrize('kwargs, message', [
    (dict(control='best'), "control must be one of 'random', 'magnitude', 'variance', 'prefix'"),
    (dict(control='variance'), "control='variance' needs index="),
    (dict(control='variance', index=np.zeros(4)), 'non-empty (docs, p) array'),
    (dict(control='random', index=DOCS), "index= is used only by control='variance'"),
    (dict(control='random', seed=-1), 'seed must be an integer >= 0'),
    (dict(control='random', seed=True), 'seed must be an integer >= 0'),
])
def test_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError, match='^SameBudget: ') as e:
        SameBudget(**kwargs)
    assert message in str(e.value)


def test_control_is_keyword_only():
    with pytest.raises(TypeError):
        SameBudget('random')


def test_input_without_a_threshold_says_where_to_put_it():
    with pytest.raises(pt.validate.InputValidationError, match='put SameBudget after a threshold'):
        SameBudget(control='random').transform(interleaved())


@pytest.mark.parametrize('kept, message', [([2, 3], 'the same on every row'), ([5, 5], r'in \[0, 4\]'),
                                           ([1.5, 1.5], 'whole number'), (['x', 'x'], 'not a number')])
def test_bad_budgets_name_the_query(kept, message):
    frame = pd.DataFrame({'qid': ['q7', 'q7'], 'query_vec': [vec([1, 2, 3, 4])] * 2,
                          'query_vec_full': [vec([1, 2, 3, 4])] * 2, 'query_kept': kept})
    with pytest.raises(ValueError, match=message) as e:
        SameBudget(control='prefix').transform(frame)
    assert "qid='q7'" in str(e.value)


def test_variance_of_another_dimensionality_is_an_error():
    with pytest.raises(ValueError, match='query_vec has 12 dimensions but the index'):
        SameBudget(control='variance', index=np.ones((3, 5))).transform(thresholded(TopK(count=3)))


def test_empty_input_keeps_the_columns():
    empty = thresholded().iloc[:0]
    out = SameBudget(control='random').transform(empty)
    assert len(out) == 0 and list(out.columns) == list(empty.columns)


def test_repr_equality_and_hash():
    assert repr(SameBudget(control='random')) == "SameBudget(control='random')"
    assert repr(SameBudget(control='random', seed=2)) == "SameBudget(control='random', seed=2)"
    assert SameBudget(control='random', seed=2) == SameBudget(control='random', seed=2)
    assert hash(SameBudget(control='random', seed=2)) == hash(SameBudget(control='random', seed=2))
    assert SameBudget(control='random', seed=2) != SameBudget(control='random', seed=3)
    assert SameBudget(control='magnitude') != SameBudget(control='prefix')
    assert SameBudget(control='variance', index=DOCS) == SameBudget(control='variance', index=DOCS)
    assert SameBudget(control='variance', index=DOCS) != SameBudget(control='variance', index=DOCS.copy())
    assert 'index=<ndarray 40x12 float32>' in repr(SameBudget(control='variance', index=DOCS))


def test_column_variance_matches_numpy_over_blocks():
    data = RNG.standard_normal((101, 3)) * [1, 1e-3, 50] + [0, 1e6, -3]  # a large mean, where E[x^2]-E[x]^2 fails
    for block in (1, 7, 100, 101, 500):
        variance, rows = maths.column_variance(data[i:i + block] for i in range(0, len(data), block))
        assert rows == 101
        np.testing.assert_allclose(variance, data.var(axis=0), rtol=1e-6)  # E[x^2] - E[x]^2: off >100x


TestSameBudgetInspect = pt.testing.transformer_test_class(lambda: SameBudget(control='magnitude'))
