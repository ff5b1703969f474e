"""The one atomic writer: the new file whole or the old one, no temporary file left, permissions from the umask."""
import os
import stat

import pytest

from pyterrier_rdime.store import atomic_open


def test_written_whole_or_not_at_all(tmp_path):
    path = tmp_path / 'record.json'
    path.write_text('old', encoding='utf-8')
    with pytest.raises(RuntimeError, match='half way'):
        with atomic_open(path) as f:
            f.write('new, but only ha')
            raise RuntimeError('half way')
    assert path.read_text(encoding='utf-8') == 'old' and os.listdir(tmp_path) == ['record.json']
    with atomic_open(path) as f:
        f.write('néw')
    assert path.read_text(encoding='utf-8') == 'néw' and os.listdir(tmp_path) == ['record.json']
    with atomic_open(tmp_path / 'data.bin', 'wb') as f:
        f.write(b'\x00\x01')
    assert (tmp_path / 'data.bin').read_bytes() == b'\x00\x01'


@pytest.mark.skipif(os.name != 'posix', reason='POSIX permissions')
def test_permissions_follow_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        with atomic_open(tmp_path / 'f.txt') as f:
            f.write('x')
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / 'f.txt').stat().st_mode) == 0o640  # pt.io.finalized_open would give 0o666


def test_only_write_modes():
    with pytest.raises(ValueError, match="mode must be 'w' or 'wb'"):
        with atomic_open('x', 'a'):
            pass
