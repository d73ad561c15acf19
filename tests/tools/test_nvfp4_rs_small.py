"""The warp-specialized RS GEMM at GEMV sizes (tools/dev/nvfp4_rs_small.py: gluon_ws with BLOCK_M 8 / 16): every
variant compiles for sm_90 within its 128-register cap without spills, issues wgmma with n = BLOCK_M (the tokens) and
m = 64 (a consumer warpgroup's rows), and, with PDL, waits on the kernel before it only after copies have started.
Static: the compile runs on the CPU; the GPU check is the tool's sweep (each variant against the fp32 reference)."""

import pytest
from sm90 import run_compiled

pytest.importorskip("triton.experimental.gluon")

CODE = r"""
import os, re, subprocess, tempfile, triton
from atlas.tools.dev.nvfp4_rs_small import configs
from atlas.tools.dev.nvfp4_wgmma_ws import compile_sm90
tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
for m in (8, 16):
    for cfg in configs(m, 6144, 4096):
        k = compile_sm90(cfg)
        ptx = k.asm["ptx"]
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"]); f.flush()
            res = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        reg = next(int(w[4:]) for w in res.split() if w.startswith("REG:"))
        stack = next(int(w[6:]) for w in res.split() if w.startswith("STACK:"))
        shapes = sorted(set(re.findall(r"wgmma\.mma_async\S*\.m(\d+)n(\d+)k(\d+)", ptx)))
        wait = ptx.find("griddepcontrol.wait")
        copies_before = ptx[:wait].count("cp.async.cg") + ptx[:wait].count("cp.async.ca") if wait >= 0 else -1
        print("CFG", m, cfg["BLOCK_M"], int(bool(cfg.get("PDL"))), reg, stack, copies_before,
              ";".join("x".join(s) for s in shapes))
"""


def test_rs_small_compiles_with_narrow_wgmma():
    rows = [line.split()[1:] for line in run_compiled(CODE).splitlines() if line.startswith("CFG")]
    assert len(rows) == 8 + 10, rows  # configs(16, ...) and configs(8, ...) on the 8B qkv shape
    for m, bm, pdl, reg, stack, copies_before, shapes in rows:
        assert int(bm) >= int(m)
        assert int(stack) == 0 and int(reg) <= 128, rows
        assert shapes == f"64x{bm}x16", (m, bm, shapes)  # one wgmma shape: 64 weight rows by BLOCK_M tokens
        if pdl == "1":
            assert int(copies_before) > 0, (m, bm, copies_before)  # weight copies started before the wait
        else:
            assert int(copies_before) == -1  # no PDL, no wait
