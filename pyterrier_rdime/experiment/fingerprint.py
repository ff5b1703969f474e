"""What a cached artefact was built from (documents, encoder, each document's text hash), recorded beside it and
checked before it is used."""
import hashlib
import re
from pathlib import Path
from typing import Iterable, Optional, Union

import numpy as np

from .. import store

#: The sidecar file of a cached artefact: a record (:mod:`pyterrier_rdime.store`) of what it was built from.
FINGERPRINT = 'rdime_fingerprint.json'
#: A dense index's per-document text hashes (uint64, in the index's docid order).
TEXT_HASHES = 'rdime_text_hashes.npy'


def slug(label: str, key: Optional[str] = None) -> str:
    """A file-name-safe folder name: ``label`` with other characters than letters, digits and ``_.-`` as ``_``, its
    last 60 characters, then ``-<key>`` where given. The one naming rule of the caches and cell folders."""
    base = re.sub(r'[^A-Za-z0-9_.-]+', '_', label).strip('_')[-60:]
    return f'{base}-{key}' if key is not None else base or '_'


def text_hash(text: str) -> int:
    """A 64-bit hash of a text (blake2b of its UTF-8 bytes): what a cached vector was encoded from."""
    return int.from_bytes(hashlib.blake2b(text.encode('utf-8', 'surrogatepass'), digest_size=8).digest(), 'little')


def text_hashes(texts: Iterable[str]) -> np.ndarray:
    """:func:`text_hash` of each text, as uint64."""
    return np.fromiter((text_hash(t) for t in texts), dtype=np.uint64)


def read_fingerprint(folder: Union[str, Path]) -> Optional[dict]:
    """The fingerprint recorded in ``folder``; ``None`` (unknown content) when there is none or it does not check."""
    try:
        return store.read_json(Path(folder) / FINGERPRINT, 'fingerprint')
    except (store.Damaged, ValueError):
        return None


def write_fingerprint(folder: Union[str, Path], **fields) -> None:
    """Records ``fields`` in ``folder``, atomically (a killed process leaves the old file or the new one)."""
    store.write_json(Path(folder) / FINGERPRINT, 'fingerprint', fields)


#: Held while a cache entry (a folder) is checked and built (:func:`pyterrier_rdime.store.locked`).
cache_entry = store.locked
