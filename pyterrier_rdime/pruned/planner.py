"""The one planner of both retrievers: what a call will do (the :class:`Plan` and its :class:`Choice`), the cost model
that is its prior (:class:`CostModel`, constants from :mod:`.calibration`), the timings measured on the index
(:class:`MeasuredChoice`) and :func:`choose`, which decides once how a call's queries are scored. A forced strategy
takes its path; under ``'auto'`` the paths within ``EXPLORE_MARGIN`` of the least estimate are timed on the index
itself, like cuDNN's benchmark mode, the runner-up re-checked every ``RECHECK_EVERY`` calls. On shards the driver
measures.
"""
import contextlib
import dataclasses
import logging
import math
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .. import store
from . import dense
from .dense import GEMV_BELOW

#: The ways of scoring a call: BLAS; float32 kept rows per query or in one pass; the int8 copy per query or one pass.
PATHS = ('dense', 'pruned', 'one pass', 'compressed', 'compressed one pass')
#: Below this matrix size (bytes) the matrix sits in the caches and ``'auto'`` scores densely (BLAS is as fast).
MIN_PRUNED_BYTES = 16 * 2 ** 20
#: Paths estimated within this factor of the cheapest are timed (the model's misses so far were up to 1.6x).
EXPLORE_MARGIN = 2.0
#: Every this many calls of a bucket on its winner, the runner-up is timed once more.
RECHECK_EVERY = 64
#: Documents the compressed path re-scores exactly per result, as the model expects (measured ~1.1; margin added).
RESCORED_PER_RESULT = 1.5
#: The timings kept per path and bucket; a path's time is the least of them.
RECENT = 3
#: A path's first call in a process is timed again when it took less than this (loading its kernel and touching its
#: data weigh on it); a longer one is kept, so that a slow path is not run twice for minutes to learn it is slow.
#: Numba compiling its kernels (a first run, or a changed numba) is taken off first: it does not recur.
COLD_SECONDS = 10.0
#: A path that scores query after query (its cost is per query) is explored or re-checked on the first ``1 /
#: EXPLORE_SHARE`` of a larger call's queries (at least ``EXPLORE_QUERIES``): the rest of the call is chosen again.
EXPLORE_SHARE = 8
EXPLORE_QUERIES = 8

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Plan:
    """How the queries of one call are scored (one of :data:`PATHS`)."""
    path: str

    def __post_init__(self):
        if self.path not in PATHS:
            raise ValueError(f'unknown path {self.path!r}; expected one of {PATHS}')

    @property
    def strategy(self) -> str:
        """The ``strategy`` value that forces this path's family."""
        return {'one pass': 'pruned', 'compressed one pass': 'compressed'}.get(self.path, self.path)


@dataclasses.dataclass(frozen=True)
class Choice:
    """The path of one call as :func:`choose` took it, its estimated cost, bucket and reason: ``'forced'``,
    ``'model'`` (alone), ``'only'`` (candidate), ``'explore'``, ``'recheck'``, ``'measured'`` (the fastest timed) or
    ``'out of core'`` (the int8 copy's paths, the float32 matrix beyond the memory: :func:`choose`);
    ``queries``: how many of the call's first queries it scores, where not all (:func:`parts`)."""
    path: str
    estimate: float
    bucket: str
    reason: str
    queries: Optional[int] = None

    @property
    def plan(self) -> Plan:
        return Plan(self.path)


def nonzero_fractions(query_vecs: np.ndarray) -> np.ndarray:
    """The fraction of non-zero dimensions of each query vector (n, dims)."""
    return np.mean(query_vecs != 0, axis=1)


def one_pass_rows(query_vecs: np.ndarray) -> float:
    """The rows of a compressed one pass in units of a row of its int8 product: a row that extends another one
    (:func:`.dense.nested_trees`) copies its parent's scores and adds its own dimensions, at ``NESTED_ADD_COST /
    (2 dims)`` each."""
    _, rows, parents = dense.nested_trees(query_vecs)
    sizes = np.count_nonzero(query_vecs[rows], axis=1)
    adds = sizes - np.where(parents >= 0, sizes[parents], 0) + 1
    return len(query_vecs) - len(rows) + dense.NESTED_ADD_COST * float(adds.sum()) / (2 * query_vecs.shape[1])


