"""The grid never reads a stale cell back and never fails quietly: every input file is in a cell's key (an edit
recomputes the cell, names the input, and gives a fresh run's numbers), damaged records are recomputed, same-named
collections keep distinct labels, model folders and duplicates are checked before any work, and a figure that cannot
be written makes the grid exit non-zero."""
import json
import logging
import shutil

import numpy as np
import pandas as pd
import pytest
from conftest import shared_collection

from pyterrier_rdime.experiment import grid as grid_module
from pyterrier_rdime.experiment.cli import main
from pyterrier_rdime.experiment.grid import CELL_FILE, distinct_labels, plan, run_grid
from pyterrier_rdime.experiment.report import SPREAD, ExperimentResult, sweep_plot

SETTINGS = dict(dimes=['prf'], ks=[0.5], depth=5, max_queries=3, sweep=False, verbose=False)
QIDS = ('1', '2', '3')


def _small_collection(folder):
    """Cranfield's first 3 queries over its first 300 documents, with a shipped run and LLM answers."""
    source = shared_collection('cranfield')
    folder.mkdir()
    lines = (source / 'docs.jsonl').read_text(encoding='utf-8').splitlines()[:300]
    (folder / 'docs.jsonl').write_text('\n'.join(lines) + '\n', encoding='utf-8')
    docnos = [json.loads(line)['docno'] for line in lines]
    queries = (source / 'queries.tsv').read_text(encoding='utf-8').splitlines()[:3]
    (folder / 'queries.tsv').write_text('\n'.join(queries) + '\n', encoding='utf-8')
    qrels = [line for line in (source / 'qrels').read_text().splitlines() if line.split()[0] in QIDS]
    (folder / 'qrels').write_text('\n'.join(qrels) + '\n')
    run = [f'{q} Q0 {docnos[(7 * int(q) + 3 * r) % 300]} {r} {20 - r} bm25' for q in QIDS for r in range(12)]
    (folder / 'bm25.run').write_text('\n'.join(run) + '\n')
    (folder / 'llm_answers.tsv').write_text(''.join(f'{q}\tan answer about aircraft {q}\n' for q in QIDS))
    return folder


def _edit_qrels(folder):
    path = folder / 'qrels'
    path.write_text('\n'.join(' '.join(f[:3] + ['0']) if f[0] == '2' else ' '.join(f)
                              for f in map(str.split, path.read_text().splitlines())) + '\n')


def _edit_queries(folder):
    path = folder / 'queries.tsv'
    path.write_text(path.read_text(encoding='utf-8').replace('what problems of heat conduction', 'boundary layer'),
                    encoding='utf-8')


def _edit_run(folder):
    _cut_run(folder / 'bm25.run')


def _cut_run(path):
    """Query 1's ranking cut to its top 3."""
    path.write_text('\n'.join(line for line in path.read_text().splitlines()
                              if not (line.startswith('1 ') and int(line.split()[3]) >= 3)) + '\n')


def _edit_answers(folder):
    path = folder / 'llm_answers.tsv'
    path.write_text(path.read_text().replace('about aircraft 2', 'about heat transfer'))


def _edit_docs(folder):
    path = folder / 'docs.jsonl'
    path.write_text(path.read_text(encoding='utf-8').replace('slipstream', 'wake', 1), encoding='utf-8')


@pytest.fixture(scope='module')
def computed(tmp_path_factory):
    """A finished one-cell grid over the small collection (LLM DIME included, so the answers count)."""
    root = tmp_path_factory.mktemp('inputs')
    collection = _small_collection(root / 'small')
    out, cache = root / 'out', root / 'cache'
    run_grid([str(collection)], ['minilm'], out, cache_dir=cache, **{**SETTINGS, 'dimes': ['prf', 'llm']})
    return root


def _numbers(out):
    return pd.read_csv(out / 'grid.csv').drop(columns=['collection'])


@pytest.mark.parametrize('edit, changed', [(_edit_qrels, 'qrels'), (_edit_queries, 'queries'),
                                           (_edit_run, 'first-stage run'), (_edit_answers, 'answers'),
                                           (_edit_docs, 'documents')])
