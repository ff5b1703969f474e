"""Oracle and active-feedback DIME: upper bounds that read the relevance judgments."""
import warnings

import numpy as np
import pandas as pd

from .. import maths
from .._config import check_bool, check_int, check_weights
from .._frames import Feedback, check_qids_written_alike, gather_vectors, numeric_column, select_feedback
from ._base import DimeScorer, some_queries


class OracleDime(DimeScorer):
    """Oracle DIME, an upper bound that reads the judgments (``qrels``: ``qid, docno, label``): per dimension ``j``,
    the Pearson correlation of the label with ``q_j * d_j`` over the judged candidates. Where it is undefined
    (fewer than two judged, or one label), ``u = q * q`` with a warning.

    ``pad_negatives=True`` labels 0 random unjudged candidates (as many as it has judged; seeded by ``seed`` and the
    qid) of a query with relevant but no non-relevant judged candidate, as DIME-SIGIR-2024's issue #3 advises; the
    column ``query_padded`` counts them (pt_docs/dime.rst).

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

    def _importance(self, inp, groups, query_vecs):
        row_labels = candidate_labels(inp, self.qrels, self)
        extra = {}
        if self.pad_negatives:
            row_labels, padded = self._pad(inp, groups, row_labels)
            extra['query_padded'] = padded
        feedback = select_feedback(inp, groups, len(inp), self)  # every candidate
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
        """Label 0 a random draw of unjudged candidates of each query that needs it, from its unjudged docnos in
        sorted order (so that the row order does not matter)."""
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
        if (padded > 0).any():
            warnings.warn(f'{self}: {some_queries(inp, groups, padded > 0)} had relevant but no non-relevant judged '
                          'candidate; padded with random unjudged candidates labelled 0 (see query_padded)',
                          stacklevel=4)
        return row_labels, padded


class ActiveFeedbackDime(DimeScorer):
    """Active-feedback DIME, an upper bound that reads the judgments (``qrels``: ``qid, docno, label``), as if a user
    had marked one relevant document ``d_rel`` (the highest label > 0; among equals the highest-scored) and, with
    ``beta > 0``, one non-relevant ``d_non`` (the lowest label <= 0): ``u = alpha * q * d_rel - beta * q * d_non``.
    Without ``d_rel`` a query falls back to ``u = q * q``, without ``d_non`` it gets no negative term (warnings).

    Input columns: ``qid, query_vec, docno, doc_vec, score``. Output columns: the input's plus ``query_dime``.

    Example::

        pipe = bm25 % 100 >> model.query_encoder() >> index.vec_loader() \\
            >> ActiveFeedbackDime(qrels=dataset.get_qrels(), beta=0.5) >> Rdime() >> VectorScorer()

    Paper: Faggioli et al., *Dimension Importance Estimation for Dense Information Retrieval* (SIGIR 2024), the
    active-feedback setting; D'Erasmo et al., *The Missing Role of Negative Feedback in DIME*.
    """
    schematic = {'label': 'Active FB'}

    def __init__(self, *, qrels: pd.DataFrame, alpha: float = 1.0, beta: float = 0.0, keep_ranking: bool = True):
        stage = type(self).__name__
        check_qrels(qrels, stage)
        check_weights(stage, alpha, beta, 'the relevant document', 'the non-relevant one')
        check_bool(stage, 'keep_ranking', keep_ranking)
        self.qrels = qrels
        self.alpha = alpha
        self.beta = beta
        self.keep_ranking = keep_ranking

    def _importance(self, inp, groups, query_vecs):
        labels = candidate_labels(inp, self.qrels, self)
        ranked = select_feedback(inp, groups, len(inp), self)  # every candidate by score
        slot_labels = np.where(ranked.mask, labels[np.where(ranked.mask, ranked.rows, 0)], np.nan)
        with np.errstate(invalid='ignore'):  # NaN (unjudged, padding) compares False: never chosen
            relevant = np.where(slot_labels > 0, slot_labels, -np.inf)
            non_relevant = np.where(slot_labels <= 0, slot_labels, np.inf)
        pos = _one(ranked, np.argmax(relevant, axis=1), np.isfinite(relevant).any(axis=1))
        neg = _one(ranked, np.argmin(non_relevant, axis=1), np.isfinite(non_relevant).any(axis=1))
        dims = query_vecs.shape[1]
        if self.beta > 0 and not neg.mask.all():
            missing = ~neg.mask[:, 0] & pos.mask[:, 0]  # the queries without a positive are reported below
            if missing.any():
                warnings.warn(f'{self}: no judged non-relevant candidate for {some_queries(inp, groups, missing)}; '
                              'no negative term for them', stacklevel=3)
        importance = maths.eclipse_dime(query_vecs, gather_vectors(inp, 'doc_vec', pos, dims, self), pos.mask,
                                        gather_vectors(inp, 'doc_vec', neg, dims, self), neg.mask,
                                        alpha=self.alpha, beta=self.beta)
        return self._magnitude_fallback(importance, query_vecs, ~pos.mask[:, 0], inp, groups,
                                        'no judged relevant candidate'), {}


def _one(ranked: Feedback, slot: np.ndarray, found: np.ndarray) -> Feedback:
    """One feedback document per query: the row at ``slot`` of the ranked candidates, where ``found``."""
    rows = np.where(found, ranked.rows[np.arange(len(slot)), slot], -1)[:, None]
    return Feedback(rows, rows >= 0)


def check_qrels(qrels: pd.DataFrame, stage: str) -> None:
    """A frame of judgments: columns ``qid, docno, label``, finite numeric labels, one per (qid, docno) (else a text
    label fails late, a NaN or a second label is lost)."""
    missing = {'qid', 'docno', 'label'} - set(getattr(qrels, 'columns', []))
    if missing:
        raise ValueError(f'{stage}: qrels must be a DataFrame with columns qid, docno, label; missing '
                         f'{sorted(missing)}')
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


def candidate_labels(inp: pd.DataFrame, qrels: pd.DataFrame, stage: object) -> np.ndarray:
    """The label of each row of ``inp`` (float64), NaN where not judged; a qid the qrels write as a float (``'1'``
    against ``'1.0'``), or the other way round, is an error."""
    keys = pd.MultiIndex.from_frame(inp[['qid', 'docno']].astype(str))
    judged = qrels.assign(qid=qrels['qid'].astype(str), docno=qrels['docno'].astype(str))
    check_qids_written_alike(keys.unique(level='qid'), set(judged['qid']), stage, 'the qrels',
                             "e.g. qrels.assign(qid=qrels['qid'].astype(int).astype(str))")
    labels = judged.drop_duplicates(['qid', 'docno']).set_index(['qid', 'docno'])['label']
    return labels.reindex(keys).to_numpy(dtype=np.float64)
