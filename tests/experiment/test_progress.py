"""A long cell keeps its progress: a cell killed after some systems resumes with the finished ones read back (never
computed twice), its result equals an uninterrupted run's, its records go once it is complete, and a changed input
never reads them."""
import json

import pandas as pd
import pyterrier as pt
import pytest
from test_experiment import _mini_collection

from pyterrier_rdime.experiment import runner, systems
from pyterrier_rdime.experiment.cli import main
from pyterrier_rdime.experiment.indexes import retriever
from pyterrier_rdime.experiment.parity import SWEEP
from pyterrier_rdime.experiment.runner import run_experiment
from pyterrier_rdime.experiment.systems import PROGRESS, SystemRecords, without_vectors

#: A retrieve-mode cell with every kind of record: table systems, the sweep, seeded random controls, the random curve.
ARGS = ['--mode', 'retrieve', '--dimes', 'prf,magnitude', '--ks', '0.5', '--num-results', '5', '--control-seeds', '2',
        '--quiet']
RESULT_FILES = ('results.csv', 'perquery.csv', 'significance.csv', 'kept_fraction.csv', 'sweep.csv', 'cv.csv',
                'seeds.csv')


class CountingRetriever(pt.Transformer):
    """Wraps the runner's retriever: notes the query rows of each call, and raises on call ``crash_at`` (a kill)."""

    def __init__(self, inner, calls, crash_at=None):
        self.inner, self.calls, self.crash_at = inner, calls, crash_at

    def transform(self, inp):
        if self.crash_at is not None and len(self.calls) + 1 == self.crash_at:
            raise KeyboardInterrupt('simulated kill')
        self.calls.append(len(inp))
        return self.inner(inp)


@pytest.fixture(scope='module')
def mini(tmp_path_factory):
    return _mini_collection(tmp_path_factory.mktemp('progress'))


def _counting(monkeypatch, calls, crash_at=None):
    monkeypatch.setattr(runner, 'retriever', lambda *a, **k: CountingRetriever(retriever(*a, **k), calls, crash_at))
    monkeypatch.setattr(systems, 'BATCH_QUERIES', 4)  # one query per call (its systems' rows are more): 3 calls


def _cell(out):
    return out / 'mini' / 'minilm'


@pytest.fixture(scope='module')
def whole(mini, tmp_path_factory):
    """The cell run without a kill: its output folder, its cache, and the query rows of each retriever call."""
    folder, calls = tmp_path_factory.mktemp('whole'), []
    with pytest.MonkeyPatch.context() as monkeypatch:
        _counting(monkeypatch, calls)
        assert main([str(mini), *ARGS, '--cache', str(folder / 'cache'), '--out', str(folder / 'out')]) == 0
    return folder, calls


def test_a_killed_cell_resumes_at_its_first_unfinished_system(mini, whole, monkeypatch):
    folder, whole_calls = whole
    assert not (_cell(folder / 'out') / PROGRESS).exists()  # a complete cell keeps no records
    cache = ['--cache', str(folder / 'cache')]
    killed = []
    _counting(monkeypatch, killed, crash_at=3)  # killed in the second query's call
    assert main([str(mini), *ARGS, *cache, '--out', str(folder / 'resumed')]) == 130
    records = list((_cell(folder / 'resumed') / PROGRESS).rglob('*.pkl'))
    assert whole_calls == [2, 54, 54] and killed == [2, 54]
    assert len(records) == 2  # the Baseline and the first query's call were recorded
    assert not (_cell(folder / 'resumed') / 'cell.json').exists()

    resumed = []
    _counting(monkeypatch, resumed)
    assert main([str(mini), *ARGS, *cache, '--out', str(folder / 'resumed')]) == 0
    # nothing searched twice, nothing lost: the killed run's searches and the resumed run's are the whole run's
    assert sum(killed) + sum(resumed) == sum(whole_calls)
    assert sum(killed) > 0 and sum(resumed) > 0
    for name in RESULT_FILES:
        pd.testing.assert_frame_equal(pd.read_csv(_cell(folder / 'resumed') / name),
                                      pd.read_csv(_cell(folder / 'out') / name), obj=name)
    assert not (_cell(folder / 'resumed') / PROGRESS).exists()


