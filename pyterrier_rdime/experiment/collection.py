"""Test collections for experiments: an ir_datasets id (``irds:…``) or a local folder of the shared-data format,
its files checked line by line when loaded."""
import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd
import pyterrier as pt

from .. import store
from .._frames import read_qid_tsv, utf8_lines
from ..llm import read_answers_tsv

REQUIRED_FILES = ('docs.jsonl', 'queries.tsv', 'qrels')
DOCS_FORMAT = 'each line of docs.jsonl is one JSON object {"docno": "<id>", "text": "<text>"}'
QUERIES_FORMAT = 'each line of queries.tsv is qid<TAB>query'
QRELS_FORMAT = 'each line of qrels is "qid 0 docno label" with an integer label'
RUN_FORMAT = 'each line of a TREC run is "qid Q0 docno rank score tag" with an integer rank and a finite score'
_INTEGER = re.compile(r'[+-]?[0-9]+')
#: The record (:mod:`pyterrier_rdime.store`) in a cached index's folder of what it was built from.
FINGERPRINT = 'rdime_fingerprint.json'

logger = logging.getLogger(__name__)


def slug(label: str, key: Optional[str] = None) -> str:
    """A file-name-safe folder name: ``label`` with other characters than letters, digits and ``_.-`` as ``_``, its
    last 60 characters, then ``-<key>`` where given. The one naming rule of the caches and cell folders."""
    base = re.sub(r'[^A-Za-z0-9_.-]+', '_', label).strip('_')[-60:]
    return f'{base}-{key}' if key is not None else base or '_'


def read_fingerprint(folder: Union[str, Path]) -> Optional[dict]:
    """The fingerprint recorded in ``folder``; ``None`` (unknown content) when there is none or it does not check."""
    try:
        return store.read_json(Path(folder) / FINGERPRINT, 'fingerprint')
    except ValueError:  # store.Damaged, or not JSON
        return None


def write_fingerprint(folder: Union[str, Path], **fields) -> None:
    """Records ``fields`` in ``folder``, atomically (a killed process leaves the old file or the new one)."""
    store.write_json(Path(folder) / FINGERPRINT, 'fingerprint', fields)


@dataclass
class Collection:
    """Everything an experiment reads from a test collection.

    Attributes:
        name: the id or folder given by the user.
        topics: ``qid, query`` of the judged queries.
        qrels: ``qid, docno, label``.
        docs: ``docs(docnos=None)`` iterates ``{'docno', 'text'}`` dicts, of all documents or of the given ones
            (in corpus order; a docno the corpus lacks is a ``ValueError`` raised by the call). A folder's lines
            are checked again while read, and a file changed since loading is an error.
        absent: ``absent(docnos)`` lists those of ``docnos`` that the corpus does not hold (in their order).
        fingerprint: what caches key the documents by: ``sha256:`` of ``docs.jsonl``, or the ir_datasets id.
        run: a supplied first-stage run (``qid, docno, score, rank``), if the collection ships one.
        answers: LLM answers (qid -> text) for LLM DIME, if the collection ships them.
        dropped_queries: qids of queries that were dropped because they have no judgments.
        num_docs: the number of documents of the corpus (``None`` where ir_datasets does not know it).
    """
    name: str
    topics: pd.DataFrame
    qrels: pd.DataFrame
    docs: Callable[[Optional[Sequence[str]]], Iterator[Dict[str, str]]] = field(repr=False)
    absent: Callable[[Sequence[str]], List[str]] = field(repr=False)
    fingerprint: str
    run: Optional[pd.DataFrame] = None
    answers: Optional[Dict[str, str]] = None
    dropped_queries: tuple = ()
    num_docs: Optional[int] = None

    #: A file-name-safe key for cache folders: the ir_datasets id or the folder's name (not its path).
    slug: str = field(init=False)

    def __post_init__(self):
        identity = self.name if self.name.startswith('irds:') else Path(self.name).resolve().name
        self.slug = slug(identity.replace('irds:', ''), hashlib.sha1(identity.encode()).hexdigest()[:8])

    @property
    def graded(self) -> bool:
        return bool(self.qrels['label'].max() > 1)


