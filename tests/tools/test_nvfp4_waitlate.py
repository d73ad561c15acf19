"""The WAIT_LATE timing probe of the Gluon NVFP4 GEMV (tools/dev/nvfp4_waitlate.py) compiles for sm_90 with its PDL
wait after every mma (the point of the probe: all the work before the wait, only the store after it), while the same
config without the probe waits before its first mma. Static: the compile runs on the CPU; the GPU run is the tool's
main()."""

import pytest

from sm90 import run_compiled

pytest.importorskip("triton.experimental.gluon")

CODE = r"""
from atlas.plugins_trt.quant_linear import triton_gemv as gemv
from atlas.tools.dev.nvfp4_waitlate import configs
shipped = {"BLOCK_M": 1, "BLOCK_N": 64, "BLOCK_K": 256, "SPLIT_K": 4, "num_warps": 4, "num_stages": 1, "GLUON": True,
           "PIPE": 1, "PRE": 4, "TILED": True, "BITS": True}
for m in (1, 16):
    for label, cfg in configs({**shipped, "BLOCK_M": gemv.gemv_bucket(m)}, m, 6144, 4096):
        ptx = gemv.compile_aot(gemv.signature_nvfp4_gemv(cfg, 6144, 4096, pdl=True)).asm["ptx"]
        wait, first, last = ptx.index("griddepcontrol.wait"), ptx.index("mma.sync"), ptx.rindex("mma.sync")
        print("CFG", m, int(bool(cfg.get("WAIT_LATE"))), int(first < wait), int(last < wait), label.replace(" ", "_"))
"""


def test_waitlate_probe_waits_after_its_work():
    rows = [line.split()[1:] for line in run_compiled(CODE).splitlines() if line.startswith("CFG")]
    assert len(rows) >= 10, rows
    assert {r[1] for r in rows} == {"0", "1"}, rows
    for m, late, first_before, last_before, label in rows:
        if late == "1":
            assert first_before == last_before == "1", (m, label)
        else:
            assert first_before == "0", (m, label)