def test_an_edited_input_recomputes_the_cell_as_a_fresh_run(computed, tmp_path, edit, changed, caplog):
    collection, out = tmp_path / 'small', tmp_path / 'out'
    shutil.copytree(computed / 'small', collection)
    shutil.copytree(computed / 'out', out)
    edit(collection)
    settings = {**SETTINGS, 'dimes': ['prf', 'llm'], 'cache_dir': computed / 'cache'}
    with caplog.at_level(logging.WARNING, logger='pyterrier_rdime'):
        rerun = run_grid([str(collection)], ['minilm'], out, **settings)
    assert [c.status for c in rerun.cells] == ['done']
    warning = [r.getMessage() for r in caplog.records if 'recomputing' in r.getMessage()]
    assert len(warning) == 1 and f'{changed} changed since it was computed' in warning[0]
    fresh = run_grid([str(collection)], ['minilm'], tmp_path / 'fresh', **settings)
    assert [c.status for c in fresh.cells] == ['done']
    pd.testing.assert_frame_equal(_numbers(out), _numbers(tmp_path / 'fresh'))


def test_an_edited_first_stage_file_recomputes_the_cell(computed, tmp_path, caplog):
    run_file = tmp_path / 'first.run'
    shutil.copy(computed / 'small' / 'bm25.run', run_file)
    settings = {**SETTINGS, 'first_stage': str(run_file), 'cache_dir': computed / 'cache'}

    def statuses():
        return [c.status for c in run_grid([str(computed / 'small')], ['minilm'], tmp_path / 'out', **settings).cells]
    assert statuses() == ['done'] and statuses() == ['skipped']
    _cut_run(run_file)
    with caplog.at_level(logging.WARNING, logger='pyterrier_rdime'):
        assert statuses() == ['done']
    assert any('first-stage file changed' in r.getMessage() for r in caplog.records)


