"""Oracle DIME: an upper bound that reads the relevance judgments."""
import numpy as np
import pandas as pd

from .. import maths
from .._config import check_bool
from .._frames import gather_vectors, numeric_column, select_feedback
from ._base import DimeScorer


class OracleDime(DimeScorer):
    """Oracle DIME, an upper bound that reads the relevance judgments: per dimension ``j``, the Pearson correlation
    between the label and ``q_j * d_j`` over the judged documents of the incoming ranking. Queries where it is
    undefined (fewer than two judged documents, or all with one label) fall back to ``u = q * q`` with a warning.

    Args:
        qrels: judgments with columns ``qid, docno, label`` (as ``dataset.get_qrels()``).

    Input columns: ``qid, query_vec, docno, doc_vec, score``. Output columns: the input's plus ``query_dime``.
    """
    schematic = {'label': 'Oracle'}

    def __init__(self, *, qrels: pd.DataFrame, keep_ranking: bool = True):
        stage = type(self).__name__
        missing = {'qid', 'docno', 'label'} - set(getattr(qrels, 'columns', []))
        if missing:
            raise ValueError(f'{stage}: qrels must be a DataFrame with columns qid, docno, label; missing '
                             f'{sorted(missing)}')
        check_bool(stage, 'keep_ranking', keep_ranking)
        _check_labels(qrels, stage)
        self.qrels = qrels
        self.keep_ranking = keep_ranking

    def _importance(self, inp, groups, query_vecs):
        keys = pd.MultiIndex.from_frame(inp[['qid', 'docno']].astype(str))
        judged = self.qrels.assign(qid=self.qrels['qid'].astype(str), docno=self.qrels['docno'].astype(str))
        labels = judged.drop_duplicates(['qid', 'docno']).set_index(['qid', 'docno'])['label']
        row_labels = labels.reindex(keys).to_numpy(dtype=np.float64)
        feedback = select_feedback(inp, groups, len(inp), self)  # every candidate: the width is capped per frame
        mask = feedback.mask & np.isfinite(row_labels[np.where(feedback.mask, feedback.rows, 0)])
        feedback = feedback._replace(mask=mask)
        doc_vecs = gather_vectors(inp, 'doc_vec', feedback, query_vecs.shape[1], self)
        slot_labels = np.where(mask, row_labels[np.where(mask, feedback.rows, 0)], 0.0)
        importance = maths.oracle_dime(query_vecs, doc_vecs, slot_labels, mask)
        undefined = np.isnan(importance).any(axis=1)
        return self._magnitude_fallback(np.nan_to_num(importance), query_vecs, undefined, inp, groups,
                                        'no oracle correlation (fewer than two judged candidates, or one label only)')


def _check_labels(qrels: pd.DataFrame, stage: str) -> None:
    """Labels must be finite numbers, one per judged (qid, docno): a text label would fail only at transform time
    with numpy's bare "could not convert", and a NaN or a second, different label would be dropped silently."""
    labels = numeric_column(qrels, 'label', stage, 'labels are relevance grades: convert the column '
                            "(qrels.assign(label=pd.to_numeric(qrels['label'])))")
    finite = np.isfinite(labels)
    if not finite.all():
        row = int(np.argmin(finite))
        raise ValueError(f"{stage}: qrels label is {labels[row]} at qid={qrels['qid'].iloc[row]!r}, "
                         f"docno={qrels['docno'].iloc[row]!r}; every judgment needs a finite label: fix or drop "
                         "those rows (qrels.dropna(subset=['label']))")
    keys = qrels[['qid', 'docno']].astype(str).assign(label=labels)
    conflicting = keys.drop_duplicates().duplicated(['qid', 'docno'])
    if conflicting.any():
        qid, docno = keys.drop_duplicates()[conflicting].iloc[0][['qid', 'docno']]
        given = sorted(map(float, keys.loc[(keys['qid'] == qid) & (keys['docno'] == docno), 'label'].unique()))
        raise ValueError(f'{stage}: qrels judge qid={qid!r}, docno={docno!r} twice with different labels {given}; '
                         'keep one judgment per query and document')
