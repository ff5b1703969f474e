"""``scale``: the paper's protocol at the paper's scale, rehearsed end to end through the runner.

``python benchmarks/run.py scale --encoder MODELS/all-mpnet-base-v2`` (``--docs`` default 8,841,823, MS MARCO's
passage count; ``--dims 768``; ``--docs 1000000`` for a smaller disk; ``--dims 384`` with the bundled MiniLM for a
quick run) does, each phase timed, its peak memory and disk measured:

1. ``core``: the DL19 pool's 14,581 passages encoded once (:mod:`scale_core`, cached, resumable);
2. ``index``: a FlexIndex of ``--docs`` passages, the real core among synthetic distractors (:mod:`scale_index`:
   why a Gaussian fitted to the core; cached, resumable);
3. ``run``: ``rdime-experiment <pool> --mode retrieve --index <it> --encoder <model> --retriever pruned`` with the
   default DIMEs, Top-k, RDIME, sweep, CV Top-k and controls, in this process (so that its phases, memory and every
   retrieval's path are recorded);
4. ``checks``: a sample of the queries of every retrieval call, checked against a brute-force top-k over the vectors
   (exact scores in float64);
5. ``frontier``: each system's nDCG@10 against its measured latency per query (one query at a time), as a figure.

It writes ``report.md``, ``report.json`` and ``frontier.png`` beside the runner's outputs (``--out``). Memory is
the peak of the process's anonymous resident memory (``RssAnon``: outside memory-mapped files) and of its whole
resident set (``VmRSS``, which also counts the pages of the memory-mapped index it touched), sampled every 0.2 s.
"""
import argparse
import contextlib
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import scale_core
import scale_index
from common import DEFAULT_CACHE, DEFAULT_COLLECTION, describe_machine, log, machine

MSMARCO_PASSAGES = 8_841_823
#: The share of each retrieval call's queries checked against brute force (at least 2 per call; the runner stacks
#: several systems' queries in one call), and their total cap (one brute-force pass).
CHECKED_SHARE, CHECKED_MAX = 0.05, 256
#: Extra documents of the brute-force top-k: a document of the exact top-k that float32 rounding pushed just below it
#: is still among the candidates re-scored in float64.
BRUTE_MARGIN = 20
#: Two scores closer than this (relative) are a tie within rounding: either order is exact.
TIE = 1e-6


def parse(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog='run.py scale', description=__doc__.split('\n\n')[0])
    p.add_argument('--docs', type=int, default=MSMARCO_PASSAGES, help='passages in the index (default: %(default)s)')
    p.add_argument('--dims', type=int, default=768, help='768 (mpnet, --encoder its folder) or 384 (minilm)')
    p.add_argument('--encoder', default=None, help="the model folder (all-mpnet-base-v2 for 768), or 'minilm'")
    p.add_argument('--collection', default=str(DEFAULT_COLLECTION), help='the real core and its queries and qrels')
    p.add_argument('--cache', default=str(DEFAULT_CACHE / 'scale'), help='core vectors and indexes')
    p.add_argument('--out', default='rdime-scale', help='the runner outputs and the report')
    p.add_argument('--max-queries', type=int, default=None, help='the first N queries only (smoke runs)')
    p.add_argument('--frontier-queries', type=int, default=3, help='queries timed one by one per kept fraction')
    p.add_argument('--delete-index', action='store_true', help='delete the index and its copies at the end')
    p.add_argument('--seed', type=int, default=0, help='seed of the distractors')
    p.add_argument('--retriever', choices=('pruned', 'sharded'), default='pruned',
                   help="the runner's --retriever: sharded runs the shards in Ray actors (no call is recorded or "
                        'checked in this process then: compare with a pruned run by --same-as)')
    p.add_argument('--shards', type=int, default=2, help='--retriever sharded: shards (default: %(default)s)')
    p.add_argument('--ray-address', default=None, help="--retriever sharded: the cluster ('auto', host:port)")
    p.add_argument('--same-as', default=None,
                   help="the --out of an earlier run on the same index: this run's per-query measures and kept "
                        'fractions must equal its')
    args = p.parse_args(argv)
    if args.encoder is None:
        if args.dims != 384:
            p.error(f'--dims {args.dims} needs --encoder: the folder of all-mpnet-base-v2 for 768 (the README says '
                    "how to get it offline), or --dims 384 for the bundled 'minilm'")
        args.encoder = 'minilm'
    return args


