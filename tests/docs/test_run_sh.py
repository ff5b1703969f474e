"""run.sh's dispatch: its first argument names the command (experiment, test, benchmark); any other first argument
(an option, a collection) goes to the experiment. Run in a copy of the script beside a fake, already installed
``.venv`` whose programs print what they were given, so nothing is installed or run."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import START_UP

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = {'rdime-experiment': 'experiment', 'pytest': 'pytest', 'python': 'python'}


@pytest.fixture(scope='module')
def checkout(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp('checkout')
    shutil.copy(ROOT / 'run.sh', folder / 'run.sh')
    for name in ('setup.cfg', 'constraints.txt'):
        (folder / name).write_text('')
    bin_dir = folder / '.venv' / 'bin'
    bin_dir.mkdir(parents=True)
    for program, label in PROGRAMS.items():
        (bin_dir / program).write_text(f'#!/usr/bin/env bash\necho "{label}" "$@"\n')
        (bin_dir / program).chmod(0o755)
    (folder / '.venv' / '.installed').touch()  # newer than setup.cfg and constraints.txt: no install
    return folder


def run(checkout: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, 'IR_DATASETS_HOME': str(checkout / 'irds')}  # set: run.sh copies nothing
    return subprocess.run(['bash', str(checkout / 'run.sh'), *args], capture_output=True, text=True, env=env,
                          timeout=START_UP)


@pytest.mark.parametrize('args, expected', [
    ((), 'experiment'),
    (('experiment', 'DATA/x', '--encoder', 'minilm'), 'experiment DATA/x --encoder minilm'),
    (('--encoder', 'minilm', 'DATA/x'), 'experiment --encoder minilm DATA/x'),  # issue 39, item 8
    (('DATA/x',), 'experiment DATA/x'),
    (('--help',), 'experiment --help'),
    (('test', '-m', 'not slow'), 'pytest -m not slow'),
    (('benchmark', 'search', '--docs', '1000'), 'python benchmarks/run.py search --docs 1000'),
])
def test_the_first_argument_names_the_command_or_goes_to_the_experiment(checkout, args, expected):
    done = run(checkout, *args)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, expected, '')
