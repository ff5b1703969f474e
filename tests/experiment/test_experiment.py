"""The experiment runner: the references' protocol on a small real subset, its options, its outputs, its error paths
(each before any work starts) and its index and retrieval backends on a tiny collection."""
import json
import math
import time

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest
from conftest import shared_collection
from ir_measures import AP, nDCG
from scipy import stats

import pyterrier_rdime as rdime
from pyterrier_rdime.experiment import cli as arguments
from pyterrier_rdime.experiment.cli import main
from pyterrier_rdime.experiment.collection import load_collection, read_fingerprint
from pyterrier_rdime.experiment.encoders import load_encoder, resolve_encoder
from pyterrier_rdime.experiment.indexes import dense_index, existing_index, first_stage_results
from pyterrier_rdime.experiment.parity import significance
from pyterrier_rdime.experiment.report import ExperimentResult
from pyterrier_rdime.experiment.runner import Options, run_experiment

NUM_QUERIES = 4
DEPTH = 12


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp('cache')


@pytest.fixture(scope='module')
def model():
    return load_encoder('minilm')


@pytest.fixture(scope='module')
def dl19(cache):
    collection = load_collection(shared_collection('msmarco-dl19-pool'))
    result = run_experiment(collection, dimes=['prf', 'swc', 'llm'], depth=DEPTH, max_queries=NUM_QUERIES,
                            cache_dir=cache, verbose=False)
    return collection, result


def _mini_collection(path, qrels_qids=('1', '2')):
    folder = path / 'mini'
    folder.mkdir()
    docs = [{'docno': f'd{i}', 'text': t} for i, t in enumerate([
        'dense retrieval with neural encoders', 'pruning embedding dimensions at query time',
        'bm25 is a lexical ranking function', 'the cat sat on the mat', 'query expansion with feedback',
        'statistics of risk estimation', 'hard thresholding of noisy signals'])]
    (folder / 'docs.jsonl').write_text('\n'.join(json.dumps(d) for d in docs) + '\n')
    (folder / 'queries.tsv').write_text('1\tdense retrieval\n2\tnoisy signal thresholding\n3\tcats\n')
    (folder / 'qrels').write_text(''.join(f'{q} 0 d{i} {int(i % 2 == 0)}\n' for q in qrels_qids for i in range(4)))
    return folder


def _first_stage(collection, cache):
    """The first stage of the queries the ``dl19`` fixture ran (only their documents are encoded)."""
    first, _ = first_stage_results(collection, 'auto', DEPTH, cache)
    return first[first['qid'].isin(collection.topics.head(NUM_QUERIES)['qid'])]


@pytest.fixture(scope='module')
def mini(tmp_path_factory):
    return _mini_collection(tmp_path_factory.mktemp('mini'))


def test_table_has_the_papers_structure(dl19):
    _, result = dl19
    assert result.measures == ['nDCG@10', 'AP']
    systems = set(result.table['system'])
    assert systems == {'Baseline', 'Vector PRF', 'Average PRF'} | {
        f'{d}/{t}' for d in ('prf', 'swc', 'llm')
        for t in ('k=0.4', 'k=0.6', 'k=0.8', 'RDIME', 'CV Top-k', 'RDIME:random', 'RDIME:magnitude', 'RDIME:variance')}
    table = result.paper_table('nDCG@10')
    assert list(table.columns) == ['DIME', 'k=0.4', 'k=0.6', 'k=0.8', 'RDIME (kept)', 'Δ% vs CV Top-k',
                                   'best Top-k, tuned on test (k)', 'CV Top-k (mean k)']
    assert list(table['DIME']) == ['PRF (M=2)', 'SWC (M=10, τ=0.1)', 'LLM', 'Baseline']
    kept = result.kept[result.kept['threshold'] == 'RDIME']
    assert len(kept) == 3 * NUM_QUERIES and kept['kept_frac'].between(0, 1, inclusive='right').all()
    topk = result.kept[result.kept['threshold'] == 'k=0.4']
    assert np.allclose(topk['kept_frac'], round(0.4 * 384) / 384)
    notes = ' '.join(result.notes)
    assert 'label ≥ 1' in notes and 'dense re-ranking (full query vector)' in notes
    assert result.settings['feedback'] == 'dense'


