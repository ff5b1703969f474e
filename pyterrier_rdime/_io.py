"""Files written whole or not at all: the one atomic writer of the package's caches, records and outputs."""
import contextlib
import os
import secrets
from pathlib import Path
from typing import IO, Iterator, Union


@contextlib.contextmanager
def atomic_open(path: Union[str, os.PathLike], mode: str = 'w') -> Iterator[IO]:
    """Opens a hidden temporary file beside ``path`` (``.<name>.<random>.tmp``, text as UTF-8 unless ``mode`` has
    ``'b'``) and moves it onto ``path`` when the block ends; when the block raises, the temporary file is removed and
    ``path`` is left as it was. A reader thus sees the old file or the new one, never half of one, and a killed
    process leaves at most the hidden temporary file.

    ``pt.io.finalized_open`` does the same but makes the new file writable by every user (mode 0o666, whatever the
    umask); this one creates it under the umask, as ``open`` does.

    Example::

        with atomic_open(folder / 'record.json') as f:
            json.dump(record, f)
    """
    if mode not in ('w', 'wb'):
        raise ValueError(f"atomic_open: mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    tmp = path.with_name(f'.{path.name}.{secrets.token_hex(4)}.tmp')
    try:
        with open(tmp, mode.replace('w', 'x'), **({} if 'b' in mode else {'encoding': 'utf-8'})) as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
