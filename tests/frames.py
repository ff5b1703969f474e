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


Q2 = (1, 0, -1, 2)


E1, E2, E3 = (1, 1, 1, 2), (3, 1, -1, 0), (-50, -50, -50, -50)


DC = (100, 100, 100, 100)


# q1: top-2 by score are D2 (7) and D1 (5), DC (1) is not feedback -> worked example 3
# q2: top-2 are E2 (0.9) and E1 (0.3); mean = [2, 1, 0, 1] -> u = [2, 0, 0, 2]; eps2 = (6 - 4) / 4 = 0.5 -> {0, 3}
INTERLEAVED = [('q2', Q2, 'e3', E3, 0.1), ('q1', Q, 'dC', DC, 1.0), ('q1', Q, 'dA', D1, 5.0),
               ('q2', Q2, 'e1', E1, 0.3), ('q1', Q, 'dB', D2, 7.0), ('q2', Q2, 'e2', E2, 0.9)]


def interleaved():
    return results(INTERLEAVED, index=[10, 3, 7, 0, 5, 1])


class FakeEncoder:
    """Stands in for a pyterrier-dr bi-encoder: encode_docs(texts) -> (n, p) array."""
    table = {'answer a': (1, 1, 0, 2), 'answer b': (0, 1, 1, 0)}

    def __init__(self):
        self.calls = []

    def encode_docs(self, texts):
        self.calls.append(list(texts))
        return np.array([self.table[t] for t in texts], dtype=np.float32)

    def __repr__(self):
        return 'FakeEncoder()'


def topk_input(dime=(0.9, 4.2, 8.4, 0.4)):
    """A one-query frame with the worked example's query_dime, for the threshold stages."""
    return queries([('q', Q)], query_dime=[vec(dime)])


def flatten(transformer):
    """The stages of a (compiled) pipeline, in order."""
    parts = getattr(transformer, '_transformers', None)
    if parts is None:
        return [transformer]
    return [t for part in parts for t in flatten(part)]
