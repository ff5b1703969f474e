"""The paper's comparison as one call: Baseline, and for each DIME each Top-k and RDIME, scored as pt.Experiment
scores them, in the reference implementations' protocol (the one-cell pipeline the CLI and the grid share), and the
run's protocol options (:class:`Options`), checked when built."""
import functools
import re
import time
import warnings
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import ir_measures
import pandas as pd

from .._config import check_bool, check_choice, check_fraction, check_int, default_cache_dir, reject
from ..llm import LlmGenerator
from . import indexes, parity, systems
from .collection import Collection, load_collection, read_trec_run
from .encoders import DEFAULT_ENCODER, AnswerVectors, load_encoder
from .indexes import check_docnos_in_index, check_index_matches, existing_index, first_stage_results, retriever
from .report import SEED_COLUMNS, ExperimentResult, kept_fractions
from .systems import NEEDS_ANSWERS, Grid, answer_sources, rerank_grid, retrieve_grid, run_stage, thresholds

DEFAULT_MEASURES = ('nDCG@10', 'AP')
#: Added by default in retrieve mode, where the ranking is deep enough (as the author's dime-library reports them).
DEEP_MEASURES = ('R@1000', 'RR@10')
#: Binary measures whose relevance level ``--rel`` sets.
BINARY = ('AP', 'R', 'RR', 'P', 'Success')
#: The name :class:`Options`' errors begin with: the command's.
STAGE = 'rdime-experiment'