class Memory:
    """Samples this process's ``RssAnon`` and ``VmRSS`` every 0.2 s; :meth:`cut` returns the peaks since the last
    cut (GiB), so that each phase gets its own."""

    def __init__(self):
        self._peak = {'anon': 0.0, 'rss': 0.0}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def now() -> Dict[str, float]:
        fields = {}
        with open('/proc/self/status') as f:
            for line in f:
                name, _, value = line.partition(':')
                if name in ('RssAnon', 'VmRSS'):
                    fields['anon' if name == 'RssAnon' else 'rss'] = int(value.split()[0]) / 2 ** 20
        return fields

    def _run(self):
        while not self._stop.wait(0.2):
            self._sample()

    def _sample(self):
        now = self.now()
        with self._lock:
            for key, value in now.items():
                self._peak[key] = max(self._peak[key], value)

    def cut(self) -> Dict[str, float]:
        self._sample()
        with self._lock:
            peaks, self._peak = dict(self._peak), {'anon': 0.0, 'rss': 0.0}
        return peaks

    def close(self):
        self._stop.set()
        self._thread.join()


def disk_bytes(*paths: Path) -> int:
    """Bytes allocated on disk under these files or folders (sparse files count what they hold)."""
    total = 0
    for path in paths:
        if path.is_file():
            total += path.stat().st_blocks * 512
        elif path.is_dir():
            for root, _, files in os.walk(path):
                total += sum((Path(root) / name).stat().st_blocks * 512 for name in files
                             if not (Path(root) / name).is_symlink())
    return total


class Phases:
    """Wall time, peak memory and disk added of each phase, in order."""

    def __init__(self, memory: Memory):
        self.memory = memory
        self.rows: List[dict] = []

    @contextlib.contextmanager
    def __call__(self, name: str, *watched: Path):
        before = disk_bytes(*watched)
        self.memory.cut()
        start = time.perf_counter()
        yield
        row = {'phase': name, 'seconds': time.perf_counter() - start, **self.memory.cut(),
               'disk_added': disk_bytes(*watched) - before}
        self.rows.append(row)
        log(f'[{name}] {row["seconds"]:.0f} s, peak RssAnon {row["anon"]:.2f} GiB, VmRSS {row["rss"]:.2f} GiB, disk '
            f'+{row["disk_added"] / 2 ** 30:.2f} GiB')


class Recorder:
    """Every retrieval of the run: the path, time and query vectors of each :meth:`PrunedRetriever.search` call (of
    each share, where a share of the call explores a path), and a sample of its queries' results for the checks; and
    the runner's own phases with their peak memory."""

    def __init__(self, memory: Memory):
        self.memory = memory
        self.calls: List[dict] = []
        self.samples: List[tuple] = []
        self.runner_phases: Dict[str, dict] = {}
        self._rng = np.random.default_rng(0)

    @contextlib.contextmanager
    def installed(self):
        from pyterrier_rdime.experiment import runner
        from pyterrier_rdime.pruned.stage import PrunedRetriever
        search, lap = PrunedRetriever._search, runner.Stopwatch.lap
        recorder = self

        def recorded_search(retriever, query_vecs, plan, choice):  # a call, or its share on one path (planner.parts)
            start = time.perf_counter()
            scores, docids = search(retriever, query_vecs, plan, choice)
            recorder.calls.append({'path': plan.path, 'queries': len(query_vecs),
                                   'seconds': time.perf_counter() - start, 'query_vecs': np.array(query_vecs)})
            sampled = min(len(query_vecs), max(2, int(np.ceil(CHECKED_SHARE * len(query_vecs)))))
            for q in recorder._rng.choice(len(query_vecs), sampled, replace=False):
                recorder.samples.append((np.array(query_vecs[q]), np.array(docids[q]), np.array(scores[q])))
            return scores, docids

        def recorded_lap(watch, phase):
            lap(watch, phase)
            peaks = recorder.memory.cut()
            row = recorder.runner_phases.setdefault(phase, {'anon': 0.0, 'rss': 0.0})
            row.update({key: max(row[key], value) for key, value in peaks.items()})

        PrunedRetriever._search, runner.Stopwatch.lap = recorded_search, recorded_lap
        try:
            yield self
        finally:
            PrunedRetriever._search, runner.Stopwatch.lap = search, lap

    def paths(self) -> List[dict]:
        """Calls, queries and seconds per path taken."""
        rows = {}
        for call in self.calls:
            row = rows.setdefault(call['path'], {'path': call['path'], 'calls': 0, 'queries': 0, 'seconds': 0.0})
            row['calls'] += 1
            row['queries'] += call['queries']
            row['seconds'] += call['seconds']
        return list(rows.values())