def test_numbers_equal_a_direct_pt_experiment_in_the_references_protocol(dl19, cache, model):
    """Feedback from the dense re-ranking of the candidates (full query vector), AP at ir_measures' rel 1."""
    collection, result = dl19
    topics = collection.topics.head(NUM_QUERIES)
    first = _first_stage(collection, cache)
    index = dense_index(collection, model, 'minilm', cache, first['docno'].unique(), verbose=False)
    prefix = pt.Transformer.from_df(first) >> model.query_encoder() >> index.vec_loader()
    dense = prefix >> index.scorer()
    answers = rdime.LlmAnswers.from_tsv(shared_collection('msmarco-dl19-pool') / 'llm_answers.tsv')
    systems = {
        'Baseline': dense,
        'prf/k=0.6': dense >> rdime.PrfDime() >> rdime.TopK(fraction=0.6) >> index.scorer(),
        'swc/RDIME': dense >> rdime.SwcDime() >> rdime.Rdime() >> index.scorer(),
        'llm/RDIME': prefix >> answers >> rdime.LlmDime(encoder=model) >> rdime.Rdime() >> index.scorer(),
    }
    direct = pt.Experiment(list(systems.values()), topics, collection.qrels, [nDCG @ 10, AP],
                           names=list(systems), verbose=False).set_index('name')
    ours = result.table.pivot(index='system', columns='measure', values='value')
    for name in systems:
        for measure in ('nDCG@10', 'AP'):
            assert ours.loc[name, measure] == pytest.approx(direct.loc[name, measure], abs=1e-9), (name, measure)


def test_first_stage_feedback_and_trec_dl_relevance(dl19, cache, model):
    collection, _ = dl19
    result = run_experiment(collection, dimes=['prf'], ks=[0.6], depth=DEPTH, max_queries=NUM_QUERIES,
                            feedback='first-stage', rel=2, cache_dir=cache, verbose=False)
    first = _first_stage(collection, cache)
    index = dense_index(collection, model, 'minilm', cache, first['docno'].unique(), verbose=False)
    prefix = pt.Transformer.from_df(first) >> model.query_encoder() >> index.vec_loader()
    direct = pt.Experiment([prefix >> rdime.PrfDime() >> rdime.Rdime() >> index.scorer()],
                           collection.topics.head(NUM_QUERIES), collection.qrels, [nDCG @ 10, AP(rel=2)],
                           names=['prf/RDIME'], verbose=False).set_index('name')
    ours = result.table.pivot(index='system', columns='measure', values='value')
    assert result.measures == ['nDCG@10', 'AP(rel=2)']
    assert ours.loc['prf/RDIME', 'AP(rel=2)'] == pytest.approx(direct.loc['prf/RDIME', 'AP(rel=2)'], abs=1e-9)
    assert ours.loc['prf/RDIME', 'nDCG@10'] == pytest.approx(direct.loc['prf/RDIME', 'nDCG@10'], abs=1e-9)
    assert 'first-stage order' in ' '.join(result.notes) and '--rel' in ' '.join(result.notes)


def test_timings_are_back_to_back_phases_that_add_up_to_the_total(dl19):
    timings = dl19[1].timings
    assert list(timings) == ['load', 'first_stage', 'index', 'systems', 'evaluation', 'total']
    assert all(v >= 0 for v in timings.values())
    assert sum(v for k, v in timings.items() if k != 'total') == pytest.approx(timings['total'], rel=1e-9)


