"""The threshold stages: Top-k by fraction and count, ties, after PRF on a result frame (RDIME's worked
examples are in test_dime.py, through PrfDime >> Rdime)."""

import numpy as np
import pytest
from frames import assert_vec, interleaved, one_row_per_query, topk_input

from pyterrier_rdime import (
    PrfDime,
    TopK,
)


@pytest.mark.parametrize('kwargs, expected', [
    ({'fraction': 0.5}, [0, 2, 3, 0]), ({'fraction': 0.6}, [0, 2, 3, 0]), ({}, [0, 2, 3, 0]),
    ({'fraction': 0.7}, [1, 2, 3, 0]), ({'fraction': 1.0}, [1, 2, 3, 4]), ({'fraction': 1}, [1, 2, 3, 4]),
    ({'fraction': 0.01}, [0, 0, 3, 0]),
    ({'count': 1}, [0, 0, 3, 0]), ({'count': 3}, [1, 2, 3, 0]), ({'count': 10}, [1, 2, 3, 4]),
    ({'count': np.int64(2)}, [0, 2, 3, 0]),
])
def test_topk_fraction_and_count(kwargs, expected):
    out = TopK(**kwargs).transform(topk_input())
    assert list(out.columns) == ['qid', 'query', 'query_vec', 'query_dime', 'query_vec_full', 'query_kept',
                                 'query_kept_frac']
    row = out.iloc[0]
    assert_vec(row['query_vec'], expected)
    kept = int(np.count_nonzero(expected))
    assert row['query_kept'] == kept and row['query_kept_frac'] == pytest.approx(kept / 4)


def test_topk_ties_keep_the_lower_index():
    assert_vec(TopK(count=2).transform(topk_input((1, 1, 1, 1)))['query_vec'].iloc[0], [1, 2, 0, 0])
    assert_vec(TopK(fraction=0.5).transform(topk_input((0, 5, 0, 5)))['query_vec'].iloc[0], [0, 2, 0, 4])


def test_topk_after_prf_on_a_result_frame():
    out = (PrfDime() >> TopK(count=1)).transform(interleaved())
    pruned = one_row_per_query(out, 'query_vec')
    assert_vec(pruned['q1'], [0, 0, 0, 4])  # u = [0.95, 2.1, 5.7, 6.2]
    assert_vec(pruned['q2'], [1, 0, 0, 0])  # u = [2, 0, 0, 2]: tie, lower index
    assert len(out) == 6
