"""The PrunedRetriever transformer: exact dense retrieval that scores only the dimensions a pruned query keeps."""
import functools
import logging
import time
from pathlib import Path
from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt

from .._config import ConfigTransformer, check_bool, check_int
from .._frames import empty_frame
from ..store import out_of_core, portable_index
from . import calibration, dense, kept, planner
from .compressed import search_compressed
from .dense import Result
from .layout import Layout
from .planner import Choice, Plan, nonzero_fractions

logger = logging.getLogger(__name__)

STRATEGIES = ('auto', 'pruned', 'dense', 'compressed')
#: A query whose scores could reach this (half the float32 range) is refused: see ``PrunedRetriever.stack_queries``.
SCORE_LIMIT = float(np.finfo(np.float32).max) / 2


class ExactRetriever(ConfigTransformer):
    """What both retrievers share: the output frame of :meth:`_rank`'s rankings, and ``% k`` variants that share the
    attributes named in ``_shared`` (the index copies, the actors, the timings)."""
    _shared: Tuple[str, ...] = ()

    def fuse_rank_cutoff(self, k: int) -> Optional[pt.Transformer]:
        """``% k`` with ``k < num_results``: the retriever with ``num_results=k``, sharing this one's copies."""
        if k >= self.num_results:
            return None
        fused = pt.inspect.transformer_apply_attributes(self, num_results=k)
        for name in self._shared:
            setattr(fused, name, getattr(self, name))
        return fused

    def _keep_arguments(self, arguments: dict) -> None:
        """Stores the checked constructor ``arguments`` (its ``locals()``) under their own names, where
        ``ConfigTransformer`` reads them."""
        ConfigTransformer.__init__(self, **{name: arguments[name] for name in self._parameters()})

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        """One row per result, input columns first: ``_rank(inp)`` gives each query's ``scores`` and ``docids`` and
        the function from docids to docnos."""
        pt.validate.query_frame(inp, extra_columns=['query_vec'], context=self)
        columns = [c for c in inp.columns if not (self.drop_query_vec and c == 'query_vec')]
        columns += [c for c in ('docno', 'docid', 'score', 'rank') if c not in columns]
        if not len(inp):
            return empty_frame(inp, columns)
        inp = inp.reset_index(drop=True)
        scores, docids, docnos = self._rank(inp)
        counts = np.array([len(d) for d in docids])
        flat_ids = np.concatenate(docids).astype(np.int64)
        out = inp.iloc[np.repeat(np.arange(len(inp)), counts)].reset_index(drop=True)
        out = out.assign(docno=docnos(flat_ids), docid=flat_ids, score=np.concatenate(scores).astype(np.float64),
                         rank=np.concatenate([np.arange(c) for c in counts]))
        return out[columns]


