"""VectorScorer: inner products and ranks, and a whole PRF >> RDIME >> scorer pipeline."""

import numpy as np
import pytest
from frames import Q2, Q, interleaved

from pyterrier_rdime import (
    PrfDime,
    Rdime,
    VectorScorer,
)


def test_vector_scorer_inner_product_and_ranks():
    inp = interleaved()
    out = VectorScorer().transform(inp)
    q_by_qid = {'q1': np.array(Q, float), 'q2': np.array(Q2, float)}
    for _, row in out.iterrows():
        expected = float(np.dot(q_by_qid[row['qid']], np.asarray(row['doc_vec'], float)))
        assert row['score'] == pytest.approx(expected, rel=1e-6)
    assert out['qid'].tolist() == ['q1'] * 3 + ['q2'] * 3
    # q1: dC = 1000, dB = 1 + 3 + 12 = 16, dA = 0.9 + 4.2 + 8.4 + 0.4 = 13.9; q2: e1 = 1 - 1 + 4 = 4, e2 = 4, e3 = -100
    assert out['docno'].tolist()[:3] == ['dC', 'dB', 'dA']
    assert out['score'].tolist()[:3] == pytest.approx([1000.0, 16.0, 13.9])
    assert out['rank'].tolist() == [0, 1, 2, 0, 1, 2]
    assert out[out.qid == 'q2']['docno'].tolist()[2] == 'e3'
    assert sorted(out.columns) == sorted(list(inp.columns) + ['rank'])


def test_full_pipeline_prf_rdime_scorer():
    out = (PrfDime() >> Rdime() >> VectorScorer()).transform(interleaved())
    # q1* = [0, 0, 3, 4]: dC = 700, dB = 15, dA = 8.8; q2* = [1, 0, 0, 2]: e1 = 5, e2 = 3, e3 = -150
    assert out['docno'].tolist() == ['dC', 'dB', 'dA', 'e1', 'e2', 'e3']
    assert out['score'].tolist() == pytest.approx([700.0, 15.0, 8.8, 5.0, 3.0, -150.0])
    assert out['rank'].tolist() == [0, 1, 2, 0, 1, 2]
