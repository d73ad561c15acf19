"""Experiment helper, not used by Atlas: two changes to the nvfp4 tensor-core kernels, timed on the GPU beside the
shipped kernels and cuBLAS BF16.

  * scale words: the e4m3 block scales loaded as int32 words (4 a word), which Triton pipelines with cp.async like
    the weights (the shipped kernels load them 2 bytes a thread, a synchronous load inside the K loop);
  * SWAP (swap-AB): acc[BLOCK_N, BLOCK_M] = W_tile @ x_tile.T, so the dequantized weights are wgmma's A operand,
    straight from registers (no shared-memory store of the bf16 tile), and several wgmma stay in flight.

    python -m atlas.tools.dev.nvfp4_swap_ab      # GPU box; writes $OUT/nvfp4_swap_ab.json

Outcome (H200, 2026-12-03): tools/results/nvfp4_swap_ab.json and quant_linear NOTES.md section 4: swap-AB is
faster and intermittently wrong, a race on the register A operand across K steps. DRAIN (added after that run,
not timed yet) makes each step wait for its wgmma before the next step's dequantization overwrites the registers.
"""
import itertools
import json
import os
import time
import zlib

import torch
import triton
import triton.language as tl

from atlas.build_engine.quantize.quantizer import quantize
from atlas.plugins_trt.quant_linear import triton_gemm as gemm
from atlas.plugins_trt.quant_linear import triton_gemv as gemv
from atlas.plugins_trt.quant_linear.reference import dequantize
from atlas.plugins_trt.quant_linear.triton_gemm import _tile_ids
from atlas.plugins_trt.quant_linear.triton_gemv import (
    _NVFP4_DOT_DOWN, _epilogue_store, _split_blocks, e4m3_byte_f32, nvfp4_tile_bf16)
from atlas.tools.bench.timing import copies_for, copy_bandwidth, graph_time
from atlas.tools.bench_gemm import rel, to_cuda

OUT = os.environ.get("OUT", "/tmp/out")

_E4M3_UP = tl.constexpr(2.0 ** 120)


@triton.jit
def scale_words_f32(sw):
    """int32 [R, G4] (4 e4m3 block scales a word, scale 4c + t in byte t) -> fp32 [R, 4 G4], exact."""
    R: tl.constexpr = sw.shape[0]
    G4: tl.constexpr = sw.shape[1]
    # join adds a last axis, so the outer join is the fastest index: [.., j, i] holds byte 2j + i
    s = tl.join(tl.join(e4m3_byte_f32(sw, 0), e4m3_byte_f32(sw, 2)),
                tl.join(e4m3_byte_f32(sw, 1), e4m3_byte_f32(sw, 3)))
    return tl.reshape(s, [R, G4 * 4]) * _E4M3_UP


