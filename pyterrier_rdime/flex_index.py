"""Whether a pyterrier-dr FlexIndex folder holds a whole index: ``FlexIndex.built()`` only checks that the folder
exists, so an indexing run stopped half way (Ctrl-C, a failed download) leaves a folder that ``built()`` accepts and
every later search fails on (``FileNotFoundError: …/pt_meta.json``). The package's one answer to "is this FlexIndex
whole": the retrievers, the statistics and the dense-vector cache all ask :func:`flex_index_problem`."""
import json
import os
from pathlib import Path
from typing import Optional, Union

#: The files of a FlexIndex, in the order pyterrier-dr's indexer finishes them: the vectors and the docnos while it
#: reads the documents, ``pt_meta.json`` (the vector size and the document count) last.
FLEX_FILES = ('vecs.f4', 'docnos.npids', 'pt_meta.json')


def flex_index_problem(index: Union[object, str, os.PathLike]) -> Optional[str]:
    """Why ``index`` (a pyterrier-dr ``FlexIndex`` or its folder) is not a whole index, in words, or ``None`` when it
    is: its folder exists, ``pt_meta.json`` reads as JSON with ``vec_size`` and ``doc_count``, ``vecs.f4`` holds
    exactly ``doc_count x vec_size`` float32 values and ``docnos.npids`` ``doc_count`` docnos."""
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
    """``True`` when ``index`` (a pyterrier-dr ``FlexIndex`` or its folder) holds a whole index; ``False`` when the
    folder is missing or was left half written (see :func:`flex_index_problem` for why). Use it instead of
    ``FlexIndex.built()``, which is ``True`` as soon as the folder exists, and rebuild with ``mode='overwrite'``,
    which replaces a half-written folder.

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
