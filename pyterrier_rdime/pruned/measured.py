"""The timings behind ``'auto'``'s measured choice (:mod:`.planner`): per bucket, each path's seconds per unit of
estimate, the least of its last ``RECENT``. A FlexIndex's record is kept under ``default_cache_dir()/cost/measured``,
keyed by machine and index file; an array index's lives in memory.
"""
import hashlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from .. import store
from .._config import default_cache_dir
from .calibration import machine_key
from .plan import Choice

#: The timings kept per path and bucket; a path's time is the least of them.
RECENT = 3

_log = logging.getLogger(__name__)


class MeasuredChoice:
    """The timings of the paths of one index on this machine, from which :func:`.planner.choose` chooses. Shared by a
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
        """Runs ``score`` (the call on ``choice.path``), records its time where measured, and returns its result."""
        start = self.clock()
        result = score()
        seconds = self.clock() - start
        if choice.reason in ('explore', 'recheck', 'measured'):
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

    def bucket_timings(self, name: str) -> Tuple[Dict[str, float], int]:
        """Of bucket ``name``: each path's measured seconds per unit of estimate, and the calls taken."""
        with self._lock:
            state = self._state(name)
            return {path: min(times) for path, times in state['seconds_per_unit'].items() if times}, state['calls']


def record_path(vecs: Path) -> Path:
    """Where the record of the index with vectors ``vecs`` is kept: keyed by machine and the file's identity."""
    identity = json.dumps({'path': str(vecs.resolve()), **store.stat_fields(vecs)}, sort_keys=True)
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return default_cache_dir() / 'cost' / 'measured' / f'{machine_key()}-{vecs.parent.name}-{digest}.json'


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