def check_exact(index, samples: List[tuple], k: int) -> dict:
    """Each sampled result against the exact top-``k``: a brute-force float32 top-(k + margin) over every document
    in one pass, its candidates and the returned documents re-scored in float64; a result is exact when its scores,
    rank by rank, are the exact top-k scores (documents within ``TIE`` of each other may come in either order)."""
    from pyterrier_rdime.pruned.dense import search_dense
    from pyterrier_rdime.store import random_rows
    if not samples:  # --retriever sharded: the calls ran in the actors
        return {'checked': 0, 'wrong': 0, 'worst_gap': 0.0}
    samples = samples[:CHECKED_MAX] if len(samples) <= CHECKED_MAX else \
        [samples[i] for i in np.linspace(0, len(samples) - 1, CHECKED_MAX).astype(int)]
    queries = np.stack([q for q, _, _ in samples]).astype(np.float32)
    vecs = vecs_of(index)
    _, brute = search_dense(vecs, queries, k + BRUTE_MARGIN, rows=True, batch_size=64)
    rows = random_rows(vecs)  # scattered rows without read-ahead: the next run's int8 copy stays cached
    wrong = []
    for (query, docids, _), candidates in zip(samples, brute):
        pool = np.union1d(candidates, docids)
        exact = np.asarray(rows[pool], dtype=np.float64) @ query.astype(np.float64)
        best = np.sort(exact)[::-1][:len(docids)]
        got = np.asarray(rows[np.sort(docids)], dtype=np.float64) @ query.astype(np.float64)
        got = np.sort(got)[::-1]
        if len(got) != min(k, len(rows)) or np.any(np.abs(got - best) > TIE * np.maximum(1, np.abs(best))):
            wrong.append(float(np.max(np.abs(got - best[:len(got)]))) if len(got) == len(best) else float('inf'))
    return {'checked': len(samples), 'wrong': len(wrong), 'worst_gap': max(wrong, default=0.0)}


