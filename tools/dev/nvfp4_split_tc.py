"""Experiment, not used by Atlas: NVFP4 split-position tensor-core GEMV (the fp8 TC path's scheme with 8 nibbles).

Kept so that the next attempt starts from working code; its status and measurements are in
plugins_trt/quant_linear/NOTES.md section 4. On the H200 the u8-scale version (INT16_SCALES False) was correct at
BLOCK_K 256 but slower than the shipped kernels (0.17-0.29 of the copy bandwidth: 218 registers, 23-way shared-memory
bank conflicts, kWidth 8) and wrong at BLOCK_K 128; the int16-scale version (INT16_SCALES True, needs K % 32 == 0)
compiles without a shared-memory round trip at kWidth 4, is correct at BLOCK_K 128 and 256, and reached 0.16-0.36
of the copy bandwidth on the H200 (2026-12-03): faster than the u8 version, still slower than the shipped kernels.

    python -m atlas.tools.dev.nvfp4_split_tc      # on the GPU box: check against the fp32 reference and time it

Reduction order: dot t (t = 0..7) sums nibble t of every int32 word j against x_t[m, j] = x[m, 8j + t]. Each
nibble position is one one-input PTX op on the words (pack 2: prmt, shr.s32, and; E2M1 * 2^-126 as bf16), times
the block scale as bf16 (scale * 2^63), so the weight tile is decoded in the dot-operand layout; the epilogue
multiplies by 2^63 * weight_scale_2.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

from atlas.plugins_trt.quant_linear.triton_gemv import (_PAIR_SEL, _PTX, _epilogue_store, _split_blocks,
                                                        e2m1_nibble_f32)

_S_UP = tl.constexpr(2.0 ** 63)


def _nibble_asm(t: int) -> str:
    """Two words (pack 2) -> bf16x2 of nibble t of each as E2M1 * 2^-126; even t is the high nibble after << 4."""
    sel = _PAIR_SEL[t // 2]
    if t % 2:
        return f"{{ .reg .b32 p; prmt.b32 p, $1, $2, {sel}; shr.s32 p, p, 6; and.b32 $0, p, 0x81C081C0; }}"
    return ("{ .reg .b32 a, b, p; shl.b32 a, $1, 4; shl.b32 b, $2, 4; "
            f"prmt.b32 p, a, b, {sel}; shr.s32 p, p, 6; and.b32 $0, p, 0x81C081C0; }}")


_N0, _N1, _N2, _N3, _N4, _N5, _N6, _N7 = (tl.constexpr(_nibble_asm(t)) for t in range(8))
# one e4m3 byte of a 16-bit pair -> bf16 of its value * 2^63 (exact: cvt to f16 is exact, the rest powers of two)
_SCALE_LO = tl.constexpr("{ .reg .b32 h2; .reg .b16 lo, hi; .reg .f32 f; cvt.rn.f16x2.e4m3x2 h2, $1; "
                         "mov.b32 {lo, hi}, h2; cvt.f32.f16 f, lo; mul.f32 f, f, 0f5F000000; cvt.rn.bf16.f32 $0, f; }")
_SCALE_HI = tl.constexpr("{ .reg .b32 h2; .reg .b16 lo, hi; .reg .f32 f; cvt.rn.f16x2.e4m3x2 h2, $1; "
                         "mov.b32 {lo, hi}, h2; cvt.f32.f16 f, hi; mul.f32 f, f, 0f5F000000; cvt.rn.bf16.f32 $0, f; }")


@triton.jit
def _nib_scaled(w, s, ASM: tl.constexpr, T: tl.constexpr):
    if _PTX:
        return tl.inline_asm_elementwise(ASM, "=r,r,r", [w], dtype=tl.bfloat16, is_pure=True, pack=2) * s
    else:
        return (e2m1_nibble_f32(w, T) * s).to(tl.bfloat16)


@triton.jit
def _split8(x, KW: tl.constexpr):
    """x [16, 8 KW] -> 8 tiles [16, KW]: tile t [m, j] = x[m, 8j + t]."""
    c0, c1 = tl.split(tl.reshape(x, [16, KW, 2, 2, 2]))
    b00, b01 = tl.split(c0)
    b10, b11 = tl.split(c1)
    x0, x4 = tl.split(b00)
    x2, x6 = tl.split(b01)
    x1, x5 = tl.split(b10)
    x3, x7 = tl.split(b11)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _scales(sg, INT16_SCALES: tl.constexpr):
    """Loaded scale tile -> [BN, BK/16] of scale * 2^63 (bf16 on the GPU, fp32 in the interpreter)."""
    if INT16_SCALES:
        if _PTX:
            lo = tl.inline_asm_elementwise(_SCALE_LO, "=h,h", [sg], dtype=tl.bfloat16, is_pure=True, pack=1)
            hi = tl.inline_asm_elementwise(_SCALE_HI, "=h,h", [sg], dtype=tl.bfloat16, is_pure=True, pack=1)
        else:
            v = sg.to(tl.int32)
            lo = (v & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32) * _S_UP
            hi = ((v >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32) * _S_UP
        return tl.reshape(tl.join(lo, hi), [sg.shape[0], sg.shape[1] * 2])
    elif _PTX:
        return sg.to(tl.float8e4nv, bitcast=True).to(tl.bfloat16) * tl.full([1, 1], _S_UP, tl.bfloat16)
    else:
        return sg.to(tl.float8e4nv, bitcast=True).to(tl.float32) * _S_UP


@triton.jit
def _step(acc, w_cols, s_rows, x_rows, row_ok, b, K, BLOCK_K: tl.constexpr, MASKED: tl.constexpr,
          INT16_SCALES: tl.constexpr):
    KW: tl.constexpr = BLOCK_K // 8
    KS: tl.constexpr = BLOCK_K // 32 if INT16_SCALES else BLOCK_K // 16  # scale elements a row
    if MASKED:
        w = tl.load(w_cols + b * KW, mask=((b * KW + tl.arange(0, KW)) < K // 8)[:, None], other=0)
        ks = K // 32 if INT16_SCALES else K // 16
        sg = tl.load(s_rows + b * KS, mask=((b * KS + tl.arange(0, KS)) < ks)[None, :], other=0)
        x = tl.load(x_rows + b * BLOCK_K, mask=row_ok[:, None] & ((b * BLOCK_K + tl.arange(0, BLOCK_K)) < K)[None, :],
                    other=0.0)
    else:
        w = tl.load(w_cols + b * KW)
        sg = tl.load(s_rows + b * KS)
        x = tl.load(x_rows + b * BLOCK_K, mask=row_ok[:, None], other=0.0)
    s = _scales(sg, INT16_SCALES)
    s = tl.trans(tl.reshape(tl.join(s, s), [s.shape[0], KW]))  # [KW, BN]: the block scale of every word
    x0, x1, x2, x3, x4, x5, x6, x7 = _split8(x, KW)
    acc = tl.dot(x0, _nib_scaled(w, s, _N0, 0), acc)
    acc = tl.dot(x1, _nib_scaled(w, s, _N1, 1), acc)
    acc = tl.dot(x2, _nib_scaled(w, s, _N2, 2), acc)
    acc = tl.dot(x3, _nib_scaled(w, s, _N3, 3), acc)
    acc = tl.dot(x4, _nib_scaled(w, s, _N4, 4), acc)
    acc = tl.dot(x5, _nib_scaled(w, s, _N5, 5), acc)
    acc = tl.dot(x6, _nib_scaled(w, s, _N6, 6), acc)
    acc = tl.dot(x7, _nib_scaled(w, s, _N7, 7), acc)
    return acc


@triton.jit(do_not_specialize=["M"])
def nvfp4_gemv_split_kernel(x_ptr, w_ptr, ws_ptr, ws2_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_sn,
                            stride_om, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                            INT16_SCALES: tl.constexpr):
    """out[M, N] (bf16, or fp32 partials [SPLIT_K, M, N]) = x[M, K] @ W.T for M <= 16; arguments as
    triton_gemv.nvfp4_gemv_kernel without bias / residual. INT16_SCALES needs K % 32 == 0."""
    tl.static_assert(BLOCK_K % 128 == 0)
    pid_n = tl.program_id(0)
    pid_k, b_lo, b_full, has_tail = _split_blocks(K, BLOCK_K, SPLIT_K)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_n, N - 1)
    out_ptr += pid_k * M * stride_om
    offs_m = tl.arange(0, 16)
    row_ok = offs_m < M
    w_cols = (w_ptr + rows[None, :] * stride_wn).to(tl.pointer_type(tl.int32)) + tl.arange(0, BLOCK_K // 8)[:, None]
    s_base = ws_ptr.to(tl.pointer_type(tl.uint8)) + rows[:, None] * stride_sn
    if INT16_SCALES:
        s_rows = s_base.to(tl.pointer_type(tl.int16)) + tl.arange(0, BLOCK_K // 32)[None, :]
    else:
        s_rows = s_base + tl.arange(0, BLOCK_K // 16)[None, :]
    x_rows = x_ptr + offs_m[:, None] * stride_xm + tl.arange(0, BLOCK_K)[None, :]
    acc = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    for b in range(b_lo, b_full):
        acc = _step(acc, w_cols, s_rows, x_rows, row_ok, b, K, BLOCK_K, False, INT16_SCALES)
    if has_tail:
        acc = _step(acc, w_cols, s_rows, x_rows, row_ok, b_full, K, BLOCK_K, True, INT16_SCALES)
    y = acc * (tl.load(ws2_ptr + rows) * _S_UP)[None, :]
    _epilogue_store(y, offs_m, offs_n, M, N, out_ptr, out_ptr, out_ptr, 0, stride_om, False, False)


def launch(x, weight, weight_scale, weight_scale_2, block_n, block_k, split_k, int16_scales, num_warps=4,
           num_stages=3, out=None):
    """fp32 partials [split_k, M, N] when split_k > 1 (sum them), else bf16 [M, N]."""
    import torch

    m, k = x.shape
    n = weight.shape[0]
    if out is None:
        out = (torch.empty(m, n, dtype=torch.bfloat16, device=x.device) if split_k == 1
               else torch.empty(split_k, m, n, dtype=torch.float32, device=x.device))
    nvfp4_gemv_split_kernel[(triton.cdiv(n, block_n), split_k, 1)](
        x, weight, weight_scale, weight_scale_2, out, m, n, k, x.stride(0), weight.stride(0), weight_scale.stride(0),
        n, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, INT16_SCALES=int16_scales, num_warps=num_warps,
        num_stages=num_stages)
    return out


def main():  # GPU: correctness on random codes and timing beside the shipped kernel's v1 configs
    import json

    import torch

    from atlas.plugins_trt.quant_linear.reference import dequantize
    from atlas.tools.bench.timing import copies_for, graph_time

    g = torch.Generator(device="cuda").manual_seed(1)
    rows = []
    for n, k in ((34816, 5120), (28672, 4096), (6144, 4096)):
        nb = n * k // 2 + n * k // 16 + 4 * n

        def rand():
            w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda", generator=g)
            s = torch.randint(0, 127, (n, k // 16), dtype=torch.uint8, device="cuda", generator=g)
            return w, s.view(torch.float8_e4m3fn), torch.rand(n, device="cuda", generator=g) + 0.5

        qs = [rand() for _ in range(copies_for(nb))]
        ref_w = dequantize("nvfp4", *qs[0])
        for m in (1, 16):
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            ref = x.float() @ ref_w.T
            for int16 in (False, True):
                for bn, bk, warps, stages in ((128, 128, 4, 3), (128, 256, 4, 3), (256, 128, 4, 3), (64, 256, 4, 3)):
                    part = launch(x, *qs[0], bn, bk, 2, int16, warps, stages).sum(0)
                    err = float((part - ref).norm() / ref.norm())  # fp32 partials: summation order only
                    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
                    us = graph_time([lambda q=q: launch(x, *q, bn, bk, 1, int16, warps, stages, out)
                                     for q in qs], repeats=10) * 1e6
                    r = {"N": n, "K": k, "M": m, "int16_scales": int16, "tile": [bn, bk, warps, stages], "us": us,
                         "bw_fraction_of_4.24TBps": nb / (us * 1e-6) / 4.24e12, "rel_error_fp32": err}
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    out = os.environ.get("OUT", "/tmp")
    json.dump(rows, open(os.path.join(out, "nvfp4_split_tc.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