def test_other_code_recomputes_the_cell(computed, tmp_path, monkeypatch, caplog):
    out = tmp_path / 'out'
    shutil.copytree(computed / 'out', out)
    settings = {**SETTINGS, 'dimes': ['prf', 'llm'], 'cache_dir': computed / 'cache'}
    assert [c.status for c in run_grid([str(computed / 'small')], ['minilm'], out, **settings).cells] == ['skipped']
    monkeypatch.setattr(grid_module, 'code_digest', lambda: 'another version')
    with caplog.at_level(logging.WARNING, logger='pyterrier_rdime'):
        assert [c.status for c in run_grid([str(computed / 'small')], ['minilm'], out, **settings).cells] == ['done']
    assert any('code changed since it was computed' in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize('damage', ['[]', 'null', '{"finished": true}', '{"key": 1, "finished": true}', 'results'])
def test_a_damaged_record_is_recomputed_with_a_warning(computed, tmp_path, damage, caplog):
    out = tmp_path / 'out'
    shutil.copytree(computed / 'out', out)
    folder = next(out.rglob(CELL_FILE)).parent
    if damage == 'results':
        text = (folder / 'results.json').read_text()
        (folder / 'results.json').write_text(text[:len(text) // 2])
    else:
        (folder / CELL_FILE).write_text(damage)
    settings = {**SETTINGS, 'dimes': ['prf', 'llm'], 'cache_dir': computed / 'cache'}
    with caplog.at_level(logging.WARNING, logger='pyterrier_rdime'):
        result = run_grid([str(computed / 'small')], ['minilm'], out, **settings)
    assert [c.status for c in result.cells] == ['done']
    assert any('recomputing' in r.getMessage() for r in caplog.records)
    pd.testing.assert_frame_equal(_numbers(out), _numbers(computed / 'out'))


def test_same_named_collections_keep_distinct_labels_in_every_output(computed, tmp_path):
    first = tmp_path / 'p1' / 'small'
    second = tmp_path / 'p2' / 'small'
    for folder in (first, second):
        shutil.copytree(computed / 'small', folder)
    _edit_qrels(second)
    result = run_grid([str(first), str(second)], ['minilm'], tmp_path / 'out', cache_dir=computed / 'cache',
                      **SETTINGS)
    assert [c.collection_label for c in result.cells] == ['p1/small', 'p2/small']
    assert len({c.folder for c in result.cells}) == 2
    table = pd.read_csv(tmp_path / 'out' / 'grid.csv')
    assert set(table['collection']) == {'p1/small', 'p2/small'}
    baseline = table[table['system'] == 'Baseline'].set_index(['collection', 'measure'])['value']
    assert baseline['p1/small', 'nDCG@10'] != baseline['p2/small', 'nDCG@10']  # each its own numbers
    markdown = (tmp_path / 'out' / 'grid.md').read_text()
    assert '| p1/small' in markdown and '| p2/small' in markdown
    tex = (tmp_path / 'out' / 'grid.tex').read_text()
    assert 'p1/small' in tex and 'p2/small' in tex


def test_distinct_labels_are_the_shortest_distinct_suffixes():
    assert distinct_labels(['/a/p1/cranfield', '/a/p2/cranfield', '/b/cisi', 'vaswani']) == \
        ['p1/cranfield', 'p2/cranfield', 'cisi', 'vaswani']
    assert distinct_labels(['/x/a/c/d', '/y/b/c/d']) == ['a/c/d', 'b/c/d']


def test_duplicated_collections_and_encoders_run_once(computed, tmp_path, caplog):
    small = str(computed / 'small')
    copy = tmp_path / 'copy'
    shutil.copytree(small, copy)
    with caplog.at_level(logging.WARNING, logger='pyterrier_rdime'):
        cells = plan([small, small, str(copy)], ['minilm', 'MiniLM'], tmp_path / 'out', **SETTINGS)
    assert [(c.collection.name, c.encoder) for c in cells] == [(small, 'minilm')]
    messages = ' '.join(r.getMessage() for r in caplog.records)
    assert f'collection {copy} is the same as {small}' in messages and '--encoder MiniLM is the same as minilm' \
        in messages


@pytest.mark.parametrize('kept', ['config.json', 'tokenizer.json'])
def test_an_incomplete_model_folder_is_refused_before_any_cell(computed, tmp_path, monkeypatch, capsys, kept):
    model = tmp_path / 'model'
    model.mkdir()
    (model / kept).write_text('{}')

    def never(collection, **kwargs):
        raise AssertionError('a cell ran')
    monkeypatch.setattr(grid_module, 'run_experiment', never)
    code = main([str(computed / 'small'), '--encoder', f'minilm,{model}', '--out', str(tmp_path / 'out'),
                 '--cache', str(computed / 'cache'), '--quiet'])
    err = capsys.readouterr().err
    assert code == 2 and str(model) in err and 'lacks' in err and 'weights' in err


def test_a_figure_that_fails_makes_the_grid_exit_non_zero_naming_cell_and_file(computed, tmp_path, monkeypatch,
                                                                              capsys):
    def broken(self, path):
        raise ValueError('drawing failed')
    monkeypatch.setattr(ExperimentResult, 'sweep_plot', broken)
    argv = [str(computed / 'small'), str(computed / 'small'), '--encoder', 'minilm', '--dimes', 'prf', '--ks', '0.5',
            '--depth', '5', '--max-queries', '3', '--no-sweep', '--quiet', '--cache', str(computed / 'cache'),
            '--out', str(tmp_path)]
    for _ in range(2):  # computed, then read back: the missing figure is reported each time
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert 'small × minilm' in err and 'sweep.png: ValueError: drawing failed' in err


@pytest.mark.parametrize('kept', [[0.9, 0.9, 0.9, 0.9, 0.1], [0.5, 0.5, 0.5], [0.42]])
def test_the_sweep_plot_draws_skewed_constant_and_single_query_spreads(tmp_path, kept):
    kept = np.asarray(kept)
    low, high = np.percentile(kept, SPREAD)
    curves = pd.DataFrame({'dime': 'prf', 'fraction': [0.4, 0.8], 'measure': 'nDCG@10', 'value': [0.4, 0.5]})
    points = pd.DataFrame([{'dime': 'prf', 'measure': 'nDCG@10', 'system': 'RDIME', 'kept': kept.mean(), 'low': low,
                            'high': high, 'value': 0.45}])
    sweep_plot(curves, points, pd.Series({'nDCG@10': 0.44}), {'prf': 'PRF'}, 'test', tmp_path / 'sweep.png')
    assert (tmp_path / 'sweep.png').stat().st_size > 0


def test_files_derived_beside_an_index_leave_the_cell_the_same_its_vectors_do_not(computed, tmp_path):
    index = tmp_path / 'index.flex'
    index.mkdir()
    (index / 'vecs.f4').write_bytes(np.arange(8, dtype=np.float32).tobytes())
    (index / 'pt_meta.json').write_text('{}')

    def key():
        return plan([str(computed / 'small')], ['minilm'], tmp_path / 'out', index=str(index), **SETTINGS)[0].key
    first = key()
    for name in ('rdime.dim_major.i8.npy', 'rdime.dim_major.i8.json', '.rdime.dim_major.npy.lock'):
        (index / name).write_bytes(b'written by the first search')
    assert key() == first
    (index / 'vecs.f4').write_bytes(np.arange(1, 9, dtype=np.float32).tobytes())
    assert key() != first