@dataclass(frozen=True)
class Options:
    """The run's protocol options, checked when built: each error names the option (as the command spells it) and
    the fix. The command builds them from its parser; the grid's cell key and the recorded settings derive from the
    fields (:data:`OPTION_NAMES`). Lists become tuples without repeats, fractions floats."""
    mode: str = 'rerank'
    first_stage: str = 'auto'
    feedback: str = 'dense'
    depth: int = 100
    num_results: int = 1000
    dimes: Tuple[str, ...] = ('prf', 'swc', 'llm')
    ks: Tuple[float, ...] = (0.4, 0.6, 0.8)
    modulators: Tuple[str, ...] = ()
    masses: Tuple[float, ...] = ()
    controls: Tuple[str, ...] = systems.DEFAULT_CONTROLS
    control_seeds: int = 10
    test: str = 't'
    alternative: str = 'two-sided'
    margin: float = parity.DEFAULT_MARGIN
    sweep: bool = True
    folds: int = parity.CV_FOLDS
    retriever: str = 'numpy'
    shards: int = 1
    max_queries: Optional[int] = None

    def __post_init__(self):
        object.__setattr__(self, 'first_stage', str(self.first_stage))
        object.__setattr__(self, 'ks', tuple(self.ks))
        for name in ('dimes', 'modulators', 'masses', 'controls'):
            object.__setattr__(self, name, tuple(dict.fromkeys(getattr(self, name))))
        if not self.dimes:
            raise ValueError(f'{STAGE}: --dimes is empty; choose among {", ".join(systems.DIME_NAMES)}')
        for option, values, choices in (('--mode', [self.mode], ('rerank', 'retrieve')),
                                        ('--feedback', [self.feedback], systems.FEEDBACKS),
                                        ('--retriever', [self.retriever], tuple(indexes.RETRIEVERS)),
                                        ('--test', [self.test], parity.TESTS),
                                        ('--alternative', [self.alternative], parity.ALTERNATIVES),
                                        ('--dimes', self.dimes, systems.DIME_NAMES),
                                        ('--modulators', self.modulators, tuple(systems.MODULATORS)),
                                        ('--controls', self.controls, systems.CONTROLS)):
            for value in values:
                check_choice(STAGE, option, value, choices)
        for mass in self.masses:
            check_fraction(STAGE, '--score-mass', mass, hint='shares of the positive importance mass, e.g. 0.8')
        for k in self.ks:
            check_fraction(STAGE, '--ks', k, hint='Top-k values are fractions of the dimensions, e.g. 0.4,0.6,0.8')
        for option, value in (('--control-seeds', self.control_seeds), ('--depth', self.depth),
                              ('--num-results', self.num_results), ('--shards', self.shards),
                              ('--max-queries', 1 if self.max_queries is None else self.max_queries)):
            check_int(STAGE, option, value, 1)
        check_int(STAGE, '--folds', self.folds, 2, 'cross-validation needs at least 2 folds of queries')
        check_bool(STAGE, '--sweep', self.sweep)
        if isinstance(self.margin, bool) or not isinstance(self.margin, (int, float)) or not 0 < self.margin < 1:
            reject(STAGE, '--margin', 'a fraction of the Baseline in (0, 1)', self.margin,
                   f'e.g. {parity.DEFAULT_MARGIN} (±{100 * parity.DEFAULT_MARGIN:g} % of the Baseline)')
        if self.mode == 'retrieve' and self.feedback == 'first-stage':
            raise ValueError(f'{STAGE}: --feedback first-stage applies to --mode rerank; --mode retrieve has no first '
                             'stage (its feedback documents come from the dense ranking): leave --feedback out')
        if self.mode == 'rerank' and self.retriever != 'numpy':
            raise ValueError(f'{STAGE}: --retriever {self.retriever!r} applies to --mode retrieve; re-ranking '
                             're-scores the candidates with the vectors of the index')
        if self.first_stage not in ('auto', 'bm25'):
            if not Path(self.first_stage).is_file():
                raise ValueError(f"{STAGE}: --first-stage {self.first_stage!r} is not 'auto', 'bm25' or an existing "
                                 'TREC run file')
            read_trec_run(self.first_stage)  # a malformed line fails now, naming the file and line
        if self.retriever.startswith('faiss-'):
            indexes.require_faiss()
        if self.shards != 1 and self.retriever != 'sharded':
            raise ValueError(f'{STAGE}: --shards applies to --retriever sharded; pass both, or leave --shards out')
        for name in ('ks', 'masses'):  # checked as given (a bool is no fraction), kept as floats
            object.__setattr__(self, name, tuple(float(value) for value in getattr(self, name)))

    def check_documents(self, num_docs: Optional[int], source: str) -> None:
        """``--shards`` against the ``num_docs`` of ``source`` (``None``: unknown), checked before any work."""
        if self.retriever == 'sharded' and num_docs is not None and self.shards > num_docs:
            raise ValueError(f'{STAGE}: --shards {self.shards} is more than the {num_docs} documents of {source}, and '
                             f'each shard holds at least one; pass --shards {num_docs} or fewer')

    @property
    def fractions(self) -> List[float]:
        """The Top-k sweep's fractions (none without ``sweep``)."""
        return list(parity.SWEEP) if self.sweep else []

    def settings(self) -> Dict[str, object]:
        """The options as recorded in a result and keyed in a grid cell (lists as lists)."""
        return {name: list(value) if isinstance(value, tuple) else value for name, value in asdict(self).items()}


#: The options' names: the keyword arguments of :func:`run_experiment` that :class:`Options` checks.
OPTION_NAMES = tuple(f.name for f in fields(Options))


class Stopwatch:
    """Seconds per phase of a run: each :meth:`lap` charges the time since the previous lap to its phase."""

    def __init__(self):
        self.timings: Dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.timings[phase] = self.timings.get(phase, 0.0) + now - self._last
        self._last = now


