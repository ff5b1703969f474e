"""Oracle DIME: an upper bound that reads the relevance judgments."""
import warnings

import numpy as np
import pandas as pd

from .. import maths
from .._config import check_bool, check_int
from .._frames import check_qids_written_alike, gather_vectors, numeric_column, select_feedback
from ._base import DimeScorer


class OracleDime(DimeScorer):
    """Oracle DIME, an upper bound that reads the relevance judgments: per dimension ``j``, the Pearson correlation
    between the label and ``q_j * d_j`` over the judged documents of the incoming ranking. Queries where it is
    undefined (fewer than two judged documents, or all with one label) fall back to ``u = q * q`` with a warning.

    With ``pad_negatives=True``, a query whose judged candidates include relevant ones (label > 0) but no
    non-relevant one (label <= 0) is padded as the DIME-SIGIR-2024 maintainers advise (its issue #3): as many
    unjudged candidates as it has judged ones (fewer if it has fewer) are drawn uniformly at random, from a generator
    fixed by ``seed`` and the qid, and labelled 0. Its correlation is then defined (it was not when every judged
    candidate had one label) and contrasts relevant with non-relevant documents. The stage says which queries it
    padded: the column ``query_padded`` (the number of candidates labelled 0 for the query, 0 where none) and a
    warning. A query with no relevant judged candidate is not padded (its measures are undefined anyway).

    Args:
        qrels: judgments with columns ``qid, docno, label`` (as ``dataset.get_qrels()``).
        pad_negatives: pad queries without a judged non-relevant candidate with random unjudged ones.
        seed: the seed of the padding draws (an integer >= 0).

    Input columns: ``qid, query_vec, docno, doc_vec, score``. Output columns: the input's plus ``query_dime`` (and
    ``query_padded`` with ``pad_negatives=True``).
    """
    schematic = {'label': 'Oracle'}

    def __init__(self, *, qrels: pd.DataFrame, pad_negatives: bool = False, seed: int = 0,
                 keep_ranking: bool = True):
        stage = type(self).__name__
        check_qrels(qrels, stage)
        check_bool(stage, 'pad_negatives', pad_negatives)
        check_int(stage, 'seed', seed, 0, 'the seed of the padding draws')
        check_bool(stage, 'keep_ranking', keep_ranking)
        self.qrels = qrels
        self.pad_negatives = pad_negatives
        self.seed = seed
        self.keep_ranking = keep_ranking

    def _extra_columns(self):
        return ('query_padded',) if self.pad_negatives else ()

    def _importance_and_columns(self, inp, groups, query_vecs):
        row_labels = candidate_labels(inp, self.qrels, self)
        extra = {}
        if self.pad_negatives:
            row_labels, padded = self._pad(inp, groups, row_labels)
            extra['query_padded'] = padded
        feedback = select_feedback(inp, groups, len(inp), self)  # every candidate: the width is capped per frame
        mask = feedback.mask & np.isfinite(row_labels[np.where(feedback.mask, feedback.rows, 0)])
        feedback = feedback._replace(mask=mask)
        doc_vecs = gather_vectors(inp, 'doc_vec', feedback, query_vecs.shape[1], self)
        slot_labels = np.where(mask, row_labels[np.where(mask, feedback.rows, 0)], 0.0)
        importance = maths.oracle_dime(query_vecs, doc_vecs, slot_labels, mask)
        undefined = np.isnan(importance).any(axis=1)
        importance = self._magnitude_fallback(np.nan_to_num(importance), query_vecs, undefined, inp, groups,
                                              'no oracle correlation (fewer than two judged candidates, or one '
                                              'label only)')
        return importance, extra

    def _pad(self, inp, groups, row_labels):
        """Label 0 a random draw of unjudged candidates of each query with relevant but no non-relevant judged
        candidates. Candidates are drawn from the query's unjudged docnos in sorted order, so the draw does not
        depend on the order of the rows."""
        judged = np.isfinite(row_labels)
        n_judged = np.bincount(groups.codes, weights=judged, minlength=groups.size)
        relevant = np.bincount(groups.codes, weights=judged & (row_labels > 0), minlength=groups.size)
        non_relevant = np.bincount(groups.codes, weights=judged & (row_labels <= 0), minlength=groups.size)
        needs = (relevant > 0) & (non_relevant == 0)
        padded = np.zeros(groups.size, dtype=np.int64)
        if not needs.any():
            return row_labels, padded
        row_labels = row_labels.copy()
        unjudged = np.flatnonzero(~judged & needs[groups.codes])
        unjudged = unjudged[np.lexsort((inp['docno'].to_numpy()[unjudged].astype(str), groups.codes[unjudged]))]
        bounds = np.searchsorted(groups.codes[unjudged], np.arange(groups.size + 1))
        qids = inp['qid'].to_numpy()[groups.first_rows]
        for query in np.flatnonzero(needs):
            pool = unjudged[bounds[query]:bounds[query + 1]]
            take = int(min(n_judged[query], len(pool)))
            chosen = pool[maths.query_rng(self.seed, str(qids[query])).choice(len(pool), take, replace=False)]
            row_labels[chosen] = 0.0
            padded[query] = take
        touched = qids[padded > 0]
        if len(touched):
            shown = ', '.join(map(repr, touched[:5])) + (' ...' if len(touched) > 5 else '')
            warnings.warn(f'{self}: {len(touched)} quer{"y" if len(touched) == 1 else "ies"} ({shown}) had relevant '
                          'but no non-relevant judged candidate; padded with random unjudged candidates labelled 0 '
                          '(see query_padded)', stacklevel=4)
        return row_labels, padded


def check_qrels(qrels: pd.DataFrame, stage: str) -> None:
    """A frame of judgments: columns ``qid, docno, label``, finite labels, one label per (qid, docno)."""
    missing = {'qid', 'docno', 'label'} - set(getattr(qrels, 'columns', []))
    if missing:
        raise ValueError(f'{stage}: qrels must be a DataFrame with columns qid, docno, label; missing '
                         f'{sorted(missing)}')
    _check_labels(qrels, stage)


def candidate_labels(inp: pd.DataFrame, qrels: pd.DataFrame, stage: object) -> np.ndarray:
    """The label of each row of ``inp`` (float64), NaN where the (qid, docno) is not judged. An input qid that the
    qrels write as a float (``'1'`` against ``'1.0'``), or the other way round, is an error naming both forms: every
    one of its candidates would read as unjudged."""
    keys = pd.MultiIndex.from_frame(inp[['qid', 'docno']].astype(str))
    judged = qrels.assign(qid=qrels['qid'].astype(str), docno=qrels['docno'].astype(str))
    check_qids_written_alike(keys.unique(level='qid'), set(judged['qid']), stage, 'the qrels',
                             "e.g. qrels.assign(qid=qrels['qid'].astype(int).astype(str))")
    labels = judged.drop_duplicates(['qid', 'docno']).set_index(['qid', 'docno'])['label']
    return labels.reindex(keys).to_numpy(dtype=np.float64)


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
