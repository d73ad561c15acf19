"""The decoder's RMSNorm deferred into the next projection: the batch-1 NVFP4 WK GEMVs without a serial tail.

At batch 1 a residual projection (o_proj, down_proj, the GDN out_proj) is the WK GEMV with the add + RMSNorm after
it (gluon_gemv.nvfp4_gemv_wk_norm_kernel): every program adds its columns into the residual stream, counts itself in,
and the last one reads the whole new row back, sums its squares and writes the normed row. That tail (two serial L2
round trips and an atomic, with the GPU otherwise idle: the next kernel waits for the whole grid) runs twice a
layer. Here it goes, in two kernels:

* the producer (`nvfp4_gemv_wk_defer_kernel`) stores h = residual + y into the residual stream as before, then
  hw = h (OFFSET + w) (bf16, the norm weight applied, not yet the row's 1 / rms) as the next projection's input, and
  each program's sum of h^2 over its columns into parts[m, program]: plain stores, no counter, no last program;
* the consumer (`nvfp4_gemv_wk_rstd_kernel`, the WK GEMV of qkv / gate_up / the GDN in_proj, plain or with SILU)
  reads hw as its x, and after its K loop sums the row's parts in a fixed order (every program the same bits) into
  rstd = rsqrt(sum / K + eps) and scales its accumulator by it before the epilogue: y = rstd (W @ hw), what
  W @ (h rstd (OFFSET + w)) is up to where the rounding falls.

The split-K GEMVs (batch 8, and the layers whose batch-1 config splits) get the same in their reductions, which are
Triton (so the interpreter runs them): `splitk_reduce_defer_kernel` (the sum of the partials into the residual stream,
hw and the parts, one program a BLOCK_N columns of a row, where splitk_reduce_norm_kernel needs one program a row) and
`splitk_reduce_rstd_kernel` (the consumer's reduction scaled by rstd, plain or SILU; the consumer's split GEMV reads
hw as its x unchanged).

So a norm costs the consumer P fp32 loads a row (P = the producer's programs) and nothing serial. Rounding: the
unfused path rounds x̂ = bf16(h rstd (OFFSET + w)), this one hw = bf16(h (OFFSET + w)) and multiplies rstd in fp32,
and sums the squares in another order: within a few bf16 ulps of the unfused result, not bit-equal
(`materialize` is the reference: hw rstd, what a consumer without the rstd form would read).

CudaLinear (runtime/layers/linear_cuda.py) launches these where the plan compiled them ("kernel_defer" /
"reduce_defer" for a residual projection's GEMV buckets, "kernel_rstd" / "reduce_rstd" and their SILU forms for a
projection reading the normed stream) and CudaOps.project_add_rms_norm defers only where the next projection takes
the deferred form and runtime/cuda_ops.DEFER_NORM is on (off until these kernels have passed their GPU tests, written
2026-12-08 without a GPU: tests/plugins_trt/test_deferred_norm.py). The kernels live outside
quant_linear/ so that the tuning cache's kernel digest (build_engine/tuning_cache.py), which covers the kernels the
search times, does not change with them: their main loop is gluon_gemv's `_wk_acc`, unchanged, and the search
chooses the config of that loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from atlas.plugins_trt.pdl import pdl_enter
from atlas.plugins_trt.quant_linear import gluon_gemv as gg
from atlas.plugins_trt.quant_linear.triton_gemv import (CONFIGS_splitk_reduce, AotSignature, _gemv_out,
                                                        _wk_norm_constexprs, aot_signature, check_tiled,
                                                        fuses_norm_gemv, fuses_silu_gemv, grid_splitk_reduce)
from atlas.plugins_trt.rms_norm.triton_norm import add_residual

PART_COLUMNS = 16
"""The fewest columns a producer program holds (BLOCK_N of a WK config: 16 num_warps / WK): a consumer of a K-wide
norm reads at most K / PART_COLUMNS parts a row."""


@dataclass
class DeferredNorm:
    """A normed residual row the producer has not divided by its rms yet: rms_norm(h) = hw rstd, rstd = rsqrt(
    parts.sum(1) / N + eps). What a residual projection's deferred form returns and a projection's rstd form reads."""

    hw: torch.Tensor
    """bf16 [M, N]: h (OFFSET + w), the norm weight applied."""
    parts: torch.Tensor
    """fp32 [M, P]: the sums of h^2 over each producer program's columns."""
    eps: float

    @property
    def shape(self) -> torch.Size:
        return self.hw.shape

    def materialize(self) -> torch.Tensor:
        """The normed rows, bf16 [M, N] (for a consumer without the rstd form; the reference of the dataflow)."""
        rstd = torch.rsqrt(self.parts.sum(1, keepdim=True) / self.hw.shape[1] + self.eps)
        return (self.hw.float() * rstd).to(torch.bfloat16)


