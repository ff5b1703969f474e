"""Whether a pyterrier-dr FlexIndex folder holds a whole index (``FlexIndex.built()`` accepts a half-written one)."""
import json
import os
from pathlib import Path
from typing import Optional, Union

#: The files of a FlexIndex, in the order pyterrier-dr's indexer finishes them (``pt_meta.json`` last).
FLEX_FILES = ('vecs.f4', 'docnos.npids', 'pt_meta.json')


def flex_index_problem(index: Union[object, str, os.PathLike]) -> Optional[str]:
    """Why ``index`` (a ``FlexIndex`` or its folder) is not a whole index, in words, or ``None`` when it is."""
    folder = Path(getattr(index, 'index_path', index))
    if not folder.is_dir():
        return f'{folder} does not exist'
    missing = [name for name in FLEX_FILES if not (folder / name).is_file()]
    if len(missing) == len(FLEX_FILES):
        return f'{folder} holds none of its files ({", ".join(FLEX_FILES)})'
    if missing:
        return f'{folder} lacks {", ".join(missing)} (an indexing run stopped before the end)'
    try:
        meta = json.loads((folder / 'pt_meta.json').read_text())
        expected = int(meta['doc_count']) * int(meta['vec_size']) * 4
    except (ValueError, KeyError, TypeError) as e:
        return f'{folder / "pt_meta.json"} does not read as a FlexIndex record ({e})'
    size = (folder / 'vecs.f4').stat().st_size
    if size != expected:
        return (f'{folder / "vecs.f4"} holds {size} bytes, not the {expected} of the {meta["doc_count"]} '
                f'{meta["vec_size"]}-dimensional vectors pt_meta.json records')
    from npids import Lookup  # pyterrier-dr's docno store
    try:
        count = len(Lookup(folder / 'docnos.npids'))
    except Exception as e:  # whatever makes it unreadable
        return f'{folder / "docnos.npids"} does not read as a docno lookup ({type(e).__name__}: {e})'
    if count != int(meta['doc_count']):
        return f'{folder / "docnos.npids"} holds {count} docnos, not the {meta["doc_count"]} pt_meta.json records'
    return None


def flex_index_complete(index: Union[object, str, os.PathLike]) -> bool:
    """Whether ``index`` (a ``FlexIndex`` or its folder) holds a whole index; use it instead of ``FlexIndex.built()``,
    which is ``True`` as soon as the folder exists.

    Example::

        index = pyterrier_dr.FlexIndex('vaswani.minilm.flex')
        if not flex_index_complete(index):
            (model >> index.indexer(mode='overwrite')).index(dataset.get_corpus_iter())
    """
    return flex_index_problem(index) is None


def check_whole(index: object, stage: str) -> None:
    """Fails, naming ``stage``, with the fix, when ``index`` is not a whole FlexIndex (:func:`flex_index_problem`)."""
    problem = flex_index_problem(index)
    if problem is not None:
        raise ValueError(f'{stage}: {index!r} is not built ({problem}); index the documents first, e.g. (encoder '
                         ">> index.indexer(mode='overwrite')).index(docs), which also replaces a folder an interrupted "
                         'run left half written')
