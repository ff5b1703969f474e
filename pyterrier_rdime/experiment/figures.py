"""The runner's figures, drawn on bare matplotlib Figures (no pyplot state, so a notebook's backend is left alone)."""
from pathlib import Path
from typing import Dict, List, Sequence, Tuple, Union

import numpy as np
import pandas as pd

#: Percentiles of the per-query kept fraction that RDIME's bar spans in the sweep plot (the inter-quartile range).
SPREAD = (25, 75)
#: Line styles of the Top-k reference lines, one per Top-k column.
TOPK_STYLES = (':', '--', '-.', (0, (6, 1.5)), (0, (3, 1, 1, 1, 1, 1)))
#: Panels per row of the grid's kept-fraction Figure (more wrap onto the next row).
PANELS_PER_ROW = 3
MEDIAN_COLOUR = 'tab:orange'
#: Space (inches) around a figure's legend.
LEGEND_GAP = 0.15


def _colours(names: Sequence[str]) -> Dict[str, tuple]:
    from matplotlib import colormaps
    palette = colormaps['tab10']
    return {name: palette(i % 10) for i, name in enumerate(names)}


def _topk_lines(ax, kept: pd.DataFrame) -> None:
    """A horizontal line at the kept fraction of each Top-k column (:data:`TOPK_STYLES`)."""
    topk = kept[kept['threshold'].str.startswith('k=')].groupby('threshold', sort=False)['kept_frac'].mean()
    for i, (threshold, fraction) in enumerate(topk.items()):
        ax.axhline(fraction, color='dimgrey', linestyle=TOPK_STYLES[i % len(TOPK_STYLES)], linewidth=1,
                   label=f'Top-k {threshold}')


def _boxes(ax, kept: pd.DataFrame, labels: Dict[str, str]) -> None:
    rdime = kept[kept['threshold'] == 'RDIME']
    names = [d for d in labels if d in set(rdime['dime'])]
    ax.boxplot([rdime.loc[rdime['dime'] == d, 'kept_frac'] for d in names], showmeans=True,
               meanprops={'marker': '^', 'markerfacecolor': 'tab:green', 'markeredgecolor': 'tab:green'},
               medianprops={'color': MEDIAN_COLOUR})
    ax.set_xticks(range(1, len(names) + 1), [labels[d] for d in names], fontsize=7)
    ax.set_ylim(0, 1.02)
    _topk_lines(ax, kept)


def _legend_inches(fig, legend) -> Tuple[float, float]:
    """The drawn width and height of ``legend`` in inches (drawn on an Agg canvas: a bare Figure has no renderer)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    box = legend.get_window_extent(fig.canvas.get_renderer())
    return box.width / fig.dpi, box.height / fig.dpi


def _box_handles() -> list:
    """Legend entries of a box's marks: its median line and its mean triangle."""
    from matplotlib.lines import Line2D
    return [Line2D([], [], color=MEDIAN_COLOUR, label='median'),
            Line2D([], [], marker='^', color='tab:green', linestyle='none', label='mean')]