def batch_features(query_vecs: np.ndarray) -> np.ndarray:
    """``(queries, union of the kept fractions, sum of the kept fractions)`` of a batch."""
    if not len(query_vecs):
        return np.zeros(3)
    union = float(np.mean((query_vecs != 0).any(axis=0)))
    return np.array([len(query_vecs), union, float(np.sum(nonzero_fractions(query_vecs)))])


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Estimated cost of each path in units of one dense ``gemv`` with top-k over the same matrix.

    - dense: 1 per query below ``GEMV_BELOW`` queries, else ``dense_gemm_fixed + dense_gemm_per_query * queries``;
    - pruned, query after query: ``pruned_fixed + pruned_slope * kept fraction`` per query;
    - pruned, one pass: ``batch_per_query * queries + batch_union * union fraction + batch_per_kept * sum of kept
      fractions``;
    - compressed: ``compressed_fixed + compressed_slope * kept fraction`` per query (one pass:
      ``compressed_pass_fixed + compressed_pass_per_query * queries``), plus :meth:`compressed_seconds` in units of
      one ``gemv`` (``gemv_seconds_per_byte`` times the matrix's size).
    """
    dense_gemm_fixed: float
    dense_gemm_per_query: float
    pruned_fixed: float
    pruned_slope: float
    batch_per_query: float
    batch_union: float
    batch_per_kept: float
    compressed_fixed: float
    compressed_slope: float
    compressed_call_seconds: float
    compressed_pass_fixed: float
    compressed_pass_per_query: float
    compressed_pass_call_seconds: float
    rescore_seconds: float
    gemv_seconds_per_byte: float

    def dense_cost(self, queries: int) -> float:
        """Estimated cost of scoring ``queries`` queries on the dense path."""
        if queries < GEMV_BELOW:
            return float(queries)
        return self.dense_gemm_fixed + self.dense_gemm_per_query * queries

    def pruned_one_by_one_cost(self, query_vecs: np.ndarray) -> float:
        """Estimated cost of the pruned path one query at a time."""
        return float(np.sum(self.pruned_fixed + self.pruned_slope * nonzero_fractions(query_vecs)))

    def pruned_batch_cost(self, query_vecs: np.ndarray) -> float:
        """Estimated cost of the pruned path for the whole batch in one pass."""
        return float(np.dot((self.batch_per_query, self.batch_union, self.batch_per_kept), batch_features(query_vecs)))

    def compressed_cost(self, query_vecs: np.ndarray, k: int, matrix_bytes: int) -> float:
        """Estimated cost of the compressed path query after query, ``k`` results each."""
        scan = self.compressed_fixed + self.compressed_slope * nonzero_fractions(query_vecs)
        seconds = self.compressed_seconds(query_vecs, k, self.compressed_call_seconds)
        return float(np.sum(scan)) + seconds / (self.gemv_seconds_per_byte * matrix_bytes)

    def compressed_one_pass_cost(self, query_vecs: np.ndarray, k: int, matrix_bytes: int) -> float:
        """Estimated cost of the compressed path for the whole batch in one pass."""
        scan = self.compressed_pass_fixed + self.compressed_pass_per_query * one_pass_rows(query_vecs)
        seconds = self.compressed_seconds(query_vecs, k, self.compressed_pass_call_seconds)
        return scan + seconds / (self.gemv_seconds_per_byte * matrix_bytes)

    def compressed_seconds(self, query_vecs: np.ndarray, k: int, call_seconds: float) -> float:
        """A compressed path's seconds that do not grow with the matrix: per-query work and exact re-scoring."""
        values = RESCORED_PER_RESULT * k * nonzero_fractions(query_vecs) * query_vecs.shape[1]
        return float(np.sum(call_seconds + self.rescore_seconds * values))

    def path_costs(self, query_vecs: np.ndarray, *, k: int, matrix_bytes: int, one_pass: bool) -> Dict[str, float]:
        """Estimated cost of ``'dense'``, ``'pruned'``, ``'one pass'``, ``'compressed'`` and ``'compressed one pass'``
        (the one-pass paths only with ``one_pass``), in that order."""
        costs = {'dense': self.dense_cost(len(query_vecs)), 'pruned': self.pruned_one_by_one_cost(query_vecs),
                 'one pass': one_pass and self.pruned_batch_cost(query_vecs),
                 'compressed': self.compressed_cost(query_vecs, k, matrix_bytes),
                 'compressed one pass': one_pass and self.compressed_one_pass_cost(query_vecs, k, matrix_bytes)}
        return {path: cost for path, cost in costs.items() if one_pass or 'one pass' not in path}


class MeasuredChoice:
    """The timings of the paths of one index on this machine, from which :func:`choose` chooses. Shared by a
    retriever and its ``% k`` variants; thread-safe; pickles without its timings (the other side reads the record).

    Args:
        record: gives the JSON file of the record, called when the record is first needed (None: in memory only).
        clock: the clock that times a call (seconds).
    """

    def __init__(self, record: Optional[Callable[[], Path]], clock: Callable[[], float] = time.perf_counter):
        self.record = record
        self.clock = clock
        self._lock = threading.Lock()
        self._buckets: Optional[Dict[str, dict]] = None
        self._path: Optional[Path] = None
        self._warm: set = set()

    def __getstate__(self) -> dict:
        return {'record': self.record, 'clock': self.clock}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    def _state(self, name: str) -> dict:
        if self._buckets is None:
            self._path = self.record() if self.record is not None else None
            self._buckets = _read_timings(self._path) if self._path is not None else {}
        return self._buckets.setdefault(name, {'calls': 0, 'seconds_per_unit': {}})

    def timed(self, choice: Choice, score: Callable[[], object]) -> object:
        """Runs ``score`` (the call on ``choice.path``), records its time where measured, less what numba spent
        compiling in it, and returns its result."""
        if choice.reason not in ('explore', 'recheck', 'measured'):
            return score()
        with _compiling(self.clock) as compiled:
            start = self.clock()
            result = score()
            seconds = self.clock() - start
        seconds = max(0.0, seconds - compiled[0])
        self._record(choice, seconds, seconds / max(choice.estimate, 1e-12))
        return result

    def _record(self, choice: Choice, seconds: float, seconds_per_unit: float) -> None:
        with self._lock:
            if choice.path not in self._warm:  # its kernel and data were cold: a short call is explored again
                self._warm.add(choice.path)
                if seconds < COLD_SECONDS:
                    return
            state = self._state(choice.bucket)
            times = state['seconds_per_unit'].setdefault(choice.path, [])
            times[:] = (times + [seconds_per_unit])[-RECENT:]
            if choice.reason in ('measured', 'recheck'):
                state['calls'] += 1
            if choice.reason != 'measured':
                _log.info('strategy=auto, %s: %s %s at %.3g s per unit of its estimate', choice.bucket, choice.reason,
                          choice.path, seconds_per_unit)
                if self._path is not None:
                    try:
                        store.write_json(self._path, 'measured-timings', {'buckets': self._buckets})
                    except OSError as error:  # the choice still holds in this process
                        _log.warning('strategy=auto: cannot save its timings to %s (%s); set PYTERRIER_RDIME_CACHE '
                                     'to a writable folder to keep them for later runs', self._path, error)

    def bucket_timings(self, name: str) -> Tuple[Dict[str, float], int]:
        """Of bucket ``name``: each path's measured seconds per unit of estimate, and the calls taken."""
        with self._lock:
            state = self._state(name)
            return {path: min(times) for path, times in state['seconds_per_unit'].items() if times}, state['calls']


@contextlib.contextmanager
def _compiling(clock: Callable[[], float]) -> Iterator[List[float]]:
    """Yields a list that holds, once the block has run, the seconds of ``clock`` numba spent compiling in it: a first
    run's first call of a path compiles its kernels, a cost that does not recur (kept, ``'auto'`` would avoid the path
    for good)."""
    spent = [0.0]
    try:
        from numba.core import event
    except ImportError:  # no compiled kernels to compile
        yield spent
        return

    class Compiling(event.Listener):  # the outermost compile events, timed on the call's clock
        depth, start = 0, 0.0

        def on_start(self, _):
            if not self.depth:
                self.start = clock()
            self.depth += 1

        def on_end(self, _):
            self.depth -= 1
            if not self.depth:
                spent[0] += clock() - self.start
    with event.install_listener('numba:compile', Compiling()):
        yield spent


def _read_timings(path: Path) -> Dict[str, dict]:
    """The buckets of the record at ``path``; none when it is missing, damaged or malformed."""
    def number(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x) and x >= 0
    try:
        buckets = store.read_json(path, 'measured-timings')['buckets']
        if not all(isinstance(state, dict) and set(state) == {'calls', 'seconds_per_unit'}
                   and isinstance(state['calls'], int) and isinstance(state['seconds_per_unit'], dict)
                   and all(isinstance(times, list) and all(map(number, times))
                           for times in state['seconds_per_unit'].values()) for state in buckets.values()):
            raise ValueError('it holds something other than timings')
        return buckets
    except (store.Damaged, KeyError, TypeError, AttributeError, ValueError) as e:
        if path.exists():
            _log.warning('strategy=auto: ignoring the timings recorded in %s (%s); measuring again', path, e)
        return {}


def bucket(query_vecs: np.ndarray, k: int) -> str:
    """The bucket of a call: ``k``, the batch size rounded down to a power of two and the quarter of the mean kept
    fraction, e.g. ``'k100 n8 kept0.25-0.50'``."""
    batch = 1 << (len(query_vecs).bit_length() - 1)
    quarter = min(3, int(float(np.mean(nonzero_fractions(query_vecs))) * 4))
    return f'k{k} n{batch} kept{quarter / 4:.2f}-{(quarter + 1) / 4:.2f}'


def candidates(costs: Dict[str, float]) -> List[str]:
    """The paths within ``EXPLORE_MARGIN`` of the least estimated cost, cheapest first."""
    least = min(costs.values())
    return sorted((path for path, cost in costs.items() if cost <= EXPLORE_MARGIN * least), key=costs.get)


def choose(query_vecs: np.ndarray, *, strategy: str, matrix_bytes: int, compiled: bool,
           model: Callable[[], CostModel], k: int, float32_ready: bool = True,
           timings: Optional[MeasuredChoice] = None, call_bucket: Optional[str] = None,
           out_of_core: bool = False) -> Choice:
    """How a call scores these pruned query vectors (n, dims), ``k`` results each: ``'dense'`` as it is;
    ``'pruned'`` / ``'compressed'`` in one pass or query after query, as ``model()`` finds cheaper; ``'auto'`` dense
    without compiled kernels, queries or a matrix of ``MIN_PRUNED_BYTES``, the int8 copy's (one pass for a batch)
    ``out_of_core`` (the float32 matrix in files the page cache cannot keep: :func:`.store.out_of_core`), else the
    measured choice with ``timings``, the least estimate without (never the float32 pruned paths without
    ``float32_ready``: it builds no copy); a per-query path explored or re-checked on a larger call takes its first
    share only (``queries``, with the share's estimate; the rest is chosen in the ``call_bucket`` of the whole call,
    without exploring: one path explored per call). ``model`` is called only when the choice depends on it; nothing
    is recorded here."""
    if strategy in ('dense', 'pruned', 'compressed'):
        one_pass = {'pruned': 'one pass', 'compressed': 'compressed one pass'}.get(strategy)
        if one_pass is None or not compiled or len(query_vecs) < 2:
            return Choice(strategy, math.nan, '', 'forced')
        if matrix_bytes >= MIN_PRUNED_BYTES:
            costs = model().path_costs(query_vecs, k=k, matrix_bytes=matrix_bytes, one_pass=True)
            one_pass = one_pass if costs[one_pass] < costs[strategy] else strategy
        return Choice(one_pass, math.nan, '', 'forced')
    if strategy != 'auto':
        raise ValueError(f"unknown strategy {strategy!r}; expected 'auto', 'pruned', 'dense' or 'compressed'")
    if not compiled or matrix_bytes < MIN_PRUNED_BYTES or not len(query_vecs):
        return Choice('dense', math.nan, '', 'model')
    if out_of_core:
        # the float32 paths read the matrix at the disk's pace, which the model (calibrated in memory) does not see,
        # and the copy's per-query path re-scores each query's rows apart: at 8.8M x 768 exploring them took 81 s
        # (dense) and 26.5 s (8 full queries, compressed), where the one pass took 18.5 s for the call's other 35
        return Choice('compressed one pass' if len(query_vecs) > 1 else 'compressed', math.nan, '', 'out of core')
    costs = model().path_costs(query_vecs, k=k, matrix_bytes=matrix_bytes, one_pass=len(query_vecs) > 1)
    if not float32_ready:
        costs = {path: cost for path, cost in costs.items() if Plan(path).strategy != 'pruned'}
    if timings is None:
        path = min(costs, key=costs.get)
        return Choice(path, costs[path], '', 'model')
    choice = measured_choice(costs, call_bucket or bucket(query_vecs, k), timings, explore=call_bucket is None)
    share = max(EXPLORE_QUERIES, -(-len(query_vecs) // EXPLORE_SHARE))
    if choice.reason in ('explore', 'recheck') and choice.path in ('pruned', 'compressed') and share < len(query_vecs):
        estimate = model().path_costs(query_vecs[:share], k=k, matrix_bytes=matrix_bytes, one_pass=False)[choice.path]
        return dataclasses.replace(choice, estimate=estimate, queries=share)
    return choice


def parts(query_vecs: np.ndarray, choose_for: Callable[[np.ndarray, Optional[str]], Choice]
          ) -> Iterator[Tuple[Choice, np.ndarray]]:
    """``(choice, queries)``: the call's queries in order, as ``choose_for(the queries left, the call's bucket)``
    takes them: all at once, or a first share to explore a per-query path on, then the rest chosen again (in the
    bucket of the whole call, among the timed paths) once that share is scored."""
    call_bucket = None
    while True:
        choice = choose_for(query_vecs, call_bucket)
        call_bucket = choice.bucket
        part, query_vecs = (query_vecs, query_vecs[:0]) if choice.queries is None else np.split(query_vecs,
                                                                                                [choice.queries])
        yield choice, part
        if not len(query_vecs):
            return


def measured_choice(costs: Dict[str, float], name: str, timings: MeasuredChoice, explore: bool = True) -> Choice:
    """The path of a call of bucket ``name`` with estimates ``costs``, by ``timings``; without ``explore`` (the rest
    of a call a share of which explored) the fastest timed path, or the least estimate where none is timed."""
    paths = candidates(costs)
    if len(paths) == 1:
        return Choice(paths[0], costs[paths[0]], name, 'only')
    factors, calls = timings.bucket_timings(name)
    untimed = [path for path in paths if path not in factors]
    if untimed and explore:
        return Choice(untimed[0], costs[untimed[0]], name, 'explore')
    if len(untimed) == len(paths):
        return Choice(paths[0], costs[paths[0]], name, 'model')
    ranking = sorted((path for path in paths if path in factors), key=lambda path: costs[path] * factors[path])
    if explore and calls and calls % RECHECK_EVERY == 0:
        return Choice(ranking[1], costs[ranking[1]], name, 'recheck')
    return Choice(ranking[0], costs[ranking[0]], name, 'measured')
