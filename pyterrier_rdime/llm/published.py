"""The catalogue of published LLM answers (:data:`CATALOGUE`: one commit-pinned CSV per LLM and query set, from
Unveiling DIME, SIGIR 2025, or DIME, SIGIR 2024), and the one download of a catalogued file into the package cache,
checked by sha256 (the catalogue's, else the first download's) on every use."""
import hashlib
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Tuple, Union

from .. import store

#: The raw files of each source repository at the commit the catalogue pins.
_UNVEILING = 'https://raw.githubusercontent.com/pinecone-io/unveiling-dime/7b0644950fc08fcfb8eee07f9481112b2ad9a0b9'
_DIME = 'https://raw.githubusercontent.com/guglielmof/DIME-SIGIR-2024/f59412adccfa339c9755fff34d6727759551d91a'
UNVEILING_DIME = 'Unveiling DIME (Campagnano, Mallia, Silvestri, SIGIR 2025)'
DIME = 'DIME (Faggioli et al., SIGIR 2024)'
#: Seconds a download may wait for the server before it fails.
TIMEOUT = 60

DL19 = 'msmarco-passage/trec-dl-2019/judged'
DL20 = 'msmarco-passage/trec-dl-2020/judged'
DL_HARD = 'msmarco-passage/trec-dl-hard'
ROBUST04 = 'disks45/nocr/trec-robust-2004'


@dataclass(frozen=True)
class Published:
    """One published answers file: ``name`` (as ``--answers`` spells it) for the query set ``dataset``."""
    name: str
    llm: str
    dataset: str
    source: str
    url: str
    sha256: Optional[str]

    @property
    def file_name(self) -> str:
        return self.url.rsplit('/', 1)[-1]


#: name -> (the LLM as its authors name it, file name in Unveiling DIME's llm_docs/ folders, sha256 of its DL19 file as
#: copied into ../shared/data (their SOURCES.md); the other query sets' are unknown)
_UNVEILING_LLMS = {
    'gpt-4': ('gpt-4', 'gpt-4.txt', 'd4188817e27d43e12043134941a8fed31c5a57287da2b6aa36eb8083e775f7ae'),
    'gpt-4o': ('gpt-4o', 'gpt-4o.txt', '6f5669b196d7a841e413a586a5b4fbe6c86bb4a2958c14dfd58fddf2546ec54c'),
    'qwen2.5-3b': ('Qwen2.5-3B-Instruct (GPTQ int4)', 'Qwen_Qwen2.5-3B-Instruct-GPTQ-Int4.txt',
                   '39337be6ccc9f13c3cc43a6431046c09980dd0772a53e4e51a06e5940f8da222'),
    'qwen2.5-7b': ('Qwen2.5-7B-Instruct (GPTQ int4)', 'Qwen_Qwen2.5-7B-Instruct-GPTQ-Int4.txt',
                   '05c52fb54402b924b8f7880965a2cd9ed44f6fd8c6bed77336d805f43cb00db9'),
    'qwen2.5-32b': ('Qwen2.5-32B-Instruct (GPTQ int4)', 'Qwen_Qwen2.5-32B-Instruct-GPTQ-Int4.txt',
                    'aef867a359f5fa3df42e7b3793b60625001a42ff786e0d1be420cd33f6bee64c'),
    'llama-3.1-8b': ('Llama-3.1-8B-Instruct (GPTQ int4)', 'hugging-quants_Meta-Llama-3.1-8B-Instruct-GPTQ-INT4.txt',
                     'bdb63cc071e0e0d2e6a82e6f04b8f032c338243d999260cb3022245aa7907af6'),
    'llama-3.2-3b': ('Llama-3.2-3B-Instruct', 'meta-llama_Llama-3.2-3B-Instruct.txt',
                     'e2c6e0778fb4a464bca211cc43536f201042cfaed869d7a784f2a4719a5fb1f0'),
    'deepseek-r1-qwen-7b': ('DeepSeek-R1-Distill-Qwen-7B (GPTQ int4)',
                            'jakiAJK_DeepSeek-R1-Distill-Qwen-7B_GPTQ-int4.txt',
                            'a040f457ea621559f3f7aaef01ba2230e4ea1f7d2a66fe4bd241aeaf9db37952'),
    'deepseek-r1-qwen-32b': ('DeepSeek-R1-Distill-Qwen-32B (GPTQ int4)',
                             'dwetzel_DeepSeek-R1-Distill-Qwen-32B-GPTQ-INT4.txt',
                             '8b5d5e8d8962fca039f1a0a03384b4b8b4e61511ccd406f3ce7841a0d845781f'),
}
#: query set -> its folder in Unveiling DIME's llm_docs/
_UNVEILING_FOLDERS = {
    DL19: 'llm_docs/msmarco-passage/msmarco-passage_trec-dl-2019_judged',
    DL20: 'llm_docs/msmarco-passage/msmarco-passage_trec-dl-2020_judged',
    DL_HARD: 'llm_docs/msmarco-passage/msmarco-passage_trec-dl-hard',
    ROBUST04: 'llm_docs/disks45_nocr_trec-robust-2004/disks45_nocr_trec-robust-2004',
}


