#!/usr/bin/env bash
# Set everything up, build the embedded default model (SmolLM2-135M-Instruct) and answer a prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup_env.sh
engine=engines/smollm2-135m-instruct
if [ ! -f "$engine/manifest.json" ]; then
    .venv/bin/atlas-build -o "$engine"
fi
.venv/bin/atlas-run generate "$engine" --prompt "${1:-What is the capital of France? Answer in one sentence.}"
