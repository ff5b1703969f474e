"""The grid: the Top-k sweep against the Top-k stages it stands for, a resumable run over two real collections on tiny
subsets (a failing cell loses no other, a re-run recomputes only what is not finished), and the combined tables."""
import dataclasses
import json
import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from conftest import shared_collection

import pyterrier_rdime as rdime
from pyterrier_rdime.experiment import grid as grid_module
from pyterrier_rdime.experiment.cli import main
from pyterrier_rdime.experiment.grid import CELL_FILE, plan, run_grid
from pyterrier_rdime.experiment.parity import BEST_IS_BASELINE, topk_runs
from pyterrier_rdime.experiment.report import ALL_MARKS, DELTA, grid_kept_figure, latex, markdown, sweep_plot
from pyterrier_rdime.experiment.runner import run_experiment

SETTINGS = dict(dimes=['prf', 'swc'], ks=[0.5], depth=5, max_queries=3, first_stage='bm25', verbose=False)


def test_sweep_scores_are_those_of_the_topk_stages():
    rng = np.random.default_rng(0)
    rows = [{'qid': q, 'docno': f'{q}-d{i}', 'query_vec': qv, 'query_dime': u, 'doc_vec': rng.normal(size=12)
             .astype(np.float32)}
            for q in ('1', '2', '3')
            for qv, u in [(rng.normal(size=12).astype(np.float32), rng.normal(size=12))] for i in range(4)]
    frame = pd.DataFrame(rows)
    frame.loc[frame['qid'] == '3', 'query_dime'] = pd.Series([np.ones(12)] * 4, index=frame.index[-4:])  # all ties
    runs = topk_runs(frame, [0.1, 0.5, 1.0])
    for fraction, run in runs.items():
        expected = (rdime.TopK(fraction=fraction) >> rdime.VectorScorer())(frame)
        merged = run.merge(expected[['qid', 'docno', 'score']], on=['qid', 'docno'], suffixes=('', '_stage'))
        assert len(merged) == len(frame)
        np.testing.assert_array_equal(merged['score'].to_numpy(), merged['score_stage'].to_numpy())


@pytest.fixture(scope='module')
def collections():
    return [str(shared_collection('cranfield')), str(shared_collection('cisi'))]


@pytest.fixture(scope='module')
def stopped_grid(collections, tmp_path_factory):
    """A grid whose second cell fails late, as a crash between cells would leave it."""
    out, cache = tmp_path_factory.mktemp('grid'), tmp_path_factory.mktemp('cache')
    calls = []

    def crash_on_cisi(collection, **kwargs):
        calls.append(collection.name)
        if collection.name.endswith('cisi'):
            raise RuntimeError('simulated crash')
        return run_experiment(collection, **kwargs)
    result = run_grid(collections, ['minilm'], out, run_cell=crash_on_cisi, cache_dir=cache, **SETTINGS)
    return SimpleNamespace(out=out, cache=cache, result=result, calls=calls)


def test_a_failing_cell_loses_no_other(stopped_grid):
    statuses = {c.collection.name.rsplit('/', 1)[-1]: c.status for c in stopped_grid.result.cells}
    assert statuses == {'cranfield': 'done', 'cisi': 'failed'}
    assert 'simulated crash' in stopped_grid.result.failed[0].error
    out = stopped_grid.out
    assert json.loads((out / 'cranfield' / 'minilm' / CELL_FILE).read_text())['finished']
    assert not (out / 'cisi' / 'minilm' / CELL_FILE).exists()
    for name in ('grid.md', 'grid.csv', 'grid_parity.csv', 'grid.tex', 'kept_fractions.png', 'kept_fractions.pdf'):
        assert (out / name).stat().st_size > 0, name
    combined = pd.read_csv(out / 'grid.csv')
    assert set(combined['collection']) == {'cranfield'}
    assert {'prf/CV Top-k', 'prf/best Top-k (tuned on test)', 'prf/RDIME', 'Baseline'} <= set(combined['system'])


def test_a_rerun_resumes_without_recomputing_finished_cells(stopped_grid, collections):
    finished = stopped_grid.out / 'cranfield' / 'minilm'
    before = {p.name: p.stat().st_mtime_ns for p in finished.iterdir()}
    rows_before = pd.read_csv(stopped_grid.out / 'grid.csv')
    calls = []

    def counting(collection, **kwargs):
        calls.append(collection.name)
        return run_experiment(collection, **kwargs)
    result = run_grid(collections, ['minilm'], stopped_grid.out, run_cell=counting, cache_dir=stopped_grid.cache,
                      **SETTINGS)
    assert [c.status for c in result.cells] == ['skipped', 'done'] and calls == [collections[1]]
    assert {p.name: p.stat().st_mtime_ns for p in finished.iterdir()} == before
    rows_after = pd.read_csv(stopped_grid.out / 'grid.csv')
    assert set(rows_after['collection']) == {'cranfield', 'cisi'}
    # the finished cell, read back, gives the combined rows it gave when it was computed
    pd.testing.assert_frame_equal(rows_after[rows_after['collection'] == 'cranfield'].reset_index(drop=True),
                                  rows_before)



def test_changed_options_make_a_finished_cell_pending_again(stopped_grid, collections):
    finished = stopped_grid.out / 'cranfield' / 'minilm'
    recorded = json.loads((finished / CELL_FILE).read_text())['key']
    same = plan(collections[:1], ['minilm'], stopped_grid.out, cache_dir='/elsewhere', workers=2, **SETTINGS)[0]
    assert same.folder == finished and same.key == recorded  # neutral options keep the key
    for change in ({'margin': 0.1}, {'depth': 6}, {'test': 'auto'}, {'sweep': False}, {'measures': ['AP']}):
        assert plan(collections[:1], ['minilm'], stopped_grid.out, **{**SETTINGS, **change})[0].key != recorded


def test_latex_has_balanced_environments_and_a_row_per_encoder_and_dime(stopped_grid):
    cell = next(c for c in stopped_grid.result.cells if c.result is not None)
    twice = [cell, SimpleNamespace(collection=cell.collection, encoder='other-encoder', result=cell.result,
                                   collection_label=cell.collection_label, encoder_label='other-encoder')]
    tex = latex(twice)
    for environment in ('table*', 'tabular'):
        opened = tex.count(rf'\begin{{{environment}}}')
        assert opened == tex.count(rf'\end{{{environment}}}') == 4  # per measure: the paper's table, the controls'
    first_table = tex.split(r'\end{table*}')[0]
    rows = [line for line in first_table.splitlines() if line.startswith(' & ') and not line.startswith(' & &')]
    labels = [line.split('&')[1].strip() for line in rows]
    assert labels == ['PRF (M=2)', r'SWC (M=10, $\tau$=0.1)', 'Baseline'] * 2
    header = [line for line in first_table.splitlines() if line.startswith(' & &')][0]
    assert header.count('&') == 5  # six columns: Model, DIME, then 0.5, CV, RDIME, Δ of the one collection
    for row in rows:
        assert row.count('&') == header.count('&') and row.endswith(r'\\')
    assert all(re.search(r'\\textbf\{', row) for row in rows if 'Baseline' not in row)


def test_cli_grid_exits_non_zero_naming_the_failed_cells(collections, stopped_grid, tmp_path, monkeypatch, capsys):
    def crash(collection, **kwargs):
        raise RuntimeError('simulated crash')
    monkeypatch.setattr(grid_module, 'run_experiment', crash)
    code = main(collections + ['--encoder', 'minilm', '--dimes', 'prf', '--ks', '0.5', '--depth', '5',
                               '--max-queries', '3', '--first-stage', 'bm25', '--quiet', '--cache',
                               str(stopped_grid.cache), '--out', str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1
    assert 'failed cells' in err and 'cranfield × minilm: RuntimeError: simulated crash' in err


def test_cli_grid_checks_every_cell_before_any_work(collections, tmp_path, monkeypatch, capsys):
    def never(collection, **kwargs):
        raise AssertionError('a cell ran')
    monkeypatch.setattr(grid_module, 'run_experiment', never)
    assert main(collections + ['/no/such/collection', '--out', str(tmp_path / 'out'), '--cache',
                               str(tmp_path / 'cache')]) == 2
    assert '/no/such/collection' in capsys.readouterr().err
    assert main(collections + ['--encoder', 'minilm,/no/such/model', '--out', str(tmp_path / 'out'), '--cache',
                               str(tmp_path / 'cache')]) == 2
    assert '/no/such/model' in capsys.readouterr().err


def _finished(stopped_grid, **changes):
    """The finished cell of the stopped grid, its result with ``changes`` (a dataclasses.replace)."""
    cell = next(c for c in stopped_grid.result.cells if c.result is not None)
    return SimpleNamespace(collection=cell.collection, encoder=cell.encoder, collection_label=cell.collection_label,
                           encoder_label=cell.encoder_label, result=dataclasses.replace(cell.result, **changes))


def _first_table_row(tex: str, label: str) -> str:
    return next(line for line in tex.split(r'\end{table*}')[0].splitlines() if line.startswith(f' & {label}'))


def test_grid_tex_bolds_every_value_that_prints_as_the_best(stopped_grid):
    cell = _finished(stopped_grid)
    table, measure = cell.result.table.copy(), cell.result.measures[0]
    for system, value in {'prf/k=0.5': 0.41231, 'prf/RDIME': 0.41249, 'prf/CV Top-k': 0.3}.items():
        table.loc[(table['system'] == system) & (table['measure'] == measure), 'value'] = value
    row = _first_table_row(latex([_finished(stopped_grid, table=table)]), 'PRF')
    assert row.count(r'\textbf{0.412}') == 2 and r'\textbf{0.300}' not in row  # equal as printed: both bold


def test_delta_is_rdime_against_cv_topk_in_every_output(stopped_grid):
    cell = _finished(stopped_grid)
    result, measure = cell.result, cell.result.measures[0]
    values = result.table[result.table['measure'] == measure].set_index('system')['value']
    expected = f'{100 * (values["prf/RDIME"] - values["prf/CV Top-k"]) / values["prf/CV Top-k"]:+.2f}'
    md, report, tex = markdown([cell]), result.to_markdown(), latex([cell])
    for text in (md, report):
        lines = text.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith('| ') and DELTA in line)
        header = lines[start]
        row = next(line for line in lines[start:] if line.startswith('| ') and 'PRF' in line)
        column = [c.strip() for c in header.split('|')].index(DELTA)
        assert [c.strip() for c in row.split('|')][column] == expected
    assert _first_table_row(tex, 'PRF').rstrip(' \\').endswith(f'& {expected}')
    assert r'$\Delta$ (\%): RDIME over CV Top-$k$' in tex and 'best Top-$k$ column' not in tex


def test_a_significant_but_equivalent_comparison_is_labelled_alike_and_footnoted_everywhere(stopped_grid):
    sig = _finished(stopped_grid).result.significance.copy()
    measure = _finished(stopped_grid).result.measures[0]  # the first table of every output
    cv = (sig['system'] == 'prf/RDIME') & (sig['comparison'] == 'CV Top-k') & (sig['measure'] == measure)
    sig.loc[cv, ['p_holm', 'significant', 'tost_p_holm', 'verdict']] = [0.029, True, 0.001, 'equivalent']
    cell = _finished(stopped_grid, significance=sig)
    md, report, tex = markdown([cell]), cell.result.to_markdown(), latex([cell])
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('| ') and 'vs CV' in line)
    header = lines[start]
    row = next(line for line in lines[start:] if line.startswith('| ') and 'PRF' in line)
    column = [c.strip() for c in header.split('|')].index('vs CV')
    assert [c.strip() for c in row.split('|')][column] == 'equivalent ¶'  # grid.md: the verdict and its mark
    parity = next(line for line in report.splitlines() if line.startswith('| PRF') and '| CV Top-k ' in line)
    assert parity.rstrip(' |').endswith('equivalent ¶')  # results.md's parity table, the same label
    paper = next(line for line in report.splitlines() if line.startswith('| PRF') and 'k=' not in line[:6])
    assert '¶ (' in paper  # and the mark beside RDIME's value, as before
    for text in (md, report):
        assert '`¶` CV Top-k' in text and '"equivalent ¶"' in text  # each footnote explains the mark and the pair
    assert r'$^{\P}$ CV Top-$k$' in tex and 'A marked value can also be equivalent' in tex


def test_footnotes_explain_only_the_marks_their_tables_hold(stopped_grid):
    result = _finished(stopped_grid).result
    md = markdown([_finished(stopped_grid)])
    md_tables = '\n'.join(line for line in md.splitlines() if line.startswith('| '))
    for mark in ALL_MARKS:  # grid.md's verdicts carry the marks of significant comparisons
        assert (f'`{mark}`' in md) == (mark != '*' and mark in md_tables), mark
    report = result.to_markdown()
    tables = '\n'.join(line for line in report.splitlines() if line.startswith('| '))
    footnote = next(line for line in report.splitlines() if 'kept) = mean fraction' in line)
    for mark in ALL_MARKS:
        assert (f'`{mark}`' in footnote) == (mark in tables), mark
    assert '`*`' in footnote  # a row always has a best Top-k column


def test_a_test_best_topk_of_one_shows_as_baseline(stopped_grid):
    sig = _finished(stopped_grid).result.significance.copy()
    best = sig['comparison'].str.startswith('best Top-k')
    sig = sig[~(best & (sig['dime'] == 'swc'))]  # SWC keeps its own best Top-k
    prf = best & (sig['dime'] == 'prf')
    sig.loc[prf[prf].index, ['comparison', 'other']] = [BEST_IS_BASELINE, 'Baseline']
    sig = sig[~((sig['dime'] == 'prf') & (sig['comparison'] == 'Baseline'))]
    cell = _finished(stopped_grid, significance=sig)
    measure = cell.result.measures[0]
    baseline = cell.result.table.set_index(['system', 'measure'])['value']['Baseline', measure]
    assert cell.result.test_best(measure, 'prf') == ('prf/k=1.0', pytest.approx(baseline))
    row = next(line for line in markdown([cell]).splitlines() if line.startswith('| ') and 'PRF' in line
               and 'Baseline' in line)
    assert f'{baseline:.4f} (k=1.0 = Baseline)' in row and '(= Baseline)' in row


def test_the_kept_fraction_figure_wraps_its_panels_and_names_median_and_each_topk(tmp_path):
    rng = np.random.default_rng(0)
    kept = pd.DataFrame([{'dime': 'prf', 'threshold': t, 'qid': str(q),
                          'kept_frac': rng.uniform(0.3, 0.9) if t == 'RDIME' else float(t[2:])}
                         for t in ('RDIME', 'k=0.4', 'k=0.6', 'k=0.8') for q in range(10)])
    cells = [(c, e, kept, {'prf': 'PRF'}) for e in ('minilm', 'mpnet') for c in ('a', 'b', 'c')]
    fig = grid_kept_figure(cells, [tmp_path / 'k.png'])
    height, width = plt_image_shape(tmp_path / 'k.png')
    assert width / height < 2  # 2 rows of 3 panels, not a 1 x 6 strip
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ['median', 'mean', 'Top-k k=0.4', 'Top-k k=0.6',
                                                          'Top-k k=0.8']
    styles = [str(h.get_linestyle()) for h in legend.legend_handles[2:]]
    assert len(set(styles)) == 3  # each Top-k its own line style


def _renderer(fig):
    """The figure's renderer, on an Agg canvas (a bare Figure has none)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    return (fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)).get_renderer()


def _inside(fig, artist):
    """Whether ``artist`` is drawn wholly inside the figure's canvas (nothing clipped at its edges)."""
    box, canvas = artist.get_window_extent(_renderer(fig)), fig.bbox
    return canvas.x0 <= box.x0 and box.x1 <= canvas.x1 and canvas.y0 <= box.y0 and box.y1 <= canvas.y1


def test_a_one_cell_figure_shows_its_whole_legend(tmp_path):
    # one panel is 3.4 inches wide: the five entries wrap into rows instead of running off both edges
    kept = pd.DataFrame([{'dime': d, 'threshold': t, 'qid': str(q), 'kept_frac': 0.5 if t == 'RDIME' else float(t[2:])}
                         for d in ('prf', 'swc') for t in ('RDIME', 'k=0.4', 'k=0.6', 'k=0.8') for q in range(5)])
    fig = grid_kept_figure([('vaswani', 'minilm', kept, {'prf': 'PRF (M=2)', 'swc': 'SWC (M=10, τ=0.1)'})],
                           [tmp_path / 'k.png'])
    legend = fig.legends[0]
    assert len(legend.get_texts()) == 5 and _inside(fig, legend)
    panel = fig.axes[0].get_window_extent(_renderer(fig))
    assert legend.get_window_extent(_renderer(fig)).y1 < panel.y0  # below the panel, not over it


def test_the_sweep_legend_stands_clear_of_the_last_panel(tmp_path):
    labels = {'prf': 'PRF (M=2)', 'swc': 'SWC (M=10, τ=0.1)', 'llm': 'LLM'}
    curves = pd.DataFrame([{'dime': d, 'fraction': f, 'measure': m, 'value': 0.5}
                           for d in [*labels, 'random'] for f in (0.5, 1.0) for m in ('nDCG@10', 'AP')])
    points = pd.DataFrame([{'dime': d, 'measure': m, 'system': s, 'kept': .5, 'low': .4, 'high': .6, 'value': .5}
                           for d in labels for m in ('nDCG@10', 'AP') for s in ('RDIME', 'CV Top-k')])
    fig = sweep_plot(curves, points, pd.Series({'nDCG@10': 0.4, 'AP': 0.3}), labels, 'title', tmp_path / 's.png')
    renderer = _renderer(fig)
    legend, last = fig.legends[0], fig.axes[-1]
    right = max(last.get_tightbbox(renderer).x1, last.get_window_extent(renderer).x1)
    assert _inside(fig, legend) and legend.get_window_extent(renderer).x0 - right >= 0.1 * fig.dpi


def plt_image_shape(path):
    from matplotlib.image import imread
    return imread(path).shape[:2]
