"""The outputs of a cell and of the grid: what the runner measured laid out as the paper's tables with the honest
comparators (results.md, grid.md, grid.tex), the csv files and the figures (drawn on bare matplotlib Figures: no pyplot
state, so a notebook's backend is left alone)."""
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd

from .parity import ALPHA, BEST_IS_BASELINE, COLUMNS, CV_COLUMNS, SAME_BUDGET, SWEEP_COLUMNS

#: Significance marks of the paper table: comparison label -> mark.
MARKS = {'CV Top-k': '¶', 'best Top-k': '†', 'Baseline': '‡', 'RDIME': '§'}
#: What a mark says RDIME is significantly different from.
MEANINGS = {'¶': 'CV Top-k', '†': 'the best Top-k tuned on the test queries', '‡': 'Baseline',
            '§': '(soft RDIME) RDIME'}
#: Every mark a table can carry: ``*`` the best Top-k column of a row, then :data:`MARKS`.
ALL_MARKS = '*' + ''.join(MARKS.values())
#: Δ%: RDIME's relative difference from the cross-validated Top-k (the honest comparator).
DELTA = 'Δ% vs CV Top-k'
TEST_NAMES = {'t': 'paired t-test', 'wilcoxon': 'Wilcoxon signed-rank test',
              'auto': 'per comparison: Shapiro–Wilk on the paired differences, then paired t-test or Wilcoxon'}
SEED_COLUMNS = ['system', 'seed', 'measure', 'value']
#: How a control comparison reads.
OUTCOMES = ('better', 'equivalent', 'worse', 'inconclusive')
#: The note under each controls table of results.md and grid.md.
CONTROLS_NOTE = ("Each control at RDIME's budget, then how RDIME compares (better or worse: the test rejects equality, "
                 'Holm over the controls of a measure; equivalent: TOST within the margin; inconclusive). `random`: '
                 "the mean over the seeds of each query's measure, ± its standard deviation over the seeds.")
GRID_COLUMNS = ['collection', 'encoder', 'dime', 'threshold', 'system', 'measure', 'value', 'kept', 'k']
BEST = 'best Top-k (tuned on test)'
TEX_TESTS = {'t': 'paired $t$-test', 'wilcoxon': 'Wilcoxon signed-rank test',
             'auto': 'paired $t$-test, or Wilcoxon signed-rank test where Shapiro--Wilk rejects normality'}
TEX_MARKS = {'†': r'\dagger', '‡': r'\ddagger', '§': r'\S', '¶': r'\P'}
#: How a control's cell in grid.tex shows RDIME's outcome against it.
TEX_OUTCOMES = {'better': r'$^{\uparrow}$', 'worse': r'$^{\downarrow}$', 'equivalent': r'$^{\approx}$',
                'inconclusive': ''}
#: Percentiles of the per-query kept fraction that RDIME's bar spans in the sweep plot (the inter-quartile range).
SPREAD = (25, 75)
#: Line styles of the Top-k reference lines, one per Top-k column.
TOPK_STYLES = (':', '--', '-.', (0, (6, 1.5)), (0, (3, 1, 1, 1, 1, 1)))
#: Panels per row of the grid's kept-fraction Figure (more wrap onto the next row).
PANELS_PER_ROW = 3
MEDIAN_COLOUR = 'tab:orange'
#: Space (inches) around a figure's legend.
LEGEND_GAP = 0.15
#: Line styles of the sources plot.
SOURCE_STYLES = {'RDIME': ('o-', 'tab:blue'), 'CV Top-k': ('x-', 'tab:orange'),
                 'random (same budget)': ('.:', 'grey'), 'magnitude (same budget)': ('s:', 'tab:green')}


