"""The files this package keeps beside a pyterrier-dr FlexIndex, and the one protocol that says whether they still
describe the index: the shared helpers of the stages that read an index (``SameBudget``'s variance control) and of
the retriever's on-disk copies (:mod:`pyterrier_rdime.pruned`), below both.

A derived file records the fingerprint of each source file of the index it was made from (``vecs.f4``,
``docnos.npids``): size, modification time, inode change time (ctime), inode number and a SHA-256 of the whole file
(0.7 s per GiB from the page cache on the project's 2-core test machine; about a minute for MS MARCO's 27 GB of
vectors, so it is taken once, when the derived file is built). On every later use the sources are only ``stat``-ed
(:func:`sources_problem`):

- size, both times and inode as recorded: unchanged. Any write to a file sets its ctime to the current time, and
  unlike the mtime (``touch``, ``os.utime``) it cannot be set back, short of changing the system clock;
- the same size, but another time or inode (touched, ``chmod``-ed, moved, copied with ``cp -a``, or rewritten in place
  with its mtime put back): the file is hashed in full; the same hash keeps the derived file (and its record takes
  the new times, so the next use does not hash again), another hash rebuilds it;
- another size: rebuilt.

:func:`vector_stats` is the first such file: the largest absolute value and the variance of each dimension, from one
streaming pass over the vectors.
"""
import contextlib
import hashlib
import json
import mmap
import os
import threading
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from . import maths
from ._config import default_cache_dir
from ._io import atomic_open

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: builds in two processes may then both run (each result is valid)
    fcntl = None

#: The float32 dimension-major layout's file name in an index folder; the other derived files take its stem.
LAYOUT_NAME = 'rdime.dim_major.npy'
#: The files of a FlexIndex that derived files are made from: the vectors, and the docnos (checked for repeats).
SOURCES = ('vecs.f4', 'docnos.npids')
#: Bytes read at a time when hashing a source.
HASH_CHUNK = 2 ** 22
#: Documents per block of a streaming pass over the vectors (``block x dims x 4`` bytes: 96 MiB at 768 dimensions).
STREAM_BLOCK = 32768
#: The fields of a source's fingerprint that a ``stat`` gives.
STAT_FIELDS = ('size', 'mtime_ns', 'ctime_ns', 'inode')


def portable_index(index: object) -> object:
    """The index as it should travel to another process: a FlexIndex reopened by path (pickling a FlexIndex whose
    vectors are open would copy them all, as a plain array), an array as it is."""
    if isinstance(index, np.ndarray) or not hasattr(index, 'index_path'):
        return index
    return type(index)(str(index.index_path), sim_fn=index.sim_fn, verbose=index.verbose)


def check_built(index: object, stage: str) -> None:
    """Fails, with the fix, when a FlexIndex's folder lacks ``pt_meta.json`` (not built, or half built)."""
    if not (Path(index.index_path) / 'pt_meta.json').is_file():
        raise ValueError(f'{stage}: {index!r} is not built (no pt_meta.json in {index.index_path}); index the '
                         "documents first, e.g. (encoder >> index.indexer(mode='overwrite')).index(docs), which "
                         'also replaces a folder an interrupted run left half written')


def flex_layout_path(index: object) -> Path:
    """Where the layout of a FlexIndex is (or will be) stored, and beside it every other derived file: in the index
    folder if a layout is there or the folder is writable, else in ``default_cache_dir()/layouts`` under a name keyed
    by the index's resolved path and size."""
    folder = Path(index.index_path)
    beside = folder / LAYOUT_NAME
    if beside.exists() or os.access(folder, os.W_OK):
        return beside
    source = folder / 'vecs.f4'
    key = hashlib.sha1(f'{folder.resolve()}:{source.stat().st_size}'.encode()).hexdigest()[:16]
    return default_cache_dir() / 'layouts' / f'{folder.name}-{key}.npy'