class PrunedRetriever(ExactRetriever):
    """Exact inner-product retrieval of the top ``num_results`` documents for pruned queries, scoring only the kept
    dimensions of each query (the non-zero entries of ``query_vec``): the same ranking as scoring every dimension with
    the zeroed query, reading a fraction of the index. Exact ties go to the lower docid on every path.

    ``strategy``: ``'auto'`` (default) takes, per call, the fastest exact path, measured on this index and machine;
    ``'pruned'`` (float32 kernel over the kept rows), ``'dense'`` (BLAS) or ``'compressed'`` (an int8 copy's kept rows,
    then an exact re-score of what its error bound cannot rule out) force one. pt_docs/pruned.rst explains the paths,
    the copies a FlexIndex gets on disk, the checks and the threads; pt_docs/speed.rst measures them.

    Args:
        index: a pyterrier-dr ``FlexIndex`` (inner product) or a ``(docs, dims)`` float array of document vectors.
        num_results: documents returned per query.
        docnos: with an array ``index``, the docno of each row (default: the row number as a string).
        strategy: ``'auto'``, ``'pruned'``, ``'dense'`` or ``'compressed'``.
        batch_size: queries per matrix product on the dense path.
        drop_query_vec: drop ``query_vec`` from the output.
        verbose: progress bars for the one-off steps of a first search (building copies, calibrating).

    Input columns: ``qid, query_vec``. Output columns: the input's plus ``docno, docid, score, rank``, sorted.

    Example::

        pipe = bm25 % 10 >> model.query_encoder() >> index.vec_loader() >> PrfDime(keep_ranking=False) >> Rdime() \\
            >> PrunedRetriever(index=index, num_results=1000)
    """
    schematic = {'label': 'PrunedRetriever'}
    _shared = ('_layout', '_measured')

    def __init__(self, *, index: object, num_results: int = 1000, docnos: Optional[Sequence[str]] = None,
                 strategy: str = 'auto', batch_size: int = 64, drop_query_vec: bool = False, verbose: bool = True):
        name = type(self).__name__
        check_int(name, 'num_results', num_results, 1)
        check_int(name, 'batch_size', batch_size, 1)
        if strategy not in STRATEGIES:
            raise ValueError(f'{name}: unknown strategy {strategy!r}; expected one of {STRATEGIES}')
        check_bool(name, 'drop_query_vec', drop_query_vec)
        check_bool(name, 'verbose', verbose)
        if isinstance(index, np.ndarray):
            if index.ndim != 2 or not index.size:
                raise ValueError(f'{name}: an array index must be a non-empty (docs, dims) matrix, got shape '
                                 f'{index.shape}')
            if docnos is not None and len(docnos) != index.shape[0]:
                raise ValueError(f'{name}: docnos has {len(docnos)} entries but the index has {index.shape[0]} rows')
        elif callable(getattr(index, 'payload', None)) and hasattr(index, 'index_path'):
            if docnos is not None:
                raise ValueError(f'{name}: docnos is only for an array index; a FlexIndex has its own docnos')
            sim_fn = getattr(getattr(index, 'sim_fn', None), 'value', 'dot')
            if sim_fn != 'dot':
                raise ValueError(f"{name}: only inner-product indexes are supported, {index!r} has sim_fn="
                                 f"{sim_fn!r}; open it with FlexIndex(path, sim_fn='dot')")
        else:
            raise ValueError(f'{name}: index must be a pyterrier_dr.FlexIndex or a (docs, dims) numpy array, got '
                             f'{type(index).__name__}')
        self._keep_arguments(locals())
        self._layout = Layout(index, docnos=docnos, stage=name, verbose=verbose)
        self._measured = planner.MeasuredChoice(
            None if isinstance(index, np.ndarray)
            else functools.partial(calibration.record_path, Path(index.index_path) / 'vecs.f4'))

    def __getstate__(self) -> dict:
        return {**self.__dict__, 'index': portable_index(self.index)}  # a FlexIndex by path, not its open vectors

    def dim_major(self) -> np.ndarray:
        """The ``(dims, docs)`` float32 C-contiguous document matrix (opened or built on first use)."""
        return self._layout.matrix()

    @property
    def shape(self) -> tuple:
        """``(dims, docs)`` of the index, without opening or building any copy."""
        return self._layout.shape

    def choice(self, query_vecs: np.ndarray, call_bucket: Optional[str] = None) -> Choice:
        """How this retriever scores these pruned query vectors (n, dims), and why: :func:`.planner.choose`."""
        dims, docs = self.shape
        return planner.choose(query_vecs, strategy=self.strategy, matrix_bytes=4 * dims * docs,
                              compiled=kept.NUMBA_AVAILABLE, model=lambda: calibration.model(verbose=self.verbose),
                              k=min(self.num_results, docs), timings=self._measured, call_bucket=call_bucket,
                              float32_ready=self.strategy != 'auto' or self._layout.has_matrix(),
                              out_of_core=not self._layout.is_array and out_of_core(4 * dims * docs))

    def plan(self, query_vecs: np.ndarray) -> Plan:
        """The plan of :meth:`choice`: decided once per call."""
        return self.choice(query_vecs).plan

    def search(self, query_vecs: np.ndarray, plan: Optional[Plan] = None) -> Result:
        """The top ``num_results`` ``(scores, docids)`` of each checked query vector, scored as ``plan`` says
        (default: as :meth:`choice` takes them, timed under ``'auto'``, where a first share may explore a path)."""
        if plan is None:  # a first share of the call may explore a path, the rest chosen again (planner.parts)
            found = [self._search(part, choice.plan, choice) for choice, part in planner.parts(query_vecs, self.choice)]
            return [s for scores, _ in found for s in scores], [d for _, docids in found for d in docids]
        return self._search(query_vecs, plan, None)

    def _search(self, query_vecs: np.ndarray, plan: Plan, choice: Optional[Choice]) -> Result:
        start = time.perf_counter()
        score = self._scorer(plan, query_vecs)
        result = score() if choice is None else self._measured.timed(choice, score)
        # the path of each call, for a reader of the log (the scale benchmark reports it)
        logger.info('%s: %d queries, %.1f %% of the dimensions kept on average, path %r%s, %.3f s',
                    type(self).__name__, len(query_vecs), 100 * float(np.mean(nonzero_fractions(query_vecs)))
                    if len(query_vecs) else 0.0, plan.path, f' ({choice.reason})' if choice is not None else '',
                    time.perf_counter() - start)
        return result

    def _scorer(self, plan: Plan, query_vecs: np.ndarray) -> Callable[[], Result]:
        """The scoring of these queries on ``plan``'s path, its files opened (or built) first."""
        if plan.path == 'dense':
            rows = None if self._layout.is_array else self._layout.doc_rows()
            matrix = self.dim_major() if rows is None else rows
            return functools.partial(dense.search_dense, matrix, query_vecs, self.num_results,
                                     batch_size=self.batch_size, rows=rows is not None)
        if plan.strategy == 'compressed':
            rows = self._layout.rescoring_rows()
            return functools.partial(search_compressed, self._layout.codes(),
                                     self.dim_major() if rows is None else None, query_vecs, self.num_results,
                                     use_numba=kept.NUMBA_AVAILABLE, one_pass=plan.path == 'compressed one pass',
                                     doc_rows=rows)
        return functools.partial(kept.search_pruned, self.dim_major(), query_vecs, self.num_results,
                                 one_pass=plan.path == 'one pass')

    def _rank(self, inp: pd.DataFrame) -> tuple:
        query_vecs = self.stack_queries(inp, self.shape[0], self._layout.abs_max(), type(self).__name__)
        return (*self.search(query_vecs), self._layout.lookup_docnos)

    @staticmethod
    def stack_queries(inp: pd.DataFrame, dims: int, abs_max: np.ndarray, name: str) -> np.ndarray:
        """The ``query_vec`` column as a float32 (n, dims) matrix, refusing (naming the qid) other sizes, NaN / inf,
        and scores that could overflow float32."""
        values = inp['query_vec'].to_numpy()
        bad = [i for i, v in enumerate(values) if np.ndim(v) != 1 or np.size(v) != dims]
        if bad:
            row = bad[0]
            raise ValueError(f'{name}: query_vec of qid={inp["qid"].iloc[row]!r} has shape '
                             f'{np.shape(values[row])}, but the index holds {dims}-dimensional vectors; encode the '
                             'queries with the model of the index')
        query_vecs = np.stack(values).astype(np.float32, copy=False)
        finite = np.isfinite(query_vecs).all(axis=1)
        if not finite.all():
            raise ValueError(f'{name}: query_vec of qid={inp["qid"].iloc[int(np.argmin(finite))]!r} holds NaN or '
                             'inf; check the encoder and the DIME / threshold stages before this one')
        # |q . d| <= sum_j |q_j| max_d |d_j|: below half the float32 range no product or partial sum can overflow
        # (the half covers rounding), so every score is finite on both paths
        bound = np.abs(query_vecs).astype(np.float64) @ abs_max
        safe = bound < SCORE_LIMIT
        if not safe.all():
            row = int(np.argmin(safe))
            raise ValueError(f'{name}: query_vec of qid={inp["qid"].iloc[row]!r} (values up to '
                             f'{np.abs(query_vecs[row]).max():.3g}) can score beyond float32 against this index: '
                             f'sum |q_j| max |d_j| = {bound[row]:.3g} >= {SCORE_LIMIT:.3g}; normalise the query '
                             'vectors (e.g. to unit length)')
        return query_vecs

