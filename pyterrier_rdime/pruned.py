"""Exact dense retrieval that scores only the dimensions a pruned query keeps."""
import contextlib
import numbers
from typing import Optional, Sequence, Tuple

import numpy as np
import pandas as pd
import pyterrier as pt

from ._config import ConfigTransformer
from ._frames import empty_frame

STRATEGIES = ('auto', 'pruned', 'dense')

#: Cost model of ``strategy='auto'`` (see :class:`PrunedRetriever`), in passes over the whole matrix, fitted on the
#: benchmark (``benchmarks/bench_rdime.py``, 1M x 768 float32, 2-core AVX2 CPU). Fewer than this many queries are
#: scored one by one on the dense path (a matrix product of 2-3 rows is slower than as many ``gemv``)...
GEMV_BELOW = 4
#: ...beyond, one matrix product serves about this many queries per pass over the matrix (compute-bound).
GEMM_QUERIES_PER_PASS = 5.0
#: Each BLAS thread beyond the first speeds the dense path up by this much (1.73-1.86x with 2 threads here), up to
#: ``DENSE_MAX_THREADS`` threads (memory bandwidth); the pruned path runs on one thread.
DENSE_THREAD_GAIN, DENSE_MAX_THREADS = 0.8, 4
#: The pruned path costs ``PRUNED_FIXED + PRUNED_SLOPE * kept fraction`` passes per query (the score vector is
#: re-read and re-written once per run of consecutive kept dimensions, and the top-k selection).
PRUNED_FIXED, PRUNED_SLOPE = 0.1, 1.1
#: Below this matrix size (bytes) the matrix sits in the CPU caches, scoring is not memory-bound and the pruned
#: kernel's per-run overhead dominates: ``'auto'`` uses the dense path.
MIN_PRUNED_BYTES = 64 * 2 ** 20


def dense_cost(queries: int, threads: int = 1) -> float:
    """Estimated passes over the matrix (of one thread) to score ``queries`` queries on the dense path with ``threads``
    BLAS threads."""
    passes = float(queries) if queries < GEMV_BELOW else 1.0 + queries / GEMM_QUERIES_PER_PASS
    return passes / (1.0 + DENSE_THREAD_GAIN * (min(threads, DENSE_MAX_THREADS) - 1))


def pruned_cost(query_vecs: np.ndarray) -> float:
    """Estimated passes over the matrix to score these pruned queries on the pruned path."""
    return float(np.sum(PRUNED_FIXED + PRUNED_SLOPE * np.mean(query_vecs != 0, axis=1)))


