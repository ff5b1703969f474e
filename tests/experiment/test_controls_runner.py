"""The controls in the runner and the grid: each RDIME column against the same number of dimensions chosen at random
(mean over seeds), by magnitude, by variance and as a prefix, and against pyterrier-dr's vector PRF, judged by the
same machinery as the Top-k comparators (its own Holm family); the vector-PRF rows equal pyterrier-dr's own stages
run by hand, and the grid writes the controls tables."""
import json

import numpy as np
import pandas as pd
import pyterrier as pt
import pyterrier_dr
import pytest
from conftest import shared_collection
from ir_measures import nDCG

from pyterrier_rdime.experiment.encoders import load_encoder
from pyterrier_rdime.experiment.grid import run_grid
from pyterrier_rdime.experiment.runner import run_experiment

QIDS = ('1', '2', '3', '4', '5', '6')
DEPTH = 8
TEXT = 300


@pytest.fixture(scope='module')
def small(tmp_path_factory):
    """Cranfield's first 6 queries re-ranking a shipped run of 8 documents each, over its first 200 documents, each
    cut to its first TEXT characters (encoding is most of these tests' time)."""
    folder = tmp_path_factory.mktemp('controls') / 'small'
    source = shared_collection('cranfield')
    folder.mkdir()
    docs = [json.loads(line) for line in (source / 'docs.jsonl').read_text(encoding='utf-8').splitlines()[:200]]
    (folder / 'docs.jsonl').write_text(''.join(json.dumps({**doc, 'text': doc['text'][:TEXT]}) + '\n' for doc in docs),
                                       encoding='utf-8')
    docnos = [doc['docno'] for doc in docs]
    queries = (source / 'queries.tsv').read_text(encoding='utf-8').splitlines()[:len(QIDS)]
    (folder / 'queries.tsv').write_text('\n'.join(queries) + '\n', encoding='utf-8')
    judged = [f.split() for f in (source / 'qrels').read_text().splitlines() if f.split()[0] in QIDS]
    relevant = {q: [d for qq, _, d, _ in judged if qq == q and d in set(docnos)] for q in QIDS}
    # each query's run: its judged documents among the first 200 first, then others, so that measures are not all 0
    run = []
    for q in QIDS:
        ranked = list(dict.fromkeys(relevant[q] + [docnos[(11 * int(q) + 5 * r) % 200] for r in range(DEPTH)]))
        run += [f'{q} Q0 {d} {r} {DEPTH - r} bm25' for r, d in enumerate(ranked[:DEPTH])]
    (folder / 'bm25.run').write_text('\n'.join(run) + '\n')
    (folder / 'qrels').write_text('\n'.join(' '.join(f) for f in judged) + '\n')
    return folder


@pytest.fixture(scope='module')
def result(small, tmp_path_factory):
    return run_experiment(str(small), dimes=['prf'], ks=[0.5], depth=DEPTH, modulators=['wiener'],
                          controls=['random', 'magnitude', 'variance', 'prefix', 'vector-prf'], control_seeds=3,
                          cache_dir=tmp_path_factory.mktemp('cache'), verbose=False)


def test_every_rdime_column_is_compared_with_every_control_in_its_own_holm_family(result):
    sig = result.significance[result.significance['measure'] == 'nDCG@10']
    controls = sig[sig['family'] == 'controls']
    expected = ['random (same budget)', 'magnitude (same budget)', 'variance (same budget)', 'prefix (same budget)',
                'Vector PRF', 'Average PRF']
    for system in ('prf/RDIME', 'prf/RDIME-Wiener'):
        assert list(controls.loc[controls['system'] == system, 'comparison']) == expected
    assert set(controls['verdict']) <= {'equivalent', 'different', 'inconclusive'}
    # the comparators' family is Holm-corrected on its own: the same p-values as a run without controls
    comparators = sig[sig['family'] == 'comparators']
    from statsmodels.stats.multitest import multipletests
    np.testing.assert_allclose(comparators['p_holm'],
                               multipletests(comparators['p_value'].fillna(1.0), method='holm')[1])
    np.testing.assert_allclose(controls['p_holm'], multipletests(controls['p_value'].fillna(1.0), method='holm')[1])


def test_random_is_the_mean_over_seeds_with_its_spread(result):
    seeds = result.seeds[(result.seeds['system'] == 'prf/RDIME:random') & (result.seeds['measure'] == 'nDCG@10')]
    assert sorted(seeds['seed']) == [0, 1, 2]
    table = result.table.set_index(['system', 'measure'])['value']
    assert table['prf/RDIME:random', 'nDCG@10'] == pytest.approx(seeds['value'].mean())
    shown = result.control_value('prf/RDIME:random', 'nDCG@10')
    assert f'± {seeds["value"].std(ddof=1):.4f} (sd over 3 seeds)' in shown
    markdown = result.to_markdown()
    assert 'does the choice of dimensions matter?' in markdown and 'random (same budget)' in markdown
    assert markdown.count("Each control at RDIME's budget, then how RDIME compares") == len(result.measures)


