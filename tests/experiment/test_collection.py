"""Loading collection folders: the parsed frames, and a clear error (file:line, the offending value, the fix) for
every malformed input. Tiny files in tmp_path; no encoder, no index."""
import hashlib
import json
import re
from pathlib import Path

import pytest
from conftest import shared_collection

from pyterrier_rdime.experiment.collection import check_in_corpus, load_collection, read_trec_run

DOCS = [{'docno': 'd0', 'text': 'dense retrieval'}, {'docno': 'd1', 'text': 'query pruning', 'title': 'ignored'},
        {'docno': 'd2', 'text': ''}]


def _folder(tmp_path, docs=None, queries='q1\tdense retrieval\nq2\tpruning\n',
            qrels='q1 0 d0 2\nq1 0 d1 -1\nq2 0 d1 1\n', run=None) -> Path:
    folder = tmp_path / 'coll'
    folder.mkdir(exist_ok=True)
    if docs is None:
        docs = ''.join(json.dumps(d) + '\n' for d in DOCS)
    for name, text in (('docs.jsonl', docs), ('queries.tsv', queries), ('qrels', qrels), ('first.run', run)):
        if text is not None:
            (folder / name).write_bytes(text if isinstance(text, bytes) else text.encode('utf-8'))
    return folder


def _fails(folder, *fragments):
    with pytest.raises(ValueError) as info:
        load_collection(folder)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    return str(info.value)


def test_a_valid_folder_is_read_as_written(tmp_path):
    run = 'q1 Q0 d1 1 3.5 bm25\n\nq1 Q0 d0 2 4.0 bm25\nq2 Q0 d2 1 -1e3 bm25\n'
    collection = load_collection(_folder(tmp_path, queries='q1\tdense\tretrieval\r\n\nq2\tpruning\n', run=run))
    assert collection.topics.values.tolist() == [['q1', 'dense\tretrieval'], ['q2', 'pruning']]
    assert collection.qrels.values.tolist() == [['q1', 'd0', 2], ['q1', 'd1', -1], ['q2', 'd1', 1]]
    assert collection.graded
    assert collection.run[['qid', 'docno', 'score', 'rank']].values.tolist() == [
        ['q1', 'd0', 4.0, 0], ['q1', 'd1', 3.5, 1], ['q2', 'd2', -1000.0, 0]]
    assert collection.num_docs == 3
    assert list(collection.docs(None)) == [{'docno': 'd0', 'text': 'dense retrieval'},
                                           {'docno': 'd1', 'text': 'query pruning'}, {'docno': 'd2', 'text': ''}]
    assert [d['docno'] for d in collection.docs(['d2', 'd0'])] == ['d0', 'd2']


def test_byte_order_marks_and_blank_lines_are_ignored(tmp_path):
    docs = '\ufeff' + json.dumps(DOCS[0]) + '\n\n' + json.dumps(DOCS[1]) + '\n'
    collection = load_collection(_folder(tmp_path, docs=docs, queries='\ufeffq1\tdense\n', qrels='\ufeffq1 0 d0 1\n'))
    assert collection.topics['qid'].tolist() == ['q1']
    assert collection.qrels['qid'].tolist() == ['q1']
    assert collection.num_docs == 2


def test_path_objects_are_accepted_and_keep_the_cache_key(tmp_path):
    folder = _folder(tmp_path)
    assert load_collection(folder).slug == load_collection(str(folder)).slug
    with pytest.raises(TypeError, match='str or os.PathLike'):
        load_collection(42)


def test_irds_collection_counts_its_documents():
    assert load_collection('irds:vaswani').num_docs == 11429


def test_shared_collection_counts_its_documents():
    assert load_collection(shared_collection('msmarco-dl19-pool')).num_docs == 14581