def run_experiment(
    collection: Union[str, Path, Collection],
    *,
    encoder: str = DEFAULT_ENCODER,
    rel: Optional[int] = None,
    measures: Optional[Sequence[str]] = None,
    index: Optional[str] = None,
    answers: Optional[Union[str, Path]] = None,
    cache_dir: Optional[Union[str, Path]] = None,
    batch_size: int = 32,
    llm_generator: Optional[str] = None,
    workers: int = 1,
    parallel_backend: str = 'joblib',
    verbose: bool = True,
    progress: Optional[systems.SystemRecords] = None,
    **option_values,
) -> ExperimentResult:
    """Run the paper's grid on a collection, in the reference implementations' protocol.

    The protocol options (the fields of :class:`Options`) come by keyword; each is the command's option of the same
    name (pt_docs/experiment.rst).

    Args:
        collection: ``irds:<id>``, a collection folder, or a loaded :class:`Collection`.
        encoder: ``'minilm'`` (bundled), ``'tasb'``, ``'contriever'``, ``'ance'``, a folder or a hub id.
        rel: relevance level of the binary measures (AP, R, RR); default: each measure's own (1, as the references).
        measures: ir_measures names; default ``nDCG@10, AP``, plus ``R@1000, RR@10`` in retrieve mode.
        index: an existing FlexIndex (folder or Hugging Face repository) instead of encoding the corpus.
        answers: LLM answers (default: the collection's): comma-separated files or published names, one LLM DIME
            each (:func:`~.systems.answer_sources`).
        cache_dir: indexes and generated answers (default: ``$PYTERRIER_RDIME_CACHE``, else the XDG cache folder).
        batch_size: encoder batch size.
        llm_generator: generate the LLM answers with :class:`LlmGenerator` (``'smollm2'`` or a hub model).
        workers, parallel_backend: processes for the query-level work (``'joblib'`` or ``'ray'``).
        progress: where each finished system is recorded for a re-run (:class:`~.systems.SystemRecords`).
    """
    unknown = sorted(set(option_values) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f'run_experiment: unknown argument {unknown[0]!r}; the options are {", ".join(OPTION_NAMES)}')
    options = Options(**option_values)
    if measures is None:
        measures = DEFAULT_MEASURES + (DEEP_MEASURES if options.mode == 'retrieve' else ())
    measure_objects = parse_measures(measures, rel)
    depth = options.depth if options.mode == 'rerank' else options.num_results  # of the ranking measured
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    watch = Stopwatch()

    if not isinstance(collection, Collection):
        collection = load_collection(collection)
    check_rel(rel, collection.qrels)
    external = existing_index(index) if index is not None else None  # the one check of --index, before any model
    if external is None:
        options.check_documents(collection.num_docs, f'collection {collection.name!r}')
    else:
        options.check_documents(len(external), f'--index {index}')
    topics = collection.topics if options.max_queries is None else collection.topics.head(options.max_queries)
    notes = _measure_notes(measure_objects, rel, depth)
    if collection.dropped_queries:
        notes.append(f'{len(collection.dropped_queries)} queries without judgments were left out.')
    llm_answers = answer_sources(answers, collection, cache_dir)
    model = load_encoder(encoder, batch_size=batch_size)  # the documents' bar is the runner's own
    if external is not None:
        check_index_matches(external, model.encode_queries(['dimension check']).shape[1], encoder, index)
    if llm_generator is not None:
        watch.lap('load')
        generated = LlmGenerator(model=None if llm_generator == 'smollm2' else llm_generator, cache=cache_dir,
                                 verbose=verbose)(topics)
        generated = dict(zip(generated['qid'], generated['query_answer']))
        watch.lap('generation')
        # alone, the generated answers replace the collection's; beside --answers, they are one more source, named
        # by the generator (or its path's last part)
        name = Path(llm_generator).stem if Path(llm_generator).exists() else llm_generator.rsplit('/', 1)[-1]
        llm_answers = {**llm_answers, re.sub(r'[^\w.+-]', '_', name): generated} if answers is not None else {
            '': generated}
        options = replace(options, dimes=options.dimes + ('llm',))
        notes.append(f'LLM DIME answers generated by {llm_generator}'
                     + (', not read from a file.' if answers is None else f' beside those of --answers {answers}.'))
    notes += _unanswered_notes(llm_answers, topics) if set(options.dimes) & set(NEEDS_ANSWERS) else []
    skipped = [d for d in options.dimes if d in NEEDS_ANSWERS] if not llm_answers else []
    if skipped:
        names = {'llm': 'LLM', 'llm-eclipse': 'LLM Eclipse'}
        notes.append(f'{" and ".join(names[d] for d in skipped)} DIME skipped: no LLM answers (no llm_answers.tsv in '
                     'the collection, no --answers).')
        options = replace(options, dimes=tuple(d for d in options.dimes if d not in skipped))
    watch.lap('load')

    stages = thresholds(options.ks, options.modulators, options.masses)
    grid = build_systems(collection, topics, model, encoder, external, index, llm_answers, options, stages, cache_dir,
                         batch_size, functools.partial(run_stage, workers=workers, backend=parallel_backend), verbose,
                         watch, progress)
    watch.lap('systems')

    perquery = evaluate(grid.frames, topics, collection.qrels, measure_objects)
    perquery, seeds = _seeded(perquery, grid, topics, collection.qrels, measure_objects)
    # the queries run only, as pt.Experiment (ir_measures scores a query of the qrels missing from a run as 0)
    swept = parity.evaluate_runs(grid.sweep, collection.qrels[collection.qrels['qid'].isin(set(topics['qid']))],
                                 measure_objects)
    # one pool of Top-k points: the table's columns as pt.Experiment measured them, and the sweep's other fractions
    pool = pd.concat([perquery[perquery['system'].str.contains('/k=', regex=False)],
                      swept.loc[~swept['system'].isin(set(perquery['system'])), list(perquery.columns)]],
                     ignore_index=True)
    dimes = list(grid.labels)  # each LLM DIME once per answer source
    cv_perquery, cv = parity.cv_systems(pool, dimes, options.folds, parity.CV_SEED)
    if pool.empty:
        notes.append("No Top-k column and no sweep (--ks '' --no-sweep): RDIME is compared with Baseline only.")
    elif cv.empty:
        notes.append('CV Top-k left out: it needs at least 2 queries.')
    perquery = pd.concat([perquery, cv_perquery.astype({'value': float})], ignore_index=True)
    aggregate = _means(perquery)
    measure_names = [str(m) for m in measure_objects]
    columns = [c for c in stages if not c.startswith('k=')]
    everything = pd.concat([perquery, pool], ignore_index=True).drop_duplicates(['system', 'qid', 'measure'])
    significance = parity.significance(_means(everything), everything, dimes, columns, options.test,
                                       options.alternative, options.margin)
    parts = aggregate['system'].str.split('/')
    table = aggregate.assign(dime=parts.str[0].where(parts.str.len() > 1, ''), threshold=parts.str[-1])[
        ['dime', 'threshold', 'system', 'measure', 'value']]
    kept = pd.concat([kept_fractions(frame, *name.split('/')) for name, frame in grid.frames.items() if '/' in name],
                     ignore_index=True)
    notes += grid.notes
    fallbacks = int(kept.loc[kept['threshold'] == 'RDIME', 'fallback'].sum())
    if fallbacks:
        notes.append(f'RDIME kept no dimension for {fallbacks} (DIME, query) pairs; those queries used the unpruned '
                     "query (fallback='full').")
    settings = {'collection': collection.name, 'encoder': encoder, **options.settings(),
                'first_stage': grid.source, 'feedback': options.feedback if options.mode == 'rerank' else 'dense',
                'depth': depth, 'retriever': options.retriever if options.mode == 'retrieve' else None,
                'sweep': options.fractions, 'cv_seed': parity.CV_SEED, 'num_queries': int(topics['qid'].nunique()),
                'measures': measure_names}
    watch.lap('evaluation')
    return ExperimentResult(measure_names, table, perquery, kept, significance, grid.labels, settings, notes,
                            {**watch.timings, 'total': sum(watch.timings.values())}, swept, cv, seeds)


