"""``--answers``: the LLM answers of a run, by source (:data:`~.systems.AnswerSources`), from files, from a
collection folder's ``llm_answers/<name>.tsv``, or from the catalogue of published answers."""
import os
import re
from pathlib import Path
from typing import List, Optional, Union

from ..llm import read_answers_csv, read_answers_tsv
from ..llm.published import CATALOGUE, fetch, published_entry
from .collection import Collection
from .systems import AnswerSources

#: A source name as ``--answers`` takes it, and as it appears in system names (``llm@<name>``).
_NAME = re.compile(r'[A-Za-z0-9][\w.+-]*')
#: Suffixes of answer files: tab-separated, or the published CSV (Unveiling DIME's files end in .txt).
_FILE_SUFFIXES = ('.tsv', '.csv', '.txt')


def split_answers(spec: Optional[str]) -> List[str]:
    """The items of ``--answers`` (comma-separated files or names), in order, without repeats."""
    return list(dict.fromkeys(item.strip() for item in (spec or '').split(',') if item.strip()))


def check_answers_spec(spec: str) -> None:
    """Each item of ``--answers`` is an existing file (parsed now) or a well-formed name."""
    items = split_answers(spec)
    if not items:
        raise ValueError(f'--answers {spec!r} names no answers; pass a qid<TAB>answer file, or names such as gpt-4 '
                         '(several: comma-separated)')
    for item in items:
        if Path(item).expanduser().is_file():
            _read_file(Path(item).expanduser())
        elif Path(item).suffix.lower() in _FILE_SUFFIXES or '/' in item or os.sep in item:
            raise ValueError(f'--answers {item}: no such file; pass a qid<TAB>answer file, a name of published '
                             "answers (e.g. gpt-4), or leave --answers out to use the collection's llm_answers.tsv")
        elif not _NAME.fullmatch(item):
            raise ValueError(f'--answers {item}: no such file, nor a name of published answers (e.g. gpt-4, '
                             'qwen2.5-3b); pass a qid<TAB>answer file or a name')


def answer_sources(spec: Optional[str], collection: Collection,
                   cache_dir: Union[str, Path]) -> AnswerSources:
    """The answers of ``--answers`` for ``collection``: source name -> (qid -> answer).

    Without ``spec``, the collection's own ``llm_answers.tsv`` as the source ``''``; a single file is the source
    ``''`` too; several items are named by the file's stem or the name. A name is read from the folder's
    ``llm_answers/<name>.tsv``, else from the published answers (:mod:`pyterrier_rdime.llm.published`).
    """
    if spec is None:
        return {} if collection.answers is None else {'': collection.answers}
    items = split_answers(spec)
    sources: AnswerSources = {}
    for item in items:
        path = Path(item).expanduser()
        if path.is_file():
            name = '' if len(items) == 1 else re.sub(r'[^\w.+-]', '_', path.stem)
            sources[name] = _read_file(path)
        else:
            sources[item] = _by_name(item, collection, Path(cache_dir))
    return sources


def _read_file(path: Path):
    return read_answers_csv(path) if path.suffix.lower() in _FILE_SUFFIXES[1:] else read_answers_tsv(path)


def _by_name(name: str, collection: Collection, cache_dir: Path):
    if not collection.name.startswith('irds:'):
        folder = Path(collection.name) / 'llm_answers'
        local = folder / f'{name}.tsv'
        if local.is_file():
            return read_answers_tsv(local)
        offered = sorted(p.stem for p in folder.glob('*.tsv'))
        published = sorted({d for n, d in CATALOGUE if n == name})
        raise ValueError(f'--answers {name}: {collection.name} has no {local.relative_to(collection.name)}'
                         + (f' (it has {", ".join(offered)})' if offered else '')
                         + '; put the answers there (qid<TAB>answer) or pass --answers FILE'
                         + (f'; {name!r} is published for irds:{", irds:".join(published)}' if published else ''))
    return read_answers_csv(fetch(published_entry(name, collection.name), cache_dir))
