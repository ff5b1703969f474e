#!/usr/bin/env python
"""What does RDIME add to a re-ranking pipeline?

Re-ranking msmarco-dl19-pool's BM25 top-100 with cached MiniLM document vectors,
``bm25 >> query_encoder >> vec_loader >> index.scorer()`` against the same with ``PrfDime()`` / ``SwcDime()`` and
``Rdime()`` inserted (also without the query encoder, the harder comparison), rounds interleaved.

Usage (from the repository root)::

    python benchmarks/run.py overhead              # ~1 min; the first run encodes the 4,297 candidates (~2.5 min)
"""
import argparse
import sys
import time
from pathlib import Path

import common  # first: it sets the environment (offline hub, temporary PyTerrier homes)
import numpy as np
import pyterrier as pt
from common import interleaved, log, table

from pyterrier_rdime.dime import PrfDime, SwcDime
from pyterrier_rdime.threshold import Rdime


def bench_overhead(args) -> dict:
    from pyterrier_rdime.experiment.collection import load_collection
    from pyterrier_rdime.experiment.dense_cache import dense_index
    from pyterrier_rdime.experiment.encoders import load_encoder
    from pyterrier_rdime.experiment.first_stage import first_stage_results

    log(f'## Pipeline overhead (re-ranking {Path(args.collection).name}, BM25 top-100)\n')
    collection = load_collection(str(args.collection))
    first, source = first_stage_results(collection, 'run', 100, args.cache)
    model = load_encoder('minilm', verbose=False)
    start = time.time()
    index = dense_index(collection, model, 'minilm', args.cache, first['docno'].unique(), verbose=False)
    log(f'document vectors: {len(index)} cached in {args.cache} ({time.time() - start:.1f} s to open or build)')
    topics = collection.topics
    bm25 = pt.Transformer.from_df(first[['qid', 'docno', 'score', 'rank']])
    encoder = model.query_encoder()
    loader, scorer = index.vec_loader(), index.scorer()
    pipes = {
        'baseline': bm25 >> encoder >> loader >> scorer,
        'PRF+RDIME': bm25 >> encoder >> loader >> PrfDime() >> Rdime() >> scorer,
        'SWC+RDIME': bm25 >> encoder >> loader >> SwcDime() >> Rdime() >> scorer,
    }
    encoded = (bm25 >> encoder)(topics)
    stages = {
        'baseline': loader >> scorer,
        'PRF+RDIME': loader >> PrfDime() >> Rdime() >> scorer,
        'SWC+RDIME': loader >> SwcDime() >> Rdime() >> scorer,
    }
    for pipe in list(pipes.values()) + list(stages.values()):  # warm up (model, memory map, caches)
        pipe(encoded if pipe in stages.values() else topics)
    full = interleaved({k: (lambda p=p: p(topics)) for k, p in pipes.items()}, args.rounds_pipeline)
    only = interleaved({k: (lambda p=p: p(encoded)) for k, p in stages.items()}, args.rounds_pipeline)
    loaded = loader(encoded)
    prf, swc = PrfDime()(loaded), SwcDime()(loaded)
    parts = interleaved({'PrfDime': lambda: PrfDime()(loaded), 'SwcDime': lambda: SwcDime()(loaded),
                         'Rdime': lambda: Rdime()(prf), 'Rdime (after SWC)': lambda: Rdime()(swc),
                         'vec_loader': lambda: loader(encoded), 'index.scorer()': lambda: scorer(Rdime()(prf))},
                        args.rounds_pipeline)
    rows, result = [], {'queries': len(topics), 'rows': len(encoded)}
    for label, times in (('full pipeline (incl. query encoding)', full), ('after the encoder (vectors cached)', only)):
        base = np.array(times['baseline'])
        for name in ('PRF+RDIME', 'SWC+RDIME'):
            ratio = np.array(times[name]) / base
            med = float(np.median(ratio))
            rows.append([label, name, f'{np.median(base) * 1000:.0f} ms', f'{np.median(times[name]) * 1000:.0f} ms',
                         f'{(med - 1) * 100:+.1f} %', f'[{(np.quantile(ratio, .25) - 1) * 100:+.1f}, '
                         f'{(np.quantile(ratio, .75) - 1) * 100:+.1f}] %'])
            result[f'{label} / {name}'] = {'baseline_s': float(np.median(base)),
                                           'with_rdime_s': float(np.median(times[name])), 'overhead': med - 1}
    log(f'{len(topics)} queries, {len(encoded)} candidate rows; medians over interleaved rounds; overhead = median '
        'of the per-round ratios (interquartile range).\n')
    log(table(rows, ['what is timed', 'stages added', 'baseline', 'with DIME+RDIME', 'overhead', 'IQR']))
    log('\nstage costs (median): ' + ', '.join(f'{k} {np.median(v) * 1000:.1f} ms' for k, v in parts.items()))
    base_full = float(np.median(full['baseline']))
    for name, dime in (('PRF+RDIME', 'PrfDime'), ('SWC+RDIME', 'SwcDime')):
        added = float(np.median(parts[dime]) + np.median(parts['Rdime']))
        log(f'{name}: the added stages take {added * 1000:.1f} ms = {100 * added / base_full:.1f} % of the full '
            f'pipeline ({base_full * 1000:.0f} ms), {added / len(topics) * 1e6:.0f} µs per query')
        result[f'added/{name}'] = {'ms': added * 1000, 'fraction_of_full_pipeline': added / base_full}
    result['stage_ms'] = {k: float(np.median(v) * 1000) for k, v in parts.items()}
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--collection', type=Path, default=common.DEFAULT_COLLECTION)
    parser.add_argument('--cache', type=Path, default=common.DEFAULT_CACHE, help='cache of document vectors')
    parser.add_argument('--rounds', type=int, default=31, help='interleaved repetitions')
    parser.add_argument('--json', type=Path)
    args = parser.parse_args(argv)
    args.rounds_pipeline = args.rounds
    with common.session(args, threads=1, note='\n') as run:  # one thread: stable ratios on a shared machine
        run['results']['overhead'] = bench_overhead(args)
    return 0


if __name__ == '__main__':
    sys.exit(main())