def parse_measures(names: Sequence[str], rel: Optional[int] = None) -> list:
    """ir_measures objects of ``names``, with ``rel`` set on the binary measures; a bad name, cutoff or relevance
    level is a ValueError naming it (ir_measures accepts ``nDCG@0``, then trec_eval fails after the run)."""
    if not names:
        raise ValueError('--measures: no measure given; for example --measures nDCG@10,AP')
    measures = []
    for name in names:
        try:
            measure = ir_measures.parse_measure(name)
        except Exception:
            raise ValueError(f'--measures: {name!r} is not an ir_measures measure; for example nDCG@10, AP, R@1000, '
                             'RR@10, P@10 (see https://ir-measur.es/)') from None
        if rel is not None and measure.NAME in BINARY:
            measure = measure(rel=rel)
        for param in ('cutoff', 'rel'):
            value = measure.params.get(param)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f'--measures: {measure} has {param} {value!r}; it must be an integer >= 1, e.g. '
                                 'nDCG@10, AP(rel=2)')
        measures.append(measure)
    return measures


def check_rel(rel: Optional[int], qrels: pd.DataFrame) -> None:
    """Fails when no judgment reaches the relevance level ``rel`` (every binary measure would be 0)."""
    if rel is not None and not (qrels['label'] >= rel).any():
        raise ValueError(f'--rel {rel}: no judgment has a label >= {rel} (the highest is {qrels["label"].max()}), '
                         'so every binary measure would be 0; use a level the qrels reach')


