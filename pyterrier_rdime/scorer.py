"""Re-scoring candidates with the (pruned) query vector."""
import numpy as np
import pandas as pd
import pyterrier as pt

from ._config import ConfigTransformer
from ._frames import check_same_dims, empty_frame, group_queries, query_vectors, stack_vectors


class VectorScorer(ConfigTransformer):
    """Re-scores each candidate by the inner product of ``query_vec`` and its ``doc_vec`` and re-ranks per query:
    ``FlexIndex.scorer()``'s float32 scores from the vectors already in the frame (an inner product below float32's
    normal range is computed in float64, so that tiny vectors still rank).

    Input columns: ``qid, query_vec, docno, doc_vec``. Output columns: the input's with new ``score`` and ``rank``,
    sorted by query and descending score.

    Example::

        pipe = bm25 % 100 >> model.query_encoder() >> index.vec_loader() >> PrfDime() >> Rdime() >> VectorScorer()
    """
    schematic = {'label': 'VectorScorer'}

    def __init__(self):
        pass

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pt.validate.result_frame(inp, extra_columns=['query_vec', 'doc_vec'], context=self)
        columns = list(inp.columns) + [c for c in ('score', 'rank') if c not in inp.columns]
        if not len(inp):
            return empty_frame(inp, columns)
        inp = inp.reset_index(drop=True)
        groups = group_queries(inp, self)
        query_vecs64 = query_vectors(inp, 'query_vec', groups, self)
        doc_vecs64 = stack_vectors(inp, 'doc_vec', np.arange(len(inp)), self, 'docno')
        query_vecs, doc_vecs = query_vecs64.astype(np.float32), doc_vecs64.astype(np.float32)
        check_same_dims(self, query_vecs.shape[1], doc_vecs.shape[1], 'doc_vec')
        with np.errstate(over='ignore', invalid='ignore'):  # reported below, with the row to blame
            scores = np.einsum('rp,rp->r', query_vecs[groups.codes], doc_vecs).astype(np.float64)
        small = np.abs(scores) < np.finfo(np.float32).tiny  # 0 or subnormal: float32 may have flushed it
        if small.any():
            rows = np.flatnonzero(small)
            scores[rows] = np.einsum('rp,rp->r', query_vecs64[groups.codes[rows]], doc_vecs64[rows])
        finite = np.isfinite(scores)
        if not finite.all():
            bad = int(np.argmin(finite))
            q_peak, d_peak = np.abs(query_vecs[groups.codes[bad]]).max(), np.abs(doc_vecs[bad]).max()
            raise ValueError(f'{self}: the inner product of qid={inp["qid"].iloc[bad]!r} and '
                             f'docno={inp["docno"].iloc[bad]!r} overflows float32 (vector values up to {q_peak:.3g} '
                             f'and {d_peak:.3g}); normalise the query and document vectors (e.g. to unit length)')
        out = inp.assign(score=scores).sort_values(['qid', 'score'], ascending=[True, False], kind='stable')
        return pt.model.add_ranks(out)[columns]
