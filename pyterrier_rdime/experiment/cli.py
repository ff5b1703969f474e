"""``rdime-experiment``: the paper's comparison on a collection and encoder, with one command."""
import argparse
import logging
import os
import sys
import time
from typing import Optional, Sequence

from .runner import DEFAULT_CACHE, DEFAULT_DIMES, DEFAULT_KS, DIME_NAMES, run_experiment


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog='rdime-experiment',
        description='RDIME vs Top-k dimension pruning (and Baseline) for each DIME, evaluated with pt.Experiment; '
                    'prints the paper-style tables and saves them with per-query kept fractions and a boxplot.')
    p.add_argument('collection', nargs='?', default='irds:vaswani',
                   help='irds:<ir_datasets id> or a folder with docs.jsonl, queries.tsv, qrels (default: %(default)s)')
    p.add_argument('--encoder', default='minilm',
                   help="'minilm' (bundled, offline), 'tasb', 'contriever', 'ance', a sentence-transformers folder or "
                        'a hub id (default: %(default)s)')
    p.add_argument('--mode', choices=('rerank', 'retrieve'), default='rerank',
                   help='re-rank the first stage, or full dense retrieval over the whole corpus (default: %(default)s)')
    p.add_argument('--first-stage', default='auto',
                   help="'auto' (the collection's *.run if any, else BM25), 'bm25' (PISA), or a TREC run file")
    p.add_argument('--depth', type=int, default=100, help='re-ranking depth (default: %(default)s)')
    p.add_argument('--num-results', type=int, default=1000, help='results per query in retrieve mode')
    p.add_argument('--dimes', default=','.join(DEFAULT_DIMES),
                   help=f'comma-separated, among {",".join(DIME_NAMES)} (default: %(default)s)')
    p.add_argument('--ks', default=','.join(map(str, DEFAULT_KS)), help='Top-k fractions (default: %(default)s)')
    p.add_argument('--rel', type=int, default=None, help='relevance level of AP (default: 2 if graded, else 1)')
    p.add_argument('--measures', default='', help='extra measures, comma-separated ir_measures names (e.g. R@1000)')
    p.add_argument('--cache', default=str(DEFAULT_CACHE), help='cache folder for indexes (default: %(default)s)')
    p.add_argument('--out', default='rdime-results', help='output folder (default: %(default)s)')
    p.add_argument('--batch-size', type=int, default=32, help='encoder batch size')
    p.add_argument('--max-queries', type=int, default=None, help='only the first N queries (smoke runs)')
    p.add_argument('--llm-generator', default=None, metavar='MODEL',
                   help="generate the LLM row's answers instead of reading llm_answers.tsv: 'smollm2' (bundled "
                        'SmolLM2-135M-Instruct, offline) or a Hugging Face model name or path; cached under --cache')
    p.add_argument('--quiet', action='store_true', help='no progress bars')
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format='%(message)s')
    start = time.time()
    try:
        result = run_experiment(
            args.collection, encoder=args.encoder, mode=args.mode, first_stage=args.first_stage, depth=args.depth,
            num_results=args.num_results, dimes=[d.strip() for d in args.dimes.split(',') if d.strip()],
            ks=[float(k) for k in args.ks.split(',') if k.strip()], rel=args.rel,
            extra_measures=[m.strip() for m in args.measures.split(',') if m.strip()], cache_dir=args.cache,
            batch_size=args.batch_size, max_queries=args.max_queries, llm_generator=args.llm_generator,
            verbose=not args.quiet)
    except (ValueError, RuntimeError, ImportError) as e:
        print(f'rdime-experiment: error: {e}', file=sys.stderr)
        return 2
    result.timings['total'] = time.time() - start
    out = result.save(args.out)
    print(result.to_markdown())
    print('timings (s): ' + ', '.join(f'{k} {v:.1f}' for k, v in result.timings.items()))
    print(f'saved to {os.path.abspath(out)}')
    return 0
