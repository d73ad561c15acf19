"""The read-ceiling kernel (tools/bench/read.py) reads every word it is given: checked under Triton's interpreter in
a fresh process (the interpreter is chosen when triton is imported)."""

import os
import subprocess
import sys
import textwrap


def test_read_kernel_reads_every_word():
    script = textwrap.dedent("""
        import numpy as np
        import torch
        from atlas.tools.bench.read import read_kernel
        g = torch.Generator().manual_seed(3)
        for iters, pre in ((4, 0), (4, 2), (4, 4), (1, 1)):
            x = torch.randint(-2**31, 2**31 - 1, (5 * 256 * iters,), generator=g, dtype=torch.int32)
            out = torch.full((5,), 7, dtype=torch.int32)
            read_kernel[(5,)](x, out, BLOCK=256, ITERS=iters, PRE=pre, PDL=False)
            want = np.bitwise_xor.reduce(x.view(5, -1).numpy(), axis=1)
            assert (out.numpy() == want).all(), (iters, pre)
            x[3 * 256 * iters + 256 * iters - 1] ^= 1  # the last word of program 3: its result changes
            read_kernel[(5,)](x, out, BLOCK=256, ITERS=iters, PRE=pre, PDL=False)
            assert out[3].item() != want[3] and (out[:3].numpy() == want[:3]).all()
        print("ok")
    """)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "ok" in run.stdout, run.stdout + run.stderr
