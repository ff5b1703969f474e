"""A cell's progress: each system's result frame recorded on disk as it is finished, so that a killed cell resumes."""
import hashlib
import logging
import pickle
import shutil
from pathlib import Path
from typing import Callable, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd

from .. import store
from .collection import slug

logger = logging.getLogger(__name__)

#: The folder of a cell's progress inside its output folder: one sub-folder per cell key.
PROGRESS = '.progress'

#: A system's record key: ``(kind, name)``, kind ``'frames'``, ``'seeded'`` or ``'sweep'``.
Key = Tuple[str, Hashable]


def without_vectors(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` without its vector columns (``query_vec``, ``doc_vec``, …): nothing later reads one."""
    return frame.drop(columns=[c for c in frame.columns if len(frame) and frame[c].dtype == object
                               and isinstance(frame[c].iloc[0], np.ndarray)])


class SystemRecords:
    """The finished systems of one cell, each its result frame (without vectors) in a checksummed record
    (:mod:`pyterrier_rdime.store`) in ``<folder>/<key>/``, read back on the next run (a bad record is recomputed
    with a warning). Other keys' folders are removed on opening; :meth:`clear` removes the records. With
    ``folder=None`` nothing is written.

    Example::

        records = SystemRecords(cell_folder / PROGRESS, cell_key)
        frame = records.frame(('frames', 'prf/RDIME'), lambda: (Rdime() >> retriever)(scored))
    """

    def __init__(self, folder: Optional[Union[str, Path]] = None, key: str = ''):
        self.folder = Path(folder) / key if folder is not None else None
        self.read_back = 0  # systems read back rather than computed, for the log and the tests
        if folder is None:
            return
        if not key:
            raise ValueError('SystemRecords: a recording folder needs the key of the cell it records (e.g. the '
                             "grid's Cell.key)")
        for stale in (p for p in Path(folder).glob('*') if p.is_dir() and p.name != key):
            logger.info('removing the progress of an earlier run with other inputs: %s', stale)
            shutil.rmtree(stale, ignore_errors=True)

    def frame(self, key: Key, compute: Callable[[], pd.DataFrame]) -> pd.DataFrame:
        """The frame of the system ``key``: read back where recorded, else ``compute()``, recorded."""
        return self.frames([key], lambda missing: [(key, compute())])[key]

    def frames(self, keys: Sequence[Key], compute: Callable[[List[Key]], Iterable[Tuple[Key, pd.DataFrame]]]
               ) -> Dict[Key, pd.DataFrame]:
        """The frames of ``keys``, in order: the recorded ones read back, the others from ``compute(missing keys)``'s
        ``(key, frame)`` pairs, each recorded as it is yielded."""
        found = {key: frame for key in keys if (frame := self._read(key)) is not None}
        if found and not self.read_back:
            logger.info('resuming the cell: reading back the systems an interrupted run finished, from %s',
                        self.folder)
        self.read_back += len(found)
        missing = [key for key in keys if key not in found]
        for key, frame in compute(missing) if missing else ():
            if key in missing and key not in found:
                found[key] = self._write(key, without_vectors(frame))
        return {key: found[key] for key in keys}

    def clear(self) -> None:
        """Removes every record of the cell (called once the cell's results and record are written)."""
        if self.folder is not None:
            shutil.rmtree(self.folder.parent, ignore_errors=True)

    def _path(self, key: Key) -> Path:
        digest = hashlib.sha256(repr(key).encode()).hexdigest()[:12]
        return self.folder / f'{slug(f"{key[0]}-{key[1]}", digest)}.pkl'

    def _read(self, key: Key) -> Optional[pd.DataFrame]:
        if self.folder is None or not self._path(key).is_file():
            return None
        try:
            recorded_key, frame = pickle.loads(store.read_record(self._path(key), 'system-frame'))
            if recorded_key != key or not isinstance(frame, pd.DataFrame):
                raise TypeError(f'it holds no frame of {key!r}')
        except Exception as e:  # a damaged record of any kind is recomputed, never the cell aborted
            logger.warning('the record %s of %r does not read back (%s: %s); recomputing it', self._path(key), key,
                           type(e).__name__, e)
            return None
        return frame

    def _write(self, key: Key, frame: pd.DataFrame) -> pd.DataFrame:
        if self.folder is not None:  # a kill leaves the record whole or absent
            store.write_record(self._path(key), 'system-frame', pickle.dumps((key, frame), pickle.HIGHEST_PROTOCOL))
        return frame