def frontier(index, result, calls: List[dict], per_fraction: int, out: Path) -> List[dict]:
    """Each frontier system's nDCG@10 (from the run) against its measured latency: pruned queries of the run whose
    kept fraction is nearest the system's, searched one at a time by a fresh ``PrunedRetriever`` ('auto'), and the
    Baseline's full queries on the dense path. Writes ``frontier.png``."""
    from pyterrier_rdime import PrunedRetriever
    vecs = np.concatenate([c['query_vecs'] for c in calls])
    kept = np.mean(vecs != 0, axis=1)
    retriever = PrunedRetriever(index=index, num_results=int(result.settings['num_results']))
    timed: Dict[float, tuple] = {}

    def latency(fraction: float, strategy: Optional[str] = None) -> tuple:
        key = (round(fraction, 3), strategy)
        if key not in timed:
            chosen = np.argsort(np.abs(kept - fraction), kind='stable')[:per_fraction]
            searcher = retriever if strategy is None else PrunedRetriever(index=index, strategy=strategy,
                                                                          num_results=retriever.num_results)
            seconds, paths = [], set()
            for q in chosen:
                paths.add(searcher.plan(vecs[q][None]).path)  # the path the search takes ('auto': measured)
                start = time.perf_counter()
                searcher.search(vecs[q][None])
                seconds.append(time.perf_counter() - start)
            timed[key] = (float(np.median(seconds)), float(np.mean(kept[chosen])), '/'.join(sorted(paths)))
        return timed[key]

    measure = 'nDCG@10'
    sweep = result.sweep[result.sweep['measure'] == measure].groupby(['dime', 'fraction'])['value'].mean()
    table = result.table[result.table['measure'] == measure].set_index('system')['value']
    rdime_kept = result.kept[result.kept['threshold'] == 'RDIME'].groupby('dime')['kept_frac'].mean() \
        if 'kept_frac' in result.kept.columns else {}
    points = []
    for (dime, fraction), value in sweep.items():
        seconds, measured_kept, path = latency(float(fraction))
        points.append({'system': f'{dime}/k={fraction}', 'dime': dime, 'kept': float(fraction), 'nDCG@10': value,
                       'latency_ms': 1e3 * seconds, 'path': path, 'timed_kept': measured_kept})
    for dime, fraction in dict(rdime_kept).items():
        seconds, measured_kept, path = latency(float(fraction))
        points.append({'system': f'{dime}/RDIME', 'dime': dime, 'kept': float(fraction),
                       'nDCG@10': float(table.get(f'{dime}/RDIME', np.nan)), 'latency_ms': 1e3 * seconds,
                       'path': path, 'timed_kept': measured_kept})
    seconds, _, path = latency(1.0, 'dense')
    points.append({'system': 'Baseline', 'dime': '', 'kept': 1.0, 'nDCG@10': float(table.get('Baseline', np.nan)),
                   'latency_ms': 1e3 * seconds, 'path': path, 'timed_kept': 1.0})
    _plot(points, out / 'frontier.png', len(vecs_of(index)))
    return points


def vecs_of(index) -> np.ndarray:
    return index.payload(return_docnos=False)[0]