@pytest.mark.parametrize('docs, fragments', [
    ('{"docno": "d0", "text": "a"}\n{"docno": "d1"}\n', ['docs.jsonl:2:', "document 'd1' has no \"text\""]),
    ('{"docno": "d0", "text": null}\n', ['docs.jsonl:1:', "document 'd0' has no \"text\""]),
    ('{"docno": "d0", "text": ["a"]}\n', ['docs.jsonl:1:', 'non-string "text" (list)']),
    ('{"text": "a"}\n', ['docs.jsonl:1:', 'has no "docno"']),
    ('{"docno": 7, "text": "a"}\n', ['docs.jsonl:1:', 'non-string "docno" 7']),
    ('{"docno": "d 0", "text": "a"}\n', ['docs.jsonl:1:', "docno 'd 0' is empty or holds whitespace"]),
    ('{"docno": "", "text": "a"}\n', ['docs.jsonl:1:', "docno '' is empty"]),
    ('\n{"docno": "d0", "text": "a"}\n\n{"docno": "d0", "text": "b"}\n',
     ['docs.jsonl:4:', "docno 'd0' is also on line 2"]),
    ('{"docno": "d0", "text": "a"}\n{"docno": "d1", "text": "b"}\n{"docno": "d2", "text": "c\n',
     ['docs.jsonl:3:', 'not valid JSON at column 25']),
    ('["d0", "a"]\n', ['docs.jsonl:1:', 'a JSON list, not an object']),
    ('', ['docs.jsonl holds no documents']),
    ('\n\n', ['docs.jsonl holds no documents']),
    (b'{"docno": "d0", "text": "a"}\n{"docno": "d1", "text": "caf\xe9"}\n',
     ['docs.jsonl:2:', 'not UTF-8', 'byte 0xe9', 'iconv -f latin1 -t utf-8']),
])
def test_bad_documents(tmp_path, docs, fragments):
    message = _fails(_folder(tmp_path, docs=docs), *fragments)
    assert str(tmp_path / 'coll' / 'docs.jsonl') in message


def test_the_docs_iterator_checks_again_before_anything_is_built(tmp_path):
    collection = load_collection(_folder(tmp_path))
    docs_path = tmp_path / 'coll' / 'docs.jsonl'
    docs_path.write_text(json.dumps(DOCS[0]) + '\n{"docno": "d1"}\n' + json.dumps(DOCS[2]) + '\n')
    consumed = []
    with pytest.raises(ValueError, match=re.escape(f'{docs_path}:2: document \'d1\' has no "text"')):
        consumed.extend(collection.docs(None))
    assert [d['docno'] for d in consumed] == ['d0']
    for edited in (DOCS[:2], [DOCS[0], {**DOCS[1], 'text': 'query pruning!'}, DOCS[2]]):
        docs_path.write_text(''.join(json.dumps(d) + '\n' for d in edited))
        with pytest.raises(ValueError, match=re.escape(f'{docs_path} changed since the collection was loaded; load '
                                                       'the collection again')):
            list(collection.docs(['d0']))


@pytest.mark.parametrize('queries, fragments', [
    ('q1\tdense\nq2\tpruning\nq1\tsparse\n', ['queries.tsv:3:', "qid 'q1' is also on line 1"]),
    ('q1\tdense\nq2 pruning\n', ['queries.tsv:2:', "no tab in 'q2 pruning'", 'qid<TAB>query']),
    ('q1\t \n', ['queries.tsv:1:', "qid 'q1' has an empty query"]),
    ('q 1\tdense\n', ['queries.tsv:1:', "qid 'q 1' is empty or holds whitespace"]),
    ('\tdense\n', ['queries.tsv:1:', "qid '' is empty"]),
    ('\n', ['queries.tsv holds no queries']),
    (b'q1\tdense\nq2\tna\xefve\n', ['queries.tsv:2:', 'not UTF-8']),
])
def test_bad_queries(tmp_path, queries, fragments):
    _fails(_folder(tmp_path, queries=queries), *fragments)


