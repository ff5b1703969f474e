"""What the runner measured, laid out as the paper's tables, and saved to disk."""
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Union

import numpy as np
import pandas as pd

from .evaluate import ALPHA

#: Significance marks of the paper table: comparison label -> mark.
MARKS = {'best Top-k': '†', 'Baseline': '‡', 'RDIME': '§'}


@dataclass
class ExperimentResult:
    """What :func:`~pyterrier_rdime.experiment.run_experiment` measured.

    Attributes:
        measures: measure names, in table order.
        table: one row per system and measure: ``dime, threshold, system, measure, value`` (mean over queries).
        perquery: ``system, qid, measure, value``.
        kept: per query and pruned system: ``dime, threshold, qid, kept_frac, fallback, mean_weight``.
        significance: ``measure, dime, system, comparison, other, p_value, p_holm, significant`` (paired test, Holm
            over the comparisons of a measure, alpha 0.05; a NaN p-value is not significant).
        labels: DIME name -> row label.
        settings: the run's settings (collection, encoder, protocol, test, ...).
        notes: what the reader must know (feedback source, relevance level, skipped rows, dropped queries).
        timings: seconds per phase.
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

    def paper_table(self, measure: str) -> pd.DataFrame:
        """The paper's layout for one measure: rows DIME, columns the Top-k fractions, RDIME (mean kept fraction),
        Δ% of RDIME over the best Top-k, then any soft-RDIME column; a Baseline row. Marks: ``*`` best Top-k,
        ``†`` significantly different from the best Top-k, ``‡`` from Baseline, ``§`` (soft RDIME) from RDIME."""
        values = self.table[self.table['measure'] == measure]
        columns = list(dict.fromkeys(values.loc[values['dime'] != '', 'threshold']))
        ks = [c for c in columns if c.startswith('k=')]
        soft = [c for c in columns if not c.startswith('k=') and c != 'RDIME']
        baseline = values.loc[values['threshold'] == 'Baseline', 'value'].iloc[0]
        rows = []
        for dime, label in self.labels.items():
            mine = values[values['dime'] == dime].set_index('threshold')['value']
            if mine.empty:
                continue
            best_k = max(ks, key=lambda k: mine[k]) if ks else None
            row = {'DIME': label}
            row.update({k: f'{mine[k]:.4f}' + ('*' if k == best_k else '') for k in ks})
            row['RDIME (kept)'] = f'{mine["RDIME"]:.4f}{self._marks(measure, dime, "RDIME")} ' \
                                  f'({self.mean_kept(dime, "RDIME"):.2f})'
            row['Δ% vs best Top-k'] = (f'{100 * (mine["RDIME"] - mine[best_k]) / mine[best_k]:+.2f}'
                                       if best_k and mine[best_k] else 'n/a')
            for column in soft:
                row[column] = f'{mine[column]:.4f}{self._marks(measure, dime, column)}'
            rows.append(row)
        rows.append({'DIME': 'Baseline', **{k: '–' for k in ks}, 'RDIME (kept)': f'{baseline:.4f} (1.00)',
                     'Δ% vs best Top-k': '', **{c: '' for c in soft}})
        return pd.DataFrame(rows)

    def mean_kept(self, dime: str, threshold: str) -> float:
        kept = self.kept
        return float(kept.loc[(kept['dime'] == dime) & (kept['threshold'] == threshold), 'kept_frac'].mean())

    def _marks(self, measure: str, dime: str, threshold: str) -> str:
        sig = self.significance
        hit = sig[(sig['measure'] == measure) & (sig['system'] == f'{dime}/{threshold}') & sig['significant']]
        return ''.join(mark for label, mark in MARKS.items() if hit['comparison'].str.startswith(label).any())

    def to_markdown(self) -> str:
        s = self.settings
        lines = [f'# RDIME vs Top-k on {s["collection"]}', '',
                 f'Encoder `{s["encoder"]}`, mode `{s["mode"]}`, first stage {s["first_stage"]}, '
                 f'{s["num_queries"]} queries.', '']
        for measure in self.measures:
            lines += [f'## {measure}', '', self.paper_table(measure).to_markdown(index=False, disable_numparse=True),
                      '']
        test = 'paired t-test' if s.get('test', 't') == 't' else 'Wilcoxon signed-rank test'
        lines += ['`*` best Top-k of the row; `†` significantly different from that best Top-k, `‡` from Baseline, '
                  f'`§` (soft RDIME) from RDIME ({test}, two-sided, Holm-corrected per measure, α = {ALPHA}); '
                  '(kept) = mean fraction of dimensions RDIME kept per query.', '']
        lines += [f'- {note}' for note in self.notes]
        return '\n'.join(lines) + '\n'

    def save(self, out_dir: Union[str, Path]) -> List[str]:
        """Writes results.csv (long table), perquery.csv, significance.csv, kept_fraction.csv, results.json,
        results.md and kept_fraction.png (boxplot of RDIME's per-query kept fraction per DIME), the plain files
        first. Returns the problems met (an output that could not be written), so that the others still are."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        problems = []
        writers = [
            ('results.csv', lambda p: self.table.to_csv(p, index=False)),
            ('perquery.csv', lambda p: self.perquery.to_csv(p, index=False)),
            ('significance.csv', lambda p: self.significance.to_csv(p, index=False)),
            ('kept_fraction.csv', lambda p: self.kept.to_csv(p, index=False)),
            ('results.json', lambda p: p.write_text(json.dumps(self._payload(), indent=2, default=_json_default),
                                                    encoding='utf-8')),
            ('results.md', lambda p: p.write_text(self.to_markdown(), encoding='utf-8')),
            ('kept_fraction.png', self.boxplot),
        ]
        for name, write in writers:
            try:
                write(out / name)
            except Exception as e:  # one output failing must not lose the others
                problems.append(f'{out / name}: {type(e).__name__}: {e}')
        return problems

    def _payload(self) -> dict:
        return {'settings': self.settings, 'notes': self.notes, 'timings': self.timings,
                'results': self.table.to_dict(orient='records'),
                'significance': self.significance.to_dict(orient='records'),
                'kept_fraction_mean': self.kept.groupby(['dime', 'threshold'])['kept_frac'].mean().reset_index()
                .to_dict(orient='records')}

    def boxplot(self, path: Union[str, Path]) -> None:
        """The paper's appendix figure: RDIME's per-query kept fraction, one box per DIME."""
        # a bare Figure: no pyplot state, so a notebook's inline backend is left alone
        from matplotlib.figure import Figure
        rdime = self.kept[self.kept['threshold'] == 'RDIME']
        names = [d for d in self.labels if d in set(rdime['dime'])]
        fig = Figure(figsize=(1.6 * max(len(names), 2) + 1, 3.5))
        ax = fig.subplots()
        ax.boxplot([rdime.loc[rdime['dime'] == d, 'kept_frac'] for d in names], showmeans=True)
        ax.set_xticks(range(1, len(names) + 1), [self.labels[d] for d in names], fontsize=8)
        ax.set_ylabel('fraction of dimensions kept')
        ax.set_ylim(0, 1.02)
        ax.set_title(f'RDIME per-query kept fraction — {Path(str(self.settings["collection"])).name}, '
                     f'{Path(str(self.settings["encoder"])).name}', fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=120)


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