def test_the_sweep_carries_the_random_curve(result, tmp_path):
    curve = result.sweep_means()
    random_curve = curve[(curve['dime'] == 'random') & (curve['measure'] == 'nDCG@10')]
    assert sorted(random_curve['fraction']) == pytest.approx([round(0.1 * i, 1) for i in range(1, 11)])
    # at fraction 1.0 every dimension is kept, whatever the seed: the Baseline's value
    baseline = result.table.set_index(['system', 'measure'])['value']['Baseline', 'nDCG@10']
    assert random_curve.set_index('fraction')['value'][1.0] == pytest.approx(baseline)
    result.sweep_plot(tmp_path / 'sweep.png')
    assert (tmp_path / 'sweep.png').stat().st_size > 0


@pytest.fixture(scope='module')
def encoded_candidates(small):
    """The MiniLM model, the collection's BM25 run and topics, and each candidate's vector, encoded here."""
    model = load_encoder('minilm')
    run = pd.read_csv(small / 'bm25.run', sep=' ', names=['qid', 'q0', 'docno', 'rank', 'score', 'tag'],
                      dtype={'qid': str, 'docno': str})
    topics = pd.read_csv(small / 'queries.tsv', sep='\t', names=['qid', 'query'], dtype=str)
    texts = {d['docno']: d['text'] for d in map(json.loads, (small / 'docs.jsonl').read_text().splitlines())}
    docnos = list(dict.fromkeys(run['docno']))
    return model, run, topics, dict(zip(docnos, model.encode_docs([texts[d] for d in docnos])))


def test_vector_prf_rows_equal_pyterrier_dr_run_by_hand(small, result, encoded_candidates):
    """pyterrier-dr's VectorPrf and AveragePrf on the dense top of the candidates, each re-scoring the candidates,
    measured with pt.Experiment, computed here without the runner."""
    model, run, topics, doc_vecs = encoded_candidates
    queries = model.query_encoder()(topics)
    candidates = run[['qid', 'docno']].merge(queries, on='qid')
    candidates['doc_vec'] = candidates['docno'].map(doc_vecs)
    candidates['score'] = [float(np.dot(q, d)) for q, d in zip(candidates['query_vec'], candidates['doc_vec'])]
    dense = pt.model.add_ranks(candidates.sort_values(['qid', 'score'], ascending=[True, False]))
    qrels = pd.read_csv(small / 'qrels', sep=' ', names=['qid', 'iter', 'docno', 'label'], dtype={'qid': str,
                                                                                                   'docno': str})
    for name, stage in (('Vector PRF', pyterrier_dr.VectorPrf()), ('Average PRF', pyterrier_dr.AveragePrf())):
        new_queries = (pt.RankCutoff(3) >> stage)(dense)[['qid', 'query_vec']]
        rescored = candidates.drop(columns=['query_vec', 'score']).merge(new_queries, on='qid')
        rescored['score'] = [float(np.dot(q, d)) for q, d in zip(rescored['query_vec'], rescored['doc_vec'])]
        rescored = pt.model.add_ranks(rescored)
        expected = pt.Experiment([rescored], topics, qrels, [nDCG @ 10], names=[name], perquery=True)
        got = result.perquery[(result.perquery['system'] == name) & (result.perquery['measure'] == 'nDCG@10')]
        merged = got.merge(expected, on='qid', suffixes=('', '_expected'))
        assert len(merged) == len(QIDS)
        np.testing.assert_allclose(merged['value'].astype(float), merged['value_expected'].astype(float),
                                   atol=1e-6)


def test_the_grid_writes_the_controls_tables(small, tmp_path):
    cache = tmp_path / 'cache'
    grid = run_grid([str(small)], ['minilm'], tmp_path / 'out', dimes=['prf', 'swc'], ks=[0.5], depth=DEPTH,
                    sweep=False, control_seeds=2, cache_dir=cache, verbose=False)
    assert [c.status for c in grid.cells] == ['done'] and not grid.problems
    markdown = (tmp_path / 'out' / 'grid.md').read_text()
    summary = markdown.split('\n\n')[2].splitlines()  # the controls' tally, a table before the measures' tables
    assert [c.strip() for c in summary[0].strip('|').split('|')] == ['DIME', 'control', 'better', 'equivalent',
                                                                      'worse', 'inconclusive', 'pairs']
    rows = [[c.strip() for c in line.strip('|').split('|')] for line in summary[2:]]
    assert rows[0][:2] == ['PRF (M=2)', 'random']
    assert all(sum(map(int, r[2:6])) == int(r[6]) == 2 for r in rows)  # one cell, two measures: each pair counted
    assert '### nDCG@10: RDIME against the controls at the same budget, and vector PRF' in markdown
    for control in ('random', 'magnitude', 'variance', 'Vector PRF', 'Average PRF'):
        assert f'| {control}' in markdown.split('### nDCG@10')[1].split('\n\n')[1].splitlines()[0]
    tex = (tmp_path / 'out' / 'grid.tex').read_text()
    assert tex.count(r'\begin{table*}') == tex.count(r'\end{table*}') == 4  # the paper's two, the controls' two
    assert 'same number of dimensions per query chosen at random' in tex
    controls = [line for line in tex.splitlines() if 'same number of dimensions per query chosen at random' in line]
    assert [line.split(' of RDIME')[0] for line in controls] == [r'\caption{nDCG@10', r'\caption{AP']  # the order
    table = pd.read_csv(tmp_path / 'out' / 'grid.csv')
    assert {'prf/RDIME:random', 'prf/RDIME:magnitude', 'prf/RDIME:variance', 'Vector PRF', 'Average PRF'} <= \
        set(table['system'])
    parity = pd.read_csv(tmp_path / 'out' / 'grid_parity.csv')
    assert set(parity['family']) == {'comparators', 'controls'}