def evaluate(frames: Dict[str, pd.DataFrame], topics: pd.DataFrame, qrels: pd.DataFrame,
             measures: list) -> pd.DataFrame:
    """``system, qid, measure, value``: the per-query frame ``pt.Experiment(..., perquery=True)`` gives for the systems'
    result frames (the qrels of the topics' queries only; NaN for a topic without qrels; sorted by system and qid),
    with one ir_measures evaluator for every system and each run handed over as a dict (:func:`.parity.run_dict`):
    pt.Experiment builds both again per system, most of its time on a grid of many systems."""
    qids = list(dict.fromkeys(topics['qid']))
    qrels = qrels[qrels['qid'].isin(set(qids))]
    if qrels.empty:
        raise ValueError(f'none of the {len(qids)} queries has qrels: check that the topics and qrels belong together')
    evaluator = parity.qrels_evaluator(qrels, measures)
    names, rows, unjudged = [str(m) for m in measures], [], 0
    for system, frame in frames.items():
        if frame.empty:
            raise ValueError(f'{system}: no results for any of the {len(qids)} queries, nothing to evaluate')
        values = {}  # qid -> measure -> value, as ir_measures yields them
        for qid, measure, value in parity.measured(evaluator, frame):
            values.setdefault(qid, {})[measure] = value
        missing = [qid for qid in qids if qid not in values]
        unjudged = max(unjudged, len(missing))
        values.update((qid, dict.fromkeys(names, float('nan'))) for qid in missing)
        rows += [(system, qid, name, value) for qid, byname in values.items() for name, value in byname.items()]
    if unjudged:
        warnings.warn(f'{unjudged} topic(s) not found in qrels: their measures are NaN and left out of the means')
    return pd.DataFrame(rows, columns=['system', 'qid', 'measure', 'value']).sort_values(['system', 'qid'])


def _seeded(perquery: pd.DataFrame, grid: Grid, topics: pd.DataFrame, qrels: pd.DataFrame, measures: list):
    """``perquery`` with the seeded systems' mean over the seeds per query added, and each seed's mean (``seeds``)."""
    if not grid.seeded:
        return perquery, pd.DataFrame(columns=SEED_COLUMNS)
    frames = {f'{system}@{seed}': frame for (system, seed), frame in grid.seeded.items()}
    seeded = evaluate(frames, topics, qrels, measures)
    seeded[['system', 'seed']] = seeded['system'].str.rsplit('@', n=1, expand=True)
    seeds = seeded.groupby(['system', 'seed', 'measure'], sort=False)['value'].mean().reset_index()
    mean = seeded.groupby(['system', 'qid', 'measure'], sort=False)['value'].mean().reset_index()
    return pd.concat([perquery, mean], ignore_index=True), seeds.astype({'seed': int})[SEED_COLUMNS]


