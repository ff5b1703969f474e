#!/usr/bin/env bash
# Builds the sdist and the wheel, checks them with twine, installs the wheel into a fresh venv WITHOUT extras, then
# the sdist over it, and runs scripts/package_smoke.py against each. Needs `build` and `twine` (the dev extra) in
# PYTHON's environment. Usage: scripts/package_smoke.sh [PYTHON]   (default: .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python=${1:-.venv/bin/python}
work=$(mktemp -d "${TMPDIR:-/tmp}/rdime-package.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$python" -m build --outdir "$work/dist" . > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$python" -m twine check --strict "$work"/dist/*
# the sdist leaves the tests out (MANIFEST.in): they read the test collections placed beside a checkout
if tar tzf "$work"/dist/*.tar.gz | grep -q '^[^/]*/tests/'; then
  echo "package_smoke: the sdist ships tests/; MANIFEST.in prunes them" >&2
  exit 1
fi
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$work"/dist/*.whl
# the core install stays light: pyterrier, numpy, pandas (pyterrier brings scipy and statsmodels); an open torch
# requirement would pull a multi-GB CUDA build
for extra in torch numba transformers pyterrier-dr pyterrier-pisa faiss-cpu ray; do
  if "$work/venv/bin/pip" show -q "$extra" 2> /dev/null; then
    echo "package_smoke: the core install pulled $extra; it belongs in an extra" >&2
    exit 1
  fi
done
(cd "$work" && "$work/venv/bin/python" "$root/scripts/package_smoke.py")
"$work/venv/bin/pip" install -q --force-reinstall --no-deps "$work"/dist/*.tar.gz
(cd "$work" && "$work/venv/bin/python" "$root/scripts/package_smoke.py")
