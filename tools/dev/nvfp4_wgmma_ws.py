"""Experiment helper (GPU box): a warp-specialized NVFP4 wgmma GEMM beside the shipped one at M 256 (the nvfp4_m256
goal), on the benchmark's six shapes, tiled + BITS weights as GPU engines run them.

The shipped kernel (gluon_gemm.nvfp4_gemm_wgmma_kernel) decodes each weight block in the warps that issue the wgmma
(register A operand) and syncs the whole CTA once a block; Nsight Compute put its tensor pipe at about half of peak
on the SMs it uses (NOTES.md, 2026-12-05 fourth session). Here the work is split between partitions that sync only
through mbarriers:

* the decoder (a worker partition of DW warps) loads the packed words and scales a block or two ahead in
  registers, decodes them exactly as the shipped kernel does (gluon_gemv._a_operand: its k order, so x is
  permuted the same way, permute_k), stores the bf16 block into an S-slot ring in shared memory (NVMMA 128-byte
  swizzle, the wgmma's A operand), and copies x's block into the same slot with cp.async, whose completion the
  slot's `ready` barrier tracks (cp.async.mbarrier.arrive.noinc: every decoder thread arrives once its copies have
  landed; after the weight stores Triton syncs the partition (bar.sync 2, 128) and thread 0 arrives once more, so
  the barrier counts 32 DW + 1);
* the consumers (the default partition, one or two warpgroups on BN / 64 x 64-row halves of the tile) wait for a
  slot, issue the shared-memory wgmma (SS: acc [BN, BM] += W [BN, BK] @ x^T [BK, BM]), and once the wgmma of the
  slot before has completed, release that slot (`empty`, count 1: Triton syncs the partition, then thread 0
  arrives, so both warpgroups are past their wgmma wait).

    python -m atlas.tools.dev.nvfp4_wgmma_ws [--m 256] [--shapes a,b]   # $OUT/nvfp4_wgmma_ws.json
    python -m atlas.tools.dev.nvfp4_wgmma_ws --sass                     # compile for sm_90 here; resources
    python -m atlas.tools.dev.nvfp4_wgmma_ws --check                    # small shapes against the reference
"""
from __future__ import annotations

import json
import os
import sys

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from atlas.plugins_trt.quant_linear import gluon_gemm as gm
from atlas.plugins_trt.quant_linear import gluon_gemv as gg