def kept_boxplot(kept: pd.DataFrame, labels: Dict[str, str], title: str, path: Union[str, Path]) -> None:
    """RDIME's per-query kept fraction, one box per DIME, with each Top-k's kept fraction as a line."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(1.6 * max(len(labels), 2) + 2.5, 3.5))
    ax = fig.subplots()
    _boxes(ax, kept, labels)
    ax.set_ylabel('fraction of dimensions kept')
    ax.set_title(title, fontsize=9)
    handles, names = ax.get_legend_handles_labels()
    ax.legend(_box_handles() + handles, ['median', 'mean'] + names, fontsize=7, loc='center left',
              bbox_to_anchor=(1, 0.5), handlelength=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def sweep_plot(curves: pd.DataFrame, points: pd.DataFrame, baseline: pd.Series, labels: Dict[str, str], title: str,
               path: Union[str, Path]):
    """Each measure against the kept fraction, per DIME: the Top-k curve, RDIME (with its :data:`SPREAD`), CV Top-k,
    the random selection, and Baseline as a line.

    Args:
        curves: ``dime, fraction, measure, value`` (mean over queries); dime ``random``: the random selection.
        points: ``dime, measure, system ('RDIME' or 'CV Top-k'), kept, low, high, value``.
        baseline: measure -> Baseline's value.

    Returns the Figure (saved to ``path``).
    """
    from matplotlib.figure import Figure
    measures = list(baseline.index)
    colours = _colours(list(labels))
    fig = Figure(figsize=(4.2 * len(measures) + 2.2, 3.6))
    axes = np.atleast_1d(fig.subplots(1, len(measures)))
    for ax, measure in zip(axes, measures):
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
        ax.axhline(baseline[measure], color='black', linestyle='--', linewidth=1, label='Baseline (all dimensions)')
        ax.set_xlabel('fraction of dimensions kept')
        ax.set_ylabel(measure)
        ax.set_xlim(0, 1.05)
        ax.grid(alpha=0.3)
    handles, names = axes[-1].get_legend_handles_labels()
    legend = fig.legend(handles, names, fontsize=7, loc='center right')
    fig.suptitle(title + f' — RDIME bar: per-query kept fraction, percentiles {SPREAD[0]}–{SPREAD[1]}', fontsize=9)
    # the panels end where the legend begins, with a gap: its width depends on the DIMEs' names, so it is measured
    width, _ = _legend_inches(fig, legend)
    fig.tight_layout(rect=(0, 0, 1 - (width + LEGEND_GAP) / fig.get_figwidth(), 1))
    fig.savefig(path, dpi=120)
    return fig


#: Line styles of the sources plot.
SOURCE_STYLES = {'RDIME': ('o-', 'tab:blue'), 'CV Top-k': ('x-', 'tab:orange'),
                 'random (same budget)': ('.:', 'grey'), 'magnitude (same budget)': ('s:', 'tab:green')}


def sources_plot(sources: List[str], curves: Dict[str, Dict[str, List[float]]], baseline: Dict[str, float],
                 title: str, path: Union[str, Path]):
    """Each measure against the LLM answer source: LLM DIME's RDIME, CV Top-k and controls, and Baseline.

    Args:
        sources: the x-axis labels, in order.
        curves: measure -> line name (a key of :data:`SOURCE_STYLES`) -> value per source.
        baseline: measure -> Baseline's value.

    Returns the Figure (saved to ``path``).
    """
    from matplotlib.figure import Figure
    measures = list(baseline)
    fig = Figure(figsize=(max(6.0, 0.55 * len(sources) + 2.5) * len(measures), 4.2))
    axes = np.atleast_1d(fig.subplots(1, len(measures)))
    x = np.arange(len(sources))
    for ax, measure in zip(axes, measures):
        for name, values in curves[measure].items():
            style, colour = SOURCE_STYLES.get(name, ('.-', None))
            ax.plot(x, values, style, color=colour, linewidth=1, markersize=5, label=name)
        ax.axhline(baseline[measure], color='black', linestyle='--', linewidth=1, label='Baseline (all dimensions)')
        ax.set_xticks(x, sources, rotation=45, ha='right', fontsize=7)
        ax.set_ylabel(measure)
        ax.grid(alpha=0.3)
    handles, names = axes[0].get_legend_handles_labels()
    legend = fig.legend(handles, names, fontsize=7, loc='center right')
    fig.suptitle(f'LLM DIME by answer source — {title}', fontsize=9)
    width, _ = _legend_inches(fig, legend)  # the panels end where the legend begins
    fig.tight_layout(rect=(0, 0, 1 - (width + LEGEND_GAP) / fig.get_figwidth(), 1))
    fig.savefig(path, dpi=120)
    return fig


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
    for ax, (collection, encoder, kept, labels) in zip(axes.flat, ordered):
        _boxes(ax, kept, labels)
        ax.set_title(f'{collection} — {encoder}', fontsize=8)
    for row in axes:
        row[0].set_ylabel('fraction kept')
    handles, names = axes.flat[0].get_legend_handles_labels()
    entries = (_box_handles() + handles, ['median', 'mean'] + names)
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