def load_collection(name: Union[str, os.PathLike]) -> Collection:
    """Load ``irds:<ir_datasets id>`` or a folder holding ``docs.jsonl``, ``queries.tsv`` and ``qrels`` (optionally
    one ``*.run`` first-stage run and ``llm_answers.tsv``).

    A folder's files must be UTF-8; blank lines are skipped. The first bad line raises ``ValueError`` naming the
    file and line (docs: JSON with string ``docno`` and ``text``, docnos unique; queries: ``qid<TAB>query``; qrels:
    four fields, integer label; a run as :func:`read_trec_run`, its docnos in the corpus). Queries without judgments
    are dropped (``dropped_queries``); a collection with no judged query is an error.

    Args:
        name: ``irds:<id>``, or the path of a collection folder (``str`` or ``os.PathLike``).
    """
    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    if not isinstance(name, str):
        raise TypeError(f'load_collection: name must be irds:<id> or the path of a collection folder (str or '
                        f'os.PathLike), got {type(name).__name__} {name!r}')
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
    unasked = ~qrels['qid'].isin(set(topics['qid']))
    if unasked.any():  # said once, here: the steps evaluate the queries only
        qids = qrels['qid'][unasked].unique()
        logger.warning('collection %s: the qrels judge %d queries that are not among its %d queries (e.g. qid %r); '
                       'their %d judgments are left out', collection.name, len(qids), len(topics), qids[0],
                       int(unasked.sum()))
    if collection.run is not None:
        collection.run = collection.run[collection.run['qid'].isin(set(topics['qid'][judged]))]
    collection.topics = topics[judged].reset_index(drop=True)
    collection.qrels = qrels[['qid', 'docno', 'label']]
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
    if len(irds.queries_cls()._fields) == 2:
        topics = dataset.get_topics()[['qid', 'query']]
    else:  # Robust04's title, description, narrative: default_text() is the title (PyTerrier gives no query column)
        topics = pd.DataFrame([(q.query_id, q.default_text()) for q in irds.queries_iter()], columns=['qid', 'query'])
    qrels = dataset.get_qrels()
    num_docs = None  # not every ir_datasets handler can count its documents without building a docstore
    with contextlib.suppress(NotImplementedError, AttributeError):
        num_docs = irds.docs_count()

    def absent(docnos: Sequence[str]) -> List[str]:
        found = irds.docs_store().get_many(list(dict.fromkeys(docnos)))
        return [d for d in docnos if d not in found]

    def docs(docnos: Optional[Sequence[str]] = None) -> Iterator[Dict[str, str]]:
        if docnos is not None:
            docnos = list(dict.fromkeys(docnos))
            check_in_corpus(absent, docnos, name)
        source = irds.docs_iter() if docnos is None else irds.docs_store().get_many_iter(docnos)
        return ({'docno': doc.doc_id, 'text': doc.default_text() if hasattr(doc, 'default_text') else ' '.join(
            str(v) for k, v in doc._asdict().items() if k != 'doc_id' and isinstance(v, str))} for doc in source)

    return Collection(name=name, topics=topics, qrels=qrels, docs=docs, absent=absent, fingerprint=name,
                      num_docs=num_docs)


def _load_folder(path: Path) -> Collection:
    missing = [f for f in REQUIRED_FILES if not (path / f).is_file()]
    if missing:
        raise ValueError(f'collection folder {path} lacks {", ".join(missing)}; a collection folder holds '
                         'docs.jsonl ({"docno", "text"} per line), queries.tsv (qid<TAB>query) and qrels (TREC format)')
    topics = read_qid_tsv(path / 'queries.tsv', what='query', allow_empty=False)
    if not topics:
        raise ValueError(f'{path / "queries.tsv"} holds no queries; {QUERIES_FORMAT}')
    qrels = _read_qrels(path / 'qrels')
    runs = sorted(path.glob('*.run'))
    if len(runs) > 1:
        raise ValueError(f'collection folder {path} holds several runs ({", ".join(r.name for r in runs)}); '
                         'keep one, or pass the one to use as the first stage explicitly')
    run = read_trec_run(runs[0]) if runs else None
    answers = read_answers_tsv(path / 'llm_answers.tsv') if (path / 'llm_answers.tsv').is_file() else None
    documents = DocsFile(path / 'docs.jsonl')
    unknown = run[run['docno'].isin(documents.absent(list(run['docno'].unique())))] if runs else ()
    if len(unknown):  # a run naming a document the corpus lacks fails now, before anything is encoded
        qid, docno = unknown.iloc[0][['qid', 'docno']]
        raise ValueError(f'{runs[0]}: docno {docno!r} (qid {qid!r}) is not in {documents.path}, nor are '
                         f'{unknown["docno"].nunique() - 1} other docnos of the run; the run and the corpus do not '
                         'match: add the documents to docs.jsonl or remove them from the run')
    return Collection(name=str(path), topics=pd.DataFrame(list(topics.items()), columns=['qid', 'query']),
                      qrels=qrels, docs=documents.docs, absent=documents.absent, fingerprint=documents.fingerprint,
                      run=run, answers=answers, num_docs=len(documents.docnos))


