"""The cost model behind strategy='auto': costs computed by hand from round constants."""
import numpy as np
import pytest

from pyterrier_rdime.pruned import cost


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
