"""benchmarks/scale.py at a tiny size: the index it builds (the real core where it says, distractors unit-norm and
fitted to the core, a killed build resumed to the same bytes), and the whole rehearsal through the runner on a few
DL19 queries, its report written and every sampled retrieval exact."""
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import shared_collection

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / 'benchmarks'))
import scale  # noqa: E402
import scale_index  # noqa: E402


def core(n=300, dims=16, seed=1):
    rng = np.random.default_rng(seed)
    vecs = rng.normal(size=(n, dims)) @ rng.normal(size=(dims, dims)) + 2.0
    return [f'c{i}' for i in range(n)], (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)).astype(np.float32)


def test_the_index_holds_the_core_where_it_says_and_distractors_like_it(tmp_path, monkeypatch):
    from pyterrier_dr import FlexIndex
    monkeypatch.setattr(scale_index, 'BLOCK', 1000)
    docnos, vecs = core()
    folder = scale_index.build_index(tmp_path / 'x.flex', docnos, vecs, 20000, verbose=False)
    names, rows, meta = FlexIndex(str(folder)).payload()
    assert (meta['doc_count'], meta['vec_size']) == (20000, 16)
    positions = scale_index.core_positions(20000, 300)
    assert positions[0] == 0 and positions[-1] == 19999 and len(set(positions)) == 300
    np.testing.assert_array_equal(rows[positions], vecs)
    assert list(names.fwd[positions[:3]]) == ['c0', 'c1', 'c2'] and names.fwd[1] == 'syn1'
    synthetic = np.delete(np.asarray(rows), positions, axis=0)
    np.testing.assert_allclose(np.linalg.norm(synthetic, axis=1), 1, atol=1e-5)
    # the fitted distribution: the distractors' mean direction and per-dimension spread follow the core's
    assert np.corrcoef(synthetic.mean(0), vecs.mean(0))[0, 1] > 0.9  # renormalised: shrunk, not turned
    assert np.corrcoef(synthetic.std(0), vecs.std(0))[0, 1] > 0.9


def test_a_killed_build_resumes_to_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(scale_index, 'BLOCK', 1000)
    docnos, vecs = core()
    whole = scale_index.build_index(tmp_path / 'a.flex', docnos, vecs, 5500, verbose=False)
    real_write = scale_index._write
    written = []

    def dying_write(path, record):
        real_write(path, record)
        written.append(record)
        if record.get('blocks_done') == 3:
            raise KeyboardInterrupt
    monkeypatch.setattr(scale_index, '_write', dying_write)
    with pytest.raises(KeyboardInterrupt):
        scale_index.build_index(tmp_path / 'b.flex', docnos, vecs, 5500, verbose=False)
    assert not (tmp_path / 'b.flex' / 'pt_meta.json').exists()  # never taken for an index
    monkeypatch.setattr(scale_index, '_write', real_write)
    blocks = []
    monkeypatch.setattr(scale_index.np.random, 'default_rng', lambda seed, real=np.random.default_rng:
                        blocks.append(seed[1]) or real(seed))
    resumed = scale_index.build_index(tmp_path / 'b.flex', docnos, vecs, 5500, verbose=False)
    assert blocks == [3, 4, 5]
    assert (whole / 'vecs.f4').read_bytes() == (resumed / 'vecs.f4').read_bytes()


@pytest.fixture
def tiny_collection(tmp_path):
    """Two DL19 queries, their qrels and answers, and the pool's passages judged for them (a few hundred)."""
    source = shared_collection('msmarco-dl19-pool')
    queries = pd.read_csv(source / 'queries.tsv', sep='\t', header=None, dtype=str).head(2)
    qrels = pd.read_csv(source / 'qrels', sep=' ', header=None, dtype=str)
    qrels = qrels[qrels[0].isin(set(queries[0]))]
    folder = tmp_path / 'tiny-dl19'
    folder.mkdir()
    docs = [json.loads(line) for line in (source / 'docs.jsonl').read_text().splitlines()]
    judged = set(qrels[2])
    kept = [d for d in docs if d['docno'] in judged][:120]
    (folder / 'docs.jsonl').write_text(''.join(json.dumps(d) + '\n' for d in kept))
    queries.to_csv(folder / 'queries.tsv', sep='\t', header=False, index=False)
    qrels[qrels[2].isin({d['docno'] for d in kept})].to_csv(folder / 'qrels', sep=' ', header=False, index=False)
    answers = pd.read_csv(source / 'llm_answers.tsv', sep='\t', header=None, dtype=str, quoting=3)
    answers[answers[0].isin(set(queries[0]))].to_csv(folder / 'llm_answers.tsv', sep='\t', header=False,
                                                     index=False, quoting=3)
    return folder


def test_the_rehearsal_at_a_tiny_size_writes_its_report(tiny_collection, tmp_path):
    out = tmp_path / 'out'
    code = scale.main(['--docs', '3000', '--dims', '384', '--collection', str(tiny_collection), '--cache',
                       str(tmp_path / 'cache'), '--out', str(out), '--frontier-queries', '1'])
    assert code == 0
    report = json.loads((out / 'report.json').read_text())
    assert [row['phase'] for row in report['phases']] == ['core', 'index', 'run', 'checks', 'frontier']
    assert report['checks']['checked'] > 10 and report['checks']['wrong'] == 0
    assert {row['path'] for row in report['paths']} and sum(row['queries'] for row in report['paths']) > 100
    systems = {p['system'] for p in report['frontier']}
    assert {'Baseline', 'prf/RDIME', 'prf/k=0.1', 'random/k=0.1'} <= systems
    assert (out / 'frontier.png').stat().st_size > 10000 and 'Exactness' in (out / 'report.md').read_text()
    # the compressed path's copies only: no float32 dimension-major copy of the index
    index = next((tmp_path / 'cache').glob('*.flex'))
    assert not (index / 'rdime.dim_major.npy').exists()


def test_a_run_is_compared_with_another_query_by_query(tmp_path):
    for name, ndcg in (('a', [0.5, 0.25]), ('b', [0.5, 0.25]), ('c', [0.5, 0.2500001])):
        cell = tmp_path / name / 'cell'
        cell.mkdir(parents=True)
        pd.DataFrame({'qid': ['1', '2'], 'name': 'RDIME', 'nDCG@10': ndcg}).to_csv(cell / 'perquery.csv', index=False)
        pd.DataFrame({'qid': ['1', '2'], 'kept': [0.3, 0.4]}).to_csv(cell / 'kept_fraction.csv', index=False)
    assert scale.same_results(tmp_path / 'a', tmp_path / 'b') == {'files': 2, 'differ': []}
    assert scale.same_results(tmp_path / 'a', tmp_path / 'c') == {'files': 2, 'differ': ['perquery.csv']}
    assert scale.check_exact(None, [], 10) == {'checked': 0, 'wrong': 0, 'worst_gap': 0.0}


def test_the_share_of_distractors_in_the_top_10():
    real = scale_index.core_positions(1000, 10)  # 0, 111, 222, ...
    samples = [(None, np.array([0, 111, 5, 6, 222, 333, 444, 555, 666, 777, 1]), None),
               (None, np.array([3, 4]), None)]
    assert real[:3].tolist() == [0, 111, 222]
    assert scale.synthetic_share(samples, 1000, 10) == pytest.approx(4 / 12)  # 2 of the first 10, then 2 of 2
    assert scale.synthetic_share([], 1000, 10) is None
