"""Run-time experiment knobs: module-level settings that an object reads when it is made (a KernelTable, a CudaOps),
set for a block so that one process can load an engine both ways for an A/B run (tools/bench_decode.py)."""

from __future__ import annotations

import contextlib
import sys


@contextlib.contextmanager
def knob(module_name: str, name: str, value):
    """module `module_name`'s global `name` set to `value` inside the block, put back after."""
    module = sys.modules[module_name]
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, before)