def _means(perquery: pd.DataFrame) -> pd.DataFrame:
    """``system, measure, value``: each system's mean over the queries, in order of appearance."""
    return perquery.groupby(['system', 'measure'], sort=False)['value'].mean().reset_index()


def build_systems(collection, topics, model, encoder, external, index_spec, answers, options: Options, stages,
                  cache_dir, batch_size, run: Callable, verbose, watch: Stopwatch,
                  records: Optional[systems.SystemRecords] = None) -> Grid:
    """The first stage (rerank mode), the dense index, and every system's result frame."""
    judged = _judged_documents(collection, topics, external) if 'oracle' in options.dimes else []
    watch.lap('load')
    needed = None
    if options.mode == 'rerank':
        first, source = first_stage_results(collection, options.first_stage, options.depth, cache_dir)
        first = first[first['qid'].isin(set(topics['qid']))]
        watch.lap('first_stage')
        needed = list(dict.fromkeys([*first['docno'], *judged]))
        if external is not None:
            check_docnos_in_index(external, needed, index_spec)
    dense = external if external is not None else indexes.dense_index(collection, model, encoder, cache_dir, needed,
                                                                      batch_size=batch_size, verbose=verbose)
    watch.lap('index')
    answer_encoder = AnswerVectors(model, Path(cache_dir) / 'answer-vectors' / f'{indexes.encoder_slug(encoder)}.pkl')
    if options.mode == 'rerank':
        return replace(rerank_grid(first, model, dense, answers, stages, collection.qrels, judged, run, options,
                                   records or systems.SystemRecords(), answer_encoder), source=source)
    search = retriever(dense, options.retriever, options.num_results, shards=options.shards, cache_dir=cache_dir,
                       verbose=verbose)
    return retrieve_grid(topics, model, dense, search, answers, stages, collection.qrels, judged, run, options,
                         records or systems.SystemRecords(), answer_encoder)


def _judged_documents(collection: Collection, topics: pd.DataFrame, external) -> List[str]:
    """The judged documents that the corpus (or the existing index) holds, for Oracle DIME."""
    judged = list(collection.qrels.loc[collection.qrels['qid'].isin(set(topics['qid'])), 'docno'].unique())
    if external is not None:
        lookup = external.payload(return_dvecs=False)[0]
        return [d for d, i in zip(judged, lookup.inv[judged]) if i >= 0]
    absent = set(collection.absent(judged))
    return [d for d in judged if d not in absent]


def _measure_notes(measures: list, rel: Optional[int], depth: int) -> List[str]:
    levels = sorted({m.params.get('rel', 1) for m in measures if m.NAME in BINARY})
    notes = [f'Binary measures count documents with label ≥ {", ".join(map(str, levels))} as relevant'
             + (' (--rel; rel ≥ 2 is the TREC DL convention).' if rel is not None else
                " (ir_measures' default, as in the reference implementations; --rel 2 gives the TREC DL "
                'convention).')] if levels else []
    deep = [str(m) for m in measures if m.NAME in ('R', 'P') and (m.params.get('cutoff') or 0) > depth]
    if deep:
        notes.append(f'{", ".join(deep)}: the ranking is shallower than the cutoff; the measure counts only what it '
                     'holds.')
    return notes


def _unanswered_notes(sources: Dict[str, Dict[str, str]], topics: pd.DataFrame) -> List[str]:
    """A note per answer source that leaves queries of the run unanswered (absent, None or blank): how many, which."""
    missing = {source: [qid for qid in dict.fromkeys(topics['qid'])
                        if not isinstance(answers.get(qid), str) or not answers[qid].strip()]
               for source, answers in sources.items()}
    return [f'LLM answers{f" {source}" if source else ""}: no answer for {len(qids)} of {topics["qid"].nunique()} '
            f'queries ({", ".join(qids[:10]) + (" …" if len(qids) > 10 else "")}); LLM DIME used q ⊙ q for them.'
            for source, qids in missing.items() if qids]

