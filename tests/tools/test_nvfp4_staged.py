"""The STAGE form of the Gluon NVFP4 GEMV (gluon_gemv._staged, swept by tools/dev/nvfp4_staged.py) compiles for
sm_90 without spills, copies every weight block into shared memory with 16-byte cp.async before the PDL wait (the
point of the form), and at 64 x 128 x 8 blocks needs few enough registers (<= 85) that two kernels' programs fit an
SM. Static: the compile runs on the CPU; the GPU check is the tool's main()."""

import pytest

from sm90 import run_compiled

pytest.importorskip("triton.experimental.gluon")

CODE = r"""
import os, subprocess, tempfile, triton
from atlas.plugins_trt.quant_linear import triton_gemv as gemv
from atlas.tools.dev.nvfp4_staged import configs
tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
for m in (1, 16):
    for cfg in configs(m, 6144, 4096):
        if cfg.get("MAXNREG"):
            continue
        k = gemv.compile_aot(gemv.signature_nvfp4_gemv(cfg, 6144, 4096, pdl=True))
        ptx = k.asm["ptx"]
        wait = ptx.index("griddepcontrol.wait")
        words = ptx.count("cp.async.cg.shared.global")
        before = ptx[:wait].count("cp.async.cg.shared.global")
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(k.asm["cubin"]); f.flush()
            res = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        reg = next(int(w[4:]) for w in res.split() if w.startswith("REG:"))
        stack = next(int(w[6:]) for w in res.split() if w.startswith("STACK:"))
        print("CFG", m, cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT_K"], cfg["STAGE"], reg, stack, words, before,
              k.metadata.shared)
"""


def test_staged_gemv_copies_its_weights_before_the_pdl_wait():
    rows = [line.split()[1:] for line in run_compiled(CODE).splitlines() if line.startswith("CFG")]
    assert len(rows) >= 10, rows
    for m, bn, bk, split, stage, reg, stack, words, before, shared in (map(int, r) for r in rows):
        assert stack == 0, (m, bn, bk, stage)
        # 16-byte copies of the words: BN x BK / 2 bytes a block, 128 threads, all S blocks issued before the wait
        assert words == before == stage * (bn * bk // 2) // (16 * 128), (m, bn, bk, stage, words, before)
        assert shared >= stage * bn * bk * 9 // 16, (m, bn, bk, stage, shared)  # words and scales of S blocks
        if (m, bn, bk, stage) == (1, 64, 128, 8):
            assert reg <= 85, reg
