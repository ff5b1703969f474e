"""The files this package derives and keeps, after pyterrier-alpha's ``Artifact``: atomic writes (:func:`atomic_open`),
checksummed records (:func:`write_record`), file identity by ``stat`` including the ctime (:func:`stat_fields`,
:func:`fingerprint`), one builder at a time (:func:`locked`), and check on every use, rebuild with a warning when stale
or damaged (:func:`derived`); whether a pyterrier-dr FlexIndex is whole (:func:`flex_index_problem`), and the files kept
beside it: where they go (:func:`flex_layout_path`), how its vectors are streamed and read, :func:`vector_stats`."""
import contextlib
import hashlib
import json
import mmap
import os
import secrets
import shutil
import threading
import warnings
from pathlib import Path
from typing import IO, Callable, Dict, Iterator, Optional, Sequence, Tuple, Union

import numpy as np

from . import maths
from ._config import default_cache_dir

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: concurrent builders each write a whole file, the last one stays
    fcntl = None

#: The fields of a file's identity that a ``stat`` gives.
STAT_FIELDS = ('size', 'mtime_ns', 'ctime_ns', 'inode')
#: Bytes read at a time when hashing a file.
HASH_CHUNK = 2 ** 22
#: The first word of every record's header line.
MAGIC = b'rdime-record'
#: The files of a FlexIndex, in the order pyterrier-dr's indexer finishes them (``pt_meta.json`` last).
FLEX_FILES = ('vecs.f4', 'docnos.npids', 'pt_meta.json')
#: The float32 dimension-major layout's file name in an index folder; the other derived files take its stem.
LAYOUT_NAME = 'rdime.dim_major.npy'
#: The files of a FlexIndex that derived files are made from: the vectors, and the docnos (checked for repeats).
SOURCES = ('vecs.f4', 'docnos.npids')
#: Documents per block of a streaming pass over the vectors (``block x dims x 4`` bytes).
STREAM_BLOCK = 32768


class Damaged(ValueError):
    """A record that is missing, unreadable, cut short, edited or of another kind (the message says which)."""


