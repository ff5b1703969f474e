"""The experiment runner on a small real subset, and its error paths."""
import json
import time

import numpy as np
import pandas as pd
import pyterrier as pt
import pytest
from conftest import shared_collection
from ir_measures import AP, nDCG

import pyterrier_rdime as rdime
from pyterrier_rdime.experiment.cli import main
from pyterrier_rdime.experiment.collection import load_collection
from pyterrier_rdime.experiment.encoders import load_encoder, resolve_encoder
from pyterrier_rdime.experiment.runner import dense_index, first_stage_results, holm, run_experiment

NUM_QUERIES = 4
DEPTH = 12


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp('cache')


@pytest.fixture(scope='module')
def dl19(cache):
    collection = load_collection(str(shared_collection('msmarco-dl19-pool')))
    result = run_experiment(collection, dimes=['prf', 'swc', 'llm'], depth=DEPTH, max_queries=NUM_QUERIES,
                            cache_dir=cache, verbose=False)
    return collection, result


def test_table_has_the_papers_structure(dl19):
    _, result = dl19
    assert result.measures == ['nDCG@10', 'AP(rel=2)']
    systems = set(result.table['system'])
    assert systems == {'Baseline'} | {f'{d}/{t}' for d in ('prf', 'swc', 'llm')
                                      for t in ('k=0.4', 'k=0.6', 'k=0.8', 'RDIME')}
    table = result.paper_table('nDCG@10')
    assert list(table.columns) == ['DIME', 'k=0.4', 'k=0.6', 'k=0.8', 'RDIME (kept)', 'Δ% vs best Top-k']
    assert list(table['DIME']) == ['PRF (M=2)', 'SWC (M=10, τ=0.1)', 'LLM', 'Baseline']
    kept = result.kept[result.kept['threshold'] == 'RDIME']
    assert len(kept) == 3 * NUM_QUERIES and kept['kept_frac'].between(0, 1, inclusive='right').all()
    topk = result.kept[result.kept['threshold'] == 'k=0.4']
    assert np.allclose(topk['kept_frac'], round(0.4 * 384) / 384)
    assert set(result.significance['comparison'].str.split(' ').str[0]) == {'best', 'Baseline'}
    assert 'label ≥ 2' in ' '.join(result.notes)


def test_numbers_equal_a_direct_pt_experiment(dl19, cache):
    collection, result = dl19
    topics = collection.topics.head(NUM_QUERIES)
    model = load_encoder('minilm')
    first, _ = first_stage_results(collection, 'auto', DEPTH, cache)
    index = dense_index(collection, model, 'minilm', cache, first['docno'].unique(), verbose=False)
    prefix = pt.Transformer.from_df(first) >> model.query_encoder() >> index.vec_loader()
    answers = rdime.LlmAnswers.from_tsv(shared_collection('msmarco-dl19-pool') / 'llm_answers.tsv')
    systems = {
        'Baseline': prefix >> index.scorer(),
        'prf/k=0.6': prefix >> rdime.PrfDime() >> rdime.TopK(k=0.6) >> index.scorer(),
        'swc/RDIME': prefix >> rdime.SwcDime() >> rdime.Rdime() >> index.scorer(),
        'llm/RDIME': prefix >> answers >> rdime.LlmDime(encoder=model) >> rdime.Rdime() >> index.scorer(),
    }
    direct = pt.Experiment(list(systems.values()), topics, collection.qrels, [nDCG @ 10, AP(rel=2)],
                           names=list(systems), verbose=False).set_index('name')
    ours = result.table.pivot(index='system', columns='measure', values='value')
    for name in systems:
        assert ours.loc[name, 'nDCG@10'] == pytest.approx(direct.loc[name, 'nDCG@10'], abs=1e-9)
        assert ours.loc[name, 'AP(rel=2)'] == pytest.approx(direct.loc[name, 'AP(rel=2)'], abs=1e-9)


def test_saved_outputs_and_cli(dl19, cache, tmp_path, capsys):
    _, result = dl19
    out = result.save(tmp_path / 'saved')
    for name in ('results.md', 'results.csv', 'results.json', 'significance.csv', 'kept_fraction.csv',
                 'kept_fraction.png'):
        assert (out / name).stat().st_size > 0
    assert json.loads((out / 'results.json').read_text())['settings']['num_queries'] == NUM_QUERIES
    assert pd.read_csv(out / 'kept_fraction.csv')['kept_frac'].between(0, 1).all()

    code = main([str(shared_collection('msmarco-dl19-pool')), '--dimes', 'prf', '--depth', str(DEPTH),
                 '--max-queries', '2', '--cache', str(cache), '--out', str(tmp_path / 'cli'), '--quiet'])
    printed = capsys.readouterr().out
    assert code == 0
    assert '| PRF (M=2)' in printed and 'Baseline' in printed
    assert (tmp_path / 'cli' / 'results.md').is_file()


def test_rerun_reuses_the_cached_index(dl19, cache, monkeypatch):
    collection, _ = dl19

    def no_encoding(*args, **kwargs):
        raise AssertionError('documents were encoded again')
    model = load_encoder('minilm')
    monkeypatch.setattr(model, 'encode_docs', no_encoding)
    first, _ = first_stage_results(collection, 'auto', DEPTH, cache)
    first = first[first['qid'].isin(collection.topics.head(NUM_QUERIES)['qid'])]
    index = dense_index(collection, model, 'minilm', cache, first['docno'].unique(), verbose=False)
    assert len(index) >= first['docno'].nunique()


