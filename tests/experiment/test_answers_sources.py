"""Several LLM answer sources in one run: one LLM DIME per source, each with its Top-k, RDIME, controls and sweep,
named by the source in every table; a source that leaves queries unanswered says so."""
import json

import numpy as np
import pytest

from pyterrier_rdime.experiment.cli import main
from pyterrier_rdime.experiment.runner import run_experiment


@pytest.fixture(scope='module')
def mini(tmp_path_factory):
    """Seven documents, two judged queries, two answer sources in llm_answers/ (``thin`` answers query 1 only)."""
    folder = tmp_path_factory.mktemp('sources') / 'mini'
    folder.mkdir()
    texts = ['dense retrieval with neural encoders', 'pruning embedding dimensions at query time',
             'bm25 is a lexical ranking function', 'the cat sat on the mat', 'query expansion with feedback',
             'statistics of risk estimation', 'hard thresholding of noisy signals']
    (folder / 'docs.jsonl').write_text(''.join(json.dumps({'docno': f'd{i}', 'text': t}) + '\n'
                                               for i, t in enumerate(texts)))
    (folder / 'queries.tsv').write_text('1\tdense retrieval\n2\tnoisy signal thresholding\n')
    (folder / 'qrels').write_text(''.join(f'{q} 0 d{i} {int(i % 2 == 0)}\n' for q in '12' for i in range(4)))
    (folder / 'llm_answers').mkdir()
    (folder / 'llm_answers' / 'full.tsv').write_text('1\tneural encoders embed text for dense retrieval\n'
                                                     '2\tthresholding removes noise from a signal\n')
    (folder / 'llm_answers' / 'thin.tsv').write_text('1\tcats sit on mats\n')
    return folder


@pytest.fixture(scope='module')
def result(mini, tmp_path_factory):
    return run_experiment(mini, dimes=['prf', 'llm'], ks=[0.5], first_stage='bm25', depth=5, answers='full,thin',
                          controls=['random', 'magnitude'], control_seeds=2,
                          cache_dir=tmp_path_factory.mktemp('cache'), verbose=False)


def test_one_llm_dime_per_source_with_its_columns_and_controls(result):
    assert result.labels == {'prf': 'PRF (M=2)', 'llm@full': 'LLM (full)', 'llm@thin': 'LLM (thin)'}
    systems = set(result.table['system'])
    for dime in ('llm@full', 'llm@thin'):
        assert {f'{dime}/{c}' for c in ('k=0.5', 'RDIME', 'CV Top-k', 'RDIME:random', 'RDIME:magnitude')} <= systems
        assert {(dime, f) for f in np.round(np.arange(0.1, 1.01, 0.1), 1)} <= set(map(tuple, result.sweep[
            ['dime', 'fraction']].drop_duplicates().round(1).itertuples(index=False)))
    assert set(result.kept['dime']) == {'prf', 'llm@full', 'llm@thin'}
    table = result.paper_table('nDCG@10')
    assert list(table['DIME']) == ['PRF (M=2)', 'LLM (full)', 'LLM (thin)', 'Baseline']
    assert set(result.significance['dime']) >= {'llm@full', 'llm@thin'}


def test_sources_give_their_own_importance(result):
    """Query 1's answers differ, so do its kept dimensions; query 2 has no 'thin' answer: q ⊙ q, as magnitude."""
    kept = result.kept[result.kept['threshold'] == 'RDIME'].set_index(['dime', 'qid'])['kept_frac']
    assert kept['llm@full', '1'] != kept['llm@thin', '1'] or kept['llm@full', '2'] != kept['llm@thin', '2']
    assert any(n.startswith('LLM answers thin: no answer for 1 of 2 queries (2)') for n in result.notes)
    assert not any('LLM answers full' in n for n in result.notes)


def test_the_command_names_each_source_in_its_tables(mini, tmp_path, capsys):
    out = tmp_path / 'out'
    assert main([str(mini), '--answers', 'full,thin', '--dimes', 'llm', '--ks', '0.5', '--no-sweep', '--first-stage',
                 'bm25', '--depth', '5', '--controls', 'magnitude', '--cache', str(tmp_path / 'cache'), '--out',
                 str(out), '--quiet']) == 0
    printed = capsys.readouterr().out
    assert 'LLM (full)' in printed and 'LLM (thin)' in printed
    grid = (out / 'grid.md').read_text(encoding='utf-8')
    assert 'LLM (full)' in grid and 'LLM (thin)' in grid
    sources = (out / 'mini' / 'minilm' / 'sources.md').read_text(encoding='utf-8').splitlines()
    assert [line.split('|')[1].strip() for line in sources[2:]] == ['LLM (full)', 'LLM (thin)', 'Baseline']
    assert 'vs magnitude (nDCG@10)' in sources[0] and 'vs random' not in sources[0]  # only the controls run
    assert (out / 'mini' / 'minilm' / 'sources.png').stat().st_size > 0


def test_sources_table_per_source(result):
    table = result.sources_table()
    assert list(table['source']) == ['LLM (full)', 'LLM (thin)', 'Baseline']
    values = result.table.set_index(['system', 'measure'])['value']
    assert table.loc[0, 'nDCG@10 RDIME'] == f"{values['llm@full/RDIME', 'nDCG@10']:.4f}"
    assert table.loc[2, 'AP RDIME'] == f"{values['Baseline', 'AP']:.4f}"
    assert set(table.loc[:1, 'vs random (AP)']) <= {'better', 'worse', 'equivalent', 'inconclusive'}
