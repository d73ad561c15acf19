"""The Gluon wgmma NVFP4 GEMM (plugins_trt/quant_linear/gluon_gemm.py) cannot run in Triton's interpreter. What the CPU
checks: x's k permutation is the one the weight decode uses (so the products keep the dot); every config compiles for
sm_90 without spills; and no instruction of its K loop writes a register that an in-flight wgmma reads as its A
operand (the race of Triton's swap-AB kernel, which the same check finds). The GPU check is the tool's main()."""

import numpy as np
import pytest
import torch
from sm90 import run_compiled

pytest.importorskip("triton.experimental.gluon")


@pytest.mark.parametrize("BK", [64, 128])
def test_x_permutation_matches_the_weight_decode_and_keeps_the_dot(BK):
    from atlas.plugins_trt.quant_linear.gluon_gemm import permutation, permute_k

    K = 3 * BK
    perm = permutation(K, BK, "cpu")
    assert sorted(perm.tolist()) == list(range(K))  # a permutation, block by block
    assert all(set(perm[b * BK:(b + 1) * BK].tolist()) == set(range(b * BK, (b + 1) * BK)) for b in range(3))
    k = np.arange(BK)  # the decode's map (tests/plugins_trt/test_gluon_gemv_mapping.py): logical k -> physical k'
    s0, i0, i1, s1, r0, rhi = k & 1, (k >> 1) & 1, (k >> 2) & 1, (k >> 3) & 1, (k >> 4) & 1, k >> 5
    phys = (BK // 4) * (2 * i1 + i0) + 4 * (2 * rhi + r0) + 2 * s1 + s0
    assert perm[:BK].tolist() == phys.tolist()
    g = torch.Generator().manual_seed(BK)
    W, x = torch.randn(16, K, generator=g, dtype=torch.float64), torch.randn(5, K, generator=g, dtype=torch.float64)
    A = W[:, perm]  # what the decode hands the wgmma, in its k order
    torch.testing.assert_close(A @ permute_k(x, BK).T, W @ x.T, rtol=1e-12, atol=1e-12)


def test_wgmma_gemm_compiles_without_spills_or_a_operand_hazards():
    from atlas.plugins_trt.quant_linear.triton_gemm import CONFIGS_nvfp4_wgmma

    out = run_compiled("from atlas.tools.dev.nvfp4_wgmma_gemm import sass_report; sass_report()")
    lines = [line for line in out.splitlines() if "BLOCK_M" in line]
    n = len(CONFIGS_nvfp4_wgmma)
    assert len(lines) == 2 * n and sum("'W_SMEM': True" in line for line in lines) == n, out  # both forms
    for line in lines:
        assert "STACK:0" in line and "LOCAL:0" in line and "HGMMA 0" not in line, line
        assert "in flight: 0 []" in line, line


def test_hazard_check_finds_the_triton_swap_ab_race():
    code = ("from atlas.tools.dev.swap_ab_sass import sass\n"
            "from atlas.tools.dev.nvfp4_wgmma_gemm import a_register_hazards\n"
            "base = dict(GROUP_M=8, HAS_BIAS=False, HAS_RESIDUAL=False, SWAP=True, BLOCK_M=128, BLOCK_N=128, "
            "BLOCK_K=64, PTX=True)\n"
            "print(len(a_register_hazards(sass(dict(base, DRAIN=False), 4, 3))), "
            "len(a_register_hazards(sass(dict(base, DRAIN=True), 4, 3))))")
    out = run_compiled(code)
    racy, drained = (int(v) for v in out.split())
    assert racy > 0 and drained == 0, out


def test_w_smem_needs_aligned_scale_rows():
    """W_SMEM copies the block scales 4 bytes at a time: K / 16 must keep rows 16-byte aligned (K % 256 == 0)."""
    from atlas.plugins_trt.quant_linear.gluon_gemm import supports

    cfg = {"BLOCK_K": 64, "W_SMEM": True}
    assert supports(cfg, 4096) and supports(cfg, 17408)
    assert not supports(cfg, 128) and not supports(cfg, 1152)
    assert supports({**cfg, "W_SMEM": False}, 128) and not supports({**cfg, "W_SMEM": False}, 96)


@pytest.mark.parametrize("BK", [64, 128])
def test_strided_permutation_equals_the_gather(BK):
    from atlas.plugins_trt.quant_linear.gluon_gemm import permute_k, permute_k_view

    g = torch.Generator().manual_seed(BK + 1)
    for m, k in ((1, BK * 2), (7, BK * 5), (64, 4096)):
        x = torch.randn(m, k, generator=g).to(torch.bfloat16)
        out = torch.empty_like(x)
        assert torch.equal(permute_k_view(x, BK), permute_k(x, BK))
        assert permute_k_view(x, BK, out) is out and torch.equal(out, permute_k(x, BK))
