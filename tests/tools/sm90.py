"""Helper of the CPU tests that compile kernels for sm_90: run Python code in a fresh process with Triton's interpreter
off (the compile needs the real backend; the test process may have imported triton with TRITON_INTERPRET=1)."""

import os
import subprocess
import sys


def run_compiled(code: str, timeout: int = 900) -> str:
    """stdout of `python -c code` with TRITON_INTERPRET=0; fails the test with the process's stderr otherwise."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "TRITON_INTERPRET": "0"})
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout
