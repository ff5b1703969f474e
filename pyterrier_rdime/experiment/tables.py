"""The grid's combined outputs from its finished cells: grid.csv, grid_parity.csv, grid.md, grid.tex and the
kept-fraction Figure."""
from pathlib import Path
from typing import List, Sequence

import numpy as np
import pandas as pd

from . import figures
from .parity import BEST_IS_BASELINE, SAME_BUDGET
from .report import ALL_MARKS, CONTROLS_NOTE, DELTA, best_text, delta, marked_verdict, outcome, write_outputs

GRID_COLUMNS = ['collection', 'encoder', 'dime', 'threshold', 'system', 'measure', 'value', 'kept', 'k']
BEST = 'best Top-k (tuned on test)'
TEX_TESTS = {'t': 'paired $t$-test', 'wilcoxon': 'Wilcoxon signed-rank test',
             'auto': 'paired $t$-test, or Wilcoxon signed-rank test where Shapiro--Wilk rejects normality'}
TEX_MARKS = {'†': r'\dagger', '‡': r'\ddagger', '§': r'\S', '¶': r'\P'}


def _names(cell) -> tuple:
    """The cell's collection and encoder labels, distinct within the grid (:func:`.grid.distinct_labels`)."""
    return cell.collection_label, cell.encoder_label


def long_table(cells: Sequence) -> pd.DataFrame:
    """Every finished cell's systems, one row per (collection, encoder, system, measure): ``value``, ``kept`` and
    ``k`` (the fraction of the best and CV Top-k rows)."""
    frames = []
    for cell in cells:
        result = cell.result
        collection, encoder = _names(cell)
        kept = result.kept.groupby(['dime', 'threshold'])['kept_frac'].mean()
        table = result.table.assign(collection=collection, encoder=encoder, k=np.nan)
        table['kept'] = [kept.get((d, t), 1.0 if t == 'Baseline' else np.nan)
                         for d, t in zip(table['dime'], table['threshold'])]
        cv = table['threshold'] == 'CV Top-k'
        table.loc[cv, 'k'] = [result.mean_cv_fraction(d, m) for d, m in zip(table.loc[cv, 'dime'],
                                                                            table.loc[cv, 'measure'])]
        best = [{'dime': dime, 'threshold': BEST, 'system': f'{dime}/{BEST}', 'measure': measure, 'value': hit[1],
                 'k': float(hit[0].split('=')[1])}
                for measure in result.measures for dime in result.labels
                if (hit := result.test_best(measure, dime)) is not None]
        frames += [table, pd.DataFrame(best, columns=GRID_COLUMNS).assign(collection=collection, encoder=encoder)]
    return pd.concat(frames, ignore_index=True)[GRID_COLUMNS]


def parity_table(cells: Sequence) -> pd.DataFrame:
    """Every finished cell's comparisons (significance.csv), with its collection and encoder."""
    return pd.concat([c.result.significance.assign(collection=_names(c)[0], encoder=_names(c)[1]) for c in cells],
                     ignore_index=True)


def markdown(cells: Sequence) -> str:
    """grid.md: per measure, one row per (collection, encoder, DIME): Baseline, best and CV Top-k, RDIME, Δ%, and
    the verdicts."""
    lines = ['# RDIME vs Top-k: the grid', '']
    controls = control_rows(cells)
    if len(controls):
        lines += ['Does the choice of dimensions matter? RDIME against each control at the same budget, in how many '
                  '(cell, measure) pairs it is better, equivalent, worse or inconclusive:', '',
                  control_summary(controls).to_markdown(index=False), '']
    for measure in dict.fromkeys(m for c in cells for m in c.result.measures):
        rows = []
        for cell in cells:
            result = cell.result
            if measure not in result.measures:
                continue
            values = result.table[result.table['measure'] == measure].set_index('system')['value']
            sig = result.significance[result.significance['measure'] == measure]
            for dime, label in result.labels.items():
                if f'{dime}/RDIME' not in values:
                    continue
                mine = sig[sig['system'] == f'{dime}/RDIME']
                verdicts = pd.Series([marked_verdict(r.verdict, r.significant, r.comparison) for r in
                                      mine.itertuples()], index=mine['comparison'], dtype=object)
                best = result.test_best(measure, dime)
                cv = values.get(f'{dime}/CV Top-k', np.nan)
                rows.append({
                    'collection': _names(cell)[0], 'encoder': _names(cell)[1], 'DIME': label,
                    'Baseline': f'{values["Baseline"]:.4f}',
                    'best Top-k, tuned on test (k)': best_text(best),
                    'CV Top-k (mean k)': f'{cv:.4f} ({result.mean_cv_fraction(dime, measure):.2f})'
                    if np.isfinite(cv) else 'n/a',
                    'RDIME (kept)': f'{values[f"{dime}/RDIME"]:.4f} ({result.mean_kept(dime, "RDIME"):.2f})',
                    DELTA: delta(values[f'{dime}/RDIME'], cv),
                    **{f'vs {short}': _verdict(verdicts, prefix) for short, prefix in
                       (('CV', 'CV Top-k'), ('test-best', 'best Top-k'), ('Baseline', 'Baseline'))}})
        lines += [f'## {measure}', '', pd.DataFrame(rows).to_markdown(index=False, disable_numparse=True), '']
        mine = controls[controls['measure'] == measure] if len(controls) else controls
        if len(mine):
            lines += [f'### {measure}: RDIME against the controls at the same budget, and vector PRF', '',
                      control_grid(mine).to_markdown(index=False, disable_numparse=True), '', CONTROLS_NOTE, '']
    shown = '\n'.join(line for line in lines if line.startswith('| '))
    lines += ['Verdicts of RDIME against CV Top-k, the best Top-k tuned on the test queries, and Baseline. '
              + cells[0].result.footnote(marks=''.join(m for m in ALL_MARKS if m != '*' and m in shown)), '']
    lines += [f'- {c.collection.name} × {c.encoder}: {c.result.settings["num_queries"]} queries, first stage '
              f'{c.result.settings["first_stage"]}' for c in cells]
    return '\n'.join(lines) + '\n'


def control_rows(cells: Sequence) -> pd.DataFrame:
    """Every finished cell's control comparisons: ``collection, encoder, dime, label, system, measure, control,
    value, kept, control_mean, control_value, outcome`` (value and kept: RDIME's)."""
    rows = []
    for cell in cells:
        result = cell.result
        sig = result.significance
        if 'family' not in sig:
            continue
        for r in sig[sig['family'] == 'controls'].itertuples():
            values = result.table[result.table['measure'] == r.measure].set_index('system')['value']
            rows.append({'collection': _names(cell)[0], 'encoder': _names(cell)[1], 'dime': r.dime,
                         'label': result.labels.get(r.dime, r.dime), 'system': r.system.split('/')[-1],
                         'measure': r.measure, 'control': r.comparison.removesuffix(SAME_BUDGET),
                         'value': values[r.system], 'kept': result.mean_kept(*r.system.split('/')),
                         'control_mean': values[r.other],
                         'control_value': result.control_value(r.other, r.measure),
                         'outcome': outcome(r.verdict, r.mean_diff)})
    return pd.DataFrame(rows)


def control_grid(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (collection, encoder, DIME, RDIME column): RDIME (kept), then each control's value and outcome."""
    table = []
    for key, group in rows.groupby(['collection', 'encoder', 'label', 'system'], sort=False):
        first = group.iloc[0]
        row = {'collection': key[0], 'encoder': key[1], 'DIME': key[2],
               key[3] if key[3] != 'RDIME' else 'RDIME (kept)': f'{first["value"]:.4f} ({first["kept"]:.2f})'}
        row.update({r.control: f'{r.control_value} {r.outcome}' for r in group.itertuples()})
        table.append(row)
    return pd.DataFrame(table).fillna('n/a')


def control_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per DIME and control, in how many (cell, measure) pairs RDIME is better, equivalent, worse or inconclusive."""
    rows = rows[rows['system'] == 'RDIME']
    table = []
    for (label, control), mine in rows.groupby(['label', 'control'], sort=False):
        tally = mine['outcome'].value_counts()
        table.append({'DIME': label, 'control': control, **{o: int(tally.get(o, 0)) for o in
                                                             ('better', 'equivalent', 'worse', 'inconclusive')},
                      'pairs': len(mine)})
    return pd.DataFrame(table)


def _verdict(verdicts: pd.Series, prefix: str) -> str:
    """The verdict of the comparison whose label starts with ``prefix``."""
    hit = verdicts[verdicts.index.str.startswith(prefix)]
    if hit.empty and prefix == 'best Top-k' and BEST_IS_BASELINE in verdicts.index:
        return f'{verdicts[BEST_IS_BASELINE]} (= Baseline)'
    return hit.iloc[0] if len(hit) else 'n/a'


def latex(cells: Sequence) -> str:
    """grid.tex: the paper's Table layout, one ``table*`` per measure: rows encoder × DIME (and Baseline), a column
    group per collection (Top-k columns, CV Top-k, RDIME, :data:`~.report.DELTA`); a group's best values bold."""
    collections = list(dict.fromkeys(_names(c)[0] for c in cells))
    encoders = list(dict.fromkeys(_names(c)[1] for c in cells))
    by_name = {_names(c): c.result for c in cells}
    ks = list(dict.fromkeys(t for r in by_name.values() for t in r.table['threshold'] if t.startswith('k=')))
    width = len(ks) + 3
    labels = {d: label for r in by_name.values() for d, label in r.labels.items()}
    first = next(iter(by_name.values()))
    out = []
    for measure in dict.fromkeys(m for r in by_name.values() for m in r.measures):
        marks = set()
        out += [r'\begin{table*}[ht]', r'\centering', r'\resizebox{\textwidth}{!}{%',
                r'\begin{tabular}{ll' + 'c' * width * len(collections) + '}', r'\toprule',
                r'\multirow{2}{*}{Model} & \multirow{2}{*}{DIME} & '
                + ' & '.join(rf'\multicolumn{{{width}}}{{c}}{{{_tex(c)}}}' for c in collections) + r' \\',
                ' '.join(rf'\cmidrule(lr){{{3 + i * width}-{2 + (i + 1) * width}}}' for i in range(len(collections))),
                ' & & ' + ' & '.join([*(k[2:] for k in ks), 'CV', 'RDIME', r'$\Delta$ (\%)'] * len(collections))
                + r' \\', r'\midrule']
        for e, encoder in enumerate(encoders):
            dimes = [d for d in labels if any(f'{d}/RDIME' in set(r.table['system'])
                                              for (_, enc), r in by_name.items() if enc == encoder)]
            out.append(rf'\multirow{{{len(dimes) + 1}}}{{*}}{{{_tex(encoder)}}}')
            for dime in dimes:
                cells_tex = [_tex_group(by_name.get((c, encoder)), measure, dime, ks, marks) for c in collections]
                out.append(f' & {_tex(labels[dime])} & ' + ' & '.join(cells_tex) + r' \\')
            cells_tex = [_tex_baseline(by_name.get((c, encoder)), measure, ks) for c in collections]
            out.append(' & Baseline & ' + ' & '.join(cells_tex) + r' \\')
            out.append(r'\midrule' if e < len(encoders) - 1 else r'\bottomrule')
        meanings = {'¶': 'CV Top-$k$', '†': 'the best Top-$k$ tuned on the test queries', '‡': 'Baseline'}
        shown = [f'$^{{{TEX_MARKS[m]}}}$ {meaning}' for m, meaning in meanings.items() if m in marks]
        test = f'{TEX_TESTS[first.settings.get("test", "t")]}, {first.settings.get("alternative", "two-sided")}'
        margin = first.settings.get('margin')
        equivalent = (rf' A marked value can also be equivalent (TOST within $\pm{100 * margin:g}$\,\% of the '
                      'Baseline): a small, consistent difference; grid.md gives each verdict with its mark.'
                      if margin else '')
        significance = (f' RDIME significantly different from {", ".join(shown)} ({test}, Holm-corrected per '
                        r'measure, $\alpha = 0.05$).' + equivalent) if shown else ''
        out += [r'\end{tabular}}', rf'\caption{{{_tex(measure)} of RDIME and Top-$k$ pruning per encoder, DIME and '
                r'collection. CV: Top-$k$ with $k$ chosen by cross-validation over the queries; $\Delta$ (\%): RDIME '
                r'over CV Top-$k$; (kept): mean fraction of dimensions RDIME kept; \textbf{bold}: best of the row in '
                r'the collection (ties alike).' + significance + '}', r'\end{table*}', '']
    return '\n'.join(out + _latex_controls(cells))


#: How a control's cell in grid.tex shows RDIME's outcome against it.
TEX_OUTCOMES = {'better': r'$^{\uparrow}$', 'worse': r'$^{\downarrow}$', 'equivalent': r'$^{\approx}$',
                'inconclusive': ''}


def _latex_controls(cells: Sequence) -> List[str]:
    """grid.tex's controls tables, one ``table*`` per measure: RDIME and each control's value, marked with the
    outcome."""
    rows = control_rows(cells)
    if rows.empty:
        return []
    rows = rows[rows['system'] == 'RDIME']
    collections = list(dict.fromkeys(rows['collection']))
    controls = list(dict.fromkeys(rows['control']))
    width = len(controls) + 1
    out = []
    for measure in dict.fromkeys(m for c in cells for m in c.result.measures):  # the paper tables' order
        mine = rows[rows['measure'] == measure]
        if mine.empty:
            continue
        out += [r'\begin{table*}[ht]', r'\centering', r'\resizebox{\textwidth}{!}{%',
                r'\begin{tabular}{ll' + 'c' * width * len(collections) + '}', r'\toprule',
                r'\multirow{2}{*}{Model} & \multirow{2}{*}{DIME} & '
                + ' & '.join(rf'\multicolumn{{{width}}}{{c}}{{{_tex(c)}}}' for c in collections) + r' \\',
                ' '.join(rf'\cmidrule(lr){{{3 + i * width}-{2 + (i + 1) * width}}}' for i in range(len(collections))),
                ' & & ' + ' & '.join(['RDIME', *map(_tex, controls)] * len(collections)) + r' \\', r'\midrule']
        encoders = list(dict.fromkeys(mine['encoder']))
        for e, encoder in enumerate(encoders):
            labels = list(dict.fromkeys(mine.loc[mine['encoder'] == encoder, 'label']))
            out.append(rf'\multirow{{{len(labels)}}}{{*}}{{{_tex(encoder)}}}')
            for label in labels:
                groups = []
                for collection in collections:
                    hit = mine[(mine['encoder'] == encoder) & (mine['label'] == label)
                               & (mine['collection'] == collection)].set_index('control')
                    if hit.empty:
                        groups.append(' & '.join(['--'] * width))
                        continue
                    first = hit.iloc[0]
                    shown = [f'{first["value"]:.3f} ({first["kept"]:.2f})']
                    shown += [f'{hit.loc[c, "control_mean"]:.3f}{TEX_OUTCOMES[hit.loc[c, "outcome"]]}'
                              if c in hit.index else '--' for c in controls]
                    groups.append(' & '.join(shown))
                out.append(f' & {_tex(label)} & ' + ' & '.join(groups) + r' \\')
            out.append(r'\midrule' if e < len(encoders) - 1 else r'\bottomrule')
        out += [r'\end{tabular}}', rf'\caption{{{_tex(measure)} of RDIME (mean kept fraction) against the same number '
                r'of dimensions per query chosen at random (mean over seeds), by the query alone (magnitude), by the '
                r"collection's variance, and against pyterrier-dr's vector PRF. RDIME $^{\uparrow}$ better, "
                r'$^{\downarrow}$ worse (the test rejects equality; Holm over the controls of a measure), '
                r'$^{\approx}$ equivalent (TOST within the margin).}', r'\end{table*}', '']
    return out


def _tex_group(result, measure: str, dime: str, ks: List[str], marks: set) -> str:
    """One collection's group of a DIME's row in grid.tex; adds the significance marks it prints to ``marks``."""
    if result is None or f'{dime}/RDIME' not in set(result.table['system']):
        return ' & '.join(['--'] * (len(ks) + 3))
    values = result.table[result.table['measure'] == measure].set_index('system')['value']
    mine = {k: values.get(f'{dime}/{k}', np.nan) for k in ks + ['CV Top-k', 'RDIME']}
    printed = {k: f'{v:.3f}' for k, v in mine.items() if np.isfinite(v)}
    best = max(printed.values(), key=float, default=None)  # ties as printed: every value that prints as the best
    rdime_marks = [m for m in result.marks(measure, dime, 'RDIME') if m in TEX_MARKS]
    marks.update(rdime_marks)
    shown = []
    for k in mine:
        text = '--' if k not in printed else (rf'\textbf{{{printed[k]}}}' if printed[k] == best else printed[k])
        if k == 'RDIME':
            text += (f'$^{{{"".join(TEX_MARKS[m] for m in rdime_marks)}}}$' if rdime_marks else '') + \
                f' ({result.mean_kept(dime, "RDIME"):.2f})'
        shown.append(text)
    return ' & '.join(shown + [delta(mine['RDIME'], mine['CV Top-k']).replace('n/a', '--')])


def _tex_baseline(result, measure: str, ks: List[str]) -> str:
    if result is None:
        return ' & '.join(['--'] * (len(ks) + 3))
    value = result.table.loc[(result.table['system'] == 'Baseline') & (result.table['measure'] == measure), 'value']
    return ' & '.join(['--'] * (len(ks) + 1) + [f'{value.iloc[0]:.3f} (1.00)', ''])


def _tex(text: str) -> str:
    for char, escaped in (('\\', r'\textbackslash{}'), ('&', r'\&'), ('%', r'\%'), ('_', r'\_'), ('#', r'\#'),
                          ('τ', r'$\tau$'), ('−', '--'), ('⊙', r'$\odot$')):
        text = text.replace(char, escaped)
    return text


def write_combined(cells: Sequence, out: Path) -> List[str]:
    """Writes the combined outputs into ``out``; returns the problems met (an output that could not be written)."""
    writers = [
        ('grid.csv', lambda p: long_table(cells).to_csv(p, index=False)),
        ('grid_parity.csv', lambda p: parity_table(cells).to_csv(p, index=False)),
        ('grid.md', lambda p: p.write_text(markdown(cells), encoding='utf-8')),
        ('grid.tex', lambda p: p.write_text(latex(cells), encoding='utf-8')),
        ('kept_fractions.png', lambda p: figures.grid_kept_figure(
            [(*_names(c), c.result.kept, c.result.labels) for c in cells], [p, p.with_suffix('.pdf')])),
    ]
    return write_outputs(out, writers)
