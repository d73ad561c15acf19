"""Experiment helper, not used by Atlas yet: an NVFP4 GEMV for M = 1..16 written in Gluon, mma.sync m16n8k16 with the
weights decoded straight into the A-operand registers (swap-AB: acc[BN, MP] += W[BN, BK] @ x^T[BK, MP], MP = 8 or 16).

Why Gluon: the Triton GEMVs lose either the instruction count (CUDA cores: ~4.6 an element, issue-bound at 0.47-0.58
of the copy bandwidth) or the layout (tensor cores: the decoded tile goes through shared memory, or the loads lose
their width). Here the layouts are written out (`gl.DistributedLinearLayout`) and every layout change is
`convert_layout(..., assert_trivial=True)`, so the compiler refuses any data movement:

  * k is permuted inside each BK block, the same way for the weights and for x (a dot product does not care): the
    thread that owns quarter i of a block for mma k-tile r holds logical k = 16r + 2i + {0, 1, 8, 9}, stored at
    physical k' = (BK/4)·i + 4r + {0, 1, 2, 3}. Each thread then reads BK/32 contiguous int32 words a row and BK/4
    contiguous x values (16-byte loads), and word j = (BK/32)·i + r // 2 holds exactly its elements.
  * one PTX op per bf16x2 pair (shl shared by the 4 pairs of a word, prmt, shr, and, bf16x2 multiply by the block
    scale: 17 instructions a word), outputs int32 so that the reorder into the A operand's register order is a
    renaming of 32-bit values; a final `mov` reinterprets them as bf16 pairs.
  * sm_90 SASS (compiled on the CPU: BK 128, BN 128, 4 warps): 3.06 instructions a weight element in the loop, no
    shared memory, 16-byte weight and x loads, 76 registers; the CUDA-core GEMV's loop is ~4.6.

Not yet run on a GPU. On the GPU box:

    python -m atlas.tools.dev.nvfp4_gluon_gemv      # checks against the fp32 reference, times it; $OUT/nvfp4_gluon_gemv.json
    python -m atlas.tools.dev.nvfp4_gluon_gemv --sass   # (no GPU needed) loop instruction mix of each config

Contract: K % BK == 0, BK in 64 / 128 / 256, BN a multiple of 16 x num_warps, 1 <= M <= MP, pointers 16-byte
aligned; SPLIT_K > 1 writes fp32 partials [SPLIT_K, M, N] for gemv.splitk_reduce_kernel.
"""
from __future__ import annotations

import json
import os
import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

S_UP = gl.constexpr(2.0 ** 118)  # decoded value = E2M1 * scale * 2^-8 (as in triton_gemv.nvfp4_tile_bf16)
_SEL = ("0x4800", "0x5910", "0x6A20", "0x7B30")  # triton_gemv._PAIR_SEL


def _pair_asm(i: int) -> str:
    """int32 word w, bf16 scale S -> the bf16x2 of nibbles 2i, 2i + 1 (E2M1 * S * 2^-126) as int32."""
    return ("{ .reg .b32 q, p, s2; shl.b32 q, $1, 4; mov.b32 s2, {$2, $2}; prmt.b32 p, q, $1, " + _SEL[i] + "; "
            "shr.s32 p, p, 6; and.b32 p, p, 0x81C081C0; mul.rn.bf16x2 $0, p, s2; }")


P0, P1, P2, P3 = (gl.constexpr(_pair_asm(i)) for i in range(4))
UNPACK = gl.constexpr("mov.b32 $0, $1;")


