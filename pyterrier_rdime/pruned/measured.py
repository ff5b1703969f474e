"""The measured choice of ``PrunedRetriever(strategy='auto')``: the cost model (:mod:`.cost`) is the prior, and the
paths it cannot rank apart are timed on the index itself, as cuDNN's benchmark mode and FFTW's planner do. A model
fitted on a small calibration matrix ranks paths whose costs differ by a factor reliably, but not near-equal ones on
every CPU and cache size (on an AMD Zen 4 it took the compressed path query after query for batches where the one
pass was 1.6x faster).

- The calls of an index are grouped in **buckets** of like shape (:func:`bucket`): ``k``, the batch size rounded
  down to a power of two, and the mean kept fraction in quarters (0-25 %, 25-50 %, 50-75 %, 75-100 %).
- The **candidates** of a call are the paths whose estimated cost is within ``EXPLORE_MARGIN`` of the least; a path
  the model puts further away is never run. With one candidate, it is taken and nothing is timed.
- What is measured is each path's **seconds per unit of its estimate** in the bucket: the model's error for that
  path at that shape. A call's cost of a path is its estimate times that factor, so the model still tells the calls
  of a bucket apart (a batch keeping 30 % from one keeping 45 %) while the measurement corrects its level.
- **Exploring**: the first calls of a bucket take each candidate not yet timed in turn, the model's best first, so
  a call is never run twice and exploring costs only the extra time of the slower candidates on those calls. A
  path's first run in a process is not recorded (it loads its compiled kernel and faults its data in), so it is
  explored once more.
- From then the candidate of least corrected cost is taken (each path's factor is the least of its last ``RECENT``
  timings: one disturbed timing does not decide), and every run's time joins its record; every
  ``RECHECK_EVERY``-th call of a bucket takes the runner-up once more, so that a change of the machine's state is
  followed.
- The **record** of an index is kept beside the calibration (``default_cache_dir()/cost/measured``), keyed by the
  machine (CPU model, numba's and BLAS's thread counts: :func:`.calibration.machine_key`) and the index's file (path,
  size, times and inode of a FlexIndex's ``vecs.f4``: rewriting the index starts a new record); it is written after
  each exploring or re-checking call, so later processes start from it. An array index's record lives in memory,
  with its retriever.
"""
import dataclasses
import hashlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np

from .. import store
from .._config import default_cache_dir
from .calibration import machine_key
from .plan import nonzero_fractions

#: Paths estimated to cost up to this factor of the cheapest are timed: the model's misses measured so far were up to
#: 1.6x (a batch of 64 at RDIME's fraction with one thread on an AMD Zen 4: 1,023 ms chosen against 632 ms).
EXPLORE_MARGIN = 2.0
#: The timings kept per path and bucket; a path's time is the least of them.
RECENT = 3
#: Every this many calls of a bucket on its winner, the runner-up is timed once more.
RECHECK_EVERY = 64
#: Why a path was taken: the only candidate; exploring (not yet timed); re-checking the runner-up; the fastest timed.
REASONS = ('only', 'explore', 'recheck', 'measured')

_log = logging.getLogger(__name__)


def bucket(query_vecs: np.ndarray, k: int) -> str:
    """The bucket of a call: ``k``, the batch size rounded down to a power of two and the quarter of the mean kept
    fraction, e.g. ``'k100 n8 kept0.25-0.50'``."""
    batch = 1 << (len(query_vecs).bit_length() - 1)
    quarter = min(3, int(float(np.mean(nonzero_fractions(query_vecs))) * 4))
    return f'k{k} n{batch} kept{quarter / 4:.2f}-{(quarter + 1) / 4:.2f}'


@dataclasses.dataclass(frozen=True)
class Choice:
    """The path of one call, its estimated cost (the model's units), its bucket and why it was taken (one of
    :data:`REASONS`)."""
    path: str
    estimate: float
    bucket: str
    reason: str

    def __post_init__(self):
        if self.reason not in REASONS:
            raise ValueError(f'unknown reason {self.reason!r}; expected one of {REASONS}')


def candidates(costs: Dict[str, float]) -> List[str]:
    """The paths within ``EXPLORE_MARGIN`` of the least estimated cost, cheapest first (an exact tie in the order
    listed)."""
    least = min(costs.values())
    return sorted((path for path, cost in costs.items() if cost <= EXPLORE_MARGIN * least), key=costs.get)


class MeasuredChoice:
    """The timings of the paths of one index on this machine, and the choice they make (see the module). Shared by a
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

    def choose(self, costs: Dict[str, float], name: str) -> Choice:
        """The path of a call of bucket ``name`` whose paths the model estimates at ``costs`` (nothing is
        recorded)."""
        paths = candidates(costs)
        if len(paths) == 1:
            return Choice(paths[0], costs[paths[0]], name, 'only')
        with self._lock:
            factors, calls = self._factors(name), self._state(name)['calls']
        untimed = [path for path in paths if path not in factors]
        if untimed:
            return Choice(untimed[0], costs[untimed[0]], name, 'explore')
        ranking = sorted(paths, key=lambda path: costs[path] * factors[path])
        if calls and calls % RECHECK_EVERY == 0:
            return Choice(ranking[1], costs[ranking[1]], name, 'recheck')
        return Choice(ranking[0], costs[ranking[0]], name, 'measured')

    def timed(self, choice: Choice, score: Callable[[], object]) -> object:
        """Runs ``score`` (the call, scored on ``choice.path``), records its time and returns its result."""
        start = self.clock()
        result = score()
        seconds = self.clock() - start
        if choice.reason != 'only':
            self._record(choice, seconds / max(choice.estimate, 1e-12))
        return result

    def _record(self, choice: Choice, seconds_per_unit: float) -> None:
        with self._lock:
            if choice.path not in self._warm:  # its kernel and data were cold: explore it again
                self._warm.add(choice.path)
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

    def factors(self, name: str) -> Dict[str, float]:
        """The measured seconds per unit of estimate of each path timed in bucket ``name`` (the least of its recent
        timings)."""
        with self._lock:
            return self._factors(name)

    def _factors(self, name: str) -> Dict[str, float]:
        return {path: min(times) for path, times in self._state(name)['seconds_per_unit'].items() if times}


def record_path(vecs: Path) -> Path:
    """Where the record of the index whose vectors are the file ``vecs`` is kept on this machine: keyed by the
    machine and by the file's path, size, times and inode."""
    identity = json.dumps({'path': str(vecs.resolve()), **store.stat_fields(vecs)}, sort_keys=True)
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return default_cache_dir() / 'cost' / 'measured' / f'{machine_key()}-{vecs.parent.name}-{digest}.json'


def _read_timings(path: Path) -> Dict[str, dict]:
    """The buckets of the record at ``path``; none (the record is then rewritten from this process's timings) when
    it is missing, does not check (:mod:`pyterrier_rdime.store`) or holds anything but call counts and timings."""
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