@gluon.jit
def _natural(wd, sc, BN: gl.constexpr, BK: gl.constexpr, BITS: gl.constexpr):
    """One block's decoded weights [BN, BK] (bf16) in natural k order: word j's pair i is k = 8j + 2i, 8j + 2i + 1
    (the layout is the words' own, each thread's words whole; the shared-memory ring takes any layout)."""
    if BITS:
        p0 = gg._pair(wd, sc, gg.Q0)
        p1 = gg._pair(wd, sc, gg.Q1)
        p2 = gg._pair(wd, sc, gg.Q2)
        p3 = gg._pair(wd, sc, gg.Q3)
    else:
        p0 = gg._pair(wd, sc, gg.P0)
        p1 = gg._pair(wd, sc, gg.P1)
        p2 = gg._pair(wd, sc, gg.P2)
        p3 = gg._pair(wd, sc, gg.P3)
    t = gl.reshape(gl.join(gl.join(p0, p2), gl.join(p1, p3)), [BN, BK // 2])  # [n, j, c, b] = pair 2c + b of word j
    u = gl.inline_asm_elementwise(gg.UNPACK, "=r,r,r", [gl.join(t, t)], dtype=gl.bfloat16, is_pure=True, pack=2)
    return gl.reshape(u, [BN, BK])


@gluon.jit
def _decoder(w_ptr, ws_ptr, x_ptr, w_s, x_s, ready, empty, M, N, K, stride_xm, stride_wn, stride_sn, pid_n, pid_m,
             b_lo, b_hi, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, S: gl.constexpr, DW: gl.constexpr,
             TILED: gl.constexpr, BITS: gl.constexpr, NAT: gl.constexpr):
    """Fill slot (kb - b_lo) % S with block kb's decoded weights and x, for kb in [b_lo, b_hi) (NAT: natural k
    order, x as given; else gluon_gemv's order, x permuted to match)."""
    KW: gl.constexpr = BK // 8
    RP: gl.constexpr = BK // 32
    a_parent: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[DW, 1],
                                                       instr_shape=[16, 64, 16])
    aL: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=a_parent, k_width=2)
    wL: gl.constexpr = gg.words_layout(BN, KW, DW, False)
    sL: gl.constexpr = gg.words_layout(BN, KW, DW, True)
    pL: gl.constexpr = gg.pairs_layout(BN, BK, DW)
    xcL: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BK // 8), BK // 8], [DW, 1], [1, 0])  # 16-byte copies

    rows = gl.minimum(pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, wL)), N - 1)
    srows = gl.minimum(pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, sL)), N - 1)
    w_rows, s_rows = gg._row_ptrs(w_ptr, ws_ptr, rows, srows, gl.arange(0, KW, layout=gl.SliceLayout(0, wL)),
                                  gl.arange(0, KW // 2, layout=gl.SliceLayout(0, sL)), K, stride_wn, stride_sn, BK,
                                  TILED)
    xm = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, xcL))
    x_rows = x_ptr + gl.minimum(xm, M - 1)[:, None] * stride_xm \
        + gl.arange(0, BK, layout=gl.SliceLayout(0, xcL))[None, :]

    wd0 = gl.load(w_rows + gm._woff(b_lo, BK, TILED))
    sr0 = gl.load(s_rows + gm._soff(b_lo, BK, TILED))
    nxt = gl.minimum(b_lo + 1, b_hi - 1)
    wd1 = gl.load(w_rows + gm._woff(nxt, BK, TILED))
    sr1 = gl.load(s_rows + gm._soff(nxt, BK, TILED))
    for kb in range(b_lo, b_hi):
        it = kb - b_lo
        slot = it % S
        mbarrier.wait(empty.index(slot), ((it // S) & 1) ^ 1)  # the consumers are done with the slot's last block
        async_copy.async_copy_global_to_shared(x_s.index(slot), x_rows + kb * BK)
        async_copy.mbarrier_arrive(ready.index(slot), increment_count=False)
        if NAT:
            a = _natural(wd0, gg._scales(sr0, BN, KW, wL), BN, BK, BITS)
        else:
            a = gg._a_operand(wd0, gg._scales(sr0, BN, KW, wL), BN, BK, RP, pL, aL, BITS)
        wd0 = wd1
        sr0 = sr1
        nxt = gl.minimum(kb + 2, b_hi - 1)
        wd1 = gl.load(w_rows + gm._woff(nxt, BK, TILED))
        sr1 = gl.load(s_rows + gm._soff(nxt, BK, TILED))
        w_s.index(slot).store(a)
        fence_async_shared()
        mbarrier.arrive(ready.index(slot))


@gluon.jit
def _consumer(w_s, x_s, ready, empty, b_lo, b_hi, BM: gl.constexpr, BN: gl.constexpr, S: gl.constexpr,
              NW: gl.constexpr):
    """acc [BN, BM] fp32 over blocks [b_lo, b_hi) from the ring."""
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BM, 16])
    acc = gl.zeros([BN, BM], gl.float32, layout=acc_l)
    for kb in range(b_lo, b_hi):
        it = kb - b_lo
        slot = it % S
        mbarrier.wait(ready.index(slot), (it // S) & 1)
        fence_async_shared()  # the cp.async writes of x (generic proxy) before the wgmma reads them (async proxy)
        acc = warpgroup_mma(w_s.index(slot), x_s.index(slot).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        mbarrier.arrive(empty.index((it + S - 1) % S), pred=it > 0)  # the block before has completed
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    return (acc, )  # warp_specialize's default results are a tuple


@gluon.jit
def nvfp4_gemm_ws_kernel(x_ptr, w_ptr, ws_ptr, ws2_ptr, bias_ptr, res_ptr, out_ptr,
                         M, N, K, stride_xm, stride_wn, stride_sn, stride_rm, stride_om,
                         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                         HAS_BIAS: gl.constexpr, HAS_RESIDUAL: gl.constexpr, TILED: gl.constexpr = False,
                         SPLIT_K: gl.constexpr = 1, BITS: gl.constexpr = False, DW: gl.constexpr = 4,
                         DREGS: gl.constexpr = 128, NAT: gl.constexpr = False):
    """out[M, N] = x @ W^T as gluon_gemm.nvfp4_gemm_wgmma_kernel (same arguments, grid, SPLIT_K partials; x
    k-permuted unless NAT), warp-specialized (module docstring): num_warps consumer warps (4 or 8), DW decoder
    warps with DREGS registers."""
    NW: gl.constexpr = gl.num_warps()
    gl.static_assert(SPLIT_K == 1 or not (HAS_BIAS or HAS_RESIDUAL))
    pid, pk = gl.program_id(0), gl.program_id(1)
    n_m = gl.cdiv(M, BLOCK_M)
    per = K // BLOCK_K // SPLIT_K
    b_lo = pk * per
    w_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, BLOCK_K],
                                    gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
    x_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, BLOCK_K],
                                    gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=32 * DW + 1)
        mbarrier.init(empty.index(i), count=1)
    acc, = gl.warp_specialize([
        (_consumer, (w_s, x_s, ready, empty, b_lo, b_lo + per, BLOCK_M, BLOCK_N, STAGES, NW)),
        (_decoder, (w_ptr, ws_ptr, x_ptr, w_s, x_s, ready, empty, M, N, K, stride_xm, stride_wn, stride_sn,
                    pid // n_m, pid % n_m, b_lo, b_lo + per, BLOCK_M, BLOCK_N, BLOCK_K, STAGES, DW, TILED, BITS,
                    NAT)),
    ], [DW], [DREGS])
    oL: gl.constexpr = gm.out_layout(BLOCK_N, NW)
    gg._store_out(gl.convert_layout(acc, oL),
                  (pid // n_m) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, oL)),
                  (pid % n_m) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, oL)), pk, M, N, ws2_ptr,
                  bias_ptr, res_ptr, out_ptr, stride_rm, stride_om, HAS_BIAS, HAS_RESIDUAL)


