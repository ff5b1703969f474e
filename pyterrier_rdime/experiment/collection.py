"""Test collections for experiments: an ir_datasets id (``irds:…``) or a local folder of the shared-data format."""
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, Optional, Sequence

import pandas as pd
import pyterrier as pt

from ..llm import read_answers_tsv

REQUIRED_FILES = ('docs.jsonl', 'queries.tsv', 'qrels')


@dataclass
class Collection:
    """Everything an experiment reads from a test collection.

    Attributes:
        name: the id or folder given by the user.
        topics: ``qid, query`` of the judged queries.
        qrels: ``qid, docno, label``.
        docs: ``docs(docnos=None)`` iterates ``{'docno', 'text'}`` dicts, of all documents or of the given ones.
        run: a supplied first-stage run (``qid, docno, score, rank``), if the collection ships one.
        answers: LLM answers (qid -> text) for LLM DIME, if the collection ships them.
        dropped_queries: qids of queries that were dropped because they have no judgments.
    """
    name: str
    topics: pd.DataFrame
    qrels: pd.DataFrame
    docs: Callable[[Optional[Sequence[str]]], Iterator[Dict[str, str]]] = field(repr=False)
    run: Optional[pd.DataFrame] = None
    answers: Optional[Dict[str, str]] = None
    dropped_queries: tuple = ()

    @property
    def slug(self) -> str:
        """A file-name-safe, unique key of the collection for caches."""
        base = re.sub(r'[^A-Za-z0-9_.-]+', '_', self.name.replace('irds:', '')).strip('_')[-60:]
        digest = hashlib.sha1(_identity(self.name).encode()).hexdigest()[:8]
        return f'{base}-{digest}'

    @property
    def graded(self) -> bool:
        return bool(self.qrels['label'].max() > 1)


def _identity(name: str) -> str:
    return name if name.startswith('irds:') else str(Path(name).resolve())


def load_collection(name: str) -> Collection:
    """Load ``irds:<ir_datasets id>`` or a folder holding ``docs.jsonl``, ``queries.tsv`` and ``qrels`` (optionally
    one ``*.run`` first-stage run and ``llm_answers.tsv``). Queries without judgments are dropped (listed in
    ``dropped_queries``); a collection where no query is judged is an error."""
    if name.startswith('irds:'):
        collection = _load_irds(name)
    elif Path(name).is_dir():
        collection = _load_folder(Path(name))
    else:
        raise ValueError(f'collection {name!r} is neither an ir_datasets id (irds:<id>, e.g. irds:vaswani) nor an '
                         f'existing folder with {", ".join(REQUIRED_FILES)}')
    return _judged_only(collection)


def _judged_only(collection: Collection) -> Collection:
    qrels = collection.qrels
    qrels = qrels.assign(qid=qrels['qid'].astype(str), docno=qrels['docno'].astype(str))
    topics = collection.topics.assign(qid=collection.topics['qid'].astype(str))
    judged = topics['qid'].isin(set(qrels['qid']))
    if not judged.any():
        raise ValueError(f'collection {collection.name!r}: none of its {len(topics)} queries has relevance '
                         'judgments; check that the qrels and the queries use the same qids')
    run = collection.run
    if run is not None:
        run = run[run['qid'].isin(set(topics['qid'][judged]))]
    collection.topics = topics[judged].reset_index(drop=True)
    collection.qrels = qrels[['qid', 'docno', 'label']]
    collection.run = run
    collection.dropped_queries = tuple(topics['qid'][~judged])
    return collection