@pytest.mark.parametrize('qrels, fragments', [
    ('q1 0 d0 1\nq1 0 d1\n', ['qrels:2:', "3 fields in 'q1 0 d1', not 4", 'qid 0 docno label']),
    ('q1 0 d0 1 extra\n', ['qrels:1:', '5 fields']),
    ('q1 0 d0 1\nq1 0 d1 x\n', ['qrels:2:', "label 'x' of qid 'q1', docno 'd1' is not an integer"]),
    ('q1 0 d0 1.5\n', ['qrels:1:', "label '1.5'"]),
    ('q1 0 d0 1\nq2 0 d0 0\nq1 0 d0 2\n', ['qrels:3:', "qid 'q1', docno 'd0' is judged again (also on line 1)"]),
    ('', ['qrels holds no judgments']),
])
def test_bad_qrels(tmp_path, qrels, fragments):
    _fails(_folder(tmp_path, qrels=qrels), *fragments)


@pytest.mark.parametrize('run, fragments', [
    ('q1 Q0 d0 1 2.0 bm25\n<html>not a run</html>\n', ['first.run:2:', '3 fields', 'qid Q0 docno rank score tag']),
    ('q1 Q0 d0 1 2.0 bm25\nq1 Q0 d1 2 high bm25\n', ['first.run:2:', "score 'high' of qid 'q1', docno 'd1'"]),
    ('q1 Q0 d0 1 nan bm25\n', ['first.run:1:', "score 'nan'", 'finite']),
    ('q1 Q0 d0 first 2.0 bm25\n', ['first.run:1:', "rank 'first' of qid 'q1', docno 'd0' is not an integer"]),
    ('q1 Q0 d0 1 2.0 bm25\nq1 Q0 d0 2 1.0 bm25\n',
     ['first.run:2:', "qid 'q1' ranks docno 'd0' twice (also on line 1)"]),
    ('\n', ['first.run holds no ranking']),
])
def test_bad_runs(tmp_path, run, fragments):
    _fails(_folder(tmp_path, run=run), *fragments)
    with pytest.raises(ValueError, match=re.escape(fragments[0])):
        read_trec_run(str(tmp_path / 'coll' / 'first.run'))


def test_a_run_naming_a_document_the_corpus_lacks_fails_at_load_time(tmp_path):
    run = 'q1 Q0 d1 1 3.5 bm25\nq1 Q0 d7 2 3.0 bm25\nq2 Q0 d8 1 1.0 bm25\n'
    message = _fails(_folder(tmp_path, run=run), "first.run: docno 'd7' (qid 'q1') is not in", 'nor are 1 other',
                     'add the documents to docs.jsonl or remove them from the run')
    assert str(tmp_path / 'coll' / 'docs.jsonl') in message


def test_documents_are_looked_up_and_fingerprinted_by_content(tmp_path):
    collection = load_collection(_folder(tmp_path))
    assert collection.absent(['d2', 'x', 'd0', 'y']) == ['x', 'y']
    expected = hashlib.sha256((tmp_path / 'coll' / 'docs.jsonl').read_bytes()).hexdigest()
    assert collection.fingerprint == f'sha256:{expected}'
    with pytest.raises(ValueError, match="the run names docno 'x' \\(and 1 more\\), which is not in the corpus of "
                                         f"collection '{re.escape(str(tmp_path / 'coll'))}'"):
        check_in_corpus(collection.absent, ['d0', 'x', 'y'], collection.name, 'the run')
    with pytest.raises(ValueError, match="the documents asked for names docno 'x'"):
        collection.docs(['d0', 'x'])  # at the call, before anything is read


def test_the_cache_key_is_the_folder_name_not_its_path(tmp_path):
    (tmp_path / 'a').mkdir()
    (tmp_path / 'b').mkdir()
    first = load_collection(_folder(tmp_path / 'a'))
    second = load_collection(_folder(tmp_path / 'b', docs='{"docno": "x", "text": "other content"}\n'))
    assert first.slug == second.slug == f'coll-{hashlib.sha1(b"coll").hexdigest()[:8]}'
    assert load_collection('irds:vaswani').slug == f'vaswani-{hashlib.sha1(b"irds:vaswani").hexdigest()[:8]}'


def test_irds_documents_are_looked_up_in_its_docstore():
    collection = load_collection('irds:vaswani')
    assert collection.absent(['1', 'nope', '11429']) == ['nope']
    assert collection.fingerprint == 'irds:vaswani'