def constexprs(config: dict, has_bias: bool = False, has_residual: bool = False) -> dict:
    split = config.get("SPLIT_K", 1)
    return {"BLOCK_M": config["BLOCK_M"], "BLOCK_N": config["BLOCK_N"], "BLOCK_K": config["BLOCK_K"],
            "STAGES": config["STAGES"], "HAS_BIAS": has_bias and split == 1,
            "HAS_RESIDUAL": has_residual and split == 1, "TILED": bool(config.get("TILED")), "SPLIT_K": split,
            "BITS": bool(config.get("BITS")), "DW": config.get("DW", 4), "DREGS": config.get("DREGS", 128),
            "NAT": bool(config.get("NAT"))}


def launch(x, weight, weight_scale, weight_scale_2, config: dict, bias=None, residual=None, out=None, x_perm=None):
    """As gluon_gemm.launch_nvfp4_gemm_wgmma, with this kernel."""
    import torch

    M, K = x.shape
    N = weight.shape[0]
    split = config.get("SPLIT_K", 1)
    if K % (config["BLOCK_K"] * split):
        raise ValueError(f"K {K} is not a multiple of BLOCK_K x SPLIT_K ({config})")
    xp = x.contiguous() if config.get("NAT") else gm.permute_k(x, config["BLOCK_K"], x_perm)
    if out is None:
        out = torch.empty(M, N, dtype=torch.bfloat16, device=x.device)
    res = residual if residual is not None else out
    dst = out if split == 1 else torch.empty(split, M, N, dtype=torch.float32, device=x.device)
    nvfp4_gemm_ws_kernel[gm.grid_wgmma(config, M, N)](
        xp, weight, weight_scale, weight_scale_2, bias if bias is not None else out, res, dst, M, N, K,
        xp.stride(0), weight.stride(0), weight_scale.stride(0), res.stride(0), N if split > 1 else out.stride(0),
        **constexprs(config, bias is not None, residual is not None), num_warps=config["num_warps"],
        maxnreg=config.get("MAXNREG"))
    if split > 1:
        from atlas.plugins_trt.quant_linear.triton_gemv import CONFIGS_splitk_reduce, launch_splitk_reduce
        launch_splitk_reduce(dst, out, CONFIGS_splitk_reduce[0], bias, residual)
    return out