@dataclass
class ExperimentResult:
    """What :func:`~pyterrier_rdime.experiment.run_experiment` measured.

    Attributes:
        measures: measure names, in table order.
        table: one row per system and measure: ``dime, threshold, system, measure, value`` (mean over queries);
            ``<dime>/CV Top-k`` is the cross-validated Top-k.
        perquery: ``system, qid, measure, value``.
        kept: per query and pruned system: ``dime, threshold, qid, kept_frac, fallback, mean_weight``.
        significance: the comparisons of :func:`~pyterrier_rdime.experiment.parity.significance`.
        labels: DIME name -> row label.
        settings: the run's settings (collection, encoder, protocol, test, margin, folds, ...).
        notes: what the reader must know (feedback source, relevance level, skipped rows, dropped queries).
        timings: seconds per phase and their ``total``.
        sweep: the Top-k sweep per query: ``dime, fraction, system, qid, measure, value`` (``dime`` ``random``:
            the random-selection curve).
        cv: the fraction cross-validation chose per fold: ``dime, measure, fold, fraction, queries``.
        seeds: each seed's mean of the ``random`` controls: ``system, seed, measure, value``.
    """
    measures: List[str]
    table: pd.DataFrame
    perquery: pd.DataFrame
    kept: pd.DataFrame
    significance: pd.DataFrame
    labels: Dict[str, str]
    settings: Dict[str, object]
    notes: List[str] = field(default_factory=list)
    timings: Dict[str, float] = field(default_factory=dict)
    sweep: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SWEEP_COLUMNS))
    cv: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=CV_COLUMNS))
    seeds: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SEED_COLUMNS))

    def paper_table(self, measure: str) -> pd.DataFrame:
        """The paper's layout for one measure: rows DIME, columns the Top-k fractions, RDIME, :data:`DELTA`, any
        soft-RDIME column, the test-tuned best Top-k and the CV Top-k; a Baseline row. Marks: :data:`ALL_MARKS`."""
        values = self.table[self.table['measure'] == measure]
        columns = list(dict.fromkeys(values.loc[values['dime'] != '', 'threshold']))
        ks = [c for c in columns if c.startswith('k=')]
        soft = [c for c in columns if not c.startswith('k=') and c not in ('RDIME', 'CV Top-k') and ':' not in c]
        rows = []
        for dime, label in self.labels.items():
            mine = values[values['dime'] == dime].set_index('threshold')['value']
            if mine.empty:
                continue
            best_k = max(ks, key=lambda k: mine[k], default=None)
            rows.append({'DIME': label, **{k: f'{mine[k]:.4f}' + ('*' if k == best_k else '') for k in ks},
                         **{c: f'{mine[c]:.4f}{self.marks(measure, dime, c)}' for c in soft},
                         **self._rdime_cells(measure, dime, self.marks(measure, dime, 'RDIME'))})
        baseline = values.loc[values['threshold'] == 'Baseline', 'value'].iloc[0]
        rows.append({'DIME': 'Baseline', **{k: '–' for k in ks}, 'RDIME (kept)': f'{baseline:.4f} (1.00)'})
        return pd.DataFrame(rows, columns=['DIME', *ks, 'RDIME (kept)', DELTA, *soft, 'best Top-k, tuned on test (k)',
                                           'CV Top-k (mean k)']).fillna('')

    def _rdime_cells(self, measure: str, dime: str, marks: str = '') -> Dict[str, str]:
        """The test-tuned best and CV Top-k, RDIME (kept) with ``marks`` and :data:`DELTA` of a table's row."""
        values = self.table[self.table['measure'] == measure].set_index('system')['value']
        rdime, cv = values[f'{dime}/RDIME'], values.get(f'{dime}/CV Top-k', np.nan)
        best = self.test_best(measure, dime)
        k = best[0].split('/')[1] if best else ''
        return {'best Top-k, tuned on test (k)': f'{best[1]:.4f} ({k}{" = Baseline" if k == "k=1.0" else ""})'
                if best else 'n/a',
                'CV Top-k (mean k)': f'{cv:.4f} ({self.mean_cv_fraction(dime, measure):.2f})'
                if np.isfinite(cv) else 'n/a',
                'RDIME (kept)': f'{rdime:.4f}{marks} ({self.mean_kept(dime, "RDIME"):.2f})', DELTA: delta(rdime, cv)}

    def parity_table(self, measure: str) -> pd.DataFrame:
        """RDIME (and any soft column) against each comparator for one measure: difference, CI, p-values, verdict."""
        sig = self.significance
        sig = sig[(sig['measure'] == measure) & (sig['family'] == 'comparators')]
        return pd.DataFrame({
            'DIME': sig['dime'].map(self.labels).fillna(sig['dime']),
            'system': sig['system'].str.split('/').str[-1],
            'vs': sig['comparison'],
            'Δ mean [95 % CI]': [f'{r.mean_diff:+.4f} [{r.ci_low:+.4f}, {r.ci_high:+.4f}]' for r in sig.itertuples()],
            'test': sig['test'],
            'p (Holm)': sig['p_holm'].map(lambda p: f'{p:.3g}'),
            f'TOST p (Holm), ±{sig["margin_abs"].iloc[0]:.4f}' if len(sig) else 'TOST p (Holm)':
                sig['tost_p_holm'].map(lambda p: f'{p:.3g}'),
            'verdict': [marked_verdict(r.verdict, r.significant, r.comparison) for r in sig.itertuples()]})

    def control_rows(self) -> pd.DataFrame:
        """The control comparisons of :attr:`significance` with ``label, column`` (the RDIME column), ``control,
        value, kept`` (RDIME's), ``control_mean, control_value`` (as printed) and ``outcome`` (:data:`OUTCOMES`)."""
        sig = self.significance if 'family' in self.significance else pd.DataFrame(columns=COLUMNS)  # none loaded
        sig = sig[sig['family'] == 'controls']
        values = self.table.set_index(['system', 'measure'])['value']
        return sig.assign(
            label=sig['dime'].map(self.labels).fillna(sig['dime']), column=sig['system'].str.split('/').str[-1],
            control=sig['comparison'].str.removesuffix(SAME_BUDGET),
            value=[values[s, m] for s, m in zip(sig['system'], sig['measure'])],
            kept=[self.mean_kept(*s.split('/')) for s in sig['system']],
            control_mean=[values[o, m] for o, m in zip(sig['other'], sig['measure'])],
            control_value=[self.control_value(o, m) for o, m in zip(sig['other'], sig['measure'])],
            # a difference is better or worse by its sign
            outcome=[('better' if d > 0 else 'worse') if v == 'different' else v
                     for v, d in zip(sig['verdict'], sig['mean_diff'])])

    def controls_table(self, measure: str) -> pd.DataFrame:
        """Each RDIME column against the same-budget controls for one measure (:data:`CONTROLS_NOTE`)."""
        rows = self.control_rows()
        rows = rows[rows['measure'] == measure]
        return pd.DataFrame({
            'DIME': rows['label'],
            'system': [f'{r.column} {r.value:.4f} ({r.kept:.2f})' for r in rows.itertuples()],
            'control': rows['comparison'],
            'control value': rows['control_value'],
            'Δ mean [95 % CI]': [f'{r.mean_diff:+.4f} [{r.ci_low:+.4f}, {r.ci_high:+.4f}]' for r in rows.itertuples()],
            'p (Holm)': rows['p_holm'].map(lambda p: f'{p:.3g}'),
            'TOST p (Holm)': rows['tost_p_holm'].map(lambda p: f'{p:.3g}'),
            'verdict': rows['outcome']})

    def control_value(self, system: str, measure: str) -> str:
        """A control's mean, with the standard deviation over its seeds where it has several."""
        value = self.table.loc[(self.table['system'] == system) & (self.table['measure'] == measure), 'value']
        seeds = self.seeds.loc[(self.seeds['system'] == system) & (self.seeds['measure'] == measure), 'value']
        spread = f' ± {seeds.std(ddof=1):.4f} (sd over {len(seeds)} seeds)' if len(seeds) > 1 else ''
        return f'{value.iloc[0]:.4f}{spread}'

    def mean_kept(self, dime: str, threshold: str) -> float:
        kept = self.kept
        return float(kept.loc[(kept['dime'] == dime) & (kept['threshold'] == threshold), 'kept_frac'].mean())

    def mean_cv_fraction(self, dime: str, measure: str) -> float:
        """The fraction cross-validation chose, averaged over the queries; NaN without CV Top-k."""
        chosen = self.cv[(self.cv['dime'] == dime) & (self.cv['measure'] == measure)]
        return float(np.average(chosen['fraction'], weights=chosen['queries'])) if len(chosen) else float('nan')

    def sweep_means(self) -> pd.DataFrame:
        """``dime, fraction, measure, value``: the sweep's mean over queries per fraction."""
        return self.sweep.groupby(['dime', 'fraction', 'measure'], sort=False)['value'].mean().reset_index()

    def test_best(self, measure: str, dime: str) -> Optional[Tuple[str, float]]:
        """``(system, value)`` of the best Top-k of ``dime`` tuned on the test queries (``<dime>/k=1.0`` where it is
        Baseline: :data:`~.parity.BEST_IS_BASELINE`); None without Top-k."""
        sig = self.significance
        mine = sig[(sig['measure'] == measure) & (sig['system'] == f'{dime}/RDIME')]
        hit = mine.loc[mine['comparison'].str.startswith('best Top-k'), 'other']
        if hit.empty and not (mine['comparison'] == BEST_IS_BASELINE).any():
            return None
        system = hit.iloc[0] if len(hit) else 'Baseline'
        pool = pd.concat([self.table[['system', 'measure', 'value']],
                          self.sweep_means().assign(system=lambda f: f['dime'] + '/k=' + f['fraction'].astype(str))])
        value = float(pool.loc[(pool['system'] == system) & (pool['measure'] == measure), 'value'].iloc[0])
        return (system if len(hit) else f'{dime}/k=1.0'), value

    def marks(self, measure: str, dime: str, threshold: str) -> str:
        """The significance marks (:data:`MARKS`) of ``<dime>/<threshold>`` for ``measure``."""
        sig = self.significance
        hit = sig[(sig['measure'] == measure) & (sig['system'] == f'{dime}/{threshold}') & sig['significant']]
        return ''.join(mark for label, mark in MARKS.items() if hit['comparison'].str.startswith(label).any())

    def answer_sources(self) -> List[str]:
        """The LLM DIMEs of a run with several answer sources (``llm@<source>``, ``llm-eclipse@<source>``)."""
        return [dime for dime in self.labels if '@' in dime]

    def sources_table(self, controls: Sequence[str] = ('random', 'magnitude')) -> pd.DataFrame:
        """One row per answer source of the LLM DIMEs: each measure at RDIME and CV Top-k, the kept fraction and
        the outcome (:data:`OUTCOMES`) against each control of ``controls``; a Baseline row."""
        values = self.table.set_index(['system', 'measure'])['value']
        compared = self.control_rows()
        outcomes = compared.set_index(['system', 'measure', 'control'])['outcome']
        controls = [c for c in controls if c + SAME_BUDGET in set(compared['comparison'])]
        rows = []
        for dime in self.answer_sources():
            row = {'source': self.labels[dime]}
            for measure in self.measures:
                row[f'{measure} RDIME'] = f'{values[f"{dime}/RDIME", measure]:.4f}'
                row[f'{measure} CV Top-k (mean k)'] = self._rdime_cells(measure, dime)['CV Top-k (mean k)']
            row['RDIME kept'] = f'{self.mean_kept(dime, "RDIME"):.2f}'
            row.update({f'vs {control} ({measure})': outcomes.get((f'{dime}/RDIME', measure, control), 'n/a')
                        for control in controls for measure in self.measures})
            rows.append(row)
        rows.append({'source': 'Baseline', **{f'{m} RDIME': f'{values["Baseline", m]:.4f}' for m in self.measures}})
        return pd.DataFrame(rows).fillna('')

    def sources_plot(self, path: Union[str, Path], controls: Sequence[str] = ('random', 'magnitude')) -> None:
        """Each measure against the answer source: LLM DIME's RDIME and CV Top-k, Baseline and controls as lines."""
        values = self.table.set_index(['system', 'measure'])['value']
        dimes = self.answer_sources()
        lines = {'RDIME': [f'{d}/RDIME' for d in dimes], 'CV Top-k': [f'{d}/CV Top-k' for d in dimes]}
        lines.update({c + SAME_BUDGET: [f'{d}/RDIME:{c}' for d in dimes] for c in controls
                      if f'{dimes[0]}/RDIME:{c}' in set(self.table['system'])})
        x = np.arange(len(dimes))

        def draw(ax, measure):
            for name, systems in lines.items():
                style, colour = SOURCE_STYLES.get(name, ('.-', None))
                ax.plot(x, [values.get((s, measure), np.nan) for s in systems], style, color=colour, linewidth=1,
                        markersize=5, label=name)
            ax.set_xticks(x, [self.labels[d] for d in dimes], rotation=45, ha='right', fontsize=7)
        _measure_panels((max(6.0, 0.55 * len(dimes) + 2.5) * len(self.measures), 4.2),
                        {m: values['Baseline', m] for m in self.measures}, draw,
                        f'LLM DIME by answer source — {self._title()}', path)

    def to_markdown(self) -> str:
        s = self.settings
        lines = [f'# RDIME vs Top-k on {s["collection"]}', '',
                 f'Encoder `{s["encoder"]}`, mode `{s["mode"]}`, first stage {s["first_stage"]}, '
                 f'{s["num_queries"]} queries.', '']
        shown = ''
        for measure in self.measures:
            paper = self.paper_table(measure)
            shown += ''.join(paper.to_numpy(str).ravel())
            lines += [f'## {measure}', '', _markdown(paper), '', _markdown(self.parity_table(measure)), '']
            controls = self.controls_table(measure)
            if len(controls):
                lines += [f'### {measure}: does the choice of dimensions matter?', '', _markdown(controls), '',
                          CONTROLS_NOTE, '']
        lines += [self.footnote(''.join(mark for mark in ALL_MARKS if mark in shown)), '']
        lines += [f'- {note}' for note in self.notes]
        return '\n'.join(lines) + '\n'

    def footnote(self, marks: str = ALL_MARKS) -> str:
        """What the tables' ``marks`` (among :data:`ALL_MARKS`), Δ%, comparators and verdicts mean for this run."""
        s = self.settings
        test = f'{TEST_NAMES[s.get("test", "t")]}, {s.get("alternative", "two-sided")}, Holm-corrected per measure, ' \
               f'α = {ALPHA}'
        margin = s.get('margin')
        folds = f'{s.get("folds")} folds of queries, seed {s.get("cv_seed")}' if s.get('sweep') else 'no sweep'
        significant = [f'`{mark}` {meaning}' for mark, meaning in MEANINGS.items() if mark in marks]
        parts = ['`*` best Top-k column of the row'] if '*' in marks else []
        if significant:
            parts.append(f'RDIME significantly different from {", ".join(significant)} ({test})')
        parts += ['(kept) = mean fraction of dimensions RDIME kept per query',
                  f'{DELTA}: RDIME\'s difference from the cross-validated Top-k, in % of it']
        both = (' A mark beside a verdict is that same test: "equivalent ¶" (or †, ‡, §) is a difference the test '
                'finds significant and TOST shows inside the margin: small and consistent, not a contradiction.'
                if margin and set(marks) & set(MARKS.values()) else '')
        return ('; '.join(parts) + '. "best Top-k, tuned on test" is the best fraction of the sweep and the Top-k '
                'columns chosen on the very queries it is scored on (no user can choose so; where it is k=1.0, it is '
                'Baseline, compared once); "CV Top-k" chooses the fraction on the other folds '
                f'({folds}) and scores it on the held-out fold. '
                + (f'Verdicts: equivalent when TOST shows the difference within ±{100 * margin:g} % of the Baseline '
                   f'(Holm-corrected p < α); different when the significance test ({test}) rejects equality and '
                   'equivalence is not shown; inconclusive otherwise (the queries cannot tell).' + both
                   if margin else ''))

    def save(self, out_dir: Union[str, Path]) -> List[str]:
        """Writes the csv files, results.json, results.md and the figures, plain files first; returns the outputs
        that could not be written (the others still are)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        frames = {'results': self.table, 'perquery': self.perquery, 'significance': self.significance,
                  'kept_fraction': self.kept, 'sweep': self.sweep, 'cv': self.cv, 'seeds': self.seeds}
        writers = [(f'{name}.csv', lambda p, frame=frame: frame.to_csv(p, index=False))
                   for name, frame in frames.items()]
        writers += [
            ('results.json', lambda p: p.write_text(self._json(), encoding='utf-8')),
            ('results.md', lambda p: p.write_text(self.to_markdown(), encoding='utf-8')),
            ('kept_fraction.png', self.boxplot),
            ('sweep.png', self.sweep_plot),
        ]
        if len(self.answer_sources()) > 1:
            writers += [('sources.md', lambda p: p.write_text(_markdown(self.sources_table()) + '\n',
                                                              encoding='utf-8')), ('sources.png', self.sources_plot)]
        return write_outputs(out, writers)

    @classmethod
    def load(cls, out_dir: Union[str, Path]) -> 'ExperimentResult':
        """The result that :meth:`save` wrote to ``out_dir`` (the grid reads finished cells back this way)."""
        out = Path(out_dir)
        payload = json.loads((out / 'results.json').read_text(encoding='utf-8'))

        def table(name):
            return pd.read_csv(out / name, dtype={'qid': str, 'dime': str, 'threshold': str}, keep_default_na=False,
                               na_values=[''])
        results = pd.DataFrame(payload['results']).fillna({'dime': ''})
        return cls(payload['measures'], results, table('perquery.csv'), table('kept_fraction.csv'),
                   pd.DataFrame(payload['significance']), payload['labels'], payload['settings'], payload['notes'],
                   payload['timings'], table('sweep.csv'), pd.DataFrame(payload['cv'], columns=CV_COLUMNS),
                   table('seeds.csv'))

    def _json(self) -> str:
        kept = self.kept.groupby(['dime', 'threshold'])['kept_frac'].mean().reset_index()
        payload = {'measures': self.measures, 'labels': self.labels, 'settings': self.settings, 'notes': self.notes,
                   'timings': self.timings, 'results': self.table.to_dict(orient='records'),
                   'significance': self.significance.to_dict(orient='records'),
                   'kept_fraction_mean': kept.to_dict(orient='records'),
                   'sweep_mean': self.sweep_means().to_dict(orient='records'), 'cv': self.cv.to_dict(orient='records')}
        numbers = (np.integer, np.floating, np.bool_)  # numpy scalars as numbers, anything else as text
        return json.dumps(payload, indent=2, default=lambda v: v.item() if isinstance(v, numbers) else str(v))

    def _title(self) -> str:
        return f'{Path(str(self.settings["collection"])).name}, {Path(str(self.settings["encoder"])).name}'

    def boxplot(self, path: Union[str, Path]) -> None:
        """The paper's appendix figure: RDIME's per-query kept fraction, one box per DIME, Top-k lines for reference."""
        from matplotlib.figure import Figure
        fig = Figure(figsize=(1.6 * max(len(self.labels), 2) + 2.5, 3.5))
        ax = fig.subplots()
        entries = _boxes(ax, self.kept, self.labels)
        ax.set_ylabel('fraction of dimensions kept')
        ax.set_title(f'RDIME per-query kept fraction — {self._title()}', fontsize=9)
        ax.legend(*entries, fontsize=7, loc='center left', bbox_to_anchor=(1, 0.5), handlelength=3)
        fig.tight_layout()
        fig.savefig(path, dpi=120)

    def sweep_plot(self, path: Union[str, Path]) -> None:
        """Each measure against the kept fraction: the Top-k sweep per DIME, RDIME and CV Top-k, Baseline."""
        curves = self.sweep_means()
        if curves.empty:  # no sweep: the Top-k columns are the curve
            topk = self.table[self.table['threshold'].str.startswith('k=')]
            curves = topk.assign(fraction=topk['threshold'].str[2:].astype(float))
        values = self.table.set_index(['system', 'measure'])['value']
        points = []
        for dime in self.labels:
            rdime = self.kept.loc[(self.kept['dime'] == dime) & (self.kept['threshold'] == 'RDIME'), 'kept_frac']
            if rdime.empty:
                continue
            low, high = np.percentile(rdime, SPREAD)
            for measure in self.measures:
                points.append({'dime': dime, 'measure': measure, 'system': 'RDIME', 'kept': rdime.mean(), 'low': low,
                               'high': high, 'value': values[f'{dime}/RDIME', measure]})
                if (f'{dime}/CV Top-k', measure) in values.index:
                    points.append({'dime': dime, 'measure': measure, 'system': 'CV Top-k',
                                   'kept': self.mean_cv_fraction(dime, measure),
                                   'value': values[f'{dime}/CV Top-k', measure]})
        baseline = pd.Series({m: values['Baseline', m] for m in self.measures})
        sweep_plot(curves, pd.DataFrame(points), baseline, self.labels, self._title(), path)


def write_combined(cells: Sequence, out: Path) -> List[str]:
    """Writes grid.csv, grid_parity.csv (every cell's significance.csv), grid.md, grid.tex and the kept-fraction
    Figure of the finished ``cells`` into ``out``; returns the outputs that could not be written."""
    writers = [
        ('grid.csv', lambda p: long_table(cells).to_csv(p, index=False)),
        ('grid_parity.csv', lambda p: _per_cell(cells, lambda r: r.significance).to_csv(p, index=False)),
        ('grid.md', lambda p: p.write_text(markdown(cells), encoding='utf-8')),
        ('grid.tex', lambda p: p.write_text(latex(cells), encoding='utf-8')),
        ('kept_fractions.png', lambda p: grid_kept_figure(
            [(c.collection_label, c.encoder_label, c.result.kept, c.result.labels) for c in cells],
            [p, p.with_suffix('.pdf')])),
    ]
    return write_outputs(out, writers)


def long_table(cells: Sequence) -> pd.DataFrame:
    """Every finished cell's systems, one row per (collection, encoder, system, measure): ``value``, ``kept`` and
    ``k`` (the fraction of the best and CV Top-k rows)."""
    frames = []
    for cell in cells:
        result = cell.result
        kept = result.kept.groupby(['dime', 'threshold'])['kept_frac'].mean()
        table = result.table.assign(collection=cell.collection_label, encoder=cell.encoder_label, k=np.nan)
        table['kept'] = [kept.get((d, t), 1.0 if t == 'Baseline' else np.nan)
                         for d, t in zip(table['dime'], table['threshold'])]
        cv = table['threshold'] == 'CV Top-k'
        table.loc[cv, 'k'] = [result.mean_cv_fraction(d, m) for d, m in zip(table.loc[cv, 'dime'],
                                                                            table.loc[cv, 'measure'])]
        best = [{'dime': dime, 'threshold': BEST, 'system': f'{dime}/{BEST}', 'measure': measure, 'value': hit[1],
                 'k': float(hit[0].split('=')[1])}
                for measure in result.measures for dime in result.labels
                if (hit := result.test_best(measure, dime)) is not None]
        frames += [table, pd.DataFrame(best, columns=GRID_COLUMNS).assign(collection=cell.collection_label,
                                                                          encoder=cell.encoder_label)]
    return pd.concat(frames, ignore_index=True)[GRID_COLUMNS]


def markdown(cells: Sequence) -> str:
    """grid.md: per measure, one row per (collection, encoder, DIME): Baseline, best and CV Top-k, RDIME, Δ%, and
    the verdicts."""
    lines = ['# RDIME vs Top-k: the grid', '']
    controls = _per_cell(cells, ExperimentResult.control_rows)
    if len(controls):
        lines += ['Does the choice of dimensions matter? RDIME against each control at the same budget, in how many '
                  '(cell, measure) pairs it is better, equivalent, worse or inconclusive:', '',
                  control_summary(controls).to_markdown(index=False), '']
    for measure in dict.fromkeys(m for c in cells for m in c.result.measures):
        rows = []
        for cell in cells:
            result = cell.result
            values = result.table[result.table['measure'] == measure].set_index('system')['value']
            sig = result.significance[result.significance['measure'] == measure]
            for dime, label in result.labels.items():
                if f'{dime}/RDIME' not in values:
                    continue
                verdicts = {r.comparison: marked_verdict(r.verdict, r.significant, r.comparison)
                            for r in sig[sig['system'] == f'{dime}/RDIME'].itertuples()}
                rows.append({
                    'collection': cell.collection_label, 'encoder': cell.encoder_label, 'DIME': label,
                    'Baseline': f'{values["Baseline"]:.4f}', **result._rdime_cells(measure, dime),
                    **{f'vs {short}': _verdict(verdicts, prefix) for short, prefix in
                       (('CV', 'CV Top-k'), ('test-best', 'best Top-k'), ('Baseline', 'Baseline'))}})
        lines += [f'## {measure}', '', _markdown(pd.DataFrame(rows)), '']
        mine = controls[controls['measure'] == measure]
        if len(mine):
            lines += [f'### {measure}: RDIME against the controls at the same budget, and vector PRF', '',
                      _markdown(control_grid(mine)), '', CONTROLS_NOTE, '']
    shown = '\n'.join(line for line in lines if line.startswith('| '))
    lines += ['Verdicts of RDIME against CV Top-k, the best Top-k tuned on the test queries, and Baseline. '
              + cells[0].result.footnote(marks=''.join(m for m in ALL_MARKS if m != '*' and m in shown)), '']
    lines += [f'- {c.collection.name} × {c.encoder}: {c.result.settings["num_queries"]} queries, first stage '
              f'{c.result.settings["first_stage"]}' for c in cells]
    return '\n'.join(lines) + '\n'


def _per_cell(cells: Sequence, frame: Callable[[ExperimentResult], pd.DataFrame]) -> pd.DataFrame:
    """Every finished cell's ``frame(result)``, with its collection and encoder."""
    return pd.concat([frame(c.result).assign(collection=c.collection_label, encoder=c.encoder_label) for c in cells],
                     ignore_index=True)


def control_grid(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (collection, encoder, DIME, RDIME column): RDIME (kept), then each control's value and outcome."""
    table = []
    for key, group in rows.groupby(['collection', 'encoder', 'label', 'column'], sort=False):
        first = group.iloc[0]
        table.append({'collection': key[0], 'encoder': key[1], 'DIME': key[2],
                      key[3] if key[3] != 'RDIME' else 'RDIME (kept)': f'{first["value"]:.4f} ({first["kept"]:.2f})',
                      **{r.control: f'{r.control_value} {r.outcome}' for r in group.itertuples()}})
    return pd.DataFrame(table).fillna('n/a')


def control_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per DIME and control, in how many (cell, measure) pairs RDIME is better, equivalent, worse or inconclusive."""
    outcomes = rows[rows['column'] == 'RDIME'].groupby(['label', 'control'], sort=False)['outcome']
    return outcomes.agg(**{o: lambda mine, o=o: int((mine == o).sum()) for o in OUTCOMES}, pairs='size').reset_index(
        ).rename(columns={'label': 'DIME'})


def _verdict(verdicts: Dict[str, str], prefix: str) -> str:
    """The verdict of the comparison whose label starts with ``prefix``."""
    hit = [verdict for comparison, verdict in verdicts.items() if comparison.startswith(prefix)]
    if not hit and prefix == 'best Top-k' and BEST_IS_BASELINE in verdicts:
        return f'{verdicts[BEST_IS_BASELINE]} (= Baseline)'
    return hit[0] if hit else 'n/a'


def latex(cells: Sequence) -> str:
    """grid.tex: the paper's Table layout, one ``table*`` per measure: rows encoder × DIME (and Baseline), a column
    group per collection (Top-k columns, CV Top-k, RDIME, :data:`DELTA`); a group's best values bold."""
    collections = list(dict.fromkeys(c.collection_label for c in cells))
    by_name = {(c.collection_label, c.encoder_label): c.result for c in cells}
    ks = list(dict.fromkeys(t for r in by_name.values() for t in r.table['threshold'] if t.startswith('k=')))
    labels = {d: label for r in by_name.values() for d, label in r.labels.items()}
    first = next(iter(by_name.values()))
    out = []
    for measure in dict.fromkeys(m for r in by_name.values() for m in r.measures):
        marks, rows = set(), {}
        for encoder in dict.fromkeys(c.encoder_label for c in cells):
            mine = [by_name.get((c, encoder)) for c in collections]
            dimes = [d for d in labels if any(r is not None and f'{d}/RDIME' in set(r.table['system']) for r in mine)]
            rows[encoder] = [(labels.get(d, 'Baseline'), [_tex_group(r, measure, d, ks, marks) for r in mine])
                             for d in [*dimes, None]]  # None: the Baseline row
        shown = [f'$^{{{TEX_MARKS[m]}}}$ {meaning.replace("Top-k", "Top-$k$")}' for m, meaning in MEANINGS.items()
                 if m in marks]  # never § (soft RDIME): the rows are RDIME's
        test = f'{TEX_TESTS[first.settings.get("test", "t")]}, {first.settings.get("alternative", "two-sided")}'
        margin = first.settings.get('margin')
        equivalent = (rf' A marked value can also be equivalent (TOST within $\pm{100 * margin:g}$\,\% of the '
                      'Baseline): a small, consistent difference; grid.md gives each verdict with its mark.'
                      if margin else '')
        significance = (f' RDIME significantly different from {", ".join(shown)} ({test}, Holm-corrected per '
                        r'measure, $\alpha = 0.05$).' + equivalent) if shown else ''
        out += _tex_table(collections, [*(k[2:] for k in ks), 'CV', 'RDIME', r'$\Delta$ (\%)'], rows,
                          f'{_tex(measure)} of RDIME and Top-$k$ pruning per encoder, DIME and collection. CV: '
                          r'Top-$k$ with $k$ chosen by cross-validation over the queries; $\Delta$ (\%): RDIME over '
                          r'CV Top-$k$; (kept): mean fraction of dimensions RDIME kept; \textbf{bold}: best of the '
                          'row in the collection (ties alike).' + significance)
    return '\n'.join(out + _latex_controls(cells))


def _latex_controls(cells: Sequence) -> List[str]:
    """grid.tex's controls tables, one ``table*`` per measure: RDIME and each control's value, marked with the
    outcome."""
    rows = _per_cell(cells, ExperimentResult.control_rows)
    rows = rows[rows['column'] == 'RDIME']
    collections = list(dict.fromkeys(rows['collection']))
    controls = list(dict.fromkeys(rows['control']))
    out = []
    for measure in dict.fromkeys(m for c in cells for m in c.result.measures):  # the paper tables' order
        table = {}
        for (encoder, label), mine in rows[rows['measure'] == measure].groupby(['encoder', 'label'], sort=False):
            hits = [mine[mine['collection'] == collection].set_index('control') for collection in collections]
            table.setdefault(encoder, []).append((label, [None if hit.empty else ' & '.join(
                [f'{hit["value"].iloc[0]:.3f} ({hit["kept"].iloc[0]:.2f})'] + [
                    f'{hit.loc[c, "control_mean"]:.3f}{TEX_OUTCOMES[hit.loc[c, "outcome"]]}' if c in hit.index
                    else '--' for c in controls]) for hit in hits]))
        if table:
            out += _tex_table(collections, ['RDIME', *map(_tex, controls)], table, (
                f'{_tex(measure)} of RDIME (mean kept fraction) against the same number of dimensions per query '
                'chosen at random (mean over seeds), by the query alone (magnitude), by the collection\'s variance, '
                r"and against pyterrier-dr's vector PRF. RDIME $^{\uparrow}$ better, $^{\downarrow}$ worse (the test "
                r'rejects equality; Holm over the controls of a measure), $^{\approx}$ equivalent (TOST within the '
                'margin).'))
    return out


def _tex_table(collections: List[str], names: List[str], rows: Dict[str, list], caption: str) -> List[str]:
    """A ``table*`` of grid.tex: a column group of ``names`` per collection; per encoder of ``rows``, its rows
    ``(label, [one group per collection, None where there is none])``."""
    width = len(names)
    out = [r'\begin{table*}[ht]', r'\centering', r'\resizebox{\textwidth}{!}{%',
           r'\begin{tabular}{ll' + 'c' * width * len(collections) + '}', r'\toprule',
           r'\multirow{2}{*}{Model} & \multirow{2}{*}{DIME} & '
           + ' & '.join(rf'\multicolumn{{{width}}}{{c}}{{{_tex(c)}}}' for c in collections) + r' \\',
           ' '.join(rf'\cmidrule(lr){{{3 + i * width}-{2 + (i + 1) * width}}}' for i in range(len(collections))),
           ' & & ' + ' & '.join(names * len(collections)) + r' \\', r'\midrule']
    for e, (encoder, lines) in enumerate(rows.items()):
        out.append(rf'\multirow{{{len(lines)}}}{{*}}{{{_tex(encoder)}}}')
        out += [f' & {_tex(label)} & ' + ' & '.join(' & '.join(['--'] * width) if group is None else group
                                                     for group in groups) + r' \\' for label, groups in lines]
        out.append(r'\midrule' if e < len(rows) - 1 else r'\bottomrule')
    return out + [r'\end{tabular}}', rf'\caption{{{caption}}}', r'\end{table*}', '']


def _tex_group(result, measure: str, dime: Optional[str], ks: List[str], marks: set) -> Optional[str]:
    """One collection's group of a DIME's row in grid.tex (dime None: Baseline's; None without it); adds the marks it
    prints to ``marks``."""
    if result is None or dime is not None and f'{dime}/RDIME' not in set(result.table['system']):
        return None
    values = result.table[result.table['measure'] == measure].set_index('system')['value']
    if dime is None:
        return ' & '.join(['--'] * (len(ks) + 1) + [f'{values["Baseline"]:.3f} (1.00)', ''])
    mine = {k: values.get(f'{dime}/{k}', np.nan) for k in ks + ['CV Top-k', 'RDIME']}
    printed = {k: f'{v:.3f}' for k, v in mine.items() if np.isfinite(v)}
    best = max(printed.values(), key=float, default=None)  # ties as printed: every value that prints as the best
    rdime_marks = result.marks(measure, dime, 'RDIME')
    marks.update(rdime_marks)
    shown = ['--' if k not in printed else rf'\textbf{{{printed[k]}}}' if printed[k] == best else printed[k]
             for k in mine]
    shown[-1] += (f'$^{{{"".join(TEX_MARKS[m] for m in rdime_marks)}}}$' if rdime_marks else '') + \
        f' ({result.mean_kept(dime, "RDIME"):.2f})'  # the RDIME column
    return ' & '.join(shown + [delta(mine['RDIME'], mine['CV Top-k']).replace('n/a', '--')])


def _tex(text: str) -> str:
    for char, escaped in (('\\', r'\textbackslash{}'), ('&', r'\&'), ('%', r'\%'), ('_', r'\_'), ('#', r'\#'),
                          ('τ', r'$\tau$'), ('−', '--'), ('⊙', r'$\odot$')):
        text = text.replace(char, escaped)
    return text


def sweep_plot(curves: pd.DataFrame, points: pd.DataFrame, baseline: pd.Series, labels: Dict[str, str], title: str,
               path: Union[str, Path]):
    """Each measure against the kept fraction, per DIME: the Top-k curve (``curves``: ``dime, fraction, measure,
    value``; dime ``random``: the random selection), RDIME with its :data:`SPREAD` and CV Top-k (``points``: ``dime,
    measure, system, kept, low, high, value``), and ``baseline`` (measure -> value) as a line. Returns the Figure."""
    from matplotlib import colormaps
    colours = {dime: colormaps['tab10'](i % 10) for i, dime in enumerate(labels)}

    def draw(ax, measure):
        for dime, label in labels.items():
            curve = curves[(curves['dime'] == dime) & (curves['measure'] == measure)].sort_values('fraction')
            ax.plot(curve['fraction'], curve['value'], '.-', color=colours[dime], linewidth=1, label=f'{label} Top-k')
            mine = points[(points['dime'] == dime) & (points['measure'] == measure)].set_index('system')
            if 'RDIME' in mine.index:
                r = mine.loc['RDIME']
                # the bar spans the percentiles themselves: the mean can lie outside them (a skewed spread)
                ax.plot([r['low'], r['high']], [r['value'], r['value']], '|-', color=colours[dime], markersize=7)
                ax.plot(r['kept'], r['value'], 'o', color=colours[dime], markersize=7, markeredgecolor='black',
                        label=f'{label} RDIME')
            if 'CV Top-k' in mine.index:
                c = mine.loc['CV Top-k']
                ax.plot(c['kept'], c['value'], 'x', color=colours[dime], markersize=8, markeredgewidth=2,
                        label=f'{label} CV Top-k')
        chance = curves[(curves['dime'] == 'random') & (curves['measure'] == measure)].sort_values('fraction')
        if len(chance):
            ax.plot(chance['fraction'], chance['value'], '.:', color='grey', linewidth=1,
                    label='random dimensions (mean over seeds)')
        ax.set_xlabel('fraction of dimensions kept')
        ax.set_xlim(0, 1.05)
    return _measure_panels((4.2 * len(baseline) + 2.2, 3.6), baseline, draw,
                           title + f' — RDIME bar: per-query kept fraction, percentiles {SPREAD[0]}–{SPREAD[1]}', path)


def grid_kept_figure(cells: List[Tuple[str, str, pd.DataFrame, Dict[str, str]]], paths: Sequence[Union[str, Path]]):
    """The paper's Figure: RDIME's per-query kept fraction per DIME, one panel per (encoder, collection),
    :data:`PANELS_PER_ROW` a row. ``cells``: ``(collection, encoder, kept, labels)``; saved to each of ``paths``."""
    from matplotlib.figure import Figure
    collections = list(dict.fromkeys(c for c, _, _, _ in cells))
    encoders = list(dict.fromkeys(e for _, e, _, _ in cells))
    ordered = sorted(cells, key=lambda c: (encoders.index(c[1]), collections.index(c[0])))
    columns = min(PANELS_PER_ROW, len(ordered))
    rows = -(-len(ordered) // columns)
    fig = Figure(figsize=(3.4 * columns, 2.9 * rows + 0.7))
    axes = fig.subplots(rows, columns, squeeze=False, sharey=True)
    for ax in axes.flat[len(ordered):]:
        ax.set_axis_off()
    entries = []  # of the first panel
    for ax, (collection, encoder, kept, labels) in zip(axes.flat, ordered):
        entries.append(_boxes(ax, kept, labels))
        ax.set_title(f'{collection} — {encoder}', fontsize=8)
    for row in axes:
        row[0].set_ylabel('fraction kept')
    entries = entries[0]
    # one row of entries if it fits the figure's width, else as many columns as fit (a one-panel grid is narrow)
    for ncols in range(len(entries[1]), 0, -1):
        legend = fig.legend(*entries, fontsize=7, loc='lower center', ncols=ncols, handlelength=3, frameon=False)
        width, height = _legend_inches(fig, legend)
        if width <= fig.get_figwidth() - LEGEND_GAP or ncols == 1:
            break
        legend.remove()
    fig.tight_layout(rect=(0, (height + LEGEND_GAP) / fig.get_figheight(), 1, 1))
    for path in paths:  # a PDF without its creation date: the same grid writes the same bytes
        fig.savefig(path, dpi=150, metadata={'CreationDate': None} if Path(path).suffix == '.pdf' else None)
    return fig


def _boxes(ax, kept: pd.DataFrame, labels: Dict[str, str]) -> Tuple[list, List[str]]:
    """RDIME's per-query kept fraction, one box per DIME, and a line at each Top-k's kept fraction; returns the legend
    entries: the boxes' median line and mean triangle, then the Top-k lines."""
    from matplotlib.lines import Line2D
    rdime = kept[kept['threshold'] == 'RDIME']
    names = [d for d in labels if d in set(rdime['dime'])]
    ax.boxplot([rdime.loc[rdime['dime'] == d, 'kept_frac'] for d in names], showmeans=True,
               meanprops={'marker': '^', 'markerfacecolor': 'tab:green', 'markeredgecolor': 'tab:green'},
               medianprops={'color': MEDIAN_COLOUR})
    ax.set_xticks(range(1, len(names) + 1), [labels[d] for d in names], fontsize=7)
    ax.set_ylim(0, 1.02)
    topk = kept[kept['threshold'].str.startswith('k=')].groupby('threshold', sort=False)['kept_frac'].mean()
    for i, (threshold, fraction) in enumerate(topk.items()):
        ax.axhline(fraction, color='dimgrey', linestyle=TOPK_STYLES[i % len(TOPK_STYLES)], linewidth=1,
                   label=f'Top-k {threshold}')
    handles, names = ax.get_legend_handles_labels()
    return ([Line2D([], [], color=MEDIAN_COLOUR, label='median'),
             Line2D([], [], marker='^', color='tab:green', linestyle='none', label='mean')] + handles,
            ['median', 'mean'] + names)


def _measure_panels(size: Tuple[float, float], baseline, draw: Callable, title: str, path: Union[str, Path]):
    """A Figure of ``size``, a panel per measure of ``baseline`` (measure -> value): ``draw(ax, measure)``, then
    Baseline as a dashed line; the last panel's legend right of the panels, ``title`` above; saved to ``path``."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=size)
    axes = np.atleast_1d(fig.subplots(1, len(baseline)))
    for ax, measure in zip(axes, list(baseline.keys())):
        draw(ax, measure)
        ax.axhline(baseline[measure], color='black', linestyle='--', linewidth=1, label='Baseline (all dimensions)')
        ax.set_ylabel(measure)
        ax.grid(alpha=0.3)
    legend = fig.legend(*axes[-1].get_legend_handles_labels(), fontsize=7, loc='center right')
    fig.suptitle(title, fontsize=9)
    # the panels end where the legend begins, with a gap: its width depends on the DIMEs' names, so it is measured
    width, _ = _legend_inches(fig, legend)
    fig.tight_layout(rect=(0, 0, 1 - (width + LEGEND_GAP) / fig.get_figwidth(), 1))
    fig.savefig(path, dpi=120)
    return fig


def _legend_inches(fig, legend) -> Tuple[float, float]:
    """The drawn width and height of ``legend`` in inches (drawn on an Agg canvas: a bare Figure has no renderer)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    box = legend.get_window_extent(fig.canvas.get_renderer())
    return box.width / fig.dpi, box.height / fig.dpi


def delta(value: float, reference: float) -> str:
    """:data:`DELTA` as printed; ``n/a`` without a (non-zero) reference."""
    return f'{100 * (value - reference) / reference:+.2f}' if np.isfinite(reference) and reference else 'n/a'


def marked_verdict(verdict: str, significant: bool, comparison: str) -> str:
    """A comparator's verdict, followed by its :data:`MARKS` mark when the test rejects equality (which an
    ``equivalent`` verdict can carry too: a small, consistent difference inside the margin)."""
    mark = next((m for label, m in MARKS.items() if comparison.startswith(label)), '') if significant else ''
    return f'{verdict} {mark}' if mark else verdict


def _markdown(frame: pd.DataFrame) -> str:
    return frame.to_markdown(index=False, disable_numparse=True)


def kept_fractions(frame: pd.DataFrame, dime: str, threshold: str) -> pd.DataFrame:
    """Per query of a pruned system's frame: the kept fraction, the fallback flag and the mean weight."""
    per_query = frame.groupby('qid', sort=False).first().reset_index()
    return pd.DataFrame({
        'dime': dime, 'threshold': threshold, 'qid': per_query['qid'],
        'kept_frac': per_query['query_kept_frac'].astype(float),
        'fallback': per_query['query_fallback'] if 'query_fallback' in per_query else False,
        'mean_weight': per_query['query_mean_weight'].astype(float) if 'query_mean_weight' in per_query else 1.0})


def write_outputs(out: Path, writers: Sequence[Tuple[str, Callable[[Path], object]]]) -> List[str]:
    """Calls each ``(file name, writer)`` on ``out / name``; returns one line per output that could not be written."""
    problems = []
    for name, write in writers:
        try:
            write(out / name)
        except Exception as e:  # whatever a writer raises, the other outputs are still written
            problems.append(f'{out / name}: {type(e).__name__}: {e}')
    return problems
