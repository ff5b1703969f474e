"""What the runner measured, laid out as the paper's tables with the honest comparators, and saved to disk."""
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd

from . import figures
from .parity import ALPHA, BEST_IS_BASELINE, SAME_BUDGET

#: Significance marks of the paper table: comparison label -> mark.
MARKS = {'CV Top-k': '¶', 'best Top-k': '†', 'Baseline': '‡', 'RDIME': '§'}
#: Every mark a table can carry: ``*`` the best Top-k column of a row, then :data:`MARKS`.
ALL_MARKS = '*' + ''.join(MARKS.values())
#: Δ%: RDIME's relative difference from the cross-validated Top-k (the honest comparator).
DELTA = 'Δ% vs CV Top-k'
TEST_NAMES = {'t': 'paired t-test', 'wilcoxon': 'Wilcoxon signed-rank test',
              'auto': 'per comparison: Shapiro–Wilk on the paired differences, then paired t-test or Wilcoxon'}
SWEEP_COLUMNS = ['dime', 'fraction', 'system', 'qid', 'measure', 'value']
CV_COLUMNS = ['dime', 'measure', 'fold', 'fraction', 'queries']
SEED_COLUMNS = ['system', 'seed', 'measure', 'value']
#: How a control comparison reads.
OUTCOMES = ('better', 'equivalent', 'worse', 'inconclusive')
#: The note under each controls table of results.md and grid.md.
CONTROLS_NOTE = ("Each control at RDIME's budget, then how RDIME compares (better or worse: the test rejects equality, "
                 'Holm over the controls of a measure; equivalent: TOST within the margin; inconclusive). `random`: '
                 "the mean over the seeds of each query's measure, ± its standard deviation over the seeds.")


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
        baseline = values.loc[values['threshold'] == 'Baseline', 'value'].iloc[0]
        rows = []
        for dime, label in self.labels.items():
            mine = values[values['dime'] == dime].set_index('threshold')['value']
            if mine.empty:
                continue
            best_k = max(ks, key=lambda k: mine[k]) if ks else None
            row = {'DIME': label}
            row.update({k: f'{mine[k]:.4f}' + ('*' if k == best_k else '') for k in ks})
            row['RDIME (kept)'] = f'{mine["RDIME"]:.4f}{self.marks(measure, dime, "RDIME")} ' \
                                  f'({self.mean_kept(dime, "RDIME"):.2f})'
            row[DELTA] = delta(mine['RDIME'], mine.get('CV Top-k', np.nan))
            for column in soft:
                row[column] = f'{mine[column]:.4f}{self.marks(measure, dime, column)}'
            best = self.test_best(measure, dime)
            row['best Top-k, tuned on test (k)'] = best_text(best)
            row['CV Top-k (mean k)'] = (f'{mine["CV Top-k"]:.4f} ({self.mean_cv_fraction(dime, measure):.2f})'
                                        if 'CV Top-k' in mine.index else 'n/a')
            rows.append(row)
        empty = {c: '' for c in soft + ['best Top-k, tuned on test (k)', 'CV Top-k (mean k)']}
        rows.append({'DIME': 'Baseline', **{k: '–' for k in ks}, 'RDIME (kept)': f'{baseline:.4f} (1.00)',
                     DELTA: '', **empty})
        return pd.DataFrame(rows)

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

    def controls_table(self, measure: str) -> pd.DataFrame:
        """Each RDIME column against the same-budget controls for one measure (:data:`CONTROLS_NOTE`)."""
        sig = self.significance
        sig = sig[(sig['measure'] == measure) & (sig['family'] == 'controls')]
        values = self.table[self.table['measure'] == measure].set_index('system')['value']
        return pd.DataFrame({
            'DIME': sig['dime'].map(self.labels).fillna(sig['dime']),
            'system': [f'{s.split("/")[-1]} {values[s]:.4f} ({self.mean_kept(*s.split("/")):.2f})'
                       for s in sig['system']],
            'control': sig['comparison'],
            'control value': [self.control_value(o, measure) for o in sig['other']],
            'Δ mean [95 % CI]': [f'{r.mean_diff:+.4f} [{r.ci_low:+.4f}, {r.ci_high:+.4f}]' for r in sig.itertuples()],
            'p (Holm)': sig['p_holm'].map(lambda p: f'{p:.3g}'),
            'TOST p (Holm)': sig['tost_p_holm'].map(lambda p: f'{p:.3g}'),
            'verdict': [outcome(r.verdict, r.mean_diff) for r in sig.itertuples()]})

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
        hit = mine[mine['comparison'].str.startswith('best Top-k')]
        if hit.empty:
            baseline = mine[mine['comparison'] == BEST_IS_BASELINE]
            if baseline.empty:
                return None
            values = self.table.set_index(['system', 'measure'])['value']
            return f'{dime}/k=1.0', float(values['Baseline', measure])
        system = hit['other'].iloc[0]
        pool = pd.concat([self.table[['system', 'measure', 'value']],
                          self.sweep_means().assign(system=lambda f: f['dime'] + '/k=' + f['fraction'].astype(str))])
        return system, float(pool.loc[(pool['system'] == system) & (pool['measure'] == measure), 'value'].iloc[0])

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
        sig = self.significance[self.significance['family'] == 'controls'].set_index(
            ['system', 'measure', 'comparison'])
        controls = [c for c in controls if c + SAME_BUDGET in set(sig.index.get_level_values('comparison'))]
        rows = []
        for dime in self.answer_sources():
            row = {'source': self.labels[dime]}
            for measure in self.measures:
                row[f'{measure} RDIME'] = f'{values[f"{dime}/RDIME", measure]:.4f}'
                cv = values.get((f'{dime}/CV Top-k', measure))
                row[f'{measure} CV Top-k (mean k)'] = ('n/a' if cv is None else
                                                       f'{cv:.4f} ({self.mean_cv_fraction(dime, measure):.2f})')
            row['RDIME kept'] = f'{self.mean_kept(dime, "RDIME"):.2f}'
            for control in controls:
                for measure in self.measures:
                    key = (f'{dime}/RDIME', measure, control + SAME_BUDGET)
                    row[f'vs {control} ({measure})'] = (outcome(sig.loc[key, 'verdict'], sig.loc[key, 'mean_diff'])
                                                        if key in sig.index else 'n/a')
            rows.append(row)
        baseline = {f'{m} RDIME': f'{values["Baseline", m]:.4f}' for m in self.measures}
        rows.append({'source': 'Baseline', **baseline})
        return pd.DataFrame(rows).fillna('')

    def sources_plot(self, path: Union[str, Path], controls: Sequence[str] = ('random', 'magnitude')) -> None:
        """Each measure against the answer source: LLM DIME's RDIME and CV Top-k, Baseline and controls as lines."""
        values = self.table.set_index(['system', 'measure'])['value']
        dimes = self.answer_sources()
        lines = {'RDIME': [f'{d}/RDIME' for d in dimes], 'CV Top-k': [f'{d}/CV Top-k' for d in dimes]}
        lines.update({c + SAME_BUDGET: [f'{d}/RDIME:{c}' for d in dimes] for c in controls
                      if f'{dimes[0]}/RDIME:{c}' in set(self.table['system'])})
        curves = {measure: {name: [values.get((system, measure), np.nan) for system in systems]
                            for name, systems in lines.items()} for measure in self.measures}
        baseline = {m: values['Baseline', m] for m in self.measures}
        figures.sources_plot([self.labels[d] for d in dimes], curves, baseline, self._title(), path)

    def to_markdown(self) -> str:
        s = self.settings
        lines = [f'# RDIME vs Top-k on {s["collection"]}', '',
                 f'Encoder `{s["encoder"]}`, mode `{s["mode"]}`, first stage {s["first_stage"]}, '
                 f'{s["num_queries"]} queries.', '']
        shown = ''
        for measure in self.measures:
            paper = self.paper_table(measure)
            shown += ''.join(paper.to_numpy(str).ravel())
            lines += [f'## {measure}', '', paper.to_markdown(index=False, disable_numparse=True),
                      '', self.parity_table(measure).to_markdown(index=False, disable_numparse=True), '']
            controls = self.controls_table(measure)
            if len(controls):
                lines += [f'### {measure}: does the choice of dimensions matter?', '',
                          controls.to_markdown(index=False, disable_numparse=True), '', CONTROLS_NOTE, '']
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
        meanings = {'¶': 'CV Top-k', '†': 'the best Top-k tuned on the test queries', '‡': 'Baseline',
                    '§': '(soft RDIME) RDIME'}
        significant = [f'`{mark}` {meaning}' for mark, meaning in meanings.items() if mark in marks]
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
        writers = [
            ('results.csv', lambda p: self.table.to_csv(p, index=False)),
            ('perquery.csv', lambda p: self.perquery.to_csv(p, index=False)),
            ('significance.csv', lambda p: self.significance.to_csv(p, index=False)),
            ('kept_fraction.csv', lambda p: self.kept.to_csv(p, index=False)),
            ('sweep.csv', lambda p: self.sweep.to_csv(p, index=False)),
            ('cv.csv', lambda p: self.cv.to_csv(p, index=False)),
            ('seeds.csv', lambda p: self.seeds.to_csv(p, index=False)),
            ('results.json', lambda p: p.write_text(json.dumps(self._payload(), indent=2, default=_json_default),
                                                    encoding='utf-8')),
            ('results.md', lambda p: p.write_text(self.to_markdown(), encoding='utf-8')),
            ('kept_fraction.png', self.boxplot),
            ('sweep.png', self.sweep_plot),
        ]
        if len(self.answer_sources()) > 1:
            writers += [('sources.md', lambda p: p.write_text(self.sources_table().to_markdown(
                index=False, disable_numparse=True) + '\n', encoding='utf-8')), ('sources.png', self.sources_plot)]
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

    def _payload(self) -> dict:
        return {'measures': self.measures, 'labels': self.labels, 'settings': self.settings, 'notes': self.notes,
                'timings': self.timings, 'results': self.table.to_dict(orient='records'),
                'significance': self.significance.to_dict(orient='records'),
                'kept_fraction_mean': self.kept.groupby(['dime', 'threshold'])['kept_frac'].mean().reset_index()
                .to_dict(orient='records'),
                'sweep_mean': self.sweep_means().to_dict(orient='records'),
                'cv': self.cv.to_dict(orient='records')}

    def _title(self) -> str:
        return f'{Path(str(self.settings["collection"])).name}, {Path(str(self.settings["encoder"])).name}'

    def boxplot(self, path: Union[str, Path]) -> None:
        """The paper's appendix figure: RDIME's per-query kept fraction, one box per DIME, Top-k lines for reference."""
        figures.kept_boxplot(self.kept, self.labels, f'RDIME per-query kept fraction — {self._title()}', path)

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
            low, high = np.percentile(rdime, figures.SPREAD)
            for measure in self.measures:
                points.append({'dime': dime, 'measure': measure, 'system': 'RDIME', 'kept': rdime.mean(), 'low': low,
                               'high': high, 'value': values[f'{dime}/RDIME', measure]})
                if (f'{dime}/CV Top-k', measure) in values.index:
                    points.append({'dime': dime, 'measure': measure, 'system': 'CV Top-k',
                                   'kept': self.mean_cv_fraction(dime, measure),
                                   'value': values[f'{dime}/CV Top-k', measure]})
        baseline = pd.Series({m: values['Baseline', m] for m in self.measures})
        figures.sweep_plot(curves, pd.DataFrame(points), baseline, self.labels, self._title(), path)