@gluon.jit
def nvfp4_gemv_wk_defer_kernel(x_ptr, w_ptr, ws_ptr, ws2_ptr, res_ptr, nw_ptr, ss_ptr, out_ptr,
                               M, N, K, stride_xm, stride_wn, stride_sn, stride_rm, stride_om,
                               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                               PDL: gl.constexpr = False, TILED: gl.constexpr = False, PRE: gl.constexpr = 0,
                               BITS: gl.constexpr = False, WK: gl.constexpr = 2, OFFSET: gl.constexpr = 0,
                               LA: gl.constexpr = 0):
    """The producer: y = x @ W.T as nvfp4_gemv_wk_kernel stores it (bf16), h = y + residual stored into the residual
    stream in place (res_ptr, row stride stride_rm: rms_norm_kernel's add_residual, the same bits), hw = h (OFFSET +
    w) to out_ptr [M, N] (row stride stride_om; nw_ptr [N] the norm weight), and the program's sum of h^2 over its
    BLOCK_N columns to ss_ptr[m P + pid] (fp32 [M, P], P = N / BLOCK_N programs). One split, grid (N / BLOCK_N, 1, 1),
    N % BLOCK_N == 0."""
    NW: gl.constexpr = gl.num_warps()
    MP: gl.constexpr = 8 if BLOCK_M <= 8 else 16
    BN: gl.constexpr = BLOCK_N
    acc = gg._wk_acc(x_ptr, w_ptr, ws_ptr, M, N, K, stride_xm, stride_wn, stride_sn, BLOCK_M, BLOCK_N, BLOCK_K, 1,
                     PDL, TILED, PRE, BITS, WK, False, LA)
    pid = gl.program_id(0)
    oL: gl.constexpr = gl.BlockedLayout([1, 1], [32 // MP, MP], [NW, 1], [1, 0])
    # from here to the residual's store: nvfp4_gemv_wk_norm_kernel's lines (the same bits in the residual stream),
    # repeated, not made a helper of gluon_gemv: that would change the tuning cache's digest of the searched kernels
    y = gg._wk_sum(acc, BN, MP, WK, oL)
    cn = pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, oL))
    cm = gl.arange(0, MP, layout=gl.SliceLayout(0, oL))
    mask = (cm < M)[None, :] & (cn < N)[:, None]
    dt: gl.constexpr = out_ptr.dtype.element_ty
    y = (y * (gl.load(ws2_ptr + cn) * 256.0)[:, None]).to(dt).to(gl.float32)  # the plain kernel's stored output
    res = res_ptr + cm[None, :] * stride_rm + cn[:, None]
    h = (y + gl.load(res, mask=mask, other=0.0).to(gl.float32)).to(res_ptr.dtype.element_ty)
    gl.store(res, h, mask=mask)
    hf = gl.where(mask, h.to(gl.float32), 0.0)
    gl.store(ss_ptr + cm * gl.num_programs(0) + pid, gl.sum(hf * hf, axis=0), mask=cm < M)
    nw = gl.load(nw_ptr + cn).to(gl.float32)
    gl.store(out_ptr + cm[None, :] * stride_om + cn[:, None], (hf * (OFFSET + nw)[:, None]).to(dt), mask=mask)