def test_collection_without_answers_skips_llm_with_a_note(tmp_path):
    folder = _mini_collection(tmp_path)
    result = run_experiment(str(folder), dimes=['prf', 'llm'], ks=[0.5], first_stage='bm25', depth=3,
                            cache_dir=tmp_path / 'cache', verbose=False)
    assert set(result.kept['dime']) == {'prf'}
    assert any('LLM DIME skipped' in n for n in result.notes)
    assert any('1 queries without judgments' in n for n in result.notes)


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


@pytest.mark.parametrize('name, message', [
    ('irds:no-such-dataset/at-all', 'unknown ir_datasets id'),
    ('/no/such/folder', 'neither an ir_datasets id'),
])
def test_unknown_collection(name, message):
    with pytest.raises(ValueError, match=message):
        load_collection(name)


def test_folder_missing_files(tmp_path):
    (tmp_path / 'docs.jsonl').write_text('')
    with pytest.raises(ValueError, match='lacks queries.tsv, qrels'):
        load_collection(str(tmp_path))


def test_queries_without_judgments(tmp_path):
    folder = _mini_collection(tmp_path, qrels_qids=('99',))
    with pytest.raises(ValueError, match='none of its 3 queries has relevance judgments'):
        load_collection(str(folder))


def test_runner_rejects_bad_options(tmp_path):
    folder = str(_mini_collection(tmp_path))
    with pytest.raises(ValueError, match='unknown DIME'):
        run_experiment(folder, dimes=['prf', 'magic'], cache_dir=tmp_path)
    with pytest.raises(ValueError, match="mode must be 'rerank' or 'retrieve'"):
        run_experiment(folder, mode='dense', cache_dir=tmp_path)
    with pytest.raises(ValueError, match='TopK'):
        run_experiment(folder, ks=[1.5], cache_dir=tmp_path)
    with pytest.raises(ValueError, match='not .auto., .bm25. or an existing TREC run file'):
        run_experiment(folder, first_stage='/no/such.run', cache_dir=tmp_path, verbose=False)


def test_hub_encoder_fails_fast_offline(monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    start = time.time()
    with pytest.raises(RuntimeError, match='not in the Hugging Face cache'):
        resolve_encoder('tasb')
    assert time.time() - start < 10


def test_cli_reports_errors(tmp_path, capsys):
    assert main(['/no/such/folder', '--cache', str(tmp_path)]) == 2
    assert 'rdime-experiment: error:' in capsys.readouterr().err


def test_holm_treats_nan_as_not_significant():
    adjusted = holm(pd.Series([0.01, np.nan, 0.04, 0.03]))
    assert adjusted.tolist() == pytest.approx([0.04, 1.0, 0.09, 0.09])


def test_retrieve_mode_runs_full_dense_retrieval(tmp_path):
    folder = _mini_collection(tmp_path)
    result = run_experiment(str(folder), mode='retrieve', num_results=5, dimes=['prf', 'swc'], ks=[0.5],
                            cache_dir=tmp_path / 'cache', verbose=False)
    assert result.settings['first_stage'].startswith('dense retrieval')
    assert set(result.table['system']) == {'Baseline', 'prf/k=0.5', 'prf/RDIME', 'swc/k=0.5', 'swc/RDIME'}
    assert result.kept.loc[result.kept['threshold'] == 'k=0.5', 'kept_frac'].eq(0.5).all()
    assert result.table['value'].between(0, 1).all()


def test_llm_row_from_a_generator(tmp_path, monkeypatch):
    calls = []

    class FakeGenerator(pt.Transformer):
        def __init__(self, **kwargs):
            calls.append(kwargs)

        def transform(self, inp):
            return inp.assign(query_answer='a passage about ' + inp['query'])

    monkeypatch.setattr('pyterrier_rdime.experiment.runner.LlmGenerator', FakeGenerator)
    folder = _mini_collection(tmp_path)
    result = run_experiment(str(folder), dimes=['prf'], ks=[0.5], first_stage='bm25', depth=4,
                            cache_dir=tmp_path / 'cache', llm_generator='smollm2', verbose=False)
    assert calls == [{'model': None, 'cache': tmp_path / 'cache', 'verbose': False}]
    assert set(result.kept['dime']) == {'prf', 'llm'}
    assert any('generated by' in n for n in result.notes)
    assert not any('LLM DIME skipped' in n for n in result.notes)


def test_dense_index_adds_only_missing_documents(tmp_path):
    collection = load_collection(str(_mini_collection(tmp_path)))
    model = load_encoder('minilm')
    first = dense_index(collection, model, 'minilm', tmp_path / 'cache', ['d0', 'd1'], verbose=False)
    kept_vecs = first.np_vecs().copy()
    encoded = []
    original = model.encode_docs
    model.encode_docs = lambda texts, batch_size=None: encoded.extend(texts) or original(texts)
    both = dense_index(collection, model, 'minilm', tmp_path / 'cache', ['d1', 'd2', 'd0'], verbose=False)
    assert encoded == ['bm25 is a lexical ranking function']
    docnos, vecs, _ = both.payload()
    assert [docnos.fwd[i] for i in range(len(both))] == ['d0', 'd1', 'd2']
    np.testing.assert_array_equal(vecs[:2], kept_vecs)
    np.testing.assert_allclose(vecs[2], original(['bm25 is a lexical ranking function'])[0], atol=1e-6)