def delta(value: float, reference: float) -> str:
    """:data:`DELTA` as printed; ``n/a`` without a (non-zero) reference."""
    return f'{100 * (value - reference) / reference:+.2f}' if np.isfinite(reference) and reference else 'n/a'


def best_text(best: Optional[Tuple[str, float]]) -> str:
    """A best Top-k tuned on the test queries (:meth:`ExperimentResult.test_best`) as a table shows it."""
    if best is None:
        return 'n/a'
    k = best[0].split('/')[1]
    return f'{best[1]:.4f} ({k}{" = Baseline" if k == "k=1.0" else ""})'


def marked_verdict(verdict: str, significant: bool, comparison: str) -> str:
    """A comparator's verdict, followed by its :data:`MARKS` mark when the test rejects equality (which an
    ``equivalent`` verdict can carry too: a small, consistent difference inside the margin)."""
    mark = next((m for label, m in MARKS.items() if comparison.startswith(label)), '') if significant else ''
    return f'{verdict} {mark}' if mark else verdict


def outcome(verdict: str, mean_diff: float) -> str:
    """A control comparison in :data:`OUTCOMES` (``different`` becomes ``better`` or ``worse`` by the sign)."""
    if verdict == 'different':
        return 'better' if mean_diff > 0 else 'worse'
    return verdict


def _json_default(value):
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    return str(value)


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
