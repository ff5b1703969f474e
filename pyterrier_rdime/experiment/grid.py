"""The paper's grid in one call: every (collection, encoder) cell run by :func:`run_experiment` into a folder of its
own, read back on a re-run where none of its inputs changed, then the combined tables and Figure (its cells on a Ray
cluster with ``--cells``). Every option is checked before any cell runs; a cell that fails loses no other one.
"""
import contextlib
import functools
import hashlib
import json
import logging
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import pandas as pd
import pyterrier as pt

from .. import store
from .._config import check_int, default_cache_dir
from .collection import Collection, load_collection, slug
from .encoders import encoder_fingerprint
from .report import ExperimentResult, write_combined
from .runner import DEFAULT_MEASURES, OPTION_NAMES, Options, check_rel, parse_measures, run_experiment
from .systems import PROGRESS, AnswerSources, SystemRecords, answer_sources

logger = logging.getLogger(__name__)

CELL_FILE = 'cell.json'
#: run_experiment's arguments that change no number: left out of a cell's options fingerprint.
NEUTRAL = ('cache_dir', 'batch_size', 'workers', 'parallel_backend', 'verbose')
#: Times a cell is run again after its node or worker was lost; its own errors are never retried.
RETRIES = 3
#: Seconds between two looks at the cells in flight.
POLL = 5
#: Seconds the cells may wait while no live node offers the CPUs one needs.
NO_NODE_TIMEOUT = 120
#: Seconds to fetch a finished cell's result, and to connect to ``ray_address``.
FETCH_TIMEOUT = 60


@dataclass
class Cell:
    """One (collection, encoder) of the grid: its output folder, its inputs' fingerprints (:func:`collection_inputs`
    and the run's) and key, and its labels in the combined outputs."""
    collection: Collection
    encoder: str
    folder: Path
    inputs: Dict[str, Optional[str]]
    collection_label: str = ''
    encoder_label: str = ''
    status: str = 'pending'  # 'done' (run now), 'skipped' (finished before, same inputs) or 'failed'
    error: str = ''
    problems: List[str] = field(default_factory=list)  # outputs of the cell that could not be written
    result: Optional[ExperimentResult] = field(default=None, repr=False)

    @property
    def key(self) -> str:
        return _digest(self.inputs)

    @property
    def name(self) -> str:
        return f'{self.collection_label or self.collection.name} × {self.encoder_label or self.encoder}'


@dataclass
class GridResult:
    """The cells of a grid run and the problems met writing outputs."""
    cells: List[Cell]
    problems: List[str]

    @property
    def failed(self) -> List[Cell]:
        return [c for c in self.cells if c.status == 'failed']


def plan(collections: Sequence[Union[str, Collection]], encoders: Sequence[str], out: Union[str, Path],
         **settings) -> List[Cell]:
    """Checks every option and every cell's collection before any work and returns the cells; one given twice is
    planned once, with a warning. Errors name the option and the fix."""
    if not collections or not encoders:
        raise ValueError('the grid needs at least one collection and one --encoder')
    options = Options(**{k: v for k, v in settings.items() if k in OPTION_NAMES})
    measures = settings.get('measures')
    parse_measures(DEFAULT_MEASURES if measures is None else measures, settings.get('rel'))
    answers = settings.get('answers')
    cache_dir = settings.get('cache_dir') or default_cache_dir()
    check_writable('--out', Path(out))
    check_writable('--cache', Path(cache_dir))
    loaded = [c if isinstance(c, Collection) else load_collection(c) for c in collections]
    for collection in loaded:  # every cell's collection checked before the first cell starts
        check_rel(settings.get('rel'), collection.qrels)
        if settings.get('index') is None:
            options.check_documents(collection.num_docs, f'collection {collection.name!r}')
    # each name of --answers resolved for each collection now (a local copy, or the published file, downloaded once)
    inputs = {id(c): collection_inputs(c, answer_sources(answers, c, cache_dir) if answers is not None else None)
              for c in loaded}
    loaded = _once(loaded, [_digest(inputs[id(c)]) for c in loaded], 'collection', lambda c: c.name)
    encoders = _once(list(encoders), [encoder_fingerprint(e) for e in encoders], '--encoder', str)
    fingerprints = {encoder: encoder_fingerprint(encoder) for encoder in encoders}  # memoised: no second hashing
    if settings.get('index') is not None and len(loaded) * len(fingerprints) > 1:
        raise ValueError('--index: an existing index serves one collection and one encoder; run a grid without it '
                         '(each cell encodes its collection, cached under --cache)')
    run_file = options.first_stage if options.first_stage not in ('auto', 'bm25') else None
    common = {'code': code_digest(), 'first-stage file': _file_digest(run_file),
              'index': _file_digest(settings.get('index')),
              'options': _digest({**options.settings(), **{k: v for k, v in settings.items()
                                                          if k not in (*OPTION_NAMES, *NEUTRAL, 'answers')}})}
    collection_labels = distinct_labels([_identity(c.name) for c in loaded])
    encoder_labels = distinct_labels([_identity(e) for e in fingerprints])
    return [Cell(collection, encoder, Path(out) / slug(collection_label) / slug(encoder_label),
                 {**inputs[id(collection)], 'encoder': fingerprint, **common}, collection_label, encoder_label)
            for collection, collection_label in zip(loaded, collection_labels)
            for (encoder, fingerprint), encoder_label in zip(fingerprints.items(), encoder_labels)]


def check_writable(option: str, folder: Path) -> None:
    """Fails at once when ``folder`` cannot be created or written, rather than after the whole run."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f'{option} {folder}: exists and is not a folder; pass a folder path')
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise ValueError(f'{option} {folder}: cannot write there ({e.strerror}); pass a writable folder') from None


def collection_inputs(collection: Collection, sources: Optional[AnswerSources] = None) -> Dict[str, Optional[str]]:
    """A fingerprint of each of a collection's files that a cell's numbers depend on (``sources``: --answers')."""
    if sources is None and collection.answers is not None:
        sources = {'': collection.answers}
    return {'documents': collection.fingerprint, 'queries': _digest(collection.topics),
            'qrels': _digest(collection.qrels),
            'first-stage run': None if collection.run is None else _digest(collection.run),
            'answers': None if sources is None else _digest(
                sorted(sources[''].items()) if list(sources) == [''] else
                sorted((name, sorted(answers.items())) for name, answers in sources.items()))}


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """The content of this package's modules and the libraries' versions: other code recomputes a cell."""
    import importlib.metadata
    versions = dict.fromkeys(('python-terrier', 'pyterrier-dr', 'pyterrier-pisa', 'ir-measures', 'numpy', 'scipy',
                              'statsmodels', 'sentence-transformers', 'torch'))  # None: not installed
    for library in versions:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[library] = importlib.metadata.version(library)
    return _digest([_file_digest(Path(__file__).resolve().parents[1], '*.py'), versions])


def distinct_labels(names: Sequence[str]) -> List[str]:
    """Each name's shortest path suffix that no other name shares (``p1/cranfield``, ``p2/cranfield``)."""
    parts = [PurePosixPath(name).parts or (name,) for name in names]
    labels = []
    for i, mine in enumerate(parts):
        depth = 1
        while depth < len(mine) and any(other[-depth:] == mine[-depth:] for j, other in enumerate(parts) if j != i):
            depth += 1
        labels.append('/'.join(mine[-depth:]).lstrip('/') or names[i])
    return labels


def _identity(name: str) -> str:
    """An ir_datasets id as given; a path as the absolute POSIX path it stands for."""
    if name.startswith('irds:'):
        return name[len('irds:'):]
    path = Path(name).expanduser()
    return path.resolve().as_posix() if path.exists() else name


def _once(items: list, keys: Sequence[str], what: str, name: Callable[[object], str]) -> list:
    """The first of the items whose content key is the same; a warning names each other one, run once."""
    first: Dict[str, object] = {}
    for item, key in zip(items, keys):
        if key in first:
            logger.warning('%s %s is the same as %s (the same content): run once', what, name(item), name(first[key]))
        else:
            first[key] = item
    return list(first.values())


def run_grid(collections: Sequence[Union[str, Collection]], encoders: Sequence[str], out: Union[str, Path], *,
             run_cell: Optional[Callable[..., ExperimentResult]] = None, cells: int = 1,
             ray_address: Optional[str] = None, **settings) -> GridResult:
    """Runs each (collection, encoder) cell with :func:`run_experiment` (``settings`` are its keyword arguments)
    and writes its outputs, then ``cell.json`` (last, atomically), into ``<out>/<collection>/<encoder>/``. A cell
    whose ``cell.json`` records the same inputs is read back instead; one whose inputs changed is recomputed with a
    warning. Then writes the combined outputs (grid.md, grid.csv, grid_parity.csv, grid.tex, kept_fractions.png/pdf).
    A cell's error is recorded and the grid goes on (a lone cell's error propagates). A cell killed midway resumes
    at the first system it had not finished (:class:`~.systems.SystemRecords`). ``cells`` > 1 runs that many cells
    at once as Ray tasks (:func:`run_cells`). ``run_cell`` replaces :func:`run_experiment` (tests)."""
    check_int('run_grid', 'cells', cells, 1, hint='the cells run at once on a Ray cluster; 1 runs them one by one')
    run_cell = run_cell or run_experiment
    planned = plan(collections, encoders, out, **settings)
    pending = [cell for i, cell in enumerate(planned, 1) if not _read_back(cell, f'{i}/{len(planned)}')]
    if cells > 1 and len(planned) > 1:  # each cell's own bars would interleave: the cells' bar only
        run_cells(pending, run_cell, {**settings, 'verbose': False, 'parallel_backend': 'joblib'}, cells=cells,
                  total=len(planned), ray_address=ray_address, verbose=settings.get('verbose', True))
        for cell in (c for c in pending if c.status == 'done' and not (c.folder / CELL_FILE).is_file()):
            _failed(cell, f'computed on a node of the cluster, but its record is not in {cell.folder} here: --out '
                          'must be a folder every node shares, at the same path')
    else:
        for cell in pending:
            logger.info('cell %d/%d %s', planned.index(cell) + 1, len(planned), cell.name)
            compute_cell(cell, run_cell, settings, lone=len(planned) == 1)
    finished = [c for c in planned if c.result is not None]
    problems = [f'{c.name}: {p}' for c in finished for p in c.problems]
    problems += write_combined(finished, Path(out)) if finished else []
    return GridResult(planned, problems)


def compute_cell(cell: Cell, run_cell: Callable[..., ExperimentResult], settings: dict, lone: bool = False) -> None:
    """Runs ``cell``, writes its outputs, then its record; sets its status and result, or its error."""
    (cell.folder / CELL_FILE).unlink(missing_ok=True)
    progress = SystemRecords(cell.folder / PROGRESS, cell.key)
    try:
        result = run_cell(cell.collection, encoder=cell.encoder, progress=progress, **settings)
        problems = result.save(cell.folder)
    except Exception as e:  # a late failure of one cell must not lose the others
        if lone:
            raise
        return _failed(cell, f'{type(e).__name__}: {e}')
    needed = [p for p in problems if Path(p.split(':')[0]).name in ('results.json', 'perquery.csv',
                                                                     'kept_fraction.csv')]
    if needed:
        return _failed(cell, '; '.join(needed))
    with store.atomic_open(cell.folder / CELL_FILE) as f:  # a crash leaves the old record or none, never half of one
        json.dump({'key': cell.key, 'inputs': cell.inputs, 'finished': True, 'collection': cell.collection.name,
                   'encoder': cell.encoder, 'problems': problems}, f, indent=2)
    progress.clear()  # the record is complete: the systems' frames are no longer needed
    cell.result, cell.status, cell.problems = result, 'done', problems


def _compute_on_node(cell: Cell, run_cell: Callable[..., ExperimentResult], settings: dict) -> Tuple[Cell, str]:
    """:func:`compute_cell` on a node of the cluster, which must run the code the cell was keyed with; the computed
    cell, and where it ran."""
    import ray
    if code_digest() != cell.inputs['code']:
        _failed(cell, f'this node runs other code ({code_digest()}) than the driver ({cell.inputs["code"]}): install '
                      'the same version of pyterrier-rdime and of its libraries on every node')
    else:
        compute_cell(cell, run_cell, settings)
    return cell, ray.util.get_node_ip_address()


def run_cells(pending: Sequence[Cell], run_cell: Callable[..., ExperimentResult], settings: dict, *, cells: int,
              total: int, ray_address: Optional[str] = None, verbose: bool = True) -> None:
    """Runs each of the ``pending`` cells (:func:`compute_cell` with ``settings``) as a Ray task reserving
    ``--workers`` CPUs, ``cells`` at once, and copies each result onto the driver's cell. Bounded by :data:`RETRIES`,
    :data:`NO_NODE_TIMEOUT` and :data:`FETCH_TIMEOUT`; interrupted, the cells in flight are cancelled."""
    if not pending:
        return
    try:
        import ray
    except ImportError:
        raise ImportError("--cells needs Ray: pip install 'pyterrier-rdime[ray]' (from a clone: pip install "
                          "'.[ray]')") from None
    from ..pruned.sharded import connect
    connect(ray_address, FETCH_TIMEOUT, '--ray-address')
    cpus = settings.get('workers', 1)
    task = ray.remote(_compute_on_node).options(num_cpus=cpus, max_retries=RETRIES, retry_exceptions=False)
    queue: List = list(pending)
    running: Dict[object, object] = {}
    waiting_since = None
    with pt.tqdm(total=total, initial=total - len(pending), desc='cells', unit='cell', disable=not verbose) as bar:
        try:
            while queue or running:
                while queue and len(running) < cells:
                    cell = queue.pop(0)
                    running[task.remote(cell, run_cell, settings)] = cell
                ready, _ = ray.wait(list(running), num_returns=1, timeout=POLL)
                for ref in ready:
                    _finish(ray, ref, running.pop(ref))
                    bar.update()
                waiting_since = None if ready or _cpus(ray) >= cpus else waiting_since or time.monotonic()
                if waiting_since is not None and time.monotonic() - waiting_since > NO_NODE_TIMEOUT:
                    # the cells left fail, for the next run
                    error = (f'no live node of the cluster offered the {cpus} CPU(s) a cell needs for '
                             f'{NO_NODE_TIMEOUT} s (the largest offers {_cpus(ray):g}): start nodes with '
                             f'--num-cpus={cpus} or more (ray start --address=HEAD:PORT), or lower --workers, then '
                             're-run the same command')
                    for cell in list(running.values()) + queue:
                        _failed(cell, error)
                    return
        finally:
            for ref in running:  # interrupted: nothing left running on the cluster
                ray.cancel(ref, force=True)


def _finish(ray, ref, cell) -> None:
    """The result of a finished task onto the driver's ``cell``; a failed task makes a failed cell."""
    try:
        computed, node = ray.get(ref, timeout=FETCH_TIMEOUT)
    except ray.exceptions.RayError as e:
        reason = f'{type(e).__name__}: {next((line for line in str(e).splitlines() if line.strip()), "")}'.rstrip(': ')
        _failed(cell, f'lost: {reason}; after {RETRIES} retries it is left for the next run of the same command')
        return
    cell.status, cell.error, cell.problems, cell.result = computed.status, computed.error, computed.problems, \
        computed.result
    logger.info('cell %s: %s on node %s', cell.name, cell.status, node)


def _failed(cell: Cell, error: str) -> None:
    cell.status, cell.error, cell.result = 'failed', error, None
    logger.error('cell %s failed: %s', cell.name, error)


def _cpus(ray) -> float:
    """The most CPUs one live node of the cluster offers (0 while the cluster cannot be asked)."""
    try:
        return max([n.get('Resources', {}).get('CPU', 0) for n in ray.nodes() if n.get('Alive')], default=0)
    except Exception:  # the head is being reached again: no CPU known, the bound goes on counting
        return 0


def _read_back(cell: Cell, position: str) -> bool:
    """Whether ``cell`` (``position`` in the grid) finished before with the same inputs and reads back (then
    ``cell.result`` holds it); if not, a warning says why, unless the record is missing."""
    path = cell.folder / CELL_FILE
    if not path.exists():
        return False
    try:
        record = json.loads(path.read_text(encoding='utf-8'))
    except (OSError, ValueError) as e:
        return _recompute(cell, f'its record {path} does not read back ({type(e).__name__}: {e})')
    if not (isinstance(record, dict) and record.get('finished') is True and isinstance(record.get('key'), str)):
        return _recompute(cell, f'its record {path} is not a finished cell\'s record')
    if record['key'] != cell.key:
        recorded = record.get('inputs') if isinstance(record.get('inputs'), dict) else {}
        changed = [name for name, value in cell.inputs.items() if recorded.get(name, value) != value] or \
            ['the options or inputs (recorded by an earlier version)']
        return _recompute(cell, f'{", ".join(changed)} changed since it was computed')
    try:
        cell.result = ExperimentResult.load(cell.folder)
    except Exception as e:  # a damaged result file of any kind: the cell is recomputed, never the grid aborted
        return _recompute(cell, f'its results in {cell.folder} do not read back ({type(e).__name__}: {e})')
    problems = record.get('problems')
    cell.status, cell.problems = 'skipped', [str(p) for p in problems] if isinstance(problems, list) else []
    logger.info('cell %s %s: finished before with the same inputs, read back', position, cell.name)
    return True


def _recompute(cell: Cell, why: str) -> bool:
    logger.warning('cell %s: %s; recomputing it', cell.name, why)
    return False


def _digest(value) -> str:
    """The content of a JSON value, or of a frame (column names, values and row order)."""
    if not isinstance(value, pd.DataFrame):
        return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]
    digest = hashlib.sha256(json.dumps(list(map(str, value.columns))).encode())
    digest.update(pd.util.hash_pandas_object(value.astype(str), index=False).to_numpy().tobytes())
    return digest.hexdigest()[:16]


def _file_digest(option: Optional[Union[str, Path]], pattern: str = '*') -> Optional[str]:
    """The content of the file or folder (its ``pattern`` files, less those derived in it) an option names; None if it
    names no local path. The derived files are left out: the first search of an index writes its copies beside it,
    which must not make the next run's cell another one."""
    path = Path(option).expanduser() if option is not None else None
    if path is None or not path.exists():
        return None
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob(pattern) if p.is_file() and not store.derived_file(p.name))
    return _digest([(file.relative_to(path).as_posix(), store.fingerprint(file)['sha256']) for file in files])