def test_a_cell_failing_after_its_searches_resumes_without_searching_again(mini, whole, monkeypatch):
    folder, whole_calls = whole
    cache = ['--cache', str(folder / 'cache')]
    real = runner.evaluate

    def killed(*args, **kwargs):
        raise KeyboardInterrupt('simulated kill in the evaluation')
    _counting(monkeypatch, [])
    monkeypatch.setattr(runner, 'evaluate', killed)
    assert main([str(mini), *ARGS, *cache, '--out', str(folder / 'late')]) == 130
    records = sorted(p.name for p in (_cell(folder / 'late') / PROGRESS).rglob('*.pkl'))
    # the Baseline and each call, not each system searched together
    assert len(records) == 1 + len(whole_calls) - 1 and records[0].startswith('call-1-of-2')

    monkeypatch.setattr(runner, 'evaluate', real)
    resumed = []
    _counting(monkeypatch, resumed)
    assert main([str(mini), *ARGS, *cache, '--out', str(folder / 'late')]) == 0
    assert resumed == [0]  # every call read back (the retriever only asked for its columns, with no query)
    for name in RESULT_FILES:
        pd.testing.assert_frame_equal(pd.read_csv(_cell(folder / 'late') / name),
                                      pd.read_csv(_cell(folder / 'out') / name), obj=name)


def test_records_of_other_inputs_are_never_read(mini, whole, tmp_path, monkeypatch):
    folder, whole_calls = whole
    cache = ['--cache', str(folder / 'cache')]
    _counting(monkeypatch, [], crash_at=3)
    assert main([str(mini), *ARGS, *cache, '--out', str(tmp_path)]) == 130
    stale = list((_cell(tmp_path) / PROGRESS).iterdir())
    assert len(stale) == 1 and list(stale[0].glob('*.pkl'))

    changed = []  # another equivalence margin: the same systems, but another cell key
    _counting(monkeypatch, changed)
    assert main([str(mini), *ARGS, *cache, '--margin', '0.1', '--out', str(tmp_path)]) == 0
    assert changed == whole_calls  # every system computed again, none read from the other key's records
    assert json.loads((_cell(tmp_path) / 'cell.json').read_text())['finished']
    assert not stale[0].exists()


def test_a_rerank_cell_resumes_with_the_finished_systems_read_back(mini, tmp_path, monkeypatch):
    settings = dict(dimes=['prf', 'swc'], ks=[0.5], first_stage='bm25', depth=4, control_seeds=2,
                    cache_dir=tmp_path / 'cache', verbose=False)
    whole = run_experiment(str(mini), progress=SystemRecords(tmp_path / 'whole', 'key'), **settings)

    real = systems.topk_runs
    sweeps = []

    def killed_in_the_second_sweep(scored, fractions):
        sweeps.append(list(fractions))
        if len(sweeps) == 2:
            raise KeyboardInterrupt('simulated kill')
        return real(scored, fractions)
    monkeypatch.setattr(systems, 'topk_runs', killed_in_the_second_sweep)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(str(mini), progress=SystemRecords(tmp_path / 'cell', 'key'), **settings)
    finished = len(list((tmp_path / 'cell' / 'key').glob('*.pkl')))
    # everything before swc's sweep: Baseline; prf's 2 columns, RDIME's 4 controls (random's 2 seeds, magnitude,
    # variance) and its 10 sweep fractions; swc's 2 columns and 4 controls
    assert finished == 1 + (2 + 4 + 10) + (2 + 4)

    sweeps.clear()
    progress = SystemRecords(tmp_path / 'cell', 'key')
    resumed = run_experiment(str(mini), progress=progress, **settings)
    assert progress.read_back == finished
    assert sweeps == [list(SWEEP)]  # only swc's sweep was computed
    for name in ('table', 'perquery', 'kept', 'significance', 'sweep', 'cv', 'seeds'):
        pd.testing.assert_frame_equal(getattr(resumed, name), getattr(whole, name), obj=name)
    assert resumed.notes == whole.notes


def test_records_hold_no_vectors_and_a_damaged_one_is_recomputed(tmp_path, caplog):
    import numpy as np
    frame = pd.DataFrame({'qid': ['1', '1'], 'docno': ['a', 'b'], 'score': [2.0, 1.0], 'query_kept_frac': [0.5, 0.5],
                          'query_vec': [np.ones(3)] * 2, 'doc_vec': [np.zeros(3), np.ones(3)]})
    assert list(without_vectors(frame).columns) == ['qid', 'docno', 'score', 'query_kept_frac']
    records = SystemRecords(tmp_path, 'k')
    computed = []
    first = records.frame(('frames', 'prf/RDIME'), lambda: computed.append(1) or frame)
    again = SystemRecords(tmp_path, 'k').frame(('frames', 'prf/RDIME'), lambda: computed.append(1) or frame)
    pd.testing.assert_frame_equal(again, first)
    assert computed == [1]
    next(tmp_path.glob('k/*.pkl')).write_bytes(b'not a pickle')
    recomputed = SystemRecords(tmp_path, 'k').frame(('frames', 'prf/RDIME'), lambda: computed.append(1) or frame)
    assert computed == [1, 1] and 'does not read back' in caplog.text
    pd.testing.assert_frame_equal(recomputed, first)
    with pytest.raises(ValueError, match='needs the key'):
        SystemRecords(tmp_path)