@gluon.jit
def nvfp4_gemv_wk_rstd_kernel(x_ptr, w_ptr, ws_ptr, ws2_ptr, ss_ptr, out_ptr, M, N, K, P,
                              stride_xm, stride_wn, stride_sn, stride_om, eps,
                              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                              PDL: gl.constexpr = False, TILED: gl.constexpr = False, PRE: gl.constexpr = 0,
                              BITS: gl.constexpr = False, WK: gl.constexpr = 2, SILU: gl.constexpr = False,
                              LA: gl.constexpr = 0, PP: gl.constexpr = 512):
    """The consumer: nvfp4_gemv_wk_kernel (no bias or residual; SILU as there) on x = hw of a DeferredNorm, its
    accumulator scaled by rstd = rsqrt(sum(ss_ptr[m P .. m P + P]) / K + eps) before the epilogue. ss_ptr fp32 [M, P]
    (P <= PP, a power of two), read after the PDL wait (in _wk_acc) in one fixed order."""
    NW: gl.constexpr = gl.num_warps()
    MP: gl.constexpr = 8 if BLOCK_M <= 8 else 16
    BN: gl.constexpr = BLOCK_N
    acc = gg._wk_acc(x_ptr, w_ptr, ws_ptr, M, N, K, stride_xm, stride_wn, stride_sn, BLOCK_M, BLOCK_N, BLOCK_K, 1,
                     PDL, TILED, PRE, BITS, WK, SILU, LA)
    pid = gl.program_id(0)
    oL: gl.constexpr = gl.BlockedLayout([1, 1], [32 // MP, MP], [NW, 1], [1, 0])
    cp = gl.arange(0, PP, layout=gl.SliceLayout(1, oL))
    cm = gl.arange(0, MP, layout=gl.SliceLayout(0, oL))
    parts = gl.load(ss_ptr + cm[None, :] * P + cp[:, None], mask=(cp < P)[:, None] & (cm < M)[None, :], other=0.0)
    rstd = gl.rsqrt(gl.sum(parts, axis=0) / K + eps)  # [MP]
    mma: gl.constexpr = gg.mma_layouts(BN * WK, BLOCK_K, MP, NW)[0]
    acc = acc * gl.convert_layout(rstd, gl.SliceLayout(0, mma))[None, :]
    if SILU:
        gg._wk_silu_store(acc, pid, M, N, ws2_ptr, out_ptr, stride_om, BN, MP, WK, NW)
    else:
        y = gg._wk_sum(acc, BN, MP, WK, oL)
        gg._store_out(y, pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, oL)), cm, 0, M, N, ws2_ptr, ws2_ptr,
                      ws2_ptr, out_ptr, 0, stride_om, False, False)