def _load_irds(name: str) -> Collection:
    import ir_datasets
    dataset_id = name[len('irds:'):]
    try:
        ir_datasets.load(dataset_id)
    except KeyError:
        raise ValueError(f'unknown ir_datasets id {dataset_id!r}; see https://ir-datasets.com for the ids') from None
    dataset = pt.get_dataset(name)
    irds = dataset.irds_ref()
    if not (irds.has_docs() and irds.has_queries() and irds.has_qrels()):
        raise ValueError(f'{name} lacks documents, queries or qrels; pick a dataset id with all three '
                         '(for example irds:msmarco-passage/trec-dl-2019/judged)')
    topics = dataset.get_topics()[['qid', 'query']]
    qrels = dataset.get_qrels()

    def docs(docnos: Optional[Sequence[str]] = None) -> Iterator[Dict[str, str]]:
        source = irds.docs_iter() if docnos is None else irds.docs_store().get_many_iter(docnos)
        for doc in source:
            yield {'docno': doc.doc_id, 'text': _doc_text(doc)}

    return Collection(name=name, topics=topics, qrels=qrels, docs=docs)


def _doc_text(doc) -> str:
    if hasattr(doc, 'default_text'):
        return doc.default_text()
    return ' '.join(str(v) for k, v in doc._asdict().items() if k != 'doc_id' and isinstance(v, str))


def _load_folder(path: Path) -> Collection:
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
    if missing:
        raise ValueError(f'collection folder {path} lacks {", ".join(missing)}; a collection folder holds '
                         'docs.jsonl ({"docno", "text"} per line), queries.tsv (qid<TAB>query) and qrels (TREC format)')
    topics = pd.read_csv(path / 'queries.tsv', sep='\t', names=['qid', 'query'], dtype=str, quoting=3,
                         keep_default_na=False)
    qrels = pd.read_csv(path / 'qrels', sep=r'\s+', names=['qid', 'iteration', 'docno', 'label'],
                        dtype={'qid': str, 'docno': str, 'label': int})
    runs = sorted(path.glob('*.run'))
    if len(runs) > 1:
        raise ValueError(f'collection folder {path} holds several runs ({", ".join(r.name for r in runs)}); '
                         'keep one, or pass the one to use as the first stage explicitly')
    run = read_trec_run(runs[0]) if runs else None
    answers = read_answers_tsv(path / 'llm_answers.tsv') if (path / 'llm_answers.tsv').is_file() else None

    def docs(docnos: Optional[Sequence[str]] = None) -> Iterator[Dict[str, str]]:
        wanted = None if docnos is None else set(docnos)
        with open(path / 'docs.jsonl', encoding='utf-8') as f:
            for line in f:
                doc = json.loads(line)
                if wanted is None or doc['docno'] in wanted:
                    yield {'docno': doc['docno'], 'text': doc['text']}

    return Collection(name=str(path), topics=topics, qrels=qrels, docs=docs, run=run, answers=answers)


def read_trec_run(path: os.PathLike) -> pd.DataFrame:
    """A TREC run file as ``qid, docno, score, rank`` (rank re-derived from the score, 0-based)."""
    run = pd.read_csv(path, sep=r'\s+', names=['qid', 'Q0', 'docno', 'rank', 'score', 'tag'],
                      dtype={'qid': str, 'docno': str, 'score': float})
    if run.empty or run['score'].isna().any():
        raise ValueError(f'{path} is not a TREC run file (qid Q0 docno rank score tag per line)')
    run = run.sort_values(['qid', 'score'], ascending=[True, False], kind='stable')
    return pt.model.add_ranks(run[['qid', 'docno', 'score']].reset_index(drop=True))


def iter_texts(collection: Collection, docnos: Optional[Iterable[str]]) -> Iterator[Dict[str, str]]:
    """Documents of ``collection`` (all, or those in ``docnos``); raises if any requested docno is missing."""
    wanted = None if docnos is None else sorted(set(docnos))
    seen = 0
    for doc in collection.docs(wanted):
        seen += 1
        yield doc
    if wanted is not None and seen < len(wanted):
        raise ValueError(f'collection {collection.name!r}: {len(wanted) - seen} of the {len(wanted)} documents of '
                         'the first-stage ranking are not in the corpus; the run and the corpus do not match')