def _plot(points: List[dict], path: Path, docs: int) -> None:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 5))
    dimes = sorted({p['dime'] for p in points if p['dime'] and not p['system'].endswith('RDIME')})
    for dime in dimes:
        line = sorted((p for p in points if p['dime'] == dime and '/k=' in p['system']), key=lambda p: p['kept'])
        ax.plot([p['latency_ms'] for p in line], [p['nDCG@10'] for p in line], marker='o', ms=4,
                linestyle='--' if dime == 'random' else '-', label=f'{dime} Top-k sweep (10 % … 100 %)')
    for p in points:
        if p['system'].endswith('RDIME'):
            ax.plot(p['latency_ms'], p['nDCG@10'], marker='*', ms=13, linestyle='none',
                    label=f'{p["dime"]} RDIME ({100 * p["kept"]:.0f} % kept)')
        elif p['system'] == 'Baseline':
            ax.plot(p['latency_ms'], p['nDCG@10'], marker='s', ms=8, color='black', linestyle='none',
                    label='dense (every dimension)')
    ax.set_xscale('log')
    # the kept fraction of a few sweep points, on top: latency is not monotone in it (the compressed path slows
    # below ~40 % kept at 8.8M), so each sweep line turns back on itself
    import matplotlib.transforms as transforms
    top = transforms.blended_transform_factory(ax.transData, ax.transAxes)
    first = sorted((p for p in points if p['dime'] == dimes[0] and '/k=' in p['system']), key=lambda p: p['kept'])
    for p in (p for p in first if round(p['kept'], 2) in (0.1, 0.2, 1.0)):
        ax.annotate(f'{100 * p["kept"]:.0f} % kept', (p['latency_ms'], 1.0), xycoords=top, xytext=(0, 2),
                    textcoords='offset points', ha='center', va='bottom', fontsize=6.5, color='dimgray')
    ax.set_title(f'{docs:,} passages: nDCG@10 against latency per query (sweep lines in order of kept fraction)',
                 fontsize=9, pad=14)
    ax.set_xlabel(f'retrieval latency per query, one query at a time (ms, log scale; {docs:,} passages)')
    ax.set_ylabel('nDCG@10 (DL19)')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7.5, loc='lower right')
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    from pyterrier_rdime.experiment.collection import load_collection
    from pyterrier_rdime.experiment.indexes import encoder_slug
    cache, out = Path(args.cache), Path(args.out)
    info = machine()
    log(f'scale: {args.docs:,} passages x {args.dims} over {args.collection} ({describe_machine(info, None)})')
    memory = Memory()
    phases = Phases(memory)
    collection = load_collection(args.collection)
    with phases('core', cache / 'core'):
        core_docnos, core_vecs = scale_core.core_vectors(args.collection, args.encoder, cache)
    if core_vecs.shape[1] != args.dims:
        log(f'--dims {args.dims}: the encoder {args.encoder} gives {core_vecs.shape[1]}-dimensional vectors')
        return 2
    folder = cache / f'{collection.slug}-{encoder_slug(args.encoder)}-{args.docs}.flex'
    with phases('index', folder):
        scale_index.build_index(folder, core_docnos, core_vecs, args.docs, args.seed)
    from pyterrier_dr import FlexIndex
    index = FlexIndex(str(folder), verbose=False)
    shutil.rmtree(out, ignore_errors=True)  # a fresh run: the grid would read a finished cell back
    recorder = Recorder(memory)
    command = [args.collection, '--mode', 'retrieve', '--index', str(folder), '--encoder', args.encoder,
               '--retriever', args.retriever, '--out', str(out), '--cache', str(cache / 'runner')]
    command += ['--max-queries', str(args.max_queries)] if args.max_queries else []
    if args.retriever == 'sharded':
        command += ['--shards', str(args.shards)] + (['--ray-address', args.ray_address] if args.ray_address else [])
    log('rdime-experiment ' + ' '.join(command))
    from pyterrier_rdime.experiment import cli
    with phases('run', folder, out, cache / 'runner'), recorder.installed():
        code = cli.main(command)
    if code != 0:
        log(f'the runner exited with {code}')
        return code
    from pyterrier_rdime.experiment.report import ExperimentResult
    cell = next(p.parent for p in out.rglob('results.json'))
    result = ExperimentResult.load(cell)
    with phases('checks'):
        checks = check_exact(index, recorder.samples, int(result.settings['num_results']))
        checks['synthetic_in_top10'] = synthetic_share(recorder.samples, args.docs, len(core_docnos))
        if args.same_as:
            checks['same_as'] = same_results(Path(args.same_as), out)
    log(f'exact: {checks["checked"] - checks["wrong"]} of {checks["checked"]} sampled results'
        + (f'; per-query results against {args.same_as}: {checks["same_as"]}' if args.same_as else ''))
    with phases('frontier'):  # from the recorded calls' queries: none in this process with --retriever sharded
        points = frontier(index, result, recorder.calls, args.frontier_queries, out) if recorder.calls else []
    sizes = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    report = {'machine': info, 'args': vars(args), 'phases': phases.rows, 'runner_phases': result.timings,
              'runner_memory': recorder.runner_phases, 'paths': recorder.paths(), 'checks': checks,
              'frontier': points, 'index_files': sizes, 'cell': str(cell)}
    (out / 'report.json').write_text(json.dumps(report, indent=2, default=float))
    (out / 'report.md').write_text(markdown(report, result), encoding='utf-8')
    log((out / 'report.md').read_text(encoding='utf-8'))
    if args.delete_index:
        shutil.rmtree(folder)
    memory.close()
    return 0 if checks['wrong'] == 0 and checks.get('same_as', {'differ': []})['differ'] == [] else 1


def synthetic_share(samples: List[tuple], docs: int, core: int, depth: int = 10) -> Optional[float]:
    """The share of the sampled results' top-``depth`` documents that are synthetic distractors (not a real passage
    of the core): how much the distractors take part in the rankings (None without samples)."""
    if not samples:
        return None
    real = scale_index.core_positions(docs, core)
    top = np.concatenate([np.asarray(docids)[:depth] for _, docids, _ in samples])
    return float(np.mean(~np.isin(top, real)))