@triton.jit(do_not_specialize=["M"])
def splitk_reduce_defer_kernel(part_ptr, bias_ptr, res_ptr, w_ptr, out_ptr, ss_ptr, M, N, stride_rm, stride_om,
                               SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr,
                               OFFSET: tl.constexpr, PDL: tl.constexpr = False):
    """The producer's split-K reduction: y = sum_s part[s, m, :] (+ bias) rounded to bf16 (splitk_reduce_norm_kernel's
    y), h = y + residual stored into the residual stream in place (the same bits), hw = h (OFFSET + w) to out, and the
    program's sum of h^2 to ss[m P + program_id(0)] (fp32 [M, P], P = cdiv(N, BLOCK_N)). Grid (P, M, 1).

    part_ptr *fp32 [SPLIT_K, M, N] contiguous;  bias_ptr *bf16 [N];  res_ptr *bf16 [M, N] row stride stride_rm;
    w_ptr *bf16 or *fp32 [N];  out_ptr *bf16 [M, N] row stride stride_om;  ss_ptr *fp32 [M, P]."""
    pdl_enter(PDL)
    m = tl.program_id(1)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    # y: splitk_reduce_norm_kernel's lines over this program's columns (the same bits in the residual stream),
    # repeated, not made a helper of triton_gemv, for the reason nvfp4_gemv_wk_defer_kernel gives
    y = tl.zeros([BLOCK_N], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        y += tl.load(part_ptr + (s * M + m) * N + offs_n, mask=nmask, other=0.0)
    if HAS_BIAS:
        y += tl.load(bias_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)
    y = y.to(out_ptr.dtype.element_ty).to(tl.float32)
    res = res_ptr + m * stride_rm + offs_n
    h = tl.where(nmask, add_residual(y, res, res, nmask), 0.0)
    tl.store(ss_ptr + m * tl.num_programs(0) + tl.program_id(0), tl.sum(h * h, axis=0))
    w = tl.load(w_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + offs_n, (h * (OFFSET + w)).to(out_ptr.dtype.element_ty), mask=nmask)


@triton.jit(do_not_specialize=["M", "P"])
def splitk_reduce_rstd_kernel(part_ptr, bias_ptr, ss_ptr, out_ptr, M, N, K, P, stride_om, eps,
                              SPLIT_K: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr, PP: tl.constexpr,
                              PDL: tl.constexpr = False, SILU: tl.constexpr = False):
    """The consumer's split-K reduction: splitk_reduce_kernel's (plain, or SILU: [gate | up] partials of width 2N into
    silu(gate) * up) with each row's sum scaled by rstd = rsqrt(sum(ss[m P .. m P + P]) / K + eps) before its bias and
    its rounding: the partials are of a GEMV on a DeferredNorm's hw [M, K]. Grid (cdiv(N, BLOCK_N), M, 1).

    part_ptr *fp32 [SPLIT_K, M, N] (SILU: 2N) contiguous;  bias_ptr *bf16 [N];  ss_ptr *fp32 [M, P] (P <= PP);
    out_ptr *bf16 [M, N] row stride stride_om."""
    pdl_enter(PDL)
    m = tl.program_id(1)
    offs_p = tl.arange(0, PP)
    rstd = tl.rsqrt(tl.sum(tl.load(ss_ptr + m * P + offs_p, mask=offs_p < P, other=0.0), axis=0) / K + eps)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < N
    dt: tl.constexpr = out_ptr.dtype.element_ty
    if SILU:
        tl.static_assert(not HAS_BIAS)
        g = tl.zeros([BLOCK_N], dtype=tl.float32)
        u = tl.zeros([BLOCK_N], dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            row = part_ptr + (s * M + m) * (2 * N)
            g += tl.load(row + offs_n, mask=nmask, other=0.0)
            u += tl.load(row + N + offs_n, mask=nmask, other=0.0)
        g = (g * rstd).to(dt).to(tl.float32)
        act = (g * tl.sigmoid(g)).to(dt).to(tl.float32)
        tl.store(out_ptr + m * stride_om + offs_n, (act * (u * rstd).to(dt).to(tl.float32)).to(dt), mask=nmask)
    else:
        y = tl.zeros([BLOCK_N], dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            y += tl.load(part_ptr + (s * M + m) * N + offs_n, mask=nmask, other=0.0)
        y = y * rstd
        if HAS_BIAS:
            y += tl.load(bias_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)
        tl.store(out_ptr + m * stride_om + offs_n, y.to(dt), mask=nmask)


# ---------------------------------------------------------------------------------------------- launchers

def parts_bound(K: int) -> int:
    """PP of a consumer of a K-wide norm: the most parts a row can have (producer programs of PART_COLUMNS columns),
    as a power of two."""
    return triton.next_power_of_2(max(1, K // PART_COLUMNS))


def _defer_constexprs(config: dict, offset: float, pdl: bool) -> dict:
    cx = _wk_norm_constexprs(config, offset, pdl, 1)
    cx.pop("NP")
    return cx


def _rstd_constexprs(config: dict, K: int, pdl: bool, silu: bool) -> dict:
    return {"PDL": pdl, "BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"], "BLOCK_K": config["BLOCK_K"],
            "TILED": bool(config.get("TILED")), "PRE": config.get("PRE", 0), "BITS": bool(config.get("BITS")),
            "WK": config["WK"], "SILU": silu, "LA": config.get("LA", 0), "PP": parts_bound(K)}


_WEIGHT_TYPES = {"x_ptr": "*bf16", "w_ptr": "*u8", "ws_ptr": "*fp8e4nv", "ws2_ptr": "*fp32"}
_STRIDES = {"M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_wn": "i32", "stride_sn": "i32"}


def signature_wk_defer(config: dict, N: int, K: int, offset: int, pdl: bool = False,
                       weight_type: str = "*bf16") -> AotSignature:
    """nvfp4_gemv_wk_defer_kernel for a WK config on a contiguous [N, K] weight (offset 0: hw = h w, 1: h (1 + w);
    weight_type: the norm weight's pointer type); grid (N / BLOCK_N, 1, 1)."""
    check_tiled(config, N, K)
    if not fuses_norm_gemv(config, N):
        raise ValueError(f"nvfp4 GEMV config {config}: only the WK GEMV of one split defers the norm (N = {N}).")
    types = {**_WEIGHT_TYPES, "res_ptr": "*bf16", "nw_ptr": weight_type, "ss_ptr": "*fp32", "out_ptr": "*bf16",
             **_STRIDES, "stride_rm": "i32", "stride_om": "i32"}
    ints = {"N": N, "K": K, "stride_xm": K, "stride_wn": K // 2, "stride_sn": K // 16, "stride_rm": N, "stride_om": N}
    return aot_signature(nvfp4_gemv_wk_defer_kernel, types, ints, _defer_constexprs(config, offset, pdl), config,
                         ("cdiv(N, BLOCK_N)", "1", "1"))


def signature_wk_rstd(config: dict, N: int, K: int, pdl: bool = False, silu: bool = False) -> AotSignature:
    """nvfp4_gemv_wk_rstd_kernel for a WK config on a contiguous [N, K] weight reading a K-wide deferred norm (silu:
    a [gate | up] projection, out [M, N / 2]); grid (N / BLOCK_N, 1, 1)."""
    check_tiled(config, N, K)
    if not fuses_norm_gemv(config, N) or (silu and not fuses_silu_gemv(config, N)):
        raise ValueError(f"nvfp4 GEMV config {config}: only the WK GEMV of one split reads a deferred norm (N = {N}).")
    types = {**_WEIGHT_TYPES, "ss_ptr": "*fp32", "out_ptr": "*bf16", **_STRIDES, "P": "i32", "stride_om": "i32",
             "eps": "fp32"}
    ints = {"N": N, "K": K, "stride_xm": K, "stride_wn": K // 2, "stride_sn": K // 16,
            "stride_om": N // 2 if silu else N}
    return aot_signature(nvfp4_gemv_wk_rstd_kernel, types, ints, _rstd_constexprs(config, K, pdl, silu), config,
                         ("cdiv(N, BLOCK_N)", "1", "1"))


def launch_wk_defer(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
                    config: dict, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, offset: float,
                    pdl: bool = False) -> DeferredNorm:
    """JIT launch of the producer (tests, benchmarks): x bf16 [M, K] @ W.T into `residual` bf16 [M, N] in place;
    returns the DeferredNorm of the new residual rows."""
    M, N, K = x.shape[0], weight.shape[0], x.shape[1]
    signature_wk_defer(config, N, K, int(offset))  # the same checks as the build's
    hw = _gemv_out(None, M, N, x.device)
    parts = torch.empty(M, N // config["BLOCK_N"], dtype=torch.float32, device=x.device)
    cx = _defer_constexprs(config, offset, pdl)
    nvfp4_gemv_wk_defer_kernel[(N // config["BLOCK_N"], 1, 1)](
        x, weight, weight_scale, weight_scale_2, residual, norm_weight, parts, hw, M, N, K, x.stride(0),
        weight.stride(0), weight_scale.stride(0), residual.stride(0), hw.stride(0), **cx,
        **({"launch_pdl": True} if pdl else {}), num_warps=config["num_warps"], num_stages=config["num_stages"])
    return DeferredNorm(hw, parts, float(eps))


def launch_wk_rstd(x: DeferredNorm, weight: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor,
                   config: dict, pdl: bool = False, silu: bool = False) -> torch.Tensor:
    """JIT launch of the consumer: the normed rows of x (a DeferredNorm) @ W.T, bf16 [M, N] (silu: silu(gate) * up,
    [M, N / 2])."""
    M, N, K = x.hw.shape[0], weight.shape[0], x.hw.shape[1]
    signature_wk_rstd(config, N, K, silu=silu)
    out = torch.empty(M, N // 2 if silu else N, dtype=torch.bfloat16, device=x.hw.device)
    cx = _rstd_constexprs(config, K, pdl, silu)
    nvfp4_gemv_wk_rstd_kernel[(N // config["BLOCK_N"], 1, 1)](
        x.hw, weight, weight_scale, weight_scale_2, x.parts, out, M, N, K, x.parts.shape[1], x.hw.stride(0),
        weight.stride(0), weight_scale.stride(0), out.stride(0), float(x.eps), **cx,
        **({"launch_pdl": True} if pdl else {}), num_warps=config["num_warps"], num_stages=config["num_stages"])
    return out


def reduce_defer_config() -> dict:
    """splitk_reduce_defer_kernel's columns a program and warps (the plain reduction's first)."""
    return dict(CONFIGS_splitk_reduce[0])


def signature_splitk_reduce_defer(split_k: int, N: int, offset: int, has_bias: bool = False, pdl: bool = False,
                                  weight_type: str = "*bf16") -> AotSignature:
    """splitk_reduce_defer_kernel summing `split_k` partials of width N (offset 0: hw = h w, 1: h (1 + w));
    grid (cdiv(N, BLOCK_N), M, 1)."""
    config = reduce_defer_config()
    types = {"part_ptr": "*fp32", "bias_ptr": "*bf16", "res_ptr": "*bf16", "w_ptr": weight_type, "out_ptr": "*bf16",
             "ss_ptr": "*fp32", "M": "i32", "N": "i32", "stride_rm": "i32", "stride_om": "i32"}
    cx = {"SPLIT_K": split_k, "BLOCK_N": config["BLOCK_N"], "HAS_BIAS": has_bias, "OFFSET": int(offset), "PDL": pdl}
    return aot_signature(splitk_reduce_defer_kernel, types, {"N": N, "stride_rm": N, "stride_om": N}, cx, config,
                         ("cdiv(N, BLOCK_N)", "M", "1"))


def signature_splitk_reduce_rstd(split_k: int, N: int, K: int, has_bias: bool = False, pdl: bool = False,
                                 silu: bool = False) -> AotSignature:
    """splitk_reduce_rstd_kernel summing `split_k` partials of width N (silu: 2N into N) of a GEMV on a K-wide
    DeferredNorm; grid (cdiv(N, BLOCK_N), M, 1)."""
    config = dict(CONFIGS_splitk_reduce[0])
    types = {"part_ptr": "*fp32", "bias_ptr": "*bf16", "ss_ptr": "*fp32", "out_ptr": "*bf16", "M": "i32", "N": "i32",
             "K": "i32", "P": "i32", "stride_om": "i32", "eps": "fp32"}
    cx = {"SPLIT_K": split_k, "BLOCK_N": config["BLOCK_N"], "HAS_BIAS": has_bias, "PP": parts_bound(K), "PDL": pdl,
          "SILU": silu}
    return aot_signature(splitk_reduce_rstd_kernel, types, {"N": N, "K": K, "stride_om": N}, cx, config,
                         ("cdiv(N, BLOCK_N)", "M", "1"))


def launch_splitk_reduce_defer(partials: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                               offset: float = 0.0, bias: torch.Tensor | None = None,
                               pdl: bool = False) -> DeferredNorm:
    """The producer's reduction of fp32 partials [SPLIT_K, M, N] into `residual` bf16 [M, N] (in place); returns the
    DeferredNorm of the new rows."""
    split, M, N = partials.shape
    config = reduce_defer_config()
    grid = grid_splitk_reduce(config, M, N)
    hw = torch.empty(M, N, dtype=torch.bfloat16, device=partials.device)
    parts = torch.empty(M, grid[0], dtype=torch.float32, device=partials.device)
    cx = {"PDL": True, "launch_pdl": True} if pdl else {}
    splitk_reduce_defer_kernel[grid](
        partials, bias if bias is not None else hw, residual, weight, hw, parts, M, N, residual.stride(0),
        hw.stride(0), SPLIT_K=split, BLOCK_N=config["BLOCK_N"], HAS_BIAS=bias is not None, OFFSET=int(offset),
        num_warps=config["num_warps"], num_stages=config["num_stages"], **cx)
    return DeferredNorm(hw, parts, float(eps))


def launch_splitk_reduce_rstd(partials: torch.Tensor, x: DeferredNorm, bias: torch.Tensor | None = None,
                              pdl: bool = False, silu: bool = False) -> torch.Tensor:
    """The consumer's reduction of fp32 partials [SPLIT_K, M, N] (silu: 2N) of a GEMV on x.hw: bf16 [M, N]."""
    split, M, N = partials.shape
    N = N // 2 if silu else N
    config = dict(CONFIGS_splitk_reduce[0])
    out = torch.empty(M, N, dtype=torch.bfloat16, device=partials.device)
    cx = {"PDL": True, "launch_pdl": True} if pdl else {}
    K = x.hw.shape[1]
    splitk_reduce_rstd_kernel[grid_splitk_reduce(config, M, N)](
        partials, bias if bias is not None else out, x.parts, out, M, N, K, x.parts.shape[1], out.stride(0),
        float(x.eps), SPLIT_K=split, BLOCK_N=config["BLOCK_N"], HAS_BIAS=bias is not None, PP=parts_bound(K),
        SILU=silu, num_warps=config["num_warps"], num_stages=config["num_stages"], **cx)
    return out