_ENTRIES = [Published(name, llm, dataset, UNVEILING_DIME, f'{_UNVEILING}/{folder}/{file_name}',
                      sha256 if dataset == DL19 else None)
            for dataset, folder in _UNVEILING_FOLDERS.items()
            for name, (llm, file_name, sha256) in _UNVEILING_LLMS.items() if dataset != ROBUST04 or name == 'gpt-4']
# one file answers the queries of every collection of the paper (it has a header row)
_ENTRIES += [Published('gpt-4-dime', 'gpt-4', dataset, DIME, f'{_DIME}/data/gpt4_answers.csv', None)
             for dataset in (DL19, DL20, DL_HARD, ROBUST04)]
#: (name, ir_datasets id) -> :class:`Published`.
CATALOGUE: Dict[Tuple[str, str], Published] = {(e.name, e.dataset): e for e in _ENTRIES}


def published_entry(name: str, dataset: str) -> Published:
    """The catalogue's entry of ``name`` for the query set ``dataset`` (an ir_datasets id, ``irds:`` optional)."""
    dataset = dataset.removeprefix('irds:')
    entry = CATALOGUE.get((name, dataset))
    if entry is not None:
        return entry
    names = sorted({n for n, d in CATALOGUE if d == dataset})
    if names:
        raise ValueError(f'published answers: no {name!r} for {dataset}; published for it: {", ".join(names)}')
    datasets = sorted({d for n, d in CATALOGUE if n == name})
    if datasets:
        raise ValueError(f'published answers: {name!r} answers the queries of {", ".join(datasets)}, not '
                         f'{dataset}; pass one of these, or a qid<TAB>answer file of your own')
    raise ValueError(f'published answers: no {name!r}; the catalogue has {", ".join(sorted({n for n, _ in CATALOGUE}))}'
                     ' (for their query sets see pyterrier_rdime.llm.published.CATALOGUE)')


def cached_path(entry: Published, cache_dir: Union[str, os.PathLike]) -> Path:
    """Where :func:`fetch` keeps ``entry``'s file: a folder per URL (a commit-pinned URL never changes its bytes)."""
    digest = hashlib.sha256(entry.url.encode()).hexdigest()[:16]
    return Path(cache_dir) / 'published_answers' / digest / entry.file_name


def fetch(entry: Published, cache_dir: Union[str, os.PathLike]) -> Path:
    """``entry``'s file in the cache, downloaded once atomically and checked by sha256 on every use (downloaded again
    if it fails); offline, a missing file is one ``ConnectionError`` line naming the URL and the fix."""
    path = cached_path(entry, cache_dir)
    record = path.with_name(path.name + '.sha256')  # the first download's sha256, where the catalogue has none
    if path.is_file():
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if entry.sha256 is None and not record.is_file():
            record.write_text(actual + '\n', encoding='ascii')
        if actual == (entry.sha256 or record.read_text(encoding='ascii').strip()):
            return path
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(entry.url, timeout=TIMEOUT) as response:
            data = response.read()
    except OSError as e:
        reason = getattr(e, 'reason', None) or e
        raise ConnectionError(f'published answers {entry.name!r} for {entry.dataset}: cannot download {entry.url} '
                              f'({reason}); download it elsewhere and put it at {path}, or pass --answers FILE '
                              '(qid<TAB>answer)') from None
    actual = hashlib.sha256(data).hexdigest()
    if entry.sha256 is not None and actual != entry.sha256:
        raise ValueError(f'published answers {entry.name!r}: {entry.url} has sha256 {actual}, not the catalogued '
                         f'{entry.sha256}; the file at that commit changed or the download was damaged: retry, or '
                         'pass --answers FILE')
    with store.atomic_open(path, 'wb') as f:
        f.write(data)
    if entry.sha256 is None:
        record.write_text(actual + '\n', encoding='ascii')
    return path