class DocsFile:
    """A collection folder's ``docs.jsonl``, read once when loaded: lines checked, bytes hashed and each line's byte
    range indexed, so that a few documents are a few reads, not a pass over the corpus."""

    def __init__(self, path: Path):
        self.path = path
        tracker = _LineSpans()
        rows = [(docno, tracker.start, tracker.end) for docno, _ in _read_docs(path, tracker)]
        if not rows:
            raise ValueError(f'{path} holds no documents; {DOCS_FORMAT}')
        self.identity = store.snapshot([path])[0]
        self.fingerprint = f'sha256:{tracker.digest.hexdigest()}'
        self.docnos: List[str] = [docno for docno, _, _ in rows]
        self.row = {docno: i for i, docno in enumerate(self.docnos)}
        self.spans = np.array([span for _, *span in rows], dtype=np.int64)  # each line's start and end byte

    def absent(self, wanted: Sequence[str]) -> List[str]:
        """Those of ``wanted`` that the corpus does not hold (in their order)."""
        return [d for d in wanted if d not in self.row]

    def docs(self, wanted: Optional[Sequence[str]] = None) -> Iterator[Dict[str, str]]:
        """:attr:`Collection.docs`; a docno the corpus lacks fails here, at the call."""
        if wanted is None:
            return self._all()
        wanted = list(dict.fromkeys(wanted))
        check_in_corpus(self.absent, wanted, str(self.path.parent))
        return self._at(np.sort(np.fromiter((self.row[d] for d in wanted), dtype=np.int64, count=len(wanted))))

    def _all(self) -> Iterator[Dict[str, str]]:
        now = hashlib.sha256()
        for docno, text in _read_docs(self.path, now):
            yield {'docno': docno, 'text': text}
        if f'sha256:{now.hexdigest()}' != self.fingerprint:
            raise self._changed()  # caches are keyed by the content loaded: a file edited since must not pass for it

    def _at(self, rows: np.ndarray) -> Iterator[Dict[str, str]]:
        with open(self.path, 'rb', buffering=0) as f:
            if store.snapshot([self.path])[0] != self.identity:  # stat after opening: a file replaced since fails
                raise self._changed()
            for row in rows:
                start, end = self.spans[row]
                f.seek(start)
                doc = json.loads(f.read(end - start).decode('utf-8').removeprefix('\ufeff'))
                if doc.get('docno') != self.docnos[row]:
                    raise self._changed()
                yield {'docno': doc['docno'], 'text': doc['text']}

    def _changed(self) -> ValueError:
        return ValueError(f'{self.path} changed since the collection was loaded; load the collection again')


class _LineSpans:
    """A ``digest`` for :func:`utf8_lines` that hashes every byte and keeps the byte range of the last line read."""

    def __init__(self):
        self.digest = hashlib.sha256()
        self.start = self.end = 0

    def update(self, raw: bytes) -> None:
        self.digest.update(raw)
        self.start, self.end = self.end, self.end + len(raw)


def _read_docs(path: Path, digest=None) -> Iterator[Tuple[str, str]]:
    first_line: Dict[str, int] = {}
    for line_no, line in utf8_lines(path, digest):
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f'{path}:{line_no}: not valid JSON at column {e.colno} ({e.msg}); {DOCS_FORMAT}') from None
        if not isinstance(doc, dict):
            raise ValueError(f'{path}:{line_no}: a JSON {type(doc).__name__}, not an object; {DOCS_FORMAT}')
        docno = doc.get('docno')
        if not isinstance(docno, str):
            problem = 'has no "docno"' if docno is None else f'has a non-string "docno" {docno!r}'
            raise ValueError(f'{path}:{line_no}: the document {problem}; {DOCS_FORMAT}')
        text = doc.get('text')
        if not isinstance(text, str):
            problem = 'has no "text"' if text is None else f'has a non-string "text" ({type(text).__name__})'
            raise ValueError(f'{path}:{line_no}: document {docno!r} {problem}; give every document a "text" string '
                             '("" for an empty document)')
        if docno.split() != [docno]:  # qrels and runs are whitespace-separated
            raise ValueError(f'{path}:{line_no}: docno {docno!r} is empty or holds whitespace, so qrels and runs '
                             '(whitespace-separated) could never name it; use docnos without spaces')
        if (earlier := first_line.setdefault(docno, line_no)) != line_no:
            raise ValueError(f'{path}:{line_no}: docno {docno!r} is also on line {earlier}; give each document its '
                             'own docno, or remove the repeated one')
        yield docno, text


