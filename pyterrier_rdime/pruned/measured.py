"""The timings behind ``strategy='auto'``'s measured choice (:mod:`.planner`): per bucket of like calls, each path's
seconds per unit of its estimate, the least of its last ``RECENT`` (a path's first run in a process, cold, is not
recorded).

- The **record** of an index is kept beside the calibration (``default_cache_dir()/cost/measured``), keyed by the
  machine (:func:`.calibration.machine_key`) and the index's file, written after each exploring or re-checking call;
  an array index's record lives in memory, with its retriever.
"""
import hashlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

from .._config import default_cache_dir
from .._index_files import read_json, stat_fields, write_json
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
            saved = (read_json(self._path) or {}).get('buckets') if self._path is not None else None
            self._buckets = saved if isinstance(saved, dict) else {}
        state = self._buckets.get(name)
        if not (isinstance(state, dict) and isinstance(state.get('calls'), int)
                and isinstance(state.get('seconds_per_unit'), dict)):  # new, or a record edited by hand
            state = self._buckets[name] = {'calls': 0, 'seconds_per_unit': {}}
        return state

    def timed(self, choice: Choice, score: Callable[[], object]) -> object:
        """Runs ``score`` (the call, scored on ``choice.path``), records its time (where ``choice`` was measured:
        explored, re-checked or taken) and returns its result."""
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
                        write_json(self._path, {'buckets': self._buckets})
                    except OSError as error:  # the choice still holds in this process
                        _log.warning('strategy=auto: cannot save its timings to %s (%s); set PYTERRIER_RDIME_CACHE '
                                     'to a writable folder to keep them for later runs', self._path, error)

    def bucket_timings(self, name: str) -> Tuple[Dict[str, float], int]:
        """Of bucket ``name``: each timed path's measured seconds per unit of estimate (the least of its recent
        timings), and the calls taken on a measured or re-checked path."""
        with self._lock:
            state = self._state(name)
            return {path: min(times) for path, times in state['seconds_per_unit'].items() if times}, state['calls']


def record_path(vecs: Path) -> Path:
    """Where the record of the index whose vectors are the file ``vecs`` is kept on this machine: keyed by the
    machine and by the file's path, size, times and inode."""
    identity = json.dumps({'path': str(vecs.resolve()), **stat_fields(vecs)}, sort_keys=True)
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return default_cache_dir() / 'cost' / 'measured' / f'{machine_key()}-{vecs.parent.name}-{digest}.json'
