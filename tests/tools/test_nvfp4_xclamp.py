"""XCLAMP in the Gluon split GEMV (gluon_gemv.nvfp4_gemv_mma_kernel): x rows past M clamped to row M - 1 instead of
masked, so the x loads lose their row mask and the zeroing of their registers. Static: compiled for sm_90 on the CPU
(the 8B qkv M 16 config the benchmark ships, tools/dev/sass_mix.py), fewer CS2R and fewer instructions a word with
it; the GPU test (tests/runtime/test_linear_tiled.py::test_xclamp_gemv_gpu) checks its outputs equal the masked
form's."""

import pytest

from sm90 import run_compiled

pytest.importorskip("triton.experimental.gluon")

CODE = r"""
from atlas.plugins_trt.quant_linear import triton_gemv as GV
from atlas.tools.dev.sass_mix import GEMVS, opcode_mix
cfg = GEMVS["8B qkv M 16 (split, UNROLL 2)"]
for xc in (0, 1):
    mix, usage, hmul2 = opcode_mix(GV.compile_aot(GV.signature_nvfp4_gemv({**cfg, "XCLAMP": bool(xc)}, 6144, 4096,
                                                                           pdl=True)).asm["cubin"])
    print("MIX", xc, mix["CS2R"], sum(mix.values()), hmul2, usage.split()[0])
"""


def test_xclamp_drops_the_x_zeroing():
    rows = {r[1]: [int(v) for v in r[2:5]] for r in (line.split() for line in run_compiled(CODE).splitlines())
            if r and r[0] == "MIX"}
    (cs_off, total_off, hm_off), (cs_on, total_on, hm_on) = rows["0"], rows["1"]
    assert hm_on == hm_off  # the same decode code
    assert cs_on < cs_off and total_on < total_off, rows