def test_saved_outputs_and_cli(dl19, cache, tmp_path, capsys):
    _, result = dl19
    assert result.save(tmp_path / 'saved') == []
    for name in ('results.md', 'results.csv', 'perquery.csv', 'results.json', 'significance.csv',
                 'kept_fraction.csv', 'kept_fraction.png', 'sweep.csv', 'cv.csv', 'sweep.png'):
        assert (tmp_path / 'saved' / name).stat().st_size > 0
    assert json.loads((tmp_path / 'saved' / 'results.json').read_text())['settings']['num_queries'] == NUM_QUERIES
    assert pd.read_csv(tmp_path / 'saved' / 'kept_fraction.csv')['kept_frac'].between(0, 1).all()

    code = main([str(shared_collection('msmarco-dl19-pool')), '--dimes', 'prf', '--depth', str(DEPTH),
                 '--max-queries', '2', '--cache', str(cache), '--out', str(tmp_path / 'cli'), '--quiet',
                 '--test', 'wilcoxon'])
    printed = capsys.readouterr().out
    assert code == 0
    assert '| PRF (M=2)' in printed and 'Baseline' in printed and 'Wilcoxon' in printed
    assert f'results in {tmp_path / "cli"}' in printed
    # one collection is a one-cell grid: the same layout, <out>/<collection>/<encoder>/ and the combined files
    assert (tmp_path / 'cli' / 'msmarco-dl19-pool' / 'minilm' / 'results.md').is_file()
    assert (tmp_path / 'cli' / 'grid.md').is_file() and not (tmp_path / 'cli' / 'results.md').exists()


def test_a_failing_output_loses_none_of_the_others(dl19, tmp_path, monkeypatch, capsys):
    _, result = dl19

    def no_matplotlib(self, path):
        raise ImportError('No module named matplotlib')
    monkeypatch.setattr(ExperimentResult, 'boxplot', no_matplotlib)
    problems = result.save(tmp_path)
    assert len(problems) == 1 and 'kept_fraction.png' in problems[0] and 'matplotlib' in problems[0]
    assert (tmp_path / 'results.md').is_file() and (tmp_path / 'perquery.csv').is_file()


def test_cli_without_the_runner_extras_says_what_to_install_before_any_work(monkeypatch, capsys):
    monkeypatch.setattr(arguments, 'missing_runner_packages', lambda: ['matplotlib', 'tabulate'])
    assert main(['irds:vaswani']) == 2
    err = capsys.readouterr().err
    assert 'matplotlib, tabulate' in err and "pip install '.[experiment]'" in err
    assert 'pip install "pyterrier-rdime[experiment] @ git+https://github.com/pyterrier-rdime/pyterrier-rdime"' in err


