"""Robust04's protocol, on a tiny stand-in registered with ir_datasets: documents of title and body fields
(disks45/nocr's TrecParsedDoc) are read as 'title body', queries of title, description and narrative (TrecQuery) as
their title; and the published GPT-4 answers for it by name."""
import ir_datasets
import pytest
from ir_datasets.formats import BaseDocs, BaseQrels, BaseQueries, TrecParsedDoc, TrecQrel, TrecQuery
from ir_datasets.indices import Docstore

from pyterrier_rdime.experiment.collection import load_collection
from pyterrier_rdime.llm.published import ROBUST04, published_entry

NAME = 'rdime-test/robust04-standin'
DOCS = [TrecParsedDoc('FBIS3-1', 'Oil prices', 'Crude rose in March.', b'<DOC>...</DOC>'),
        TrecParsedDoc('LA0101-2', 'Elephant poaching', 'Ivory trade bans in Africa.', b'<DOC>...</DOC>'),
        TrecParsedDoc('FT911-3', '', 'A body without a title.', b'<DOC>...</DOC>')]
QUERIES = [TrecQuery('301', 'international organized crime', 'Identify organizations ...', 'A relevant document ...'),
           TrecQuery('302', 'poliomyelitis and post-polio', 'Is the disease under control?', 'Relevant ...')]
QRELS = [TrecQrel('301', 'FBIS3-1', 1, '0'), TrecQrel('302', 'LA0101-2', 2, '0')]


class _Store(Docstore):
    def get_many_iter(self, doc_ids):
        wanted = set(doc_ids)
        return (d for d in DOCS if d.doc_id in wanted)


class _Docs(BaseDocs):
    def docs_iter(self):
        return iter(DOCS)

    def docs_cls(self):
        return TrecParsedDoc

    def docs_store(self):
        return _Store(TrecParsedDoc)

    def docs_count(self):
        return len(DOCS)

    def docs_namespace(self):
        return NAME

    def docs_lang(self):
        return 'en'


class _Queries(BaseQueries):
    def queries_iter(self):
        return iter(QUERIES)

    def queries_cls(self):
        return TrecQuery

    def queries_namespace(self):
        return NAME

    def queries_lang(self):
        return 'en'


class _Qrels(BaseQrels):
    def qrels_iter(self):
        return iter(QRELS)

    def qrels_cls(self):
        return TrecQrel

    def qrels_defs(self):
        return {0: 'not relevant', 1: 'relevant', 2: 'highly relevant'}


@pytest.fixture(scope='module')
def standin():
    if NAME not in ir_datasets.registry:
        ir_datasets.registry.register(NAME, ir_datasets.Dataset(_Docs(), _Queries(), _Qrels()))
    return load_collection(f'irds:{NAME}')


def test_title_queries(standin):
    """PyTerrier's get_topics() gives no query column for a query class of several fields: the runner failed on
    Robust04 with a KeyError; it now reads each query's default text, the title."""
    assert standin.topics.to_dict('list') == {
        'qid': ['301', '302'], 'query': ['international organized crime', 'poliomyelitis and post-polio']}


def test_documents_are_title_and_body(standin):
    assert {d['docno']: d['text'] for d in standin.docs(None)} == {
        'FBIS3-1': 'Oil prices Crude rose in March.', 'LA0101-2': 'Elephant poaching Ivory trade bans in Africa.',
        'FT911-3': ' A body without a title.'}
    assert [d['text'] for d in standin.docs(['LA0101-2'])] == ['Elephant poaching Ivory trade bans in Africa.']
    assert standin.num_docs == 3 and standin.fingerprint == f'irds:{NAME}'


def test_robust04_answers_are_published_for_gpt4_only():
    assert published_entry('gpt-4', 'irds:' + ROBUST04).url.endswith(
        'llm_docs/disks45_nocr_trec-robust-2004/disks45_nocr_trec-robust-2004/gpt-4.txt')
    with pytest.raises(ValueError, match='published for it: gpt-4, gpt-4-dime'):
        published_entry('llama-3.2-3b', ROBUST04)
