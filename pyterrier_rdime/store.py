"""The one store of the files this package derives and keeps, after pyterrier-alpha's ``Artifact``: atomic writes
(:func:`atomic_open`), checksummed records (:func:`write_record`), file identity by ``stat`` including the ctime
(:func:`stat_fields`, :func:`fingerprint`), one builder at a time (:func:`locked`), and check on every use, rebuild
with a warning when stale or damaged (:func:`derived`)."""
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import threading
import warnings
from pathlib import Path
from typing import IO, Callable, Dict, Iterator, Optional, Sequence, Tuple, Union

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


def fingerprint(source: Path) -> dict:
    """:func:`stat_fields` and the SHA-256 of a file, hashed once per process while its stat stays the same."""
    fields = stat_fields(source)
    key = Path(source).resolve()
    if _HASHED.get(key, {}).items() >= fields.items():
        return dict(_HASHED[key])
    digest = hashlib.sha256()
    buffer = bytearray(HASH_CHUNK)
    with open(source, 'rb') as f:
        while read := f.readinto(buffer):
            digest.update(memoryview(buffer)[:read])
            if hasattr(os, 'posix_fadvise'):  # a full read must not evict what the searches read
                os.posix_fadvise(f.fileno(), f.tell() - read, read, os.POSIX_FADV_DONTNEED)
    _HASHED[key] = {**fields, 'sha256': digest.hexdigest()}
    return dict(_HASHED[key])


def sources_problem(recorded: Dict[str, dict], folder: Path, *, verify: bool) -> Tuple[Optional[str], Dict[str, dict]]:
    """``(problem, refreshed)`` for a derived file's recorded sources: ``problem`` None while all are unchanged (a
    moved stat is hashed when ``verify``); ``refreshed`` the new fingerprints of same-content sources."""
    moved = {}
    for name, built_from in recorded.items():
        try:
            now = stat_fields(folder / name)
        except OSError as e:
            return f'{folder / name} cannot be read ({e.strerror})', {}
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
        with _REGISTRY_LOCK:
            _OPENED[path] = (now, value)
        return value

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
    problem, refreshed = sources_problem(sources, folder, verify=verify)
    if problem is not None:
        return None, problem
    if refreshed:
        with contextlib.suppress(OSError):  # a read-only folder: the next use hashes again
            write_json(record, kind, {**held, 'sources': {**sources, **refreshed}})
    return content, None