def same_results(before: Path, after: Path) -> dict:
    """The per-query measures and kept fractions of every system (``perquery.csv``, ``kept_fraction.csv``) of the
    cell in ``before`` against this run's in ``after``: equal rankings give equal measures, query by query;
    ``{'files': n, 'differ': [names]}``."""
    import pandas as pd
    differ, files = [], 0
    for name in ('perquery.csv', 'kept_fraction.csv'):
        old, new = (pd.read_csv(next(root.rglob(name))) for root in (before, after))
        files += 1
        if not (old.shape == new.shape and old.drop(columns=old.select_dtypes('number').columns).equals(
                new.drop(columns=new.select_dtypes('number').columns))
                and np.allclose(old.select_dtypes('number'), new.select_dtypes('number'), rtol=0, atol=1e-9,
                                equal_nan=True)):
            differ.append(name)
    return {'files': files, 'differ': differ}


def synthetic_line(report: dict) -> str:
    share = report['checks'].get('synthetic_in_top10')
    return '' if share is None else (f' Synthetic distractors are {share:.1%} of the sampled results\' top-10 '
                                     'documents (the rest are real passages of the core).')


def same_as_line(report: dict) -> str:
    if not report['args'].get('same_as'):
        return ''
    differ = report['checks']['same_as']['differ']
    return (f' Per-query measures and kept fractions against {report["args"]["same_as"]}: '
            + ('equal.' if not differ else f'differ in {", ".join(differ)}.'))


def markdown(report: dict, result) -> str:
    gib = 2 ** 30
    lines = [f'# Collection-scale rehearsal: {report["args"]["docs"]:,} passages x {report["args"]["dims"]}', '',
             f'{describe_machine(report["machine"], None)}.', '',
             '| phase | wall | peak RssAnon | peak VmRSS | disk added |', '|---|---:|---:|---:|---:|']
    for row in report['phases']:
        lines.append(f'| {row["phase"]} | {row["seconds"]:.0f} s | {row["anon"]:.2f} GiB | {row["rss"]:.2f} GiB | '
                     f'{row["disk_added"] / gib:.2f} GiB |')
    lines += ['', "The runner's phases:", '', '| phase | wall | peak RssAnon | peak VmRSS |', '|---|---:|---:|---:|']
    for phase, seconds in report['runner_phases'].items():
        memory = report['runner_memory'].get(phase)
        peaks = f'{memory["anon"]:.2f} GiB | {memory["rss"]:.2f} GiB' if memory else '(the phases above) | '
        lines.append(f'| {phase} | {seconds:.0f} s | {peaks} |')
    lines += ['', 'Retrieval calls by path:', '', '| path | calls | queries | seconds | per query |',
              '|---|---:|---:|---:|---:|']
    for row in report['paths']:
        lines.append(f'| {row["path"]} | {row["calls"]} | {row["queries"]} | {row["seconds"]:.1f} | '
                     f'{1e3 * row["seconds"] / max(1, row["queries"]):.0f} ms |')
    files = report['index_files']
    vecs = files.get('vecs.f4', 0)
    lines += ['', 'Index files: ' + ', '.join(f'{name} {size / gib:.2f} GiB' for name, size in files.items()
                                              if size > 2 ** 20)
              + (f' (derived files: {sum(s for n, s in files.items() if n.startswith("rdime.")) / max(1, vecs):.0%}'
                 ' of vecs.f4)' if vecs else ''), '',
              f'Exactness: {report["checks"]["checked"] - report["checks"]["wrong"]} of '
              f'{report["checks"]["checked"]} sampled results equal the brute-force exact top-k.'
              + same_as_line(report) + synthetic_line(report), '',
              '| system | kept | nDCG@10 | latency per query | path |', '|---|---:|---:|---:|---|']
    for p in sorted(report['frontier'], key=lambda p: (p['dime'], p['kept'])):
        lines.append(f'| {p["system"]} | {p["kept"]:.2f} | {p["nDCG@10"]:.4f} | {p["latency_ms"]:.0f} ms | '
                     f'{p["path"]} |')
    lines += ['', "The runner's table:", '', result.to_markdown()]
    return '\n'.join(lines) + '\n'


if __name__ == '__main__':
    sys.exit(main())