class PrunedRetriever(ConfigTransformer):
    """Exact inner-product retrieval of the top ``num_results`` documents for pruned queries, scoring only the kept
    dimensions of each query: the speed-up RDIME / Top-k pruning promises, with the same ranking as scoring every
    dimension with the zeroed query (:class:`pyterrier_rdime.Rdime` sets dropped dimensions of ``query_vec`` to 0).

    The kept set of a query is the set of non-zero entries of its ``query_vec`` (a kept dimension whose value is
    exactly 0 contributes nothing, so skipping it is exact). The document vectors are held as a dimension-major
    ``(dims, docs)`` float32 copy, built on first use (``dims * docs * 4`` bytes of memory; pass a Fortran-ordered
    ``(docs, dims)`` array to share its memory instead), so that the vectors of one dimension are contiguous.

    Two exact scoring paths; ``strategy`` picks one:

    - ``'pruned'``: one query at a time, a BLAS ``gemv`` per run of consecutive kept dimensions (BLAS limited to one
      thread), reading only the kept rows of the matrix: cost ∝ kept fraction × docs × dims, plus a pass over the
      score vector per run. Pays off when scoring is memory-bound: one query (or two) at a time over a matrix much
      larger than the CPU caches (≳ 10^5 documents of 768 dimensions).
    - ``'dense'``: batches of ``batch_size`` queries scored over every dimension with one matrix product per block of
      documents (the zeroed query), as pyterrier-dr's numpy retriever does. A batch reads the matrix once and is
      compute-bound, and the kept sets of different queries barely overlap (the union of 8 RDIME kept sets covers
      ~98% of the dimensions), so for large batches this is faster than scoring each query's kept dimensions alone.
    - ``'auto'`` (default): per call, the path of lower estimated cost (:func:`pruned_cost`, :func:`dense_cost`,
      in passes over the matrix), and ``'dense'`` for a matrix under ``MIN_PRUNED_BYTES`` (64 MiB). With one BLAS
      thread that is ``'pruned'`` for up to three queries keeping < ~80% of the dimensions, four keeping < ~30%;
      with two BLAS threads (the dense path then reads the matrix ~1.8x faster, the pruned path stays on one
      core), single queries keeping < ~40%; with four or more, < ~20%.

    Both paths return the same documents up to floating-point ties: scores agree to float32 summation-order
    precision (~1e-6 relative), so documents whose scores differ by less than that may swap or, at the cut-off,
    differ.

    Args:
        index: a pyterrier-dr ``FlexIndex`` (inner product) or a ``(docs, dims)`` float array of document vectors.
        num_results: documents returned per query.
        docnos: with an array ``index``, the docno of each row (default: the row number as a string).
        strategy: ``'auto'``, ``'pruned'`` or ``'dense'`` (see above).
        batch_size: queries per matrix product on the dense path.
        drop_query_vec: drop ``query_vec`` from the output.
        verbose: show a progress bar over the queries.

    Input columns: ``qid, query_vec`` (a query frame, e.g. the output of ``PrfDime(keep_ranking=False) >> Rdime()``).
    Output columns: the input's plus ``docno, docid, score, rank`` (as pyterrier-dr's retrievers), ``num_results``
    rows per query, sorted by query and descending score.

    The saving is on the pruned search itself: feedback for the DIME should come from a cheap first stage (BM25, an
    approximate index) or none at all (LLM DIME), not from a second exhaustive dense search.

    Example::

        index = pyterrier_dr.FlexIndex('msmarco.flex')
        pipe = bm25 % 10 >> model.query_encoder() >> index.vec_loader() >> PrfDime(keep_ranking=False) >> Rdime() \\
            >> PrunedRetriever(index=index, num_results=1000)
        pipe.search('what is a dense retriever')  # one query: only its kept dimensions of the index are read
    """
    schematic = {'label': 'PrunedRetriever'}

    def __init__(self, *, index: object, num_results: int = 1000, docnos: Optional[Sequence[str]] = None,
                 strategy: str = 'auto', batch_size: int = 64, drop_query_vec: bool = False, verbose: bool = False):
        name = type(self).__name__
        for arg, value in (('num_results', num_results), ('batch_size', batch_size)):
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
                raise ValueError(f'{name}: {arg} must be an integer >= 1, got {value!r}')
        if strategy not in STRATEGIES:
            raise ValueError(f'{name}: unknown strategy {strategy!r}; expected one of {STRATEGIES}')
        if isinstance(index, np.ndarray):
            if index.ndim != 2 or not index.size:
                raise ValueError(f'{name}: an array index must be a non-empty (docs, dims) matrix, got shape '
                                 f'{index.shape}')
            if docnos is not None and len(docnos) != index.shape[0]:
                raise ValueError(f'{name}: docnos has {len(docnos)} entries but the index has {index.shape[0]} rows')
        elif callable(getattr(index, 'payload', None)):
            if docnos is not None:
                raise ValueError(f'{name}: docnos is only for an array index; a FlexIndex has its own docnos')
            sim_fn = getattr(getattr(index, 'sim_fn', None), 'value', 'dot')
            if sim_fn != 'dot':
                raise ValueError(f"{name}: only inner-product indexes are supported, {index!r} has sim_fn="
                                 f"{sim_fn!r}; open it with FlexIndex(path, sim_fn='dot')")
        else:
            raise ValueError(f'{name}: index must be a pyterrier_dr.FlexIndex or a (docs, dims) numpy array, got '
                             f'{type(index).__name__}')
        self.index = index
        self.num_results = num_results
        self.docnos = docnos
        self.strategy = strategy
        self.batch_size = batch_size
        self.drop_query_vec = drop_query_vec
        self.verbose = verbose
        self._dim_major: Optional[np.ndarray] = None
        self._docno_lookup = None

    def fuse_rank_cutoff(self, k: int) -> Optional[pt.Transformer]:
        """``PrunedRetriever(num_results=n) % k`` with ``k < n`` is the retriever with ``num_results=k``."""
        if k < self.num_results:
            fused = PrunedRetriever(index=self.index, num_results=k, docnos=self.docnos, strategy=self.strategy,
                                    batch_size=self.batch_size, drop_query_vec=self.drop_query_vec,
                                    verbose=self.verbose)
            fused._dim_major, fused._docno_lookup = self._dim_major, self._docno_lookup
            return fused
        return None

    # the matrix
    def dim_major(self) -> np.ndarray:
        """The ``(dims, docs)`` float32 C-contiguous document matrix, built (once) on first use."""
        if self._dim_major is None:
            if isinstance(self.index, np.ndarray):
                vecs = self.index
            else:
                _, vecs, _ = self.index.payload()
            self._dim_major = dimension_major(vecs)
        return self._dim_major

    def _lookup_docnos(self, docids: np.ndarray) -> np.ndarray:
        if isinstance(self.index, np.ndarray):
            if self.docnos is None:
                return docids.astype(str).astype(object)
            if self._docno_lookup is None:
                self._docno_lookup = np.asarray(self.docnos, dtype=object)
            return self._docno_lookup[docids]
        docnos = self.index.payload(return_dvecs=False)[0]
        return np.asarray(docnos.fwd[docids], dtype=object)

    def choose_strategy(self, query_vecs: np.ndarray) -> str:
        """The path ``strategy='auto'`` takes for these (already pruned) query vectors (n, dims)."""
        if self.strategy != 'auto':
            return self.strategy
        dt = self.dim_major()
        if dt.nbytes < MIN_PRUNED_BYTES or not len(query_vecs):
            return 'dense'
        return 'pruned' if pruned_cost(query_vecs) < dense_cost(len(query_vecs), blas_threads()) else 'dense'

    def transform(self, inp: pd.DataFrame) -> pd.DataFrame:
        pt.validate.query_frame(inp, extra_columns=['query_vec'], context=self)
        columns = [c for c in inp.columns if not (self.drop_query_vec and c == 'query_vec')]
        columns += [c for c in ('docno', 'docid', 'score', 'rank') if c not in columns]
        if not len(inp):
            return empty_frame(inp, columns)
        inp = inp.reset_index(drop=True)
        query_vecs = self._stack_queries(inp)
        strategy = self.choose_strategy(query_vecs)
        if strategy == 'pruned':
            scores, docids = search_pruned(self.dim_major(), query_vecs, self.num_results, verbose=self.verbose)
        else:
            scores, docids = search_dense(self.dim_major(), query_vecs, self.num_results,
                                          batch_size=self.batch_size, verbose=self.verbose)
        counts = np.array([len(d) for d in docids])
        flat_ids = np.concatenate(docids).astype(np.int64)
        out = inp.iloc[np.repeat(np.arange(len(inp)), counts)].reset_index(drop=True)
        out = out.assign(docno=self._lookup_docnos(flat_ids), docid=flat_ids,
                         score=np.concatenate(scores).astype(np.float64),
                         rank=np.concatenate([np.arange(c) for c in counts]))
        return out[columns]

    def _stack_queries(self, inp: pd.DataFrame) -> np.ndarray:
        values = inp['query_vec'].to_numpy()
        dims = self.dim_major().shape[0]
        bad = [i for i, v in enumerate(values) if np.ndim(v) != 1 or np.size(v) != dims]
        if bad:
            row = bad[0]
            raise ValueError(f'{self}: query_vec of qid={inp["qid"].iloc[row]!r} has shape {np.shape(values[row])}, '
                             f'but the index holds {dims}-dimensional vectors; encode the queries with the model '
                             'of the index')
        query_vecs = np.stack(values).astype(np.float32, copy=False)
        finite = np.isfinite(query_vecs).all(axis=1)
        if not finite.all():
            raise ValueError(f'{self}: query_vec of qid={inp["qid"].iloc[int(np.argmin(finite))]!r} holds NaN or '
                             'inf; check the encoder and the DIME / threshold stages before this one')
        return query_vecs