@contextlib.contextmanager
def atomic_open(path: Union[str, os.PathLike], mode: str = 'w') -> Iterator[IO]:
    """Opens a hidden temporary file beside ``path`` and moves it onto ``path`` when the block ends (removed if it
    raises). Unlike ``pt.io.finalized_open``, the file is created under the umask."""
    if mode not in ('w', 'wb'):
        raise ValueError(f"atomic_open: mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    tmp = path.with_name(f'.{path.name}.{secrets.token_hex(4)}.tmp')
    try:
        with open(tmp, mode.replace('w', 'x'), **({} if 'b' in mode else {'encoding': 'utf-8'})) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_record(path: Path, kind: str, content: bytes) -> None:
    """Writes ``content`` as a record of ``kind`` (one word) at ``path``, atomically, behind its checksum."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, 'wb') as out:
        out.write(b'%s %s %d %s\n' % (MAGIC, kind.encode(), len(content), hashlib.sha256(content).hexdigest().encode()))
        out.write(content)


def read_record(path: Path, kind: str) -> bytes:
    """The content of the record of ``kind`` at ``path``; :class:`Damaged` when it is missing or does not check."""
    try:
        with open(path, 'rb') as f:
            header, content = f.readline().split(), f.read()
    except OSError as e:
        raise Damaged(f'{path.name} is missing or unreadable ({e.strerror})') from None
    if len(header) != 4 or header[0] != MAGIC:
        raise Damaged(f'{path.name} is not a record of this version')
    if header[1] != kind.encode():
        raise Damaged(f'{path.name} is a record of {header[1].decode(errors="replace")!r}, not of {kind!r}')
    if header[2] != str(len(content)).encode() or header[3] != hashlib.sha256(content).hexdigest().encode():
        raise Damaged(f'{path.name} fails its checksum (cut short or edited)')
    return content


def write_json(path: Path, kind: str, content: dict) -> None:
    write_record(path, kind, json.dumps(content).encode())


def read_json(path: Path, kind: str) -> dict:
    """The JSON object of the record of ``kind`` at ``path`` (:class:`Damaged` when there is none that checks)."""
    content = json.loads(read_record(path, kind))
    if not isinstance(content, dict):
        raise Damaged(f'{path.name} does not hold a JSON object')
    return content


def stat_fields(path: Path) -> dict:
    """Size, modification time, inode change time and inode of ``path`` (raises OSError when it cannot be read)."""
    stat = os.stat(path)
    return dict(zip(STAT_FIELDS, (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)))


def snapshot(paths: Sequence[Union[str, os.PathLike]]) -> tuple:
    """The stat identity of each path (None where unreadable): equal snapshots mean no file changed in between."""
    identities = []
    for path in paths:
        try:
            identities.append(tuple(stat_fields(path).values()))
        except OSError:
            identities.append(None)
    return tuple(identities)


#: Fingerprints taken in this process, by resolved path: a file whose stat is unchanged is not hashed twice.
_HASHED: Dict[Path, dict] = {}
#: Files at least this large keep their SHA-256 in a record under ``default_cache_dir()/fingerprints``, trusted by the
#: next process while the file's stat is the same (as :func:`derived` trusts its sources'): an 8.8M x 768 index's
#: vectors (25 GiB) took 43 s to hash on a 2-core Zen 3, on every run of the grid.
KEPT_HASH_BYTES = 2 ** 26


def fingerprint(source: Path) -> dict:
    """:func:`stat_fields` and the SHA-256 of a file, hashed once while its stat stays the same: once per process, and
    once across processes for a file of at least :data:`KEPT_HASH_BYTES`."""
    fields = stat_fields(source)
    key = Path(source).resolve()
    if _HASHED.get(key, {}).items() >= fields.items():
        return dict(_HASHED[key])
    kept = (default_cache_dir() / 'fingerprints' / f'{hashlib.sha1(str(key).encode()).hexdigest()[:16]}.json'
            if fields['size'] >= KEPT_HASH_BYTES else None)
    with contextlib.suppress(ValueError):  # none yet, damaged or not JSON (Damaged is a ValueError): hashed again
        held = read_json(kept, 'sha256') if kept is not None else {}
        if (held.get('path') == str(key) and {name: held.get(name) for name in STAT_FIELDS} == fields
                and isinstance(held.get('sha256'), str)):
            _HASHED[key] = {**fields, 'sha256': held['sha256']}
            return dict(_HASHED[key])
    digest = hashlib.sha256()
    buffer = bytearray(HASH_CHUNK)
    with open(source, 'rb') as f:
        while read := f.readinto(buffer):
            digest.update(memoryview(buffer)[:read])
            if hasattr(os, 'posix_fadvise'):  # a full read must not evict what the searches read
                os.posix_fadvise(f.fileno(), f.tell() - read, read, os.POSIX_FADV_DONTNEED)
    _HASHED[key] = {**fields, 'sha256': digest.hexdigest()}
    if kept is not None:
        with contextlib.suppress(OSError):  # a read-only cache: the next process hashes again
            write_json(kept, 'sha256', {'path': str(key), **_HASHED[key]})
    return dict(_HASHED[key])


_REGISTRY_LOCK = threading.Lock()
_THREAD_LOCKS: Dict[Path, threading.Lock] = {}


@contextlib.contextmanager
def locked(path: Path):
    """Held while the entry ``path`` is checked and built: one builder at a time, across threads and processes
    (``flock``); removes what a killed builder left."""
    path = Path(path)
    with _REGISTRY_LOCK:
        thread_lock = _THREAD_LOCKS.setdefault(path, threading.Lock())
    with thread_lock, contextlib.ExitStack() as stack:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = stack.enter_context(open(path.parent / f'.{path.name}.lock', 'a'))
        except OSError:  # a read-only folder: nothing can be built in it, so there is nothing to serialise
            lock = None
        if lock is not None and fcntl is not None:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            stack.callback(fcntl.flock, lock.fileno(), fcntl.LOCK_UN)
            stem, suffix = os.path.splitext(path.name)
            for leftover in {*path.parent.glob(f'.{path.name}.*.tmp'), *path.parent.glob(f'.{stem}.*.tmp{suffix}')}:
                shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink(missing_ok=True)
        yield


#: Derived files opened in this process: path -> (snapshot of the file and its sources, opened value).
_OPENED: Dict[Path, Tuple[tuple, object]] = {}


def derived(path: Path, kind: str, *, folder: Path, sources: Sequence[str], build: Optional[Callable[[Path], dict]],
            open_with: Callable[[Path, dict], object] = lambda path, content: content,
            check: Callable[[Path, dict], Optional[str]] = lambda path, content: None,
            before_build: Callable[[], None] = lambda: None, what: str, stage: str, data: bool = True) -> object:
    """The file derived from ``sources`` at ``path``, opened by ``open_with(path, content)`` (cached while the
    ``stat`` of each file is unchanged). Its record (``path`` + ``.json``, or ``path`` itself when ``data`` is False)
    holds the sources' fingerprints and ``content``; when anything is stale, damaged or ``check`` objects,
    ``build(path)`` rebuilds it, with a warning naming ``what``, ``stage`` and the reason (``build=None``: None)."""
    record = path.with_suffix('.json') if data else path
    own = [str(path), str(record)] if data else [str(path)]
    watched = own + [os.path.join(folder, name) for name in sources]

    def held(now: tuple) -> Optional[object]:
        with _REGISTRY_LOCK:
            opened = _OPENED.get(path)
        return opened[1] if opened is not None and opened[0] == now else None

    def opened(now: tuple, content: dict) -> object:
        value = open_with(path, content)
        with _REGISTRY_LOCK:  # a thread that opened the same file meanwhile came first: every caller gets its value
            first = _OPENED.get(path)
            if first is None or first[0] != now:
                first = _OPENED[path] = (now, value)
        return first[1]

    now = snapshot(watched)
    if (value := held(now)) is not None:
        return value
    content, problem = _current(path, record, kind, folder, sources, check, data, verify=False)
    if problem is None:
        return opened(now, content)
    if build is None:
        return None
    before_build()
    with locked(path):  # another builder may be at work: wait, then look again (hashing now)
        now = snapshot(watched)
        if (value := held(now)) is not None:
            return value
        content, problem = _current(path, record, kind, folder, sources, check, data, verify=True)
        if problem is not None:
            if record.exists() or (data and path.exists()):
                warnings.warn(f'{stage}: rebuilding {what} {path}: {problem}', stacklevel=3)
            record.unlink(missing_ok=True)
            if data:  # removed first: a stale file must not take the room the new one needs
                path.unlink(missing_ok=True)
            fingerprints = {name: fingerprint(folder / name) for name in sources}  # a change during the build
            content = build(path)  # shows as a changed ctime on the next use
            write_json(record, kind, {'sources': fingerprints, 'data': snapshot([path])[0] if data else None,
                                      'content': content})
            now = snapshot(own) + now[len(own):]
        return opened(now, content)


def _current(path: Path, record: Path, kind: str, folder: Path, names: Sequence[str],
             check: Callable[[Path, dict], Optional[str]], data: bool, *, verify: bool) -> tuple:
    """``(content, None)`` for an entry whose record, data file and sources are current, else ``(None, why)``."""
    try:
        held = read_json(record, kind)
        sources, identity, content = held['sources'], held['data'], held['content']
        if set(sources) != set(names) or not all(isinstance(fields, dict) for fields in sources.values()):
            raise TypeError('its sources are not those of this version')
        problem = check(path, content)
        if problem is None and data and (identity is None or tuple(identity) != snapshot([path])[0]):
            problem = f'{path.name} is not the file its record describes (written since, or a build was interrupted)'
    except Damaged as e:
        return None, f'its record {e}'
    except (KeyError, TypeError, ValueError, OSError) as e:
        return None, f'its record {record.name} is unreadable ({type(e).__name__}: {e})'
    if problem is not None:
        return None, problem
    moved = {}  # the sources whose stat changed: hashed when ``verify``, their fingerprints then refreshed
    for name, built_from in sources.items():
        try:
            now = stat_fields(folder / name)
        except OSError as e:
            return None, f'{folder / name} cannot be read ({e.strerror})'
        if now['size'] != built_from.get('size'):
            return None, f'{folder / name} changed since it was built (its size)'
        if any(now[key] != built_from.get(key) for key in STAT_FIELDS):
            moved[name] = now
    if moved and not verify:
        return None, f'{", ".join(moved)} may have changed since it was built (a time or the inode)'
    for name in moved:  # touched, copied, moved or chmod-ed, or rewritten in place: the content tells
        moved[name] = fingerprint(folder / name)
        if moved[name]['sha256'] != sources[name].get('sha256'):
            return None, f'{folder / name} changed since it was built (its content: SHA-256)'
    if moved:
        with contextlib.suppress(OSError):  # a read-only folder: the next use hashes again
            write_json(record, kind, {**held, 'sources': {**sources, **moved}})
    return content, None


def derived_file(name: str) -> bool:
    """Whether a file of an index folder is one this package derives there (made from the index's own files and
    checked against them on every use: not an input of its own) or a hidden temporary or lock file."""
    return name.startswith(('.', Path(LAYOUT_NAME).stem))


def flex_index_problem(index: Union[object, str, os.PathLike]) -> Optional[str]:
    """Why ``index`` (a ``FlexIndex`` or its folder) is not a whole index, in words, or ``None`` when it is."""
    folder = Path(getattr(index, 'index_path', index))
    if not folder.is_dir():
        return f'{folder} does not exist'
    missing = [name for name in FLEX_FILES if not (folder / name).is_file()]
    if len(missing) == len(FLEX_FILES):
        return f'{folder} holds none of its files ({", ".join(FLEX_FILES)})'
    if missing:
        return f'{folder} lacks {", ".join(missing)} (an indexing run stopped before the end)'
    try:
        meta = json.loads((folder / 'pt_meta.json').read_text())
        expected = int(meta['doc_count']) * int(meta['vec_size']) * 4
    except (ValueError, KeyError, TypeError) as e:
        return f'{folder / "pt_meta.json"} does not read as a FlexIndex record ({e})'
    size = (folder / 'vecs.f4').stat().st_size
    if size != expected:
        return (f'{folder / "vecs.f4"} holds {size} bytes, not the {expected} of the {meta["doc_count"]} '
                f'{meta["vec_size"]}-dimensional vectors pt_meta.json records')
    from npids import Lookup  # pyterrier-dr's docno store
    try:
        count = len(Lookup(folder / 'docnos.npids'))
    except Exception as e:  # whatever makes it unreadable
        return f'{folder / "docnos.npids"} does not read as a docno lookup ({type(e).__name__}: {e})'
    if count != int(meta['doc_count']):
        return f'{folder / "docnos.npids"} holds {count} docnos, not the {meta["doc_count"]} pt_meta.json records'
    return None


def flex_index_complete(index: Union[object, str, os.PathLike]) -> bool:
    """Whether ``index`` (a ``FlexIndex`` or its folder) holds a whole index; use it instead of ``FlexIndex.built()``,
    which is ``True`` as soon as the folder exists.

    Example::

        index = pyterrier_dr.FlexIndex('vaswani.minilm.flex')
        if not flex_index_complete(index):
            (model >> index.indexer(mode='overwrite')).index(dataset.get_corpus_iter())
    """
    return flex_index_problem(index) is None


def check_whole(index: object, stage: str) -> None:
    """Fails, naming ``stage``, with the fix, when ``index`` is not a whole FlexIndex (:func:`flex_index_problem`)."""
    problem = flex_index_problem(index)
    if problem is not None:
        raise ValueError(f'{stage}: {index!r} is not built ({problem}); index the documents first, e.g. (encoder '
                         ">> index.indexer(mode='overwrite')).index(docs), which also replaces a folder an interrupted "
                         'run left half written')


def portable_index(index: object) -> object:
    """The index as it should travel to another process: a FlexIndex by path (not its open vectors)."""
    if isinstance(index, np.ndarray) or not hasattr(index, 'index_path'):
        return index
    return type(index)(str(index.index_path), sim_fn=index.sim_fn, verbose=index.verbose)


def flex_layout_path(index: object) -> Path:
    """Where a FlexIndex's layout, and beside it every derived file, is stored: the index folder if writable, else
    ``default_cache_dir()/layouts``."""
    folder = Path(index.index_path)
    beside, source = os.path.join(folder, LAYOUT_NAME), os.path.join(folder, 'vecs.f4')
    if os.path.exists(beside) or os.access(folder, os.W_OK) or not os.path.isfile(source):  # not built: no write
        return Path(beside)
    key = hashlib.sha1(f'{folder.resolve()}:{os.stat(source).st_size}'.encode()).hexdigest()[:16]
    return default_cache_dir() / 'layouts' / f'{folder.name}-{key}.npy'


def check_finite(rows: np.ndarray, start: int, docnos: Optional[object], stage: str, source: str) -> None:
    """Fails, naming the first document (docno and docid) with a NaN or infinite value (it would score NaN)."""
    finite = np.isfinite(rows).all(axis=1)
    if not finite.all():
        docid = start + int(np.argmin(finite))
        docno = str(docid) if docnos is None else str(docnos[docid])
        raise ValueError(f'{stage}: document {docno!r} (docid {docid}) of {source} has NaN or infinite values in its '
                         'vector: it would score NaN, which cannot be ranked against real scores; re-encode it or '
                         'rebuild the index without it')


@contextlib.contextmanager
def row_reader(vecs: np.ndarray):
    """``read(start, stop) -> (stop - start, dims) float32`` rows of ``vecs``; a memory map is read with plain file
    reads, each block then dropped from the page cache, so a streaming pass does not evict what the searches need."""
    if whole_map(vecs):
        row_bytes = vecs.shape[1] * 4
        with open(vecs.filename, 'rb') as f:
            def read(start: int, stop: int) -> np.ndarray:
                rows = np.empty((stop - start, vecs.shape[1]), dtype=np.float32)
                f.seek(vecs.offset + start * row_bytes)
                if f.readinto(memoryview(rows).cast('B')) != rows.nbytes:
                    raise OSError(f'{vecs.filename} ended before document {stop}: the index is truncated')
                if hasattr(os, 'posix_fadvise'):
                    os.posix_fadvise(f.fileno(), vecs.offset + start * row_bytes, rows.nbytes,
                                     os.POSIX_FADV_DONTNEED)
                return rows
            yield read
    else:
        yield lambda start, stop: np.asarray(vecs[start:stop], dtype=np.float32)


def whole_map(vecs: np.ndarray) -> bool:
    """Whether ``vecs`` is a whole float32 memory map of rows (a FlexIndex's ``vecs.f4``), which :func:`row_reader`
    and :func:`random_rows` read from its file and offset; a slice of one keeps its parent's offset and is not."""
    return (isinstance(vecs, np.memmap) and isinstance(vecs.base, mmap.mmap) and bool(vecs.filename)
            and vecs.dtype == np.float32 and vecs.flags.c_contiguous)


def random_rows(vecs: np.ndarray) -> np.ndarray:
    """The rows of a float32 memory map (a FlexIndex's ``vecs.f4``), read by ``rows[docids]``, through a map of their
    own advised ``MADV_RANDOM``: the kernel's read-ahead around scattered rows would read far more than them. Other
    arrays (:func:`whole_map`) as they are."""
    if not whole_map(vecs):
        return vecs
    rows = np.memmap(vecs.filename, dtype=np.float32, mode='r', offset=vecs.offset, shape=vecs.shape)
    if hasattr(mmap, 'MADV_RANDOM'):
        rows._mmap.madvise(mmap.MADV_RANDOM)
    return rows


#: Bytes beyond this share of the machine's memory are out of core: the page cache cannot keep them beside the work's
#: own memory, so reading them again means reading the disk. A smaller file stays cached once read, where asking the
#: kernel again for each row (~1 us) costs more than it saves.
OUT_OF_CORE_SHARE = 0.5


def memory_bytes() -> int:
    """This machine's physical memory, in bytes."""
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def out_of_core(nbytes: int, memory: Optional[int] = None) -> bool:
    """Whether ``nbytes`` of files exceed ``OUT_OF_CORE_SHARE`` of ``memory`` (default: this machine's)."""
    return nbytes > OUT_OF_CORE_SHARE * (memory_bytes() if memory is None else memory)


def prefetch_rows(rows: np.ndarray, docids: np.ndarray) -> None:
    """Asks the kernel to read these rows of a float32 memory map (:func:`random_rows`) into the page cache, all at
    once: scattered rows arrive faster with many reads in flight than faulted in one at a time by each thread. Only
    from a file :func:`out_of_core`."""
    filename = getattr(rows, 'filename', None)
    if not (isinstance(rows, np.memmap) and filename and hasattr(os, 'posix_fadvise')):
        return
    if not out_of_core(os.path.getsize(filename)):
        return
    row_bytes = rows.shape[1] * rows.itemsize
    fd = os.open(filename, os.O_RDONLY)
    try:
        for docid in np.unique(docids).tolist():
            os.posix_fadvise(fd, rows.offset + docid * row_bytes, row_bytes, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


def vector_stats(index: object, *, stage: str, verbose: bool = False) -> Dict[str, np.ndarray]:
    """``{'abs_max', 'variance'}`` of each dimension over a FlexIndex's vectors (float64), from one streaming pass,
    kept in ``rdime.dim_major.stats.json``; later calls only ``stat`` the vectors."""
    folder = Path(index.index_path)

    def build(path: Path) -> Dict[str, list]:
        docnos, vectors, _ = portable_index(index).payload()  # a fresh map of the current file
        return _stats_pass(vectors, docnos.fwd, stage, str(folder), verbose)
    return derived(
        flex_layout_path(index).with_suffix('.stats.json'), 'vector-stats', folder=folder, sources=('vecs.f4',),
        data=False, before_build=lambda: check_whole(index, stage), build=build, what='the vector statistics',
        stage=stage, check=lambda path, content: None if len(content['abs_max']) == len(content['variance']) else
        'its record is unreadable',
        open_with=lambda path, content: {name: np.asarray(content[name], dtype=np.float64)
                                         for name in ('abs_max', 'variance')})


def _stats_pass(vectors: np.ndarray, docnos: object, stage: str, source: str, verbose: bool) -> Dict[str, list]:
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
                check_finite(rows, start, docnos, stage, source)
                np.maximum(abs_max, np.abs(rows).max(axis=0), out=abs_max)
                progress.update(len(rows))
                yield rows
        variance, _ = maths.column_variance(blocks())
    return {'abs_max': abs_max.tolist(), 'variance': variance.tolist()}
