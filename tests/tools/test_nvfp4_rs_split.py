"""tools/dev/nvfp4_rs_split.py's variants (RS 256 x 128 x 64 at SPLIT_K 2, with and without PDL) compile for sm_90
without spills within the shipped 128 x 128 x 128 config's registers and shared memory, so that the GPU sweep times
kernels that fit one CTA an SM. Static: the compile runs on the CPU; the GPU check is the sweep (each variant
against the fp32 reference)."""

import pytest
from sm90 import run_compiled

pytest.importorskip("triton.experimental.gluon")

CODE = r"""
import os, subprocess, tempfile, triton
from atlas.plugins_trt.quant_linear import triton_gemm as GM
from atlas.tools.dev.nvfp4_rs_split import variants
from atlas.tools.dev.nvfp4_wgmma_ws import compile_sm90
tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
tiled = {"TILED": True, "BITS": True}
for name, cfg in [("shipped", {**GM.CONFIGS_nvfp4_ws_rs[0], "PDL": True, **tiled})] + [
        (v, {**c, **tiled}) for v, c in variants().items()]:
    k = compile_sm90(cfg)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"]); f.flush()
        res = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    reg = next(int(w[4:]) for w in res.split() if w.startswith("REG:"))
    stack = next(int(w[6:]) for w in res.split() if w.startswith("STACK:"))
    print("CFG", name, cfg.get("SPLIT_K", 1), reg, stack, k.metadata.shared)
"""


def test_rs_split_variants_fit_like_the_shipped_tile():
    rows = {line.split()[1]: [int(v) for v in line.split()[2:]] for line in run_compiled(CODE).splitlines()
            if line.startswith("CFG")}
    assert set(rows) == {"shipped", "rs256x128_sk2", "rs256x128_sk2_pdl"}, rows
    _, reg0, _, shared0 = rows["shipped"]
    for name in ("rs256x128_sk2", "rs256x128_sk2_pdl"):
        split, reg, stack, shared = rows[name]
        assert split == 2 and stack == 0, rows
        assert reg <= reg0 and shared <= shared0, rows  # 168 registers, 146 KiB against 168 and 164 KiB
