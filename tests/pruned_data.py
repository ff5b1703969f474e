"""Shared data and helpers of the test_pruned_*.py files: a seeded corpus with queries pruned to about half their
dimensions, a float64 reference top-k, query frames and small FlexIndexes."""
import numpy as np
import pandas as pd

DOCS, DIMS, K = 3000, 48, 25


def make_corpus():
    """``(docs, query_vecs)``: 3000 x 48 documents and 6 queries (one keeps every dimension, one keeps five)."""
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((DOCS, DIMS)).astype(np.float32)
    queries = rng.standard_normal((6, DIMS)).astype(np.float32)
    keep = rng.random(queries.shape) < 0.5
    keep[0] = True  # one query keeps everything
    keep[1, :] = False
    keep[1, [0, 1, 2, 7, DIMS - 1]] = True  # five kept dims: the kernel's rows in a pass of four, then one
    return docs, np.where(keep, queries, 0).astype(np.float32)


def full_topk(docs, query_vec, k):
    scores = docs.astype(np.float64) @ query_vec.astype(np.float64)
    order = np.argsort(-scores, kind='stable')[:k]
    return scores[order], order


def query_frame(query_vecs):
    return pd.DataFrame({'qid': [f'q{i}' for i in range(len(query_vecs))],
                         'query': [f'text {i}' for i in range(len(query_vecs))], 'query_vec': list(query_vecs)})


def flex_index(path, docs, docnos=None):
    from pyterrier_dr import FlexIndex
    index = FlexIndex(str(path), verbose=False)
    docnos = docnos or [f'd{i}' for i in range(len(docs))]
    index.indexer(mode='overwrite').index({'docno': d, 'doc_vec': v} for d, v in zip(docnos, docs))
    return index