@triton.jit
def dot_step_w(acc, w_rows, s_rows, x_rows, row_ok, b, K, BLOCK_K: tl.constexpr, MASKED: tl.constexpr,
               PTX: tl.constexpr, SWAP: tl.constexpr, DRAIN: tl.constexpr = False):
    KW: tl.constexpr = BLOCK_K // 8
    KS: tl.constexpr = BLOCK_K // 64
    offs_j = tl.arange(0, KW)
    offs_s = tl.arange(0, KS)
    offs_k = tl.arange(0, BLOCK_K)
    if MASKED:
        w = tl.load(w_rows + b * KW, mask=((b * KW + offs_j) < K // 8)[None, :], other=0)
        sw = tl.load(s_rows + b * KS, mask=((b * KS + offs_s) < K // 64)[None, :], other=0)
        x = tl.load(x_rows + b * BLOCK_K, mask=row_ok[:, None] & ((b * BLOCK_K + offs_k) < K)[None, :], other=0.0)
    else:
        w = tl.load(w_rows + b * KW)
        sw = tl.load(s_rows + b * KS)
        x = tl.load(x_rows + b * BLOCK_K, mask=row_ok[:, None], other=0.0)
    wt = nvfp4_tile_bf16(w, scale_words_f32(sw), PTX)  # [BN, BK]
    if SWAP:
        acc = tl.dot(wt, tl.trans(x), acc)
        if DRAIN:  # a use of acc makes Triton wait for every wgmma of the step before the next step's dequantize
            acc = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [acc], dtype=tl.float32, is_pure=True, pack=1)
    else:
        acc = tl.dot(x, tl.trans(wt), acc)
    return acc


@triton.jit(do_not_specialize=["M"])
def gemm_w(x_ptr, w_ptr, ws_ptr, ws2_ptr, bias_ptr, res_ptr, out_ptr,
           M, N, K, stride_xm, stride_wn, stride_sn, stride_rm, stride_om,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
           HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, PTX: tl.constexpr, SWAP: tl.constexpr,
           DRAIN: tl.constexpr = False):
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_m = tl.minimum(offs_m, M - 1)
    rows_n = tl.minimum(offs_n, N - 1)
    x_rows = x_ptr + rows_m[:, None] * stride_xm + tl.arange(0, BLOCK_K)[None, :]
    w_rows = (w_ptr + rows_n[:, None] * stride_wn).to(tl.pointer_type(tl.int32)) + tl.arange(0, BLOCK_K // 8)[None, :]
    s_rows = ((ws_ptr + rows_n[:, None] * stride_sn).to(tl.pointer_type(tl.int32))
              + tl.arange(0, BLOCK_K // 64)[None, :])
    row_ok = offs_m >= 0
    if SWAP:
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for b in range(0, K // BLOCK_K):
        acc = dot_step_w(acc, w_rows, s_rows, x_rows, row_ok, b, K, BLOCK_K, False, PTX, SWAP, DRAIN)
    if K % BLOCK_K != 0:
        acc = dot_step_w(acc, w_rows, s_rows, x_rows, row_ok, K // BLOCK_K, K, BLOCK_K, True, PTX, SWAP, DRAIN)
    if SWAP:
        y = tl.trans(acc * (tl.load(ws2_ptr + rows_n) * _NVFP4_DOT_DOWN)[:, None])
    else:
        y = acc * (tl.load(ws2_ptr + rows_n) * _NVFP4_DOT_DOWN)[None, :]
    _epilogue_store(y, offs_m, offs_n, M, N, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om, HAS_BIAS, HAS_RESIDUAL)


@triton.jit(do_not_specialize=["M"])
def gemv_w(x_ptr, w_ptr, ws_ptr, ws2_ptr, bias_ptr, res_ptr, out_ptr,
           M, N, K, stride_xm, stride_wn, stride_sn, stride_rm, stride_om,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
           HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, PTX: tl.constexpr, SWAP: tl.constexpr,
           DRAIN: tl.constexpr = False):
    """The tensor-core path of nvfp4_gemv_kernel (BLOCK_M 2..16) with scale words."""
    pid_n = tl.program_id(0)
    pid_k, b_lo, b_full, has_tail = _split_blocks(K, BLOCK_K, SPLIT_K)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(offs_n, N - 1)
    w_rows = (w_ptr + rows[:, None] * stride_wn).to(tl.pointer_type(tl.int32)) + tl.arange(0, BLOCK_K // 8)[None, :]
    s_rows = ((ws_ptr + rows[:, None] * stride_sn).to(tl.pointer_type(tl.int32))
              + tl.arange(0, BLOCK_K // 64)[None, :])
    out_ptr += pid_k * M * stride_om
    TILE_M: tl.constexpr = 16 if BLOCK_M < 16 else BLOCK_M
    offs_m = tl.arange(0, TILE_M)
    row_ok = offs_m < M
    x_rows = x_ptr + offs_m[:, None] * stride_xm + tl.arange(0, BLOCK_K)[None, :]
    if SWAP:
        acc = tl.zeros([BLOCK_N, TILE_M], dtype=tl.float32)
    else:
        acc = tl.zeros([TILE_M, BLOCK_N], dtype=tl.float32)
    for b in range(b_lo, b_full):
        acc = dot_step_w(acc, w_rows, s_rows, x_rows, row_ok, b, K, BLOCK_K, False, PTX, SWAP, DRAIN)
    if has_tail:
        acc = dot_step_w(acc, w_rows, s_rows, x_rows, row_ok, b_full, K, BLOCK_K, True, PTX, SWAP, DRAIN)
    if SWAP:
        y = tl.trans(acc * (tl.load(ws2_ptr + rows) * _NVFP4_DOT_DOWN)[:, None])
    else:
        y = acc * (tl.load(ws2_ptr + rows) * _NVFP4_DOT_DOWN)[None, :]
    _epilogue_store(y, offs_m, offs_n, M, N, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om, HAS_BIAS, HAS_RESIDUAL)


SHAPES = {"27b.gate_up": (34816, 5120), "27b.down": (5120, 17408), "8b.qkv": (6144, 4096), "8b.gate_up": (28672, 4096)}
MS = [int(m) for m in os.environ.get("EXP_MS", "1,4,16,64,256,2048").split(",")]
# EXP_SHAPES: a comma list of SHAPES keys; EXP_VARIANTS=drain: only the DRAIN variants (and no GEMV sweep)
SHAPES = {n: SHAPES[n] for n in os.environ.get("EXP_SHAPES", ",".join(SHAPES)).split(",")}
DRAIN_ONLY = os.environ.get("EXP_VARIANTS", "") == "drain"
# the shipped kernels at the configs the last benchmark chose (timed beside the variants)
shipped = {(c["shape"], c["M"]): c["nvfp4"]["config"] for c in json.load(open("tools/results/gemm.json"))["cases"]}
NAMES = {"27b.gate_up": "qwen3.5-27b.gate_up", "27b.down": "qwen3.5-27b.down", "8b.qkv": "llama-3.1-8b.qkv",
         "8b.gate_up": "llama-3.1-8b.gate_up"}


def launch_w(kernel, x, q, cx, grid, warps, stages, out, workspace=None):
    N, K = q.weight.shape[0], q.weight.shape[1] * 2
    M = x.shape[0]
    dst = workspace if workspace is not None else out
    kernel[grid](x, q.weight, q.weight_scale, q.weight_scale_2, out, out, dst, M, N, K, x.stride(0), q.weight.stride(0),
                 q.weight_scale.stride(0), N, N, **cx, num_warps=warps, num_stages=stages)
    if workspace is not None:
        gemv.launch_splitk_reduce(workspace, out, gemv.CONFIGS_splitk_reduce[0])
    return out


def gemv_variants():
    for swap, ptx, drain in ((False, False, False), (True, False, False), (True, True, False), (True, True, True)):
        for bn, bk, split in itertools.product((64, 128), (128, 256), (1, 2, 4)):
            yield dict(kind="gemv_w", SWAP=swap, PTX=ptx, DRAIN=drain, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split,
                       warps=4, stages=3)


def gemm_variants():
    for swap, ptx, drain in ((True, True, False), (True, False, False), (False, True, False), (False, False, False),
                             (True, True, True), (True, False, True)):
        for bm, bn, bk, w, s in ((64, 128, 64, 4, 4), (64, 128, 128, 4, 3), (128, 128, 64, 4, 3), (128, 128, 64, 8, 3),
                                 (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (64, 256, 64, 8, 3), (256, 64, 64, 4, 3),
                                 (128, 64, 128, 4, 3)):
            if drain or not DRAIN_ONLY:
                yield dict(kind="gemm_w", SWAP=swap, PTX=ptx, DRAIN=drain, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                           warps=w, stages=s)


def run_variant(v, x, q, out, ws):
    M = x.shape[0]; N = q.weight.shape[0]
    if v["kind"] == "gemv_w":
        bm = gemv.gemv_bucket(M)
        cx = dict(BLOCK_M=max(bm, 2), BLOCK_N=v["BLOCK_N"], BLOCK_K=v["BLOCK_K"], SPLIT_K=v["SPLIT_K"], HAS_BIAS=False,
                  HAS_RESIDUAL=False, PTX=v["PTX"], SWAP=v["SWAP"], DRAIN=v.get("DRAIN", False))
        grid = (triton.cdiv(N, v["BLOCK_N"]), v["SPLIT_K"], 1)
        return launch_w(gemv_w, x, q, cx, grid, v["warps"], v["stages"], out,
                        ws[: v["SPLIT_K"] * M * N].view(v["SPLIT_K"], M, N) if v["SPLIT_K"] > 1 else None)
    cx = dict(BLOCK_M=v["BLOCK_M"], BLOCK_N=v["BLOCK_N"], BLOCK_K=v["BLOCK_K"], GROUP_M=8, HAS_BIAS=False,
              HAS_RESIDUAL=False, PTX=v["PTX"], SWAP=v["SWAP"], DRAIN=v.get("DRAIN", False))
    grid = (triton.cdiv(M, v["BLOCK_M"]) * triton.cdiv(N, v["BLOCK_N"]), 1, 1)
    return launch_w(gemm_w, x, q, cx, grid, v["warps"], v["stages"], out)


def main():
    bw = copy_bandwidth()
    res = {"copy_bandwidth": bw, "rows": []}
    t0 = time.time()
    for name, (n, k) in SHAPES.items():
        g = torch.Generator(device="cuda").manual_seed(zlib.crc32(name.encode()))
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.02)
        q = to_cuda(quantize(w, "nvfp4")); wb = w.to(torch.bfloat16); del w
        wref = dequantize("nvfp4", q.weight, q.weight_scale, q.weight_scale_2)
        nbytes = n * k // 2 + n * k // 16 + n * 4
        qs = [q] + [to_cuda(q) for _ in range(copies_for(nbytes) - 1)]
        bws = [wb] + [wb.clone() for _ in range(copies_for(n * k * 2) - 1)]
        ws = torch.empty(4 * 16 * n, device="cuda", dtype=torch.float32)
        for m in MS:
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = x.float() @ wref.T
            row = {"shape": name, "N": n, "K": k, "M": m, "bytes": nbytes + m * k * 2 + m * n * 2}
            row["cublas_us"] = graph_time([lambda ww=ww: torch.matmul(x, ww.T, out=out) for ww in bws], repeats=20) * 1e6
            cfg = shipped.get((NAMES[name], m))
            if cfg is not None:
                if m <= 16:
                    f = lambda qt: gemv.launch_nvfp4_gemv(x, qt.weight, qt.weight_scale, qt.weight_scale_2, cfg, out=out)
                else:
                    f = lambda qt: gemm.launch_nvfp4_gemm(x, qt.weight, qt.weight_scale, qt.weight_scale_2, cfg, out=out)
                row["shipped_us"] = graph_time([lambda qt=qt: f(qt) for qt in qs], repeats=20) * 1e6
            variants = (list(gemv_variants()) if m <= 16 and not DRAIN_ONLY else []) \
                + (list(gemm_variants()) if m >= 16 else [])
            row["variants"] = []
            for v in variants:
                try:
                    out.fill_(float("nan"))
                    err = rel(run_variant(v, x, qs[0], out, ws), ref)
                    rec = {**v, "rel_error": err}
                    if err < 1e-2:
                        rec["us"] = graph_time([lambda qt=qt: run_variant(v, x, qt, out, ws) for qt in qs], repeats=10) * 1e6
                except Exception as e:
                    rec = {**v, "error": f"{type(e).__name__}: {e}"[:300]}
                row["variants"].append(rec)
            ok = [r for r in row["variants"] if "us" in r]
            best = min(ok, key=lambda r: r["us"]) if ok else None
            if best:
                row["best"] = best
            print(f"{name:12s} M={m:5d} cublas {row['cublas_us']:7.1f} shipped {row.get('shipped_us', 0):7.1f} "
                  f"best {best['us'] if best else 0:7.1f} bw {row['bytes'] / (best['us'] * 1e-6) / bw if best else 0:.2f} "
                  f"{ {k: best[k] for k in best if k not in ('rel_error', 'us')} if best else ''} "
                  f"bad {sum(1 for r in row['variants'] if 'us' not in r)} t {time.time() - t0:.0f}s", flush=True)
            res["rows"].append(row)
            json.dump(res, open(f"{OUT}/nvfp4_swap_ab.json", "w"), indent=1)
        del qs, bws
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
