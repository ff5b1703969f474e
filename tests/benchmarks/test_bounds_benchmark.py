"""The counting of benchmarks/bounds.py: stopping points computed by hand on tiny matrices, and the oracle threshold
never stops a document of the true top-k."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'benchmarks'))
import bounds  # noqa: E402

QUERY = np.array([1.0, 0.5])  # already in reading order: |q_j| * M_j = 1, 0.5 with M = (1, 1)
ABS_MAX = np.array([1.0, 1.0])
ROWS = np.array([[1.0, 0.4, 0.1, 0.0],   # documents as columns: scores 1.5, 0.5, 0.55, -0.45
                 [1.0, 0.2, 0.9, -0.9]])


def test_remaining_bound_is_the_sum_of_the_dimensions_not_yet_read():
    assert bounds.remaining_bound(np.array([1.0, 0.5])).tolist() == [1.5, 0.5, 0.0]


def test_global_bound_by_hand():
    # bound before reading 1.5; after dim 1: d_1 + 0.5, so documents 2-4 fall below 1 (0.9, 0.6, 0.5); document 1 never
    remaining = bounds.remaining_bound(QUERY * ABS_MAX)[:, None]
    assert bounds.dims_read(QUERY[:, None] * ROWS, remaining, 1.0).tolist() == [2, 1, 1, 1]
    # a threshold above the bound before reading: nothing is read
    assert bounds.dims_read(QUERY[:, None] * ROWS, remaining, 2.0).tolist() == [0, 0, 0, 0]


def test_block_bound_by_hand():
    # second block (documents 3, 4): M = (0.1, 0.9), weights 0.1, 0.45: bound before reading 0.55 < 1, skipped whole;
    # first block: M = (1, 1), as the global bound
    found = bounds.stopping_points(ROWS, QUERY, ABS_MAX, 1.0, (2,))
    assert found['block M/2'].tolist() == [2, 1, 0, 0]
    assert found['global M'].tolist() == [2, 1, 1, 1]
    assert bounds.block_dims_read(found['global M'], 2).tolist() == [2, 1]


def test_cauchy_schwarz_by_hand():
    # document 2: ||q|| * ||d|| = sqrt(1.25) * sqrt(0.2) = 0.5 < 1 before reading; document 4 after dim 1:
    # 0 + 0.5 * 0.9 = 0.45 < 1, before reading sqrt(1.25) * 0.9 = 1.006 >= 1
    found = bounds.stopping_points(ROWS, QUERY, ABS_MAX, 1.0, (2,))
    assert found['Cauchy-Schwarz'].tolist() == [2, 0, 1, 1]


def test_tally_shares(monkeypatch):
    monkeypatch.setattr(bounds, 'BLOCK_SIZES', (2,))
    tally = bounds.Tally()
    tally.add(bounds.stopping_points(ROWS, QUERY, ABS_MAX, 1.0, (2,)), dims=2)
    shares = tally.shares()
    assert shares['global M|document'] == pytest.approx(5 / 8)
    assert shares['global M|block|2'] == pytest.approx((2 * 2 + 1 * 2) / 8)
    assert shares['block M|block|2'] == pytest.approx((2 * 2 + 0) / 8)
    assert shares['block M|document|2'] == pytest.approx(3 / 8)
    assert tally.blocks['block M|block|2'].tolist() == [2, 1, 1]  # blocks, skipped whole, read in full


def test_thresholds_are_the_kth_best_scores():
    rng = np.random.default_rng(0)
    matrix = rng.standard_normal((8, 300)).astype(np.float32)
    queries = rng.standard_normal((3, 8)).astype(np.float32)
    expected = np.sort(queries @ matrix, axis=1)[:, -bounds.K]
    np.testing.assert_allclose(bounds.thresholds(matrix, queries), expected, rtol=1e-6)


@pytest.mark.parametrize('seed', range(5))
def test_oracle_never_stops_a_top_k_document(seed):
    rng = np.random.default_rng(seed)
    dims, docs, k = 12, 512, 10
    rows = rng.standard_normal((dims, docs)) + 0.3
    query = rng.standard_normal(dims)
    abs_max = np.abs(rows).max(axis=1)
    order = np.argsort(-np.abs(query) * abs_max)
    rows, query, abs_max = rows[order], query[order], abs_max[order]
    scores = query @ rows
    theta = np.sort(scores)[-k]
    found = bounds.stopping_points(rows, query, abs_max, theta, (64, 128))
    top = np.flatnonzero(scores >= theta)
    for variant, counts in found.items():
        assert np.all(counts[top] == dims), variant
        stopped = counts < dims
        assert np.all(scores[stopped] < theta), variant  # a document stopped early is never in the top-k
        assert stopped.any(), variant  # and the count is not trivially "read everything"
