"""Shared helpers of the stage tests: the paper's worked-example vectors and tiny hand-built frames."""
import numpy as np
import pandas as pd

Q = (1, 2, 3, 4)
D1 = (0.9, 2.1, 2.8, 0.1)
D2 = (1, 0, 1, 3)
EX2 = (0.5, 0.1, 1.0, -1.0)


def vec(values):
    return np.asarray(values, dtype=np.float32)


def results(rows, index=None):
    """A result frame from (qid, query_vec, docno, doc_vec, score) tuples."""
    return pd.DataFrame({
        'qid': [r[0] for r in rows],
        'query': [f'text of {r[0]}' for r in rows],
        'query_vec': [vec(r[1]) for r in rows],
        'docno': [r[2] for r in rows],
        'doc_vec': [vec(r[3]) for r in rows],
        'score': [float(r[4]) for r in rows],
    }, index=index)


def queries(rows, **extra):
    """A query frame from (qid, query_vec) tuples, plus extra per-query columns."""
    frame = pd.DataFrame({'qid': [r[0] for r in rows], 'query': [f'text of {r[0]}' for r in rows],
                          'query_vec': [vec(r[1]) for r in rows]})
    return frame.assign(**extra)


def one_row_per_query(frame, column):
    """{qid: value of column} after checking that every row of a query holds the same value."""
    out = {}
    for qid, group in frame.groupby('qid', sort=False):
        values = group[column].tolist()
        for v in values[1:]:
            np.testing.assert_array_equal(v, values[0])
        out[qid] = values[0]
    return out


def assert_vec(actual, expected, atol=1e-6):
    assert isinstance(actual, np.ndarray) and actual.dtype == np.float32 and actual.ndim == 1
    np.testing.assert_allclose(actual, expected, rtol=0, atol=atol)
