"""Test environment: offline hub, temporary PyTerrier / ir_datasets homes (pyterrier-pisa writes there on import) and
default cache folder, and the shared collections beside the project."""
import os
import shutil
import tempfile
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / 'shared'
DATA = SHARED / 'data'
#: Seconds a test waits for a child process to start (import, connect): a bound that catches a hang, never a slow
#: start on a loaded machine.
START_UP = 600

os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
os.environ.setdefault('PT_TEST_TRANSFORMER_REPORTS', '0')  # pt.testing.transformer_test_class: no report files
_home = Path(tempfile.mkdtemp(prefix='rdime-tests-'))
os.environ['PYTERRIER_HOME'] = str(_home / 'pyterrier')
if (SHARED / 'irds').is_dir():
    shutil.copytree(SHARED / 'irds', _home / 'irds')
os.environ['IR_DATASETS_HOME'] = str(_home / 'irds')
# the package's default cache folder (answer caches, pruned layouts): never the user's ~/.cache
os.environ['PYTERRIER_RDIME_CACHE'] = str(_home / 'rdime-cache')


@pytest.fixture(autouse=True)
def offline_documentation(monkeypatch):
    """pt.schematic looks classes up in PyTerrier's online documentation index; pretend it is empty."""
    import pyterrier as pt
    monkeypatch.setattr(pt.documentation, '_cached_objects_inv', {}, raising=False)


def pytest_collection_modifyitems(items):
    """Notebooks run whole pipelines with an encoder: slow, like the Ray, encoder and generator tests."""
    for item in items:
        if item.path.suffix == '.ipynb':
            item.add_marker(pytest.mark.slow)


def pytest_unconfigure(config):
    """Remove the temporary homes: every test session would otherwise leave a copy of ../shared/irds in /tmp."""
    shutil.rmtree(_home, ignore_errors=True)


def shared_collection(name: str) -> Path:
    path = DATA / name
    if not path.is_dir():
        pytest.fail(f'{path} is missing: the tests read the real collections from ../shared/data beside the project')
    return path