def test_significance_marks_and_delta_against_hand_computed_values():
    """Six queries, one DIME: RDIME gains 0.1 on every query but one over Baseline, and ties the best Top-k."""
    qids = [str(q) for q in range(6)]
    base = np.array([0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    values = {'Baseline': base, 'prf/k=0.4': base + 0.05, 'prf/k=0.8': base + np.array([.1, .1, .1, .1, .1, .2]),
              'prf/RDIME': base + np.array([.1, .1, .1, .1, .1, .3])}
    perquery = pd.DataFrame([{'system': s, 'qid': q, 'measure': 'nDCG@10', 'value': v}
                             for s, vs in values.items() for q, v in zip(qids, vs)])
    aggregate = perquery.groupby(['system', 'measure'], sort=False)['value'].mean().reset_index()
    sig = significance(aggregate, perquery, ['prf'], ['RDIME'], 't').set_index('comparison').rename(
        index={'best Top-k (k=0.8, tuned on the test queries)': 'best Top-k (k=0.8)'})
    # RDIME - best Top-k (k=0.8): differences [0,0,0,0,0,.1]: mean 1/60, sd sqrt(1/600)
    t_topk = (1 / 60) / (math.sqrt(1 / 600) / math.sqrt(6))
    p_topk = 2 * stats.t.sf(t_topk, df=5)
    # RDIME - Baseline: differences [.1,.1,.1,.1,.1,.3]: mean 2/15, sd sqrt(1/150)
    t_base = (2 / 15) / (math.sqrt(1 / 150) / math.sqrt(6))
    p_base = 2 * stats.t.sf(t_base, df=5)
    assert sig.loc['best Top-k (k=0.8)', 'p_value'] == pytest.approx(p_topk, rel=1e-6)
    assert sig.loc['Baseline', 'p_value'] == pytest.approx(p_base, rel=1e-6)
    # Holm over two comparisons: the smaller p doubled, the larger max(itself, that)
    assert sig.loc['Baseline', 'p_holm'] == pytest.approx(2 * p_base, rel=1e-6)
    assert sig.loc['best Top-k (k=0.8)', 'p_holm'] == pytest.approx(max(p_topk, 2 * p_base), rel=1e-6)
    assert sig.loc['Baseline', 'significant'] and not sig.loc['best Top-k (k=0.8)', 'significant']

    table = aggregate.assign(dime=aggregate['system'].str.split('/').str[0].where(
        aggregate['system'].str.contains('/'), ''), threshold=aggregate['system'].str.split('/').str[-1])
    cv = base.mean() + 0.07  # a CV Top-k in the table only (Δ% reads it; it is no comparison of this hand count)
    table = pd.concat([table, pd.DataFrame([{'system': 'prf/CV Top-k', 'measure': 'nDCG@10', 'value': cv,
                                             'dime': 'prf', 'threshold': 'CV Top-k'}])], ignore_index=True)
    kept = pd.DataFrame({'dime': 'prf', 'threshold': 'RDIME', 'qid': qids, 'kept_frac': [0.5] * 5 + [0.2],
                         'fallback': False, 'mean_weight': 1.0})
    result = ExperimentResult(['nDCG@10'], table, perquery, kept, sig.reset_index(), {'prf': 'PRF (M=2)'},
                              {'collection': 'c', 'encoder': 'e', 'mode': 'rerank', 'first_stage': 'f',
                               'num_queries': 6})
    row = result.paper_table('nDCG@10').set_index('DIME').loc['PRF (M=2)']
    assert row['k=0.8'] == f'{base.mean() + 0.1 + 0.1 / 6:.4f}*' and row['k=0.4'] == f'{base.mean() + 0.05:.4f}'
    rdime_mean = base.mean() + 0.8 / 6
    assert row['RDIME (kept)'] == f'{rdime_mean:.4f}‡ (0.45)'
    assert row['Δ% vs CV Top-k'] == f'{100 * (0.8 / 6 - 0.07) / cv:+.2f}'  # RDIME over CV Top-k, not the best Top-k


def test_identical_systems_are_never_significant():
    perquery = pd.DataFrame([{'system': s, 'qid': str(q), 'measure': 'AP', 'value': q / 10}
                             for s in ('Baseline', 'prf/k=0.5', 'prf/RDIME') for q in range(5)])
    aggregate = perquery.groupby(['system', 'measure'], sort=False)['value'].mean().reset_index()
    sig = significance(aggregate, perquery, ['prf'], ['RDIME'], 'wilcoxon')
    assert sig['p_value'].isna().all() and not sig['significant'].any()


def test_no_topk_column(mini, tmp_path):
    result = run_experiment(mini, dimes=['prf'], ks=[], first_stage='bm25', depth=4, cache_dir=tmp_path,
                            sweep=False, controls=[], verbose=False)
    assert set(result.table['system']) == {'Baseline', 'prf/RDIME'}
    row = result.paper_table('nDCG@10').iloc[0]
    assert row['Δ% vs CV Top-k'] == 'n/a'
    assert set(result.significance['comparison']) == {'Baseline'}


def test_soft_rdime_columns_and_their_marks(mini, tmp_path):
    result = run_experiment(mini, dimes=['prf'], ks=[0.5], modulators=['james-stein', 'wiener'],
                            first_stage='bm25', depth=4, cache_dir=tmp_path, verbose=False)
    table = result.paper_table('nDCG@10')
    assert list(table.columns)[-4:] == ['RDIME-JS', 'RDIME-Wiener', 'best Top-k, tuned on test (k)',
                                        'CV Top-k (mean k)']
    sig = result.significance
    best = sig.loc[(sig['system'] == 'prf/RDIME') & sig['comparison'].str.startswith('best Top-k'), 'comparison']
    comparators = sig[sig['family'] == 'comparators']
    assert set(comparators.loc[comparators['system'] == 'prf/RDIME-JS', 'comparison']) == {
        'CV Top-k', best.iloc[0], 'Baseline', 'RDIME'}
    kept = result.kept.set_index(['threshold', 'qid'])
    assert (kept.loc['RDIME-JS', 'kept_frac'] == kept.loc['RDIME', 'kept_frac']).all()
    assert (kept.loc['RDIME-Wiener', 'mean_weight'] < 1).all() and (kept.loc['RDIME', 'mean_weight'] == 1).all()


def test_oracle_correlates_over_every_judged_document(tmp_path, model):
    """The references' oracle reads all judged documents of the query, also those the ranking did not retrieve."""
    folder = _mini_collection(tmp_path)
    collection = load_collection(folder)
    result = run_experiment(collection, dimes=['oracle'], ks=[0.5], first_stage='bm25', depth=2, cache_dir=tmp_path,
                            verbose=False)
    index = dense_index(collection, model, 'minilm', tmp_path, ['d0', 'd1', 'd2', 'd3'], verbose=False)
    judged = collection.qrels.merge(model.query_encoder()(collection.topics), on='qid').assign(score=0.0)
    expected = rdime.OracleDime(qrels=collection.qrels, keep_ranking=False)(index.vec_loader()(judged))
    kept = result.kept[result.kept['threshold'] == 'RDIME'].set_index('qid')['kept_frac']
    pruned = rdime.Rdime()(expected).set_index('qid')['query_kept_frac']
    assert kept.to_dict() == pytest.approx(pruned.to_dict())


@pytest.mark.parametrize('argv, message', [
    (['--max-queries', '0'], '--max-queries must be an integer >= 1, got 0'),
    (['--max-queries', '-1'], '--max-queries must be an integer >= 1, got -1'),
    (['--depth', '0'], '--depth must be an integer >= 1, got 0'),
    (['--depth', '-5'], '--depth must be an integer >= 1, got -5'),
    (['--mode', 'retrieve', '--num-results', '0'], '--num-results must be an integer >= 1, got 0'),
    (['--ks', 'x'], '--ks'),
    (['--ks', '1.5'], '--ks must be a fraction in (0, 1], got 1.5'),
    (['--measures', 'Bogus@3'], "'Bogus@3' is not an ir_measures measure"),
    (['--dimes', 'prf,magic'], "--dimes must be one of 'prf', 'swc', 'llm', 'rank'"),
    (['--modulators', 'soft'], "--modulators must be one of 'james-stein', 'wiener', got 'soft'"),
    (['--mode', 'dense'], "--mode must be one of 'rerank', 'retrieve', got 'dense'"),
    (['--feedback', 'bm25'], "--feedback must be one of 'dense', 'first-stage', got 'bm25'"),
    (['--test', 'z'], "--test must be one of 't', 'wilcoxon', 'auto', got 'z'"),
    (['--alternative', 'up'], "--alternative must be one of 'two-sided', 'greater', 'less', got 'up'"),
    (['--margin', '0'], '--margin must be a fraction of the Baseline in (0, 1), got 0.0'),
    (['--folds', '1'], '--folds must be an integer >= 2, got 1'),
    (['--retriever', 'torch'], '--retriever \'torch\' applies to --mode retrieve'),
    (['--first-stage', '/no/such.run'], "is not 'auto', 'bm25' or an existing TREC run file"),
    (['--workers', '0'], '--workers must be an integer >= 1'),
    (['--mode', 'retrieve', '--shards', '2'], '--shards applies to --retriever sharded'),
    (['--mode', 'retrieve', '--retriever', 'sharded', '--shards', '0'], '--shards must be an integer >= 1, got 0'),
])
def test_cli_rejects_bad_options_before_any_work(argv, message, mini, tmp_path, capsys):
    start = time.time()
    assert main([str(mini), '--cache', str(tmp_path / 'cache'), '--out', str(tmp_path / 'out')] + argv) == 2
    assert message in capsys.readouterr().err
    assert time.time() - start < 5  # no model was loaded


@pytest.mark.parametrize('dimes', ['llm', 'llm-eclipse', 'llm,llm-eclipse'])
def test_llm_dimes_without_answers_say_where_answers_come_from(dimes, mini, tmp_path, capsys):
    assert not (mini / 'llm_answers.tsv').exists()
    assert main([str(mini), '--dimes', dimes, '--cache', str(tmp_path / 'c'), '--out', str(tmp_path / 'o')]) == 2
    err = capsys.readouterr().err
    assert f'--dimes {dimes}: the LLM DIMEs need LLM answers, and {mini} has none' in err
    assert all(fix in err for fix in ('--answers', 'llm_answers.tsv', '--llm-generator'))
    assert '--dimes is empty' not in err


def test_help_shows_each_options_default(capsys):
    with pytest.raises(SystemExit):
        main(['--help'])
    out = ' '.join(capsys.readouterr().out.split())  # argparse wraps lines
    for text in ('results per query in retrieve mode (default: 1000)', 'encoder batch size (default: 32)',
                 'or a TREC run file (default: auto)', 're-ranking depth (default: 100)'):
        assert text in out


def test_topk_values_are_fractions_even_as_integers():
    assert Options(ks=[1, 0.5]).ks == (1.0, 0.5)  # 1 is the whole query, not one dimension


def test_cli_rejects_unusable_folders_before_any_work(mini, tmp_path, capsys):
    a_file = tmp_path / 'file'
    a_file.write_text('')
    assert main([str(mini), '--out', str(a_file)]) == 2
    assert '--out' in capsys.readouterr().err
    assert main([str(mini), '--cache', str(a_file / 'below')]) == 2
    assert '--cache' in capsys.readouterr().err


def test_a_relevance_level_no_judgment_reaches_is_an_error(mini, tmp_path):
    with pytest.raises(ValueError, match='--rel 9: no judgment has a label >= 9'):
        run_experiment(mini, rel=9, cache_dir=tmp_path, verbose=False)


def test_hub_encoder_and_hub_index_fail_fast_offline(monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    start = time.time()
    with pytest.raises(ConnectionError, match='not in the Hugging Face cache'):
        resolve_encoder('tasb')
    with pytest.raises(ConnectionError, match='the Hugging Face hub cannot be reached'):
        existing_index('macavaney/msmarco-passage.tasb.flex')
    assert time.time() - start < 10


def test_cli_reports_errors(tmp_path, capsys):
    assert main(['/no/such/folder', '--cache', str(tmp_path), '--out', str(tmp_path / 'out')]) == 2
    assert 'rdime-experiment: error:' in capsys.readouterr().err


def test_collection_without_answers_skips_llm_with_a_note(mini, tmp_path):
    result = run_experiment(mini, dimes=['prf', 'llm'], ks=[0.5], first_stage='bm25', depth=3,
                            cache_dir=tmp_path, verbose=False)
    assert set(result.kept['dime']) == {'prf'}
    assert any('LLM DIME skipped' in n for n in result.notes)
    assert any('1 queries without judgments' in n for n in result.notes)


def test_llm_row_from_a_generator(mini, tmp_path, monkeypatch):
    calls = []

    class FakeGenerator(pt.Transformer):
        def __init__(self, **kwargs):
            calls.append(kwargs)

        def transform(self, inp):
            return inp.assign(query_answer='a passage about ' + inp['query'])

    monkeypatch.setattr('pyterrier_rdime.experiment.runner.LlmGenerator', FakeGenerator)
    result = run_experiment(mini, dimes=['prf'], ks=[0.5], first_stage='bm25', depth=4, cache_dir=tmp_path,
                            llm_generator='smollm2', verbose=False)
    assert calls == [{'model': None, 'cache': tmp_path, 'verbose': False}]
    assert set(result.kept['dime']) == {'prf', 'llm'}
    assert any('generated by' in n for n in result.notes)


def test_rerun_reuses_the_cached_index(dl19, cache, model, monkeypatch):
    collection, _ = dl19

    def no_encoding(*args, **kwargs):
        raise AssertionError('documents were encoded again')
    monkeypatch.setattr(model, 'encode_docs', no_encoding)
    first = _first_stage(collection, cache)
    index = dense_index(collection, model, 'minilm', cache, first['docno'].unique(), verbose=False)
    assert len(index) >= first['docno'].nunique()


def test_dense_index_adds_only_missing_documents(tmp_path, model):
    collection = load_collection(_mini_collection(tmp_path))
    first = dense_index(collection, model, 'minilm', tmp_path / 'cache', ['d0', 'd1'], verbose=False)
    kept_vecs = first.np_vecs().copy()
    encoded = []
    original = model.encode_docs
    model.encode_docs = lambda texts, batch_size=None: encoded.extend(texts) or original(texts)
    try:
        both = dense_index(collection, model, 'minilm', tmp_path / 'cache', ['d1', 'd2', 'd0'], verbose=False)
    finally:
        model.encode_docs = original
    assert encoded == ['bm25 is a lexical ranking function']
    docnos, vecs, _ = both.payload()
    assert [docnos.fwd[i] for i in range(len(both))] == ['d0', 'd1', 'd2']
    np.testing.assert_array_equal(vecs[:2], kept_vecs)
    np.testing.assert_allclose(vecs[2], original(['bm25 is a lexical ranking function'])[0], atol=1e-6)


def test_a_complete_index_is_reused_without_reading_the_corpus(tmp_path, model):
    collection = load_collection(_mini_collection(tmp_path))
    index = dense_index(collection, model, 'minilm', tmp_path, None, verbose=False)
    assert len(index) == 7 and read_fingerprint(index.index_path)['complete']

    def no_reading(docnos=None):
        raise AssertionError('the corpus was read again')
    collection.docs = no_reading
    assert len(dense_index(collection, model, 'minilm', tmp_path, None, verbose=False)) == 7


@pytest.fixture(scope='module')
def small_index(mini, tmp_path_factory, model):
    """A FlexIndex of the mini collection, built the way a user builds one."""
    import pyterrier_dr
    path = tmp_path_factory.mktemp('index') / 'mini.flex'
    index = pyterrier_dr.FlexIndex(str(path), verbose=False)
    (model >> index.indexer()).index(load_collection(mini).docs(None))
    return path


@pytest.mark.parametrize('mode', ['rerank', 'retrieve'])
def test_an_existing_index_gives_the_numbers_of_the_encoded_one(mode, mini, small_index, tmp_path):
    settings = dict(mode=mode, dimes=['prf'], ks=[0.5], first_stage='bm25', depth=4, num_results=5, verbose=False)
    given = run_experiment(mini, index=str(small_index), cache_dir=tmp_path / 'a', **settings)
    encoded = run_experiment(mini, cache_dir=tmp_path / 'b', **settings)
    pd.testing.assert_frame_equal(given.table, encoded.table, atol=1e-6)
    assert not list((tmp_path / 'a').rglob('*.flex'))  # nothing was encoded


def test_an_index_of_another_encoder_is_refused_with_the_encoder_it_needs(mini, tmp_path):
    import pyterrier_dr
    path = tmp_path / 'msmarco.tasb.flex'
    pyterrier_dr.FlexIndex(str(path), verbose=False).index(
        [{'docno': f'd{i}', 'doc_vec': np.ones(768, dtype=np.float32)} for i in range(7)])
    with pytest.raises(ValueError, match='768-dimensional vectors but the encoder .minilm. gives 384.*--encoder tasb'):
        run_experiment(mini, index=str(path), cache_dir=tmp_path, verbose=False)


def test_retrieval_backends_give_the_same_ranking(mini, small_index, tmp_path):
    settings = dict(mode='retrieve', dimes=['prf'], ks=[0.5], num_results=5, index=str(small_index),
                    cache_dir=tmp_path, verbose=False)
    tables = {backend: run_experiment(mini, retriever=backend, **settings).perquery
              for backend in ('numpy', 'torch', 'faiss-flat', 'pruned')}
    for backend, table in tables.items():
        pd.testing.assert_frame_equal(table, tables['numpy'], atol=1e-6, obj=backend)
    approximate = run_experiment(mini, retriever='faiss-hnsw', **settings)
    assert approximate.table['value'].between(0, 1).all()


def test_sharded_retriever_on_a_local_ray_cluster_gives_the_numbers_of_pruned(mini, small_index, tmp_path, capsys):
    ray = pytest.importorskip('ray', reason='ray is not installed: pip install pyterrier-rdime[ray]')
    import pyterrier_dr
    # a small cell: one DIME, one Top-k, no controls, no sweep (each system is one call of the retriever)
    common = [str(mini), '--mode', 'retrieve', '--dimes', 'prf', '--ks', '0.5', '--num-results', '5', '--index',
              str(small_index), '--controls', '', '--no-sweep', '--quiet', '--cache', str(tmp_path / 'cache')]
    assert main(common + ['--out', str(tmp_path / 'pruned'), '--retriever', 'pruned']) == 0
    try:
        assert main(common + ['--out', str(tmp_path / 'sharded'), '--retriever', 'sharded', '--shards', '2',
                              '--ray-address', 'local']) == 0
    finally:
        ray.shutdown()
    capsys.readouterr()
    cell = 'mini/minilm/perquery.csv'
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / 'sharded' / cell), pd.read_csv(tmp_path / 'pruned' / cell))
    shards = sorted((tmp_path / 'cache' / 'shards').glob('*/shard-*-of-2.flex'))
    assert [len(pyterrier_dr.FlexIndex(str(s))) for s in shards] == [3, 4]  # the 7 documents, cut by the runner


def test_workers_give_the_serial_numbers(mini, tmp_path):
    settings = dict(dimes=['prf'], ks=[0.5], first_stage='bm25', depth=4, cache_dir=tmp_path, verbose=False)
    serial = run_experiment(mini, **settings)
    parallel = run_experiment(mini, workers=2, **settings)
    pd.testing.assert_frame_equal(serial.table, parallel.table, atol=1e-6)


def test_workers_on_a_local_ray_cluster_give_the_serial_numbers(mini, tmp_path, capsys):
    ray = pytest.importorskip('ray', reason='ray is not installed: pip install pyterrier-rdime[ray]')
    common = [str(mini), '--dimes', 'prf', '--ks', '0.5', '--first-stage', 'bm25', '--depth', '4', '--quiet',
              '--cache', str(tmp_path / 'cache')]
    assert main(common + ['--out', str(tmp_path / 'serial')]) == 0
    try:
        assert main(common + ['--out', str(tmp_path / 'ray'), '--workers', '2', '--ray-address', 'local']) == 0
    finally:
        ray.shutdown()
    capsys.readouterr()
    cell = 'mini/minilm/perquery.csv'  # the one cell of the one-cell grid
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / 'ray' / cell), pd.read_csv(tmp_path / 'serial' / cell),
                                  atol=1e-6)


def test_quiet_reaches_the_pruned_retrievers_progress_bars():
    from pyterrier_rdime.experiment.indexes import retriever
    vectors = np.eye(4, dtype=np.float32)
    assert retriever(vectors, 'pruned', 2, verbose=False).verbose is False
    assert retriever(vectors, 'pruned', 2).verbose is True