def identity(path: Path) -> Optional[Tuple[int, int, int]]:
    """Inode, modification time and size of ``path`` (None if it cannot be read): a derived file's own identity,
    recorded so that a record is never read as describing another file."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def stat_fields(source: Path) -> dict:
    stat = source.stat()
    return dict(zip(STAT_FIELDS, (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)))


#: Fingerprints taken in this process, by resolved path: a file whose stat fields are unchanged is not hashed twice
#: (two derived files built one after the other from MS MARCO's 27 GB of vectors share one hash).
_HASHED: Dict[Path, dict] = {}


def fingerprint(source: Path) -> dict:
    """Size, modification time, inode change time, inode number and SHA-256 of a file. The hash reads the whole file,
    once per process while the stat fields stay the same; the stat is taken first, so a change while hashing shows as
    a changed ctime on the next check."""
    fields = stat_fields(source)
    key = Path(source).resolve()
    known = _HASHED.get(key)
    if known is not None and all(known[name] == fields[name] for name in STAT_FIELDS):
        return dict(known)
    digest = hashlib.sha256()
    buffer = bytearray(HASH_CHUNK)
    view = memoryview(buffer)
    with open(source, 'rb') as f:
        offset = 0
        while True:
            read = f.readinto(buffer)
            if not read:
                break
            digest.update(view[:read])
            if hasattr(os, 'posix_fadvise'):  # as row_reader: a full read must not evict what the searches read
                os.posix_fadvise(f.fileno(), offset, read, os.POSIX_FADV_DONTNEED)
            offset += read
    _HASHED[key] = {**fields, 'sha256': digest.hexdigest()}
    return dict(_HASHED[key])


def sources_problem(recorded: Dict[str, dict], folder: Path, *, verify: bool) -> Tuple[Optional[str], Dict[str, dict]]:
    """``(problem, refreshed)`` for the sources a derived file recorded (name -> fingerprint): ``problem`` is None
    while every source is unchanged (the module's protocol: ``stat`` first, a full hash only where a time or the inode
    moved and ``verify`` is set; without ``verify`` such a source is reported, for the caller to verify under its
    lock); ``refreshed`` holds the new fingerprints of sources whose content is unchanged but whose times moved, for
    the caller to write back so the next use does not hash again."""
    moved = {}
    for name, built_from in recorded.items():
        try:
            now = stat_fields(folder / name)
        except OSError as e:
            return f'{folder / name} cannot be read ({e})', {}
        if now['size'] != built_from.get('size'):
            return f'{folder / name} changed since it was built (its size)', {}
        if any(now[key] != built_from.get(key) for key in STAT_FIELDS):
            moved[name] = now
    if moved and not verify:
        return f'{", ".join(moved)} may have changed since it was built (a time or the inode)', {}
    for name in moved:  # touched, copied, moved or chmod-ed, or rewritten in place: the content tells
        moved[name] = fingerprint(folder / name)
        if moved[name]['sha256'] != recorded[name].get('sha256'):
            return f'{folder / name} changed since it was built (its content: SHA-256)', {}
    return None, moved


def current_sources(recorded: Dict[str, dict], folder: Path, *, verify: bool, built: str,
                    save: Callable[[Dict[str, dict]], None]) -> Optional[str]:
    """None while the sources a derived file recorded are unchanged (:func:`sources_problem`), else why not, naming
    what was built from them (``built``, e.g. 'the layout'). Where only a time or the inode moved and the content is
    the same, ``save(sources)`` records the new fingerprints, so that the next use need not hash again (a folder no
    longer writable: the next use hashes again)."""
    problem, refreshed = sources_problem(recorded, folder, verify=verify)
    if problem is not None:
        return problem.replace('since it was built', f'since {built} was built')
    if refreshed:
        with contextlib.suppress(OSError):
            save({**recorded, **refreshed})
    return None


def read_json(path: Path) -> Optional[dict]:
    """The JSON object at ``path``, or None when it is missing or unreadable."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_json(path: Path, record: dict) -> None:
    """Written to a temporary file renamed into place: a reader never sees half a record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path) as out:
        json.dump(record, out)


@contextlib.contextmanager
def exclusive(source: Path):
    """An exclusive lock across processes, held on an index's file (opened read-only, left unchanged)."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(source, 'rb') as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def check_finite(rows: np.ndarray, start: int, docnos: Optional[object], stage: str, source: str) -> None:
    """Fails, naming the first document (docno and docid) with a NaN or infinite value: it would score NaN, and a
    NaN score cannot be ranked against real ones."""
    finite = np.isfinite(rows).all(axis=1)
    if not finite.all():
        docid = start + int(np.argmin(finite))
        docno = str(docid) if docnos is None else str(docnos[docid])
        raise ValueError(f'{stage}: document {docno!r} (docid {docid}) of {source} has NaN or infinite values in its '
                         'vector: it would score NaN, which cannot be ranked against real scores; re-encode it or '
                         'rebuild the index without it')


@contextlib.contextmanager
def row_reader(vecs: np.ndarray):
    """``read(start, stop) -> (stop - start, dims) float32`` rows of ``vecs``; a C-ordered float32 memory map is
    read with plain file reads, so its pages do not pile up in this process, and each block is then dropped from the
    page cache (``POSIX_FADV_DONTNEED``): a streaming pass over MS MARCO's 27 GB of vectors would otherwise mark
    them as the page cache's working set and evict the int8 copy the searches need (measured in the scale
    rehearsal: its first searches read the copy back from disk)."""
    filename = getattr(vecs, 'filename', None)
    if isinstance(vecs, np.memmap) and filename and vecs.dtype == np.float32 and vecs.flags.c_contiguous:
        row_bytes = vecs.shape[1] * 4
        with open(filename, 'rb') as f:
            def read(start: int, stop: int) -> np.ndarray:
                rows = np.empty((stop - start, vecs.shape[1]), dtype=np.float32)
                f.seek(vecs.offset + start * row_bytes)
                if f.readinto(memoryview(rows).cast('B')) != rows.nbytes:
                    raise OSError(f'{filename} ended before document {stop}: the index is truncated')
                if hasattr(os, 'posix_fadvise'):
                    os.posix_fadvise(f.fileno(), vecs.offset + start * row_bytes, rows.nbytes,
                                     os.POSIX_FADV_DONTNEED)
                return rows
            yield read
    else:
        yield lambda start, stop: np.asarray(vecs[start:stop], dtype=np.float32)