def configs() -> list[dict]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, STAGES, consumer warps, SPLIT_K, decoder warps, register split) variants, tiled +
    BITS, then three of them in natural k order (NAT). A register split (DREGS for the decoder, MAXNREG for the
    kernel) caps the registers: with 8 decoder warps (16 in all), or to fit two CTAs an SM."""
    two = {"DREGS": 96, "MAXNREG": 128}
    plan = [(128, 128, 64, 4, 8, 1, 4, {}), (256, 64, 64, 3, 4, 1, 4, {}), (128, 64, 64, 4, 4, 1, 4, {}),
            (128, 128, 64, 3, 8, 1, 4, {}), (256, 128, 64, 3, 8, 1, 4, {}), (128, 128, 64, 4, 8, 2, 4, {}),
            (128, 64, 128, 3, 4, 1, 4, {}), (128, 128, 64, 4, 8, 1, 8, two),
            (64, 128, 64, 4, 8, 1, 4, {"DREGS": 96, "MAXNREG": 80}),  # two CTAs an SM (80 registers, 99 KB)
            (128, 64, 64, 4, 4, 1, 4, two)]  # two CTAs an SM (128 registers, 99 KB)
    out = [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": st, "num_warps": w, "SPLIT_K": sp,
            "TILED": True, "BITS": True, "DW": dw, **regs} for bm, bn, bk, st, w, sp, dw, regs in plan]
    return out + [{**out[i], "NAT": True} for i in (0, 1, 4)]  # natural k order: no permute_k launch


def compile_sm90(config: dict):
    """The kernel compiled for sm_90 here (no GPU needed): triton's CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = nvfp4_gemm_ws_kernel
    types = {"x_ptr": "*bf16", "w_ptr": "*u8", "ws_ptr": "*fp8e4nv", "ws2_ptr": "*fp32", "bias_ptr": "*bf16",
             "res_ptr": "*bf16", "out_ptr": "*bf16" if config.get("SPLIT_K", 1) == 1 else "*fp32"}
    cx = constexprs(config)
    sig = {n: ("constexpr" if n in cx else types.get(n, "i32")) for n in fn.arg_names}
    aligned = ("N", "K", "stride_xm", "stride_wn", "stride_sn", "stride_rm", "stride_om")
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*") or n in aligned}
    opts = {"num_warps": config["num_warps"]}
    if config.get("MAXNREG"):
        opts["maxnreg"] = config["MAXNREG"]
    return triton.compile(GluonASTSource(fn=fn, signature=sig, constexprs=cx, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=opts)


def sync_facts(config: dict) -> dict:
    """What the kernel's barrier counts rely on, read off its sm_90 PTX: the mbarrier init counts, the cp.async
    arrivals (unpredicated: every decoder thread), and for each plain mbarrier.arrive whether it is predicated (one
    thread) and the partition barrier just before it ("bar.sync id, threads")."""
    import re

    ptx = compile_sm90(config).asm["ptx"].splitlines()
    counts = {int(c) for line in ptx for c in re.findall(r"mbarrier\.init\S* \[[^]]+\], (\d+);", line)}
    facts = {"init_counts": sorted(counts), "arrives": [],
             "noinc": [line.strip() for line in ptx if "cp.async.mbarrier.arrive" in line]}
    for i, line in enumerate(ptx):
        if re.search(r"\bmbarrier\.arrive\.shared", line) and "cp.async" not in line:
            before = [p.strip() for p in ptx[max(0, i - 6):i] if re.search(r"\bbar\.sync\b", p)]
            facts["arrives"].append({"predicated": line.strip().startswith("@"),
                                     "bar_before": before[-1] if before else None})
    return facts


def sass_report() -> None:
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    for cfg in configs():
        try:
            c = compile_sm90(cfg)
        except Exception as e:  # noqa: BLE001 — report and go on
            print(f"{cfg}: compile failed: {type(e).__name__}: {str(e)[:2000]}")
            continue
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(c.asm["cubin"])
            f.flush()
            res = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        usage = " ".join(w for line in res.splitlines() if "REG:" in line for w in line.split()
                         if w.startswith(("REG:", "STACK:", "LOCAL:")))
        print(f"{cfg}: {usage}, shared {c.metadata.shared} B")


def check() -> bool:
    """Every config on small shapes (M below, at and above BLOCK_M; odd M) against the fp32 reference and for
    run-to-run equality; prints one line each, returns whether all passed."""
    import torch

    from atlas.tools.bench_gemm import rel
    from atlas.tools.dev.variants import nvfp4_tiled_weight

    ok = True
    for n, k in ((256, 1024), (384, 2048)):
        g, w, ws, ws2, ref_w = nvfp4_tiled_weight(n, k, bits=True)
        for m in (77, 300):
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            ref = x.float() @ ref_w.T
            for cfg in configs():
                y1 = launch(x, w, ws, ws2, cfg)
                y2 = launch(x, w, ws, ws2, cfg)
                torch.cuda.synchronize()
                err, same = rel(y1, ref), bool(torch.equal(y1, y2))
                ok &= err < 1e-2 and same
                print(f"check N {n} K {k} M {m} {cfg}: err {err:.5f} det {same}", flush=True)
    return ok


def main() -> None:
    import torch

    from atlas.tools.bench.timing import copies_for, graph_time
    from atlas.tools.bench_gemm import rel
    from atlas.tools.dev.nvfp4_wgmma_sk import SHAPES
    from atlas.tools.dev.variants import nvfp4_tiled_weight

    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    ms = [int(v) for v in (sys.argv[sys.argv.index("--m") + 1].split(",") if "--m" in sys.argv else ["256"])]
    only = sys.argv[sys.argv.index("--shapes") + 1].split(",") if "--shapes" in sys.argv else list(SHAPES)
    if set(only) - set(SHAPES):
        raise SystemExit(f"--shapes: unknown {sorted(set(only) - set(SHAPES))}; known: {', '.join(SHAPES)}")
    shipped = {(c["shape"], c["M"]): c for c in json.load(open("tools/results/gemm.json"))["cases"]}
    res = {"device": torch.cuda.get_device_name(), "rows": []}
    for name, (n, k) in SHAPES.items():
        if name not in only:
            continue
        g, w, ws, ws2, ref_w = nvfp4_tiled_weight(n, k, bits=True)
        nbytes = n * k // 2 + n * k // 16
        copies = [(w, ws)] + [(w.clone(), ws.clone()) for _ in range(copies_for(nbytes) - 1)]
        wbf = ref_w.to(torch.bfloat16)
        for m in ms:
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            ref = x.float() @ ref_w.T
            row = {"shape": name, "N": n, "K": k, "M": m,
                   "cublas_us": graph_time([lambda: x @ wbf.T], repeats=20) * 1e6, "variants": []}
            cfgs = []
            c0 = shipped.get((name, m))
            if c0 is not None and c0["nvfp4"]["config"].get("WGMMA") and "SK" not in c0["nvfp4"]["config"]:
                cfgs.append(("shipped", gm.launch_nvfp4_gemm_wgmma, c0["nvfp4"]["config"]))
            cfgs.append(("plain", gm.launch_nvfp4_gemm_wgmma,
                         {"WGMMA": True, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "STAGES": 3, "num_warps": 4,
                          "num_stages": 1, "W_SMEM": True, "TILED": True, "BITS": True}))
            cfgs += [("ws", launch, c) for c in configs()]
            for kind, fn, cfg in cfgs:
                rec = {"kind": kind, "config": cfg}
                try:
                    y1 = fn(x, w, ws, ws2, cfg)
                    y2 = fn(x, w, ws, ws2, cfg)
                    torch.cuda.synchronize()
                    rec["rel_error"] = rel(y1, ref)
                    rec["deterministic"] = bool(torch.equal(y1, y2))
                    if rec["rel_error"] < 1e-2:
                        rec["us"] = graph_time([lambda a=a, b=b, cfg=cfg, fn=fn: fn(x, a, b, ws2, cfg)
                                                for a, b in copies], repeats=20) * 1e6
                except Exception as e:  # noqa: BLE001 — record and go on
                    rec["error"] = f"{type(e).__name__}: {e}"[:400]
                row["variants"].append(rec)
                tag = (f"{kind} {cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']} S{cfg['STAGES']} "
                       f"w{cfg['num_warps']} sk{cfg.get('SPLIT_K', 1)}")
                print(f"{name:22s} M={m:4d} {tag:28s} "
                      + (f"{rec['us']:8.1f} us  x{row['cublas_us'] / rec['us']:.2f} cuBLAS" if "us" in rec else "")
                      + f"  err {rec.get('rel_error', float('nan')):.4f} det {rec.get('deterministic')}"
                      + (f"  {rec['error'][:300]}" if "error" in rec else ""), flush=True)
            ok = [r for r in row["variants"] if "us" in r]
            row["best"] = min(ok, key=lambda r: r["us"]) if ok else None
            res["rows"].append(row)
            json.dump(res, open(f"{out_dir}/nvfp4_wgmma_ws.json", "w"), indent=1)
        del copies


if __name__ == "__main__":
    if "--sass" in sys.argv:
        sass_report()
    elif "--check" in sys.argv:
        raise SystemExit(0 if check() else 1)
    else:
        main()
