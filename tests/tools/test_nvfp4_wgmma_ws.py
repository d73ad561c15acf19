"""The warp-specialized NVFP4 wgmma GEMM (tools/dev/nvfp4_wgmma_ws.py) cannot run in Triton's interpreter; its GPU check
is the tool's --check. What the CPU checks: every config compiles for sm_90 without spills, and the PTX does what the
barrier counts assume (the `ready` count 32 DW + 1 is every decoder thread's cp.async arrival plus one arrival after
the weight stores, 32 DW for RS's copy-only loader; each plain arrive is one thread's, after a barrier over its whole
partition)."""

import json
import re

import pytest
from sm90 import run_compiled

pytest.importorskip("triton.experimental.gluon")


def test_ws_gemm_compiles_without_spills():
    from atlas.tools.dev.nvfp4_wgmma_ws import configs

    out = run_compiled("from atlas.tools.dev.nvfp4_wgmma_ws import sass_report; sass_report()")
    lines = [line for line in out.splitlines() if "BLOCK_M" in line]
    assert len(lines) == len(configs()), out
    for line in lines:
        assert "STACK:0" in line and "LOCAL:0" in line, line


# two consumer warpgroups, one, two decoder warpgroups; RS with two consumer warpgroups and one; RS with two
# one-warpgroup consumer partitions (KS 2), and with PP; RS on the persistent stream-K grid; TA on RS and on RS-SK
@pytest.mark.parametrize("index", [0, 1, 7, 8, 14, 15, 20, 25, 35, 36, 40, 41])
def test_ws_gemm_barrier_counts_match_the_ptx(index):
    from atlas.tools.dev.nvfp4_wgmma_ws import configs

    cfg = configs()[index]
    facts = json.loads(run_compiled(
        f"import json; from atlas.tools.dev.nvfp4_wgmma_ws import configs, sync_facts; "
        f"print(json.dumps(sync_facts(configs()[{index}])))").strip().splitlines()[-1])
    dw = cfg.get("DW", 4)
    consumers, decoder = 32 * cfg["num_warps"], 32 * dw
    if cfg.get("TA"):  # every loader thread's copies and every consumer thread's release (twice in the loop, once
        # more at an SK item's end) are cp.async arrivals of one each: `ready` counts 32 DW, `empty` the consumers
        assert facts["init_counts"] == sorted([decoder, consumers]) and facts["arrives"] == [], facts
        assert len(facts["noinc"]) == 3 + ("SK" in cfg), facts
        assert not any(line.startswith("@") for line in facts["noinc"]), facts
        return
    assert len(facts["noinc"]) == 1 and not facts["noinc"][0].startswith("@"), facts  # every decoder thread
    if cfg.get("RS"):  # the loader's cp.async arrivals fill `ready`; each consumer partition's arrive on `empty`
        # (twice: the loop is unrolled by two), and with KS 2 the odd partition's on `done`, is one thread's after a
        # barrier over that partition
        assert facts["init_counts"] == [1, 32 * dw], facts
        ks = cfg.get("KS", 1)  # the persistent form (SK) arrives once more, for an item's last block
        assert len(facts["arrives"]) == 2 * ks + ks - 1 + ("SK" in cfg), facts
        for arrive in facts["arrives"]:
            assert arrive["predicated"] and arrive["bar_before"].endswith(f" {consumers};"), facts
        return
    assert facts["init_counts"] == [1, 32 * dw + 1], facts
    assert len(facts["arrives"]) == 2, facts
    for arrive in facts["arrives"]:
        assert arrive["predicated"], facts
    counts = sorted(int(re.search(r"(\d+);", a["bar_before"]).group(1)) for a in facts["arrives"])
    assert counts == sorted([consumers, decoder]), facts


def test_xp_copies_x_in_the_decode_order_four_bytes_at_a_time():
    """XP (the k permutation folded into the RS loader's x copies): the copies are 4-byte cp.async (the contiguity
    hints hold: two adjacent k a pair, so 2 BM BK / 4 bytes of x a block in 4-byte copies), and the host hands the
    kernel x as given. The permutation itself is gluon_gemm.k_phys, the formula permute_k gathers by (checked against
    the strided-copy form in test_nvfp4_wgmma_gemm)."""
    import torch

    from atlas.plugins_trt.quant_linear.gluon_ws import x_operand
    from atlas.tools.dev.nvfp4_wgmma_ws import configs

    index = next(i for i, c in enumerate(configs()) if c.get("XP") and c["BLOCK_M"] == 256 and not c.get("KS"))
    cfg = configs()[index]
    out = run_compiled(
        "import os, subprocess, tempfile, triton\n"
        "from atlas.tools.dev.nvfp4_wgmma_ws import configs, compile_sm90\n"
        f"c = compile_sm90(configs()[{index}])\n"
        "tool = os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin', 'cuobjdump')\n"
        "f = tempfile.NamedTemporaryFile(suffix='.cubin', delete=False); f.write(c.asm['cubin']); f.close()\n"
        "s = subprocess.run([tool, '-sass', f.name], capture_output=True, text=True).stdout\n"
        "print(s.count('LDGSTS.E '), s.count('LDGSTS.E.BYPASS.128'))")
    four, sixteen = (int(v) for v in out.split()[-2:])
    per_thread = cfg["BLOCK_M"] * cfg["BLOCK_K"] // 2 // (32 * cfg["DW"])  # 4-byte x copies a loader thread
    assert four >= per_thread, out
    x = torch.randn(3, 4 * cfg["BLOCK_K"]).to(torch.bfloat16)
    assert torch.equal(x_operand(x, cfg), x)