def dimension_major(vecs: np.ndarray, *, chunk: int = 65536) -> np.ndarray:
    """A ``(dims, docs)`` float32 C-contiguous copy of ``(docs, dims)`` document vectors (no copy when ``vecs`` is
    already a Fortran-ordered float32 array), filled in chunks of documents so that a memory-mapped index is read
    once, sequentially."""
    if vecs.dtype == np.float32 and vecs.flags.f_contiguous:
        return vecs.T
    docs, dims = vecs.shape
    out = np.empty((dims, docs), dtype=np.float32)
    for start in range(0, docs, chunk):
        out[:, start:start + chunk] = np.asarray(vecs[start:start + chunk], dtype=np.float32).T
    return out


def kept_runs(kept: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``(starts, ends)`` of the runs of consecutive True entries of a 1-D mask (half-open intervals)."""
    idx = np.flatnonzero(kept)
    if not len(idx):
        return idx, idx
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    return idx[np.r_[0, breaks]], idx[np.r_[breaks - 1, len(idx) - 1]] + 1


def pruned_scores(dim_major: np.ndarray, query_vec: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """Inner products of one query with every document, reading only the rows of ``dim_major`` (dims, docs) where
    ``query_vec`` is non-zero: one BLAS ``gemv`` per run of consecutive kept dimensions (``axpy`` for a lone one),
    accumulated in ``out``. ``dim_major`` must be C-contiguous float32."""
    query_vec = np.ascontiguousarray(query_vec, dtype=np.float32)
    if out is None:
        out = np.empty(dim_major.shape[1], dtype=np.float32)
    out[:] = 0.0
    starts, ends = kept_runs(query_vec != 0)
    blas = _blas()
    for a, b in zip(starts.tolist(), ends.tolist()):
        if blas is None:  # pragma: no cover
            out += query_vec[a:b] @ dim_major[a:b]
        elif b - a == 1:  # a lone dimension: y += q_j * row_j
            blas.saxpy(dim_major[a], out, a=float(query_vec[a]))
        else:  # a run of rows: y += rows^T q (the transposed C-ordered block is Fortran-ordered: no copy)
            blas.sgemv(1.0, dim_major[a:b].T, query_vec[a:b], beta=1.0, y=out, overwrite_y=True)
    return out


def _blas():
    try:
        from scipy.linalg import blas
    except ImportError:  # pragma: no cover - scipy comes with pyterrier
        return None
    return blas


_BLAS_CONTROLLER = None


def _controller():
    global _BLAS_CONTROLLER
    if _BLAS_CONTROLLER is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # pragma: no cover
            return None
        _blas()  # load scipy's BLAS first, so that the controller sees it
        _BLAS_CONTROLLER = ThreadpoolController()
    return _BLAS_CONTROLLER


def one_blas_thread():
    """A context limiting BLAS to one thread: the pruned path makes many small ``gemv`` calls, where BLAS threads
    only add synchronisation (up to 5x slower on a busy 2-core machine). A no-op without ``threadpoolctl``."""
    controller = _controller()
    return contextlib.nullcontext() if controller is None else controller.limit(limits=1, user_api='blas')


def blas_threads() -> int:
    """The number of threads BLAS (hence the dense path) may use now (1 when unknown)."""
    controller = _controller()
    if controller is None:  # pragma: no cover
        return 1
    return max([info['num_threads'] for info in controller.select(user_api='blas').info()] or [1])


def top_k(scores: np.ndarray, k: int, offset: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """The ``k`` highest of a 1-D score array, descending (ties by lower index): ``(scores, indices + offset)``."""
    n = len(scores)
    k = min(k, n)
    idx = np.argpartition(scores, n - k)[n - k:] if k < n else np.arange(n)
    idx = idx[np.lexsort((idx, -scores[idx]))]
    return scores[idx], idx + offset


def search_pruned(dim_major: np.ndarray, query_vecs: np.ndarray, k: int, *,
                  verbose: bool = False) -> Tuple[list, list]:
    """Top-``k`` (scores, docids) of each pruned query, one query at a time over its kept dimensions only (BLAS
    limited to one thread meanwhile)."""
    buffer = np.empty(dim_major.shape[1], dtype=np.float32)
    scores, docids = [], []
    rows = pt.tqdm(query_vecs, desc='PrunedRetriever', unit='q') if verbose else query_vecs
    with one_blas_thread():
        for query_vec in rows:
            s, d = top_k(pruned_scores(dim_major, query_vec, buffer), k)
            scores.append(s)
            docids.append(d)
    return scores, docids


def search_dense(dim_major: np.ndarray, query_vecs: np.ndarray, k: int, *, batch_size: int = 64,
                 doc_block: int = 32768, verbose: bool = False) -> Tuple[list, list]:
    """Top-``k`` (scores, docids) of each query scored over every dimension (the reference the pruned path must
    match): fewer than ``GEMV_BELOW`` queries one by one (a ``gemv`` each), else ``batch_size`` queries per matrix
    product over blocks of ``doc_block`` documents (16k-64k is fastest here: larger blocks slow OpenBLAS down),
    merging the top-k block by block."""
    dims, docs = dim_major.shape
    k = min(k, docs)
    doc_block = max(doc_block, 2 * k)
    scores, docids = [], []
    if len(query_vecs) < GEMV_BELOW:
        for query_vec in query_vecs:
            s, d = top_k(np.ascontiguousarray(query_vec, dtype=np.float32) @ dim_major, k)
            scores.append(s)
            docids.append(d)
        return scores, docids
    batches = range(0, len(query_vecs), batch_size)
    if verbose:
        batches = pt.tqdm(batches, desc='PrunedRetriever (dense)', unit='batch')
    for q0 in batches:
        queries = np.ascontiguousarray(query_vecs[q0:q0 + batch_size], dtype=np.float32)
        best_s = np.empty((len(queries), 0), dtype=np.float32)
        best_i = np.empty((len(queries), 0), dtype=np.int64)
        for d0 in range(0, docs, doc_block):
            block = queries @ dim_major[:, d0:d0 + doc_block]
            ids = np.broadcast_to(np.arange(d0, d0 + block.shape[1]), block.shape)
            cand_s = np.concatenate([best_s, block], axis=1)
            cand_i = np.concatenate([best_i, ids], axis=1)
            width = cand_s.shape[1]
            if width > k:
                part = np.argpartition(cand_s, width - k, axis=1)[:, width - k:]
                cand_s = np.take_along_axis(cand_s, part, axis=1)
                cand_i = np.take_along_axis(cand_i, part, axis=1)
            best_s, best_i = cand_s, cand_i
        for s, i in zip(best_s, best_i):
            order = np.lexsort((i, -s))
            scores.append(s[order])
            docids.append(i[order])
    return scores, docids