@gluon.constexpr_function
def words_layout(BN, KW, NW, HALF):
    """int32 words [BN, KW] (row n, word j; HALF: one entry a word pair, [BN, KW / 2], for the block scales):
    registers walk the thread's contiguous words, then row n + 8 and the row repeats; lanes 0-1 pick the quarter
    of the block, lanes 2-4 and the warps the rows (those of the mma A operand)."""
    BN, KW, NW, HALF = (getattr(v, "value", v) for v in (BN, KW, NW, HALF))
    RP = KW // 4 // (2 if HALF else 1)
    reg = [[0, 1 << b] for b in range(RP.bit_length() - 1)] + [[8, 0]] + [
        [16 * NW << b, 0] for b in range((BN // (16 * NW)).bit_length() - 1)]
    return gl.DistributedLinearLayout(reg_bases=reg, lane_bases=[[0, RP], [0, 2 * RP], [1, 0], [2, 0], [4, 0]],
                                      warp_bases=[[16 << b, 0] for b in range(NW.bit_length() - 1)], block_bases=[],
                                      shape=[BN, KW // (2 if HALF else 1)])


@gluon.constexpr_function
def pairs_layout(BN, BK, NW):
    """The A operand's layout without its k + 1 basis: int32 [BN, BK/2], each the bf16x2 of (k, k + 1)."""
    BN, BK, NW = (getattr(v, "value", v) for v in (BN, BK, NW))
    reg = [[8, 0]] + [[0, 4 << b] for b in range((BK // 8).bit_length() - 1)] + [
        [16 * NW << b, 0] for b in range((BN // (16 * NW)).bit_length() - 1)]
    return gl.DistributedLinearLayout(reg_bases=reg, lane_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
                                      warp_bases=[[16 << b, 0] for b in range(NW.bit_length() - 1)], block_bases=[],
                                      shape=[BN, BK // 2])


@gluon.constexpr_function
def x_layout(BK, MP, NW):
    """x [MP, BK] in physical order: lane l holds row l // 4 (and + 8 for MP 16) and the contiguous quarter l % 4
    of the block; the warps replicate it."""
    BK, MP, NW = (getattr(v, "value", v) for v in (BK, MP, NW))
    q = BK // 4
    reg = [[0, 1 << b] for b in range(q.bit_length() - 1)] + ([[8, 0]] if MP == 16 else [])
    return gl.DistributedLinearLayout(reg_bases=reg, lane_bases=[[0, q], [0, 2 * q], [1, 0], [2, 0], [4, 0]],
                                      warp_bases=[[0, 0]] * (NW.bit_length() - 1), block_bases=[], shape=[MP, BK])


@gluon.jit
def _pair(wd, sc, ASM: gl.constexpr):
    return gl.inline_asm_elementwise(ASM, "=r,r,h", [wd, sc], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def nvfp4_gemv_mma_kernel(w_ptr, s_ptr, x_ptr, ws2_ptr, out_ptr, M, N, K, stride_wn, stride_sn, stride_xm,
                          BK: gl.constexpr, BN: gl.constexpr, MP: gl.constexpr, SPLIT_K: gl.constexpr,
                          NW: gl.constexpr):
    """Grid (cdiv(N, BN), SPLIT_K). w u8 [N, K/2], s e4m3 (as u8) [N, K/16], x bf16 [M, K], ws2 f32 [N];
    out bf16 [M, N] (SPLIT_K 1) or f32 [SPLIT_K, M, N]."""
    KW: gl.constexpr = BK // 8
    RP: gl.constexpr = BK // 32
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1], instr_shape=[16, 8])
    aL: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    bL: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    wL: gl.constexpr = words_layout(BN, KW, NW, False)
    sL: gl.constexpr = words_layout(BN, KW, NW, True)
    pL: gl.constexpr = pairs_layout(BN, BK, NW)
    xL: gl.constexpr = x_layout(BK, MP, NW)
    pid, pk = gl.program_id(0), gl.program_id(1)
    nb = K // BK
    per = (nb + SPLIT_K - 1) // SPLIT_K
    b_lo = pk * per
    b_hi = gl.minimum(b_lo + per, nb)
    rows = gl.minimum(pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, wL)), N - 1)
    w_rows = (w_ptr + rows[:, None] * stride_wn).to(gl.pointer_type(gl.int32)) \
        + gl.arange(0, KW, layout=gl.SliceLayout(0, wL))[None, :]
    srows = gl.minimum(pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, sL)), N - 1)
    s_rows = s_ptr + srows[:, None] * stride_sn + gl.arange(0, KW // 2, layout=gl.SliceLayout(0, sL))[None, :]
    xm = gl.arange(0, MP, layout=gl.SliceLayout(1, xL))
    x_rows = x_ptr + xm[:, None] * stride_xm + gl.arange(0, BK, layout=gl.SliceLayout(0, xL))[None, :]
    xmask = (xm < M)[:, None]
    acc = gl.zeros([BN, MP], gl.float32, layout=mma)
    for kb in range(b_lo, b_hi):
        wd = gl.load(w_rows + kb * KW)
        sc = gl.load(s_rows + kb * (BK // 16)).to(gl.float8e4nv, bitcast=True).to(gl.float32)
        sc = (sc * S_UP).to(gl.bfloat16)  # exact: at most 4 significant bits, below 2^127
        sc = gl.convert_layout(gl.reshape(gl.join(sc, sc), [BN, KW]), wL, assert_trivial=True)  # one a word
        p0 = _pair(wd, sc, P0)
        p1 = _pair(wd, sc, P1)
        p2 = _pair(wd, sc, P2)
        p3 = _pair(wd, sc, P3)
        t = gl.join(gl.join(p0, p1), gl.join(p2, p3))   # int32 [BN, KW, c, b]: bf16x2 of nibbles 4c + 2b + {0, 1}
        t = gl.reshape(t, [BN, 2, 2, RP, 2, 2])         # n, i1, i0, rhi, r0, s1 (k = s0 + 2i0 + 4i1 + 8s1 + 16r0 + 32rhi)
        t = gl.permute(t, [0, 3, 4, 5, 1, 2])            # n, rhi, r0, s1, i1, i0
        t = gl.convert_layout(gl.reshape(t, [BN, BK // 2]), pL, assert_trivial=True)  # 32-bit values renamed
        u = gl.inline_asm_elementwise(UNPACK, "=r,r,r", [gl.join(t, t)], dtype=gl.bfloat16, is_pure=True, pack=2)
        a = gl.convert_layout(gl.reshape(u, [BN, BK]), aL, assert_trivial=True)
        xv = gl.load(x_rows + kb * BK, mask=xmask, other=0.0)  # [MP, BK] physical: i1, i0, rhi, r0, s1, s0
        xv = gl.permute(gl.reshape(xv, [MP, 2, 2, RP, 2, 2, 2]), [3, 4, 5, 1, 2, 6, 0])  # rhi, r0, s1, i1, i0, s0, m
        b = gl.convert_layout(gl.reshape(xv, [BK, MP]), bL, assert_trivial=True)
        acc = mma_v2(a, b, acc)
    cn = pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, mma))
    cm = gl.arange(0, MP, layout=gl.SliceLayout(0, mma))
    y = acc * (gl.load(ws2_ptr + gl.minimum(cn, N - 1)) * 256.0)[:, None]
    mask = (cm < M)[None, :] & (cn < N)[:, None]
    gl.store(out_ptr + pk * M * N + cm[None, :] * N + cn[:, None], y.to(out_ptr.dtype.element_ty), mask=mask)


CONFIGS = [dict(BK=bk, BN=bn, NW=nw, SPLIT_K=s) for bk, bn, nw in ((128, 64, 4), (128, 128, 4), (256, 64, 4),
                                                                  (256, 128, 4), (128, 128, 8), (64, 64, 4))
           for s in (1, 2, 4)]


def launch(x, weight, weight_scale, weight_scale_2, cfg, out=None, workspace=None):
    """y = x @ W.T for nvfp4 W (u8 [N, K/2], e4m3 [N, K/16], f32 [N]); x bf16 [M, K], M <= 16."""
    import torch

    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    M, K = x.shape
    N = weight.shape[0]
    MP = 8 if M <= 8 else 16
    out = torch.empty(M, N, dtype=torch.bfloat16, device=x.device) if out is None else out
    split = cfg["SPLIT_K"]
    dst = out if split == 1 else (workspace if workspace is not None else
                                  torch.empty(split, M, N, dtype=torch.float32, device=x.device))
    nvfp4_gemv_mma_kernel[(triton.cdiv(N, cfg["BN"]), split)](
        weight, weight_scale.view(torch.uint8), x, weight_scale_2, dst, M, N, K, weight.stride(0),
        weight_scale.stride(0), x.stride(0), BK=cfg["BK"], BN=cfg["BN"], MP=MP, SPLIT_K=split, NW=cfg["NW"],
        num_warps=cfg["NW"])
    if split > 1:
        gemv.launch_splitk_reduce(dst, out, gemv.CONFIGS_splitk_reduce[0])
    return out


def sass_report() -> None:
    """Compile every config for sm_90 (no GPU) and print the loop's instruction mix per weight element."""
    import collections
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    sig = {"w_ptr": "*u8", "s_ptr": "*u8", "x_ptr": "*bf16", "ws2_ptr": "*fp32", "out_ptr": "*bf16", "M": "i32",
           "N": "i32", "K": "i32", "stride_wn": "i32", "stride_sn": "i32", "stride_xm": "i32", "BK": "constexpr",
           "BN": "constexpr", "MP": "constexpr", "SPLIT_K": "constexpr", "NW": "constexpr"}
    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in
             ("w_ptr", "s_ptr", "x_ptr", "ws2_ptr", "out_ptr", "K", "stride_wn", "stride_sn", "stride_xm")}
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    for cfg in [c for c in CONFIGS if c["SPLIT_K"] == 1]:
        for mp in (8, 16):
            src = GluonASTSource(fn=nvfp4_gemv_mma_kernel, signature=sig, attrs=attrs,
                                 constexprs={"BK": cfg["BK"], "BN": cfg["BN"], "MP": mp, "SPLIT_K": 1, "NW": cfg["NW"]})
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg["NW"]})
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(k.asm["cubin"])
                f.flush()
                sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
                res = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
            ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4})\*/\s+(.*?);", sass)]
            lo, hi = next((int(m.group(1), 16), a) for a, t in ins
                          if (m := re.search(r"BRA\s+0x([0-9a-f]+)", t)) and int(m.group(1), 16) < a)
            loop = [t for a, t in ins if lo <= a <= hi]
            ops = collections.Counter((t.split()[1] if t.startswith("@") else t.split()[0]).split(".")[0] for t in loop)
            per = cfg["BN"] * cfg["BK"] / (32 * cfg["NW"])
            usage = " ".join(w for line in res.splitlines() if "REG:" in line for w in line.split()
                             if w.startswith(("REG:", "STACK:", "SHARED:")))
            print(f"BK {cfg['BK']} BN {cfg['BN']} warps {cfg['NW']} MP {mp}: {len(loop) / per:.2f} instructions an "
                  f"element, {usage}, LDS/STS in loop {ops['LDS'] + ops['STS']}; {dict(ops.most_common(8))}")


def main() -> None:
    import torch

    from atlas.build_engine.quantize.quantizer import quantize
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    from atlas.plugins_trt.quant_linear.reference import dequantize
    from atlas.tools.bench.timing import copies_for, copy_bandwidth, graph_time
    from atlas.tools.bench_gemm import rel, to_cuda

    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    shipped = {(c["shape"], c["M"]): c["nvfp4"]["config"] for c in
               json.load(open("tools/results/gemm.json"))["cases"]}
    shapes = {"qwen3.5-27b.gate_up": (34816, 5120), "qwen3.5-27b.down": (5120, 17408),
              "llama-3.1-8b.qkv": (6144, 4096), "llama-3.1-8b.gate_up": (28672, 4096)}
    bw = copy_bandwidth()
    res = {"copy_bandwidth": bw, "rows": []}
    for name, (n, k) in shapes.items():
        g = torch.Generator(device="cuda").manual_seed(n + k)
        q = to_cuda(quantize(torch.randn(n, k, device="cuda", generator=g) * 0.02, "nvfp4"))
        wref = dequantize("nvfp4", q.weight, q.weight_scale, q.weight_scale_2)
        nbytes = n * k // 2 + n * k // 16 + n * 4
        qs = [q] + [to_cuda(q) for _ in range(copies_for(nbytes) - 1)]
        for m in (1, 2, 4, 8, 16):
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            ref = x.float() @ wref.T
            row = {"shape": name, "N": n, "K": k, "M": m, "bytes": nbytes + m * k * 2 + m * n * 2}
            cfg0 = shipped.get((name, m))
            if cfg0 is not None:
                row["shipped_us"] = graph_time([lambda qt=qt: gemv.launch_nvfp4_gemv(
                    x, qt.weight, qt.weight_scale, qt.weight_scale_2, cfg0) for qt in qs], repeats=20) * 1e6
            row["variants"] = []
            for cfg in CONFIGS:
                rec = dict(cfg)
                try:
                    rec["rel_error"] = rel(launch(x, q.weight, q.weight_scale, q.weight_scale_2, cfg), ref)
                    if rec["rel_error"] < 1e-2:
                        rec["us"] = graph_time([lambda qt=qt, cfg=cfg: launch(
                            x, qt.weight, qt.weight_scale, qt.weight_scale_2, cfg) for qt in qs], repeats=20) * 1e6
                except Exception as e:  # noqa: BLE001 — record and go on
                    rec["error"] = f"{type(e).__name__}: {e}"[:300]
                row["variants"].append(rec)
            ok = [r for r in row["variants"] if "us" in r]
            best = min(ok, key=lambda r: r["us"]) if ok else None
            row["best"] = best
            errs = sorted({round(r["rel_error"], 4) for r in row["variants"] if "rel_error" in r})
            print(f"{name:22s} M={m:2d} shipped {row.get('shipped_us', 0):7.1f} us  gluon best "
                  f"{best['us'] if best else 0:7.1f} us (bw {row['bytes'] / (best['us'] * 1e-6) / bw if best else 0:.2f})"
                  f" {({k: best[k] for k in ('BK', 'BN', 'NW', 'SPLIT_K')} if best else '')} rel errors {errs[:4]}",
                  flush=True)
            res["rows"].append(row)
            json.dump(res, open(f"{out_dir}/nvfp4_gluon_gemv.json", "w"), indent=1)


if __name__ == "__main__":
    sass_report() if "--sass" in sys.argv else main()
