"""What a cached artefact was built from, recorded beside it and checked before it is used: the collection's
documents (:attr:`Collection.fingerprint`), the encoder's content (:func:`encoder_fingerprint`) and, for a dense
index, a hash of each document's text, so that a changed corpus re-encodes only the documents that changed."""
import contextlib
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Iterable, Iterator, Optional, Union

import numpy as np

from .._io import atomic_open

#: The sidecar file of a cached artefact: a JSON object of what it was built from.
FINGERPRINT = 'rdime_fingerprint.json'
#: A dense index's per-document text hashes (uint64, in the index's docid order).
TEXT_HASHES = 'rdime_text_hashes.npy'
VERSION = 1


def slug(label: str, key: Optional[str] = None) -> str:
    """A file-name-safe folder name: ``label`` with every run of characters other than letters, digits and ``_.-``
    as one ``_``, its last 60 characters, then ``-<key>`` where given (a digest that keeps apart labels that read
    the same). The one naming rule of the caches and of a grid's cell folders."""
    base = re.sub(r'[^A-Za-z0-9_.-]+', '_', label).strip('_')[-60:]
    return f'{base}-{key}' if key is not None else base or '_'


def text_hash(text: str) -> int:
    """A 64-bit hash of a text (blake2b of its UTF-8 bytes): what a cached vector was encoded from."""
    return int.from_bytes(hashlib.blake2b(text.encode('utf-8', 'surrogatepass'), digest_size=8).digest(), 'little')


def text_hashes(texts: Iterable[str]) -> np.ndarray:
    """:func:`text_hash` of each text, as uint64."""
    return np.fromiter((text_hash(t) for t in texts), dtype=np.uint64)


def read_fingerprint(folder: Union[str, Path]) -> Optional[dict]:
    """The fingerprint recorded in ``folder``; ``None`` when there is none or it cannot be read (a cache written
    before fingerprints, or by hand), which callers treat as built from unknown content."""
    path = Path(folder) / FINGERPRINT
    try:
        recorded = json.loads(path.read_text(encoding='utf-8'))
    except (OSError, ValueError):
        return None
    return recorded if isinstance(recorded, dict) and recorded.get('version') == VERSION else None


def write_fingerprint(folder: Union[str, Path], **fields) -> None:
    """Records ``fields`` in ``folder``, atomically (a killed process leaves the old file or the new one)."""
    with atomic_open(Path(folder) / FINGERPRINT) as f:
        json.dump({'version': VERSION, **fields}, f, indent=1)


@contextlib.contextmanager
def cache_entry(path: Path) -> Iterator[None]:
    """Held while the cache entry ``path`` is checked and built: one builder at a time (a second process waits,
    then finds the entry built), and what a killed builder left (``pt.io.finalized_directory``'s hidden temporary
    folders beside ``path``) is removed, since no other builder can be running."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; concurrent builders still each write a whole entry
        yield
        return
    with open(path.parent / f'.{path.name}.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stem, suffix = os.path.splitext(path.name)
        for leftover in path.parent.glob(f'.{stem}.*.tmp{suffix}'):
            shutil.rmtree(leftover, ignore_errors=True)
        yield
