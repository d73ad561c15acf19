#!/usr/bin/env bash
# Source on the GPU box (no registry there): install the carried wheels (.whl/, see
# ../shared/wheels/README.md) and make the checkout importable as `atlas.*` without pip-installing it.
set -e
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
mkdir -p /tmp/ns/atlas
for d in build_engine runtime plugins_trt tools; do ln -sfn "$PWD/$d" "/tmp/ns/atlas/$d"; done
export PYTHONPATH=/tmp/ns:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
set +e
