"""The WK form of the Gluon NVFP4 GEMV (gluon_gemv.nvfp4_gemv_wk_kernel, swept by tools/dev/nvfp4_wk.py) compiles
for sm_90 without spills for every variant, reads its weights with 16-byte loads (a warp's K group is a scalar, so
the addresses stay vectorizable), issues its PRE blocks' weight loads before the PDL wait, and runs one mma a 16-k
step of each block (the K groups share no work). Static: the compile runs on the CPU; the GPU checks are
test_linear_tiled.py::test_wk_gemv_gpu and the tool's main()."""

import pytest

from sm90 import run_compiled

pytest.importorskip("triton.experimental.gluon")

USAGE = r"""
import os, subprocess, tempfile, triton
tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")

def usage(k):
    # (registers, stack bytes) a thread of the compiled kernel k, from cuobjdump
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"]); f.flush()
        res = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    return (next(int(w[4:]) for w in res.split() if w.startswith("REG:")),
            next(int(w[6:]) for w in res.split() if w.startswith("STACK:")))
"""

CODE = USAGE + r"""
from atlas.plugins_trt.quant_linear import triton_gemv as gemv
from atlas.tools.dev.nvfp4_wk import configs
for m in (1, 16):
    for cfg in configs(m, 6144, 4096):
        k = gemv.compile_aot(gemv.signature_nvfp4_gemv(cfg, 6144, 4096, pdl=True))
        ptx = k.asm["ptx"]
        wait = ptx.index("griddepcontrol.wait")
        reg, stack = usage(k)
        print("CFG", m, cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["num_warps"], cfg["WK"], cfg["PRE"], reg, stack,
              ptx[:wait].count("ld.global.v4"), ptx.count("ld.global.v4"), ptx.count("mma.sync"),
              ptx.count("%tid.x"), k.metadata.shared)
"""


def test_wk_gemv_compiles_with_wide_loads_before_the_wait():
    rows = [line.split()[1:] for line in run_compiled(CODE).splitlines() if line.startswith("CFG")]
    assert len(rows) >= 15, rows
    for m, bn, bk, nw, wk, pre, reg, stack, v4_before, v4, mmas, tid, shared in (map(int, r) for r in rows):
        key = (m, bn, bk, nw, wk, pre)
        assert stack == 0 and reg <= 255, key
        # a block's words: BLOCK_N WK rows x BLOCK_K / 2 bytes, in 16-byte loads over the program's threads; x too
        w16 = bn * wk * bk // 2 // 16 // (32 * nw)
        assert v4_before == pre * w16, (key, v4_before)
        assert v4 >= (pre + 1) * w16, (key, v4)
        # mma m16n8k16: each warp a 16-row slab, BLOCK_K / 16 steps a block, MP / 8 column tiles; PRE blocks + loop
        assert mmas == (pre + 1) * (bk // 16) * (2 if m > 8 else 1), (key, mmas)
        assert tid >= 1, key  # the warp's K group read from %tid.x
        assert shared >= bn * wk * (16 if m > 8 else 8) * 4, (key, shared)  # the groups' fp32 sums


NORM_CODE = USAGE + r"""
from atlas.plugins_trt.quant_linear import triton_gemv as gemv
from atlas.build_engine.linear_kernels import wk_candidates
for m in (1, 4):
    for cfg in wk_candidates(m, 4096, 14336):
        for silu in (False, True):
            n = 28672 if silu else 4096
            sig = (gemv.signature_nvfp4_gemv(cfg, n, 4096, pdl=True, silu=True) if silu
                   else gemv.signature_nvfp4_gemv_wk_norm(cfg, n, 14336, 1, pdl=True))
            k = gemv.compile_aot(sig)
            ptx = k.asm["ptx"]
            reg, stack = usage(k)
            print("CFG", int(silu), m, cfg["BLOCK_K"], cfg["num_warps"], cfg["WK"], cfg["PRE"], reg, stack,
                  ptx.count("atom."), ptx.count("fence.acq_rel.gpu"), ptx.count("ld.global.cg"),
                  ptx[:ptx.index("griddepcontrol.wait")].count("ld.global.v4"))
"""


def test_wk_gemv_fused_forms_compile_without_spills():
    """The WK GEMV's fused forms for sm_90: SILU (SiLU-mul in the epilogue) and nvfp4_gemv_wk_norm_kernel (the add +
    RMSNorm after it: one counter atomic between two fences, the last program's residual row read once, whole, past
    L1) compile without spills, their PRE weight loads still before the PDL wait."""
    rows = [line.split()[1:] for line in run_compiled(NORM_CODE).splitlines() if line.startswith("CFG")]
    assert len(rows) >= 8, rows
    for silu, m, bk, nw, wk, pre, reg, stack, atoms, fences, cg, v4_before in (map(int, r) for r in rows):
        key = (silu, m, bk, nw, wk, pre)
        assert stack == 0 and reg <= 255, key
        assert v4_before >= pre * (16 * wk * bk // 2 // 16 // (32 * nw)), key
        if silu:
            assert atoms == fences == cg == 0, key
        else:
            # the last program's residual row: read once, whole (N 4096), in 16-byte loads past L1, all in flight
            assert atoms == 1 and fences == 2 and cg == 4096 // (8 * 32 * nw), key


DEFER_CODE = USAGE + r"""
from atlas.build_engine.linear_kernels import wk_candidates
from atlas.plugins_trt.quant_linear import triton_gemv as gemv
from atlas.plugins_trt.rms_norm import deferred as D
for m in (1, 4):
    for cfg in wk_candidates(m, 4096, 14336):
        for form, sig in [("defer", D.signature_wk_defer(cfg, 4096, 14336, 1, pdl=True)),
                          ("rstd", D.signature_wk_rstd(cfg, 6144, 4096, pdl=True)),
                          ("silu", D.signature_wk_rstd(cfg, 28672, 4096, pdl=True, silu=True))]:
            k = gemv.compile_aot(sig)
            ptx = k.asm["ptx"]
            reg, stack = usage(k)
            print("CFG", form, m, cfg["BLOCK_K"], cfg["num_warps"], cfg["WK"], cfg["PRE"], reg, stack,
                  ptx.count("atom."), ptx.count("fence."), ptx.count("rsqrt"),
                  ptx[:ptx.index("griddepcontrol.wait")].count("ld.global.v4"))
"""


def test_deferred_norm_forms_compile_without_spills_or_a_serial_tail():
    """The deferred-norm forms (plugins_trt/rms_norm/deferred.py) for sm_90: the producer and the consumer (plain and
    SILU) without spills, without atomics or fences (no counter, no last program), one rsqrt in a consumer, the PRE
    weight loads before the PDL wait."""
    rows = [line.split()[1:] for line in run_compiled(DEFER_CODE).splitlines() if line.startswith("CFG")]
    assert {r[0] for r in rows} == {"defer", "rstd", "silu"} and len(rows) >= 9, rows
    for form, *values in rows:
        m, bk, nw, wk, pre, reg, stack, atoms, fences, rsqrts, v4_before = map(int, values)
        key = (form, m, bk, nw, wk, pre)
        assert stack == 0 and reg <= 255, key
        assert atoms == 0 and fences == 0, key  # no counter, no last program
        assert rsqrts == (0 if form == "defer" else 1), key
        assert v4_before >= pre * (16 * wk * bk // 2 // 16 // (32 * nw)), key  # the PRE weights before the wait
