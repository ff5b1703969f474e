"""The paper's grid in one call: every (collection, encoder) cell run by :func:`run_experiment` into a folder of its
own, skipped on a re-run with the same options, then the combined tables and Figure of the finished cells.

Every option and cell is checked before any cell runs: the collections load, the encoders resolve, the answers file
parses. A cell that fails loses no other one.
"""
import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

from ..llm import read_answers_tsv
from . import evaluate as ev
from .collection import Collection, load_collection
from .encoders import encoder_fingerprint
from .report import ExperimentResult
from .runner import check_options, run_experiment
from .tables import write_combined

logger = logging.getLogger(__name__)

CELL_FILE = 'cell.json'
#: run_experiment's arguments that change no number: left out of a cell's options key.
NEUTRAL = ('cache_dir', 'batch_size', 'workers', 'parallel_backend', 'verbose')
CHECKED = ('mode', 'first_stage', 'dimes', 'ks', 'modulators', 'feedback', 'retriever', 'test', 'depth', 'num_results',
           'max_queries', 'sweep', 'folds', 'margin', 'alternative')


@dataclass
class Cell:
    """One (collection, encoder) of the grid, its output folder and the key of its options."""
    collection: Collection
    encoder: str
    folder: Path
    key: str
    status: str = 'pending'  # 'done' (run now), 'skipped' (finished before, same options) or 'failed'
    error: str = ''
    result: Optional[ExperimentResult] = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f'{self.collection.name} × {self.encoder}'


@dataclass
class GridResult:
    """The cells of a grid run and the problems met writing outputs."""
    cells: List[Cell]
    problems: List[str]

    @property
    def failed(self) -> List[Cell]:
        return [c for c in self.cells if c.status == 'failed']


def slug(text: str) -> str:
    """A readable folder name: the ir_datasets id or the last part of a path."""
    name = text[len('irds:'):] if text.startswith('irds:') else Path(text).expanduser().resolve().name
    return re.sub(r'[^A-Za-z0-9_.-]+', '-', name).strip('-') or 'cell'


def plan(collections: Sequence[Union[str, Collection]], encoders: Sequence[str], out: Union[str, Path],
         **settings) -> List[Cell]:
    """Checks every option and cell before any work and returns the cells with their folders
    (``<out>/<collection>/<encoder>/``) and options keys. Errors name the option or cell and the fix."""
    if not collections or not encoders:
        raise ValueError('the grid needs at least one collection and one --encoder')
    check_options(**{k: v for k, v in settings.items() if k in CHECKED})
    ev.parse_measures(settings.get('measures') or ev.DEFAULT_MEASURES, settings.get('rel'))
    answers = settings.get('answers')
    answers_key = _digest(sorted(read_answers_tsv(answers).items())) if answers is not None else None
    loaded = [c if isinstance(c, Collection) else load_collection(c) for c in collections]
    for collection in loaded:
        ev.check_rel(settings.get('rel'), collection.qrels)
    fingerprints = {encoder: encoder_fingerprint(encoder) for encoder in dict.fromkeys(encoders)}
    keyed = {k: v for k, v in settings.items() if k not in NEUTRAL and k != 'answers'}
    if settings.get('index') is not None and len(loaded) * len(fingerprints) > 1:
        raise ValueError('--index: an existing index serves one collection and one encoder; run a grid without it '
                         '(each cell encodes its collection, cached under --cache)')
    encoder_folders, used = {}, set()
    for encoder in fingerprints:
        encoder_folders[encoder] = _unique(slug(encoder), used)
    cells, used = [], set()
    for collection in loaded:
        collection_folder = Path(out) / _unique(slug(collection.name), used)
        for encoder in fingerprints:
            folder = collection_folder / encoder_folders[encoder]
            key = _digest({'collection': collection.fingerprint, 'encoder': fingerprints[encoder],
                           'answers': answers_key, **keyed})
            cells.append(Cell(collection, encoder, folder, key))
    return cells


def run_grid(collections: Sequence[Union[str, Collection]], encoders: Sequence[str], out: Union[str, Path], *,
             run_cell: Optional[Callable[..., ExperimentResult]] = None, **settings) -> GridResult:
    """Runs each (collection, encoder) cell with :func:`run_experiment` (``settings`` are its keyword arguments)
    and writes its outputs, then ``cell.json`` (last, atomically), into ``<out>/<collection>/<encoder>/``; a cell
    whose ``cell.json`` records the same options key is read back instead. Then writes the combined outputs
    (grid.md, grid.csv, grid_parity.csv, grid.tex, kept_fractions.png/pdf) of the finished cells. A cell's error is
    recorded and the grid goes on. ``run_cell`` replaces :func:`run_experiment` (tests)."""
    run_cell = run_cell or run_experiment
    cells = plan(collections, encoders, out, **settings)
    for i, cell in enumerate(cells, 1):
        if _finished(cell):
            cell.result, cell.status = ExperimentResult.load(cell.folder), 'skipped'
            logger.info('cell %d/%d %s: finished before with the same options, read back', i, len(cells), cell.name)
            continue
        logger.info('cell %d/%d %s', i, len(cells), cell.name)
        (cell.folder / CELL_FILE).unlink(missing_ok=True)
        start = time.time()
        try:
            result = run_cell(cell.collection, encoder=cell.encoder, **settings)
            result.timings['total'] = time.time() - start
            problems = result.save(cell.folder)
        except Exception as e:  # a late failure of one cell must not lose the others
            cell.status, cell.error = 'failed', f'{type(e).__name__}: {e}'
            logger.error('cell %s failed: %s', cell.name, cell.error)
            continue
        needed = [p for p in problems if Path(p.split(':')[0]).name in ('results.json', 'perquery.csv',
                                                                         'kept_fraction.csv')]
        if needed:
            cell.status, cell.error = 'failed', '; '.join(needed)
            continue
        _write_atomically(cell.folder / CELL_FILE, {'key': cell.key, 'finished': True, 'collection':
                                                    cell.collection.name, 'encoder': cell.encoder,
                                                    'problems': problems})
        cell.result, cell.status = result, 'done'
    finished = [c for c in cells if c.result is not None]
    problems = write_combined(finished, Path(out)) if finished else []
    return GridResult(cells, problems)


def _finished(cell: Cell) -> bool:
    try:
        record = json.loads((cell.folder / CELL_FILE).read_text(encoding='utf-8'))
    except (OSError, ValueError):
        return False
    return record.get('finished') is True and record.get('key') == cell.key


def _write_atomically(path: Path, payload: Dict) -> None:
    """Written whole or not at all: a crash leaves the old file or none, never half of one."""
    temporary = path.with_name(path.name + '.tmp')
    temporary.write_text(json.dumps(payload, indent=2), encoding='utf-8')
    os.replace(temporary, path)


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _unique(name: str, used: set) -> str:
    candidate, n = name, 1
    while candidate in used:
        n += 1
        candidate = f'{name}-{n}'
    used.add(candidate)
    return candidate