class RowFile:
    """The rows of a C-ordered float32 memory map (a FlexIndex's ``vecs.f4``) read by ``rows[docids]`` through a
    memory map of their own, advised ``MADV_RANDOM``: reading a few scattered rows through the index's own map faults
    in the kernel's read-ahead around each (128 KiB or more per 3 KiB row at 768 dimensions), which made the exact
    re-scoring of the compressed path read ~1 GB/s from disk at 8.8M documents for a few MB of rows; without
    read-ahead a row out of the page cache costs its own page or two, and one in it a memory copy (a ``pread`` per
    row, the first fix, cost ~8 us a row: 1-2 ms per query of a top-100, 10-15 % of a query at 1M documents)."""

    def __init__(self, vecs: np.memmap):
        self.filename, self.offset, self.shape = vecs.filename, vecs.offset, vecs.shape
        self._rows: Optional[np.memmap] = None

    def __len__(self) -> int:
        return self.shape[0]

    def __getstate__(self) -> dict:
        return {**self.__dict__, '_rows': None}

    def __getitem__(self, docids) -> np.ndarray:
        if self._rows is None:
            rows = np.memmap(self.filename, dtype=np.float32, mode='r', offset=self.offset, shape=self.shape)
            if hasattr(mmap, 'MADV_RANDOM'):
                rows._mmap.madvise(mmap.MADV_RANDOM)
            self._rows = rows
        return np.asarray(self._rows[np.asarray(docids, dtype=np.int64).reshape(-1)])


_STATS_LOCK = threading.Lock()
_STATS: Dict[Path, Tuple[dict, Dict[str, np.ndarray]]] = {}


def stats_path(index: object) -> Path:
    """The record of :func:`vector_stats` for a FlexIndex: ``rdime.dim_major.stats.json`` beside the layout."""
    return flex_layout_path(index).with_suffix('.stats.json')


def vector_stats(index: object, *, stage: str, verbose: bool = False) -> Dict[str, np.ndarray]:
    """``{'abs_max', 'variance'}``: the largest absolute value and the population variance of each dimension over the
    document vectors of a FlexIndex (float64 ``(dims,)`` each), from one streaming pass (a progress bar with
    ``verbose``; a document with NaN or inf is an error naming it), cached in a JSON record beside the layout with the
    fingerprint of ``vecs.f4``. Later calls, in this process or another, only ``stat`` the vectors
    (:func:`sources_problem`): no call reads them again while they are unchanged."""
    check_built(index, stage)
    folder = Path(index.index_path)
    path = stats_path(index)
    with _STATS_LOCK:
        held = _STATS.get(path)
        record = held[0] if held is not None else read_json(path)
        problem, refreshed = ('none yet', {}) if record is None else _stats_problem(record, folder)
        if problem is None and held is not None and not refreshed:
            return held[1]
        if problem is None:
            if refreshed:
                record = {**record, 'sources': {**record['sources'], **refreshed}}
                with contextlib.suppress(OSError):  # a read-only cache: the next use hashes again
                    write_json(path, record)
        else:
            sources = {'vecs.f4': fingerprint(folder / 'vecs.f4')}  # before the pass: a change during it shows later
            vectors = portable_index(index).payload(return_docnos=False)[0]  # a fresh map of the current file
            record = {'sources': sources, **_stats_pass(vectors, stage, str(folder), verbose)}
            write_json(path, record)
        stats = {name: np.asarray(record[name], dtype=np.float64) for name in ('abs_max', 'variance')}
        _STATS[path] = (record, stats)
        return stats


def _stats_problem(record: dict, folder: Path) -> Tuple[Optional[str], Dict[str, dict]]:
    try:
        sources = record['sources']
        if set(sources) != {'vecs.f4'} or len(record['abs_max']) != len(record['variance']):
            raise KeyError('sources')
    except (KeyError, TypeError):
        return 'its record is unreadable', {}
    return sources_problem(sources, folder, verify=True)


def _stats_pass(vectors: np.ndarray, stage: str, source: str, verbose: bool) -> Dict[str, list]:
    docs, dims = vectors.shape
    if not docs:
        raise ValueError(f'{stage}: {source} holds no documents')
    abs_max = np.zeros(dims)
    from tqdm.auto import tqdm
    with row_reader(vectors) as read, tqdm(total=docs, desc=f'{stage}: vector statistics', unit='doc',
                                           disable=not verbose) as progress:
        def blocks():
            for start in range(0, docs, STREAM_BLOCK):
                rows = read(start, min(docs, start + STREAM_BLOCK))
                check_finite(rows, start, None, stage, source)
                np.maximum(abs_max, np.abs(rows).max(axis=0), out=abs_max)
                progress.update(len(rows))
                yield rows
        variance, _ = maths.column_variance(blocks())
    return {'abs_max': abs_max.tolist(), 'variance': variance.tolist()}