def test_the_random_curve_from_vectors_equals_the_same_budget_stage():
    """The sweep's random curve (numpy on the vectors in hand) scores as ``TopK`` then ``SameBudget('random')``."""
    from pyterrier_rdime import MagnitudeDime, SameBudget, TopK, VectorScorer
    from pyterrier_rdime.experiment.parity import random_runs
    rng = np.random.default_rng(3)
    frame = pd.DataFrame([{'qid': q, 'docno': f'{q}-{i}', 'query_vec': qv, 'doc_vec': rng.normal(size=10)
                           .astype(np.float32), 'score': float(-i), 'rank': i}
                          for q, qv in (('a', rng.normal(size=10).astype(np.float32)),
                                        ('b', rng.normal(size=10).astype(np.float32))) for i in range(3)])
    runs = random_runs(frame, [0.3, 0.7], seeds=2)
    for (name, fraction), run in runs.items():
        seed = int(name.split('#')[1])
        stage = MagnitudeDime() >> TopK(fraction=fraction) >> SameBudget(control='random', seed=seed) >> VectorScorer()
        expected = stage(frame).set_index(['qid', 'docno'])['score']
        np.testing.assert_array_equal(run.set_index(['qid', 'docno'])['score'].loc[expected.index].to_numpy(),
                                      expected.to_numpy())


@pytest.mark.slow  # three runs, one of them encoding the whole (small) corpus
def test_the_rerank_variance_control_reads_the_candidates_whatever_the_cache_holds(small, encoded_candidates,
                                                                                  tmp_path):
    """The same re-ranking before and after a retrieve run on the same cache (which encodes the whole corpus into
    the cached index): the variance control reads the run's candidates, so its numbers stay; and they are those of
    SameBudget over the candidates' vectors encoded here."""
    from pyterrier_rdime import PrfDime, Rdime, SameBudget, VectorScorer
    from pyterrier_rdime.experiment.collection import load_collection
    from pyterrier_rdime.experiment.indexes import dense_index_path
    cache = tmp_path / 'cache'
    rerank = dict(dimes=['prf'], ks=[0.5], depth=DEPTH, controls=['variance'], sweep=False, cache_dir=cache,
                  verbose=False)
    before = run_experiment(str(small), **rerank)
    run_experiment(str(small), mode='retrieve', dimes=['prf'], ks=[0.5], controls=[], sweep=False,
                   num_results=DEPTH, cache_dir=cache, verbose=False)
    from pyterrier_dr import FlexIndex
    held = FlexIndex(str(dense_index_path(load_collection(str(small)), 'minilm', cache)), verbose=False)
    assert len(held) == 200  # the retrieve run left the whole corpus in the cached index
    after = run_experiment(str(small), **rerank)
    variance = [s for s in before.perquery['system'].unique() if s.endswith(':variance')]
    assert variance == ['prf/RDIME:variance']
    pd.testing.assert_frame_equal(before.perquery[before.perquery['system'].isin(variance)].reset_index(drop=True),
                                  after.perquery[after.perquery['system'].isin(variance)].reset_index(drop=True))
    # the expectation computed here: the candidates' own vectors, ranked with SameBudget over them
    model, run, topics, doc_vecs = encoded_candidates
    candidates = run[['qid', 'docno']].merge(model.query_encoder()(topics), on='qid')
    candidates['doc_vec'] = candidates['docno'].map(doc_vecs)
    dense = VectorScorer()(candidates)
    control = PrfDime() >> Rdime() >> SameBudget(control='variance', index=np.stack(list(doc_vecs.values())))
    ranked = (control >> VectorScorer())(dense)
    qrels = pd.read_csv(small / 'qrels', sep=' ', names=['qid', 'iter', 'docno', 'label'],
                        dtype={'qid': str, 'docno': str})
    expected = pt.Experiment([ranked], topics, qrels, [nDCG @ 10], names=['v'], perquery=True)
    got = after.perquery[(after.perquery['system'] == 'prf/RDIME:variance') & (after.perquery['measure'] == 'nDCG@10')]
    merged = got.merge(expected, on='qid', suffixes=('', '_expected'))
    assert len(merged) == len(QIDS)
    np.testing.assert_allclose(merged['value'].astype(float), merged['value_expected'].astype(float), atol=1e-6)
