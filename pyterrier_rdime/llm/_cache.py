"""The on-disk cache of generated answers: one SQLite file, one row per answer, keyed by everything the answer
depends on; each write is one transaction, so a killed run resumes without a wrong answer."""
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Dict, List, NamedTuple, Tuple

CACHE_FILE = 'llm_answers.sqlite3'
_CHUNK = 500  # queries per SELECT: SQLite caps the number of bound parameters
_KEY_FIELDS = ('model', 'prompt', 'settings')

#: ``(model identity, prompt template, settings JSON)``: with the query text, the key of a cached answer.
Key = Tuple[str, str, str]


class Mismatch(NamedTuple):
    """Queries that have cached answers, none of them under the key asked for."""
    queries: List[str]
    nearest: Key  # of the keys the cache holds for them, the one that differs from the asked key in fewest parts

    def describe(self, key: Key) -> str:
        """What differs, e.g. ``prompt 'Answer: {query}' (cached: 'Write ...')``."""
        return '; '.join(f'{name} {_short(mine)} (cached: {_short(theirs)})'
                         for name, mine, theirs in zip(_KEY_FIELDS, key, self.nearest) if mine != theirs)


def _short(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:57] + '...')


class AnswerCache:
    """The answer cache file ``<folder>/llm_answers.sqlite3`` of ``stage``; opening it creates the folder and the
    table, so that a bad folder or file fails before anything is generated."""

    def __init__(self, folder: Path, stage: str):
        self.path = Path(folder) / CACHE_FILE
        self.stage = stage
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OSError(f'{stage}: cannot create the answer cache folder {folder} ({e.strerror or e}); pass '
                          'cache= a folder that can be created and written, or cache=False') from e
        if self.path.exists() and not self.path.is_file():
            raise OSError(f'{stage}: {self.path} is a folder (or another non-file), not the answer cache file; move it '
                          'away or pass another cache= folder')
        with closing(self._connect()):
            pass

    def read(self, key: Key, queries: List[str]) -> Tuple[Dict[str, str], Mismatch]:
        """The cached answers of ``queries`` under ``key``, and the queries cached only under other keys."""
        found: Dict[str, str] = {}
        others: Dict[str, List[Key]] = {}
        with closing(self._connect()) as db:
            for start in range(0, len(queries), _CHUNK):
                chunk = queries[start:start + _CHUNK]
                marks = ', '.join('?' * len(chunk))
                rows = self._run(db, 'SELECT model, prompt, settings, query, answer FROM answers '
                                     f'WHERE query IN ({marks})', chunk)
                for model, prompt, settings, query, answer in rows:
                    if (model, prompt, settings) == key:
                        found[query] = answer
                    else:
                        others.setdefault(query, []).append((model, prompt, settings))
        stale = [q for q in queries if q in others and q not in found]
        keys = [k for q in stale for k in others[q]]
        nearest = min(keys, key=lambda k: sum(a != b for a, b in zip(k, key))) if keys else key
        return found, Mismatch(stale, nearest)

    def write(self, key: Key, answers: Dict[str, str]) -> None:
        """Store ``answers`` (query text -> answer) under ``key``, all in one transaction."""
        created = time.strftime('%Y-%m-%dT%H:%M:%S')
        with closing(self._connect()) as db:
            with db:
                self._run(db, 'INSERT OR REPLACE INTO answers VALUES (?, ?, ?, ?, ?, ?)',
                          [(*key, q, a, created) for q, a in answers.items()], many=True)

    def _connect(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(str(self.path), timeout=60)
        except sqlite3.Error as e:
            raise self._error(e) from e
        try:
            self._run(db, 'CREATE TABLE IF NOT EXISTS answers (model TEXT NOT NULL, prompt TEXT NOT NULL, '
                          'settings TEXT NOT NULL, query TEXT NOT NULL, answer TEXT NOT NULL, created TEXT NOT NULL, '
                          'PRIMARY KEY (model, prompt, settings, query))')
            columns = [row[1] for row in self._run(db, 'PRAGMA table_info(answers)')]
        except Exception:
            db.close()
            raise
        if columns[:5] != ['model', 'prompt', 'settings', 'query', 'answer']:
            db.close()
            raise ValueError(f'{self.stage}: {self.path} holds a table "answers" with columns {columns}, not an '
                             'answer cache of LlmGenerator; move that file away or pass another cache= folder')
        return db

    def _run(self, db: sqlite3.Connection, sql: str, params=(), many: bool = False) -> list:
        try:
            cursor = db.executemany(sql, params) if many else db.execute(sql, params)
            return cursor.fetchall()
        except sqlite3.Error as e:
            raise self._error(e) from e

    def _error(self, error: sqlite3.Error) -> OSError:
        message = str(error)
        if 'not a database' in message or 'malformed' in message:
            fix = ('the file is damaged or not an answer cache; delete it (it only holds cached answers, which are '
                   'then generated again) or pass another cache= folder')
        elif 'readonly' in message or 'unable to open' in message:
            fix = 'the folder or the file cannot be opened for writing; pass cache= a writable folder, or cache=False'
        else:
            fix = 'pass another cache= folder, or cache=False'
        return OSError(f'{self.stage}: the answer cache {self.path} cannot be used ({type(error).__name__}: '
                       f'{error}); {fix}')
