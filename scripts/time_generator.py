"""Times LlmGenerator (the default SmolLM2, no cache) on the first queries of a ``qid<TAB>query`` file: the load, then
the seconds per answer and the tokens per second, and prints each answer's start. llm.rst's speed figures come from
it, e.g. ``python scripts/time_generator.py DATA/vaswani/queries.tsv --threads 1 --batch-size 8``."""
import argparse
import time

import pandas as pd

from pyterrier_rdime import LlmGenerator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('queries', help='a qid<TAB>query file, e.g. DATA/vaswani/queries.tsv')
    parser.add_argument('--count', type=int, default=4, help='the first N queries (default: %(default)s)')
    parser.add_argument('--threads', type=int, default=1, help='torch CPU threads (default: %(default)s)')
    parser.add_argument('--max-new-tokens', type=int, default=128, help='(default: %(default)s)')
    parser.add_argument('--batch-size', type=int, default=8, help='(default: %(default)s)')
    args = parser.parse_args()
    queries = pd.read_csv(args.queries, sep='\t', names=['qid', 'query'], dtype=str).head(args.count)['query']
    generator = LlmGenerator(cache=False, threads=args.threads, max_new_tokens=args.max_new_tokens,
                             batch_size=args.batch_size, verbose=False)
    start = time.perf_counter()
    tokenizer = generator._loaded().tokenizer
    loaded = time.perf_counter() - start
    start = time.perf_counter()
    answers = generator.generate(queries)
    seconds = time.perf_counter() - start
    tokens = [len(tokenizer(answer)['input_ids']) for answer in answers.values()]
    print(f'threads {args.threads}, batch {args.batch_size}, max_new_tokens {args.max_new_tokens}: '
          f'load {loaded:.1f} s, {seconds / len(answers):.1f} s per answer, {sum(tokens) / seconds:.1f} tokens/s '
          f'(answers of {tokens} tokens)')
    for query, answer in answers.items():
        print(f'{query}\n  -> {answer[:200]}')


if __name__ == '__main__':
    main()
