"""The prototype of benchmarks/four_bit.py (a measurement, not library code): its packing round-trips, its bound holds
for every document, and its two-level filter returns the exact top-k, so that the numbers it prints in speed.rst
describe a correct path."""
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip('numba')
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'benchmarks'))
import four_bit  # noqa: E402

from pyterrier_rdime.pruned import dense, int8_copy  # noqa: E402
from pyterrier_rdime.pruned.plan import kept_dims  # noqa: E402

DOCS = four_bit.PACK_DOCS + 2001  # a full packed block and an odd one


def prototype(rows: np.ndarray) -> four_bit.FourBit:
    matrix = np.ascontiguousarray(rows.T)
    codes, scale, error = four_bit.quantise4(matrix)
    return four_bit.FourBit(four_bit.pack(codes), scale, error, int8_copy.quantise(matrix), rows)


def data(seed: int = 0, dims: int = 12) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((DOCS, dims)).astype(np.float32)
    rows[:, 0] = 0.25  # a constant column
    rows[7, 1] = 1e3  # an extreme value: most of its dimension's codes are 0
    rows[100:110] = rows[5]  # exact ties
    return rows


def test_pack_round_trips_over_blocks_and_an_odd_tail():
    codes = np.random.default_rng(1).integers(-7, 8, size=(3, DOCS)).astype(np.int8)
    assert np.array_equal(four_bit.unpack(four_bit.pack(codes), DOCS), codes)


@pytest.mark.parametrize('kept', [[0], [1], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [2, 5, 9]])
def test_bound_holds_for_every_document(kept):
    rows = data()
    four = prototype(rows)
    query = np.zeros(rows.shape[1], dtype=np.float32)
    query[kept] = np.random.default_rng(2).standard_normal(len(kept))
    dims, values, _ = kept_dims(query[None])
    weights = (values * four.scale[dims]).astype(np.float32)
    approx, _, shift = four.scan(dims, weights, 10)
    exact = rows.astype(np.float64) @ query.astype(np.float64)
    assert np.all(np.abs(approx.astype(np.float64) - shift - exact)
                  <= four_bit.bound4(four.scale, four.error, dims, values, weights))


@pytest.mark.parametrize('level8', [False, True])
@pytest.mark.parametrize('seed', [0, 3])
def test_two_level_filter_returns_the_exact_top_k(level8, seed):
    rows = data(seed)
    four = prototype(rows)
    rng = np.random.default_rng(seed + 10)
    for _ in range(3):
        query = rng.standard_normal(rows.shape[1]).astype(np.float32)
        query[rng.random(len(query)) < 0.5] = 0
        query[5] = 1.0  # at least one kept dimension
        scores, docids = four.search(query, 50, level8=level8)
        ref_scores, ref_docids = dense.search_dense(np.ascontiguousarray(rows.T), query[None], 50)
        assert np.array_equal(docids, ref_docids[0])
        np.testing.assert_allclose(scores, ref_scores[0], rtol=0, atol=1e-5)