def _read_qrels(path: Path) -> pd.DataFrame:
    lines = _trec_lines(path, 4, QRELS_FORMAT, ('label', f'{QRELS_FORMAT} (0 or a negative label: not relevant)'),
                        'judgments', 'qid {qid!r}, docno {docno!r} is judged again (also on line {line}); keep one '
                        'judgment per query and document')
    return pd.DataFrame([(qid, docno, int(label)) for _, (qid, _, docno, label) in lines],
                        columns=['qid', 'docno', 'label'])


def _trec_lines(path: Path, count: int, form: str, integer: Tuple[str, str], nothing: str,
                repeated: str) -> Iterator[Tuple[int, List[str]]]:
    """``(line number, fields)`` of a qrels or run file (``form``): ``count`` fields, the fourth an integer
    (``integer``: its name and the fix), a (qid, docno) once (``repeated``: the message); none is an error."""
    first_line: Dict[Tuple[str, str], int] = {}
    for line_no, line in utf8_lines(path):
        fields = line.split()
        if len(fields) != count:
            raise ValueError(f'{path}:{line_no}: {len(fields)} fields in {line[:80]!r}, not {count}; {form}')
        qid, docno = fields[0], fields[2]
        if not _INTEGER.fullmatch(fields[3]):
            raise ValueError(f'{path}:{line_no}: {integer[0]} {fields[3]!r} of qid {qid!r}, docno {docno!r} is not an '
                             f'integer; {integer[1]}')
        yield line_no, fields
        if (earlier := first_line.setdefault((qid, docno), line_no)) != line_no:  # after the caller's own checks
            raise ValueError(f'{path}:{line_no}: ' + repeated.format(qid=qid, docno=docno, line=earlier))
    if not first_line:
        raise ValueError(f'{path} holds no {nothing}; {form}')


def read_trec_run(path: Union[str, os.PathLike]) -> pd.DataFrame:
    """A TREC run file as ``qid, docno, score, rank`` (rank re-derived from the score, 0-based); the first bad line
    (not ``qid Q0 docno rank score tag``, or a (qid, docno) repeated) raises ``ValueError`` with its file and line."""
    path = Path(path)
    return _parsed_run(path, store.snapshot([path])[0]).copy()


@functools.lru_cache(maxsize=4)
def _parsed_run(path: Path, identity: Optional[tuple]) -> pd.DataFrame:
    """:func:`read_trec_run`, parsed once per file content (``identity``)."""
    rows = []
    lines = _trec_lines(path, 6, RUN_FORMAT, ('rank', RUN_FORMAT), 'ranking', 'qid {qid!r} ranks docno {docno!r} '
                        'twice (also on line {line}); keep one line per query and document')
    for line_no, (qid, _, docno, _, score, _) in lines:
        try:
            value = float(score)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise ValueError(f'{path}:{line_no}: score {score!r} of qid {qid!r}, docno {docno!r} is not a finite '
                             f'number; {RUN_FORMAT}')
        rows.append((qid, docno, value))
    run = pd.DataFrame(rows, columns=['qid', 'docno', 'score'])
    run = run.sort_values(['qid', 'score'], ascending=[True, False], kind='stable')
    return pt.model.add_ranks(run.reset_index(drop=True))


def check_in_corpus(absent: Callable, docnos: Sequence[str], name: str, source: str = 'the documents asked for'):
    """The one error for docnos of ``source`` that the corpus of collection ``name`` lacks (``absent(docnos)``)."""
    missing = absent(list(dict.fromkeys(docnos)))
    if missing:
        more = f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''
        raise ValueError(f'{source} names docno {missing[0]!r}{more}, which is not in the corpus of collection '
                         f'{name!r}; the ranking and the corpus do not match: use the run made for this corpus, or '
                         'add the documents to it')
