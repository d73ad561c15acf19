"""Experiment helper: check and time the Gluon NVFP4 GEMV (plugins_trt/quant_linear/gluon_gemv.py) on the GPU beside
the shipped Triton GEMV, or print its sm_90 loop instruction mix (no GPU needed).

    python -m atlas.tools.dev.nvfp4_gluon_gemv          # GPU box: $OUT/nvfp4_gluon_gemv.json
    python -m atlas.tools.dev.nvfp4_gluon_gemv --sass   # CPU: loop instructions a weight element per config
    python -m atlas.tools.dev.nvfp4_gluon_gemv --probe  # GPU box: where a wrong result comes from ($OUT/gluon_probe.*)
    python -m atlas.tools.dev.nvfp4_gluon_gemv --splits # GPU box: SPLIT_K 2..17 at M 1, PDL launches
                                                        #   ($OUT/nvfp4_gluon_splits.json)
    python -m atlas.tools.dev.nvfp4_gluon_gemv --tiled  # GPU box: row-major against block-contiguous weights
                                                        #   (TILED) and x through shared memory (XSMEM), M 1 / 4 /
                                                        #   8 / 16, PDL ($OUT/nvfp4_gluon_tiled.json)
    python -m atlas.tools.dev.nvfp4_gluon_gemv --unroll  # GPU box: UNROLL 2 and the cp.async form, M 1..16
                                                         #   ($OUT/nvfp4_gluon_unroll.json)
    python -m atlas.tools.dev.nvfp4_gluon_gemv --pre     # GPU box: weights loaded before the PDL wait, M 1..16
"""
from __future__ import annotations

import json
import os
import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from atlas.plugins_trt.quant_linear import gluon_gemv as gg

CONFIGS = [dict(BK=bk, BN=bn, NW=nw, SPLIT_K=s, PIPE=p) for bk, bn, nw, p in (
    (128, 64, 4, 1), (128, 128, 4, 1), (256, 64, 4, 1), (256, 128, 4, 1), (128, 128, 8, 1), (64, 64, 4, 1),
    (128, 64, 4, 2), (128, 128, 4, 2), (256, 64, 4, 2), (128, 64, 4, 3), (128, 128, 4, 3), (256, 64, 4, 3),
    (128, 64, 4, 4), (256, 256, 8, 1), (128, 256, 8, 1)) for s in (1, 4, 16)]


@gluon.jit
def _probe_kernel(w_ptr, ws_ptr, x_ptr, a_ptr, b_ptr, c_ptr, BN: gl.constexpr, BK: gl.constexpr, MP: gl.constexpr):
    """One block (rows 0..BN-1, k 0..BK-1) through the kernel's own pieces: the decoded A operand [BN, BK], the
    B operand [BK, MP] (both logical k order) and one mma_v2 [BN, MP], stored through a plain blocked layout."""
    NW: gl.constexpr = gl.num_warps()
    KW: gl.constexpr = BK // 8
    RP: gl.constexpr = BK // 32
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1], instr_shape=[16, 8])
    aL: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    bL: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
    wL: gl.constexpr = gg.words_layout(BN, KW, NW, False)
    sL: gl.constexpr = gg.words_layout(BN, KW, NW, True)
    pL: gl.constexpr = gg.pairs_layout(BN, BK, NW)
    xL: gl.constexpr = gg.x_layout(BK, MP, NW)
    plain: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [NW, 1], [1, 0])
    rows = gl.arange(0, BN, layout=gl.SliceLayout(1, wL))
    wd = gl.load((w_ptr + rows[:, None] * (BK // 2)).to(gl.pointer_type(gl.int32))
                 + gl.arange(0, KW, layout=gl.SliceLayout(0, wL))[None, :])
    srows = gl.arange(0, BN, layout=gl.SliceLayout(1, sL))
    sc = gg._scales(gl.load(ws_ptr + srows[:, None] * (BK // 16)
                            + gl.arange(0, KW // 2, layout=gl.SliceLayout(0, sL))[None, :]), BN, KW, wL)
    xm = gl.arange(0, MP, layout=gl.SliceLayout(1, xL))
    xv = gl.load(x_ptr + xm[:, None] * BK + gl.arange(0, BK, layout=gl.SliceLayout(0, xL))[None, :])
    a = gg._a_operand(wd, sc, BN, BK, RP, pL, aL)
    b = gg._x_operand(xv, BK, MP, RP, bL)
    c = mma_v2(a, b, gl.zeros([BN, MP], gl.float32, layout=mma))
    r = gl.arange(0, BN, layout=gl.SliceLayout(1, plain))
    kk = gl.arange(0, BK, layout=gl.SliceLayout(0, plain))
    gl.store(a_ptr + r[:, None] * BK + kk[None, :], gl.convert_layout(a, plain))
    kr = gl.arange(0, BK, layout=gl.SliceLayout(1, plain))
    mc = gl.arange(0, MP, layout=gl.SliceLayout(0, plain))
    gl.store(b_ptr + kr[:, None] * MP + mc[None, :], gl.convert_layout(b, plain))
    gl.store(c_ptr + r[:, None] * MP + mc[None, :], gl.convert_layout(c, plain))


def probe() -> None:
    """Find where a wrong Gluon result comes from: (1) the pieces of one block (_probe_kernel) against their
    numpy meaning; (2) the full kernel writing into a NaN-filled output (did it write at all?) at small shapes."""
    import traceback

    import numpy as np
    import torch

    from atlas.build_engine.quantize.quantizer import quantize
    from atlas.plugins_trt.quant_linear.reference import dequantize
    from atlas.tools.bench_gemm import rel, to_cuda

    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    report, dump = {}, {}
    g = torch.Generator(device="cuda").manual_seed(7)
    for bk, bn, mp in ((64, 64, 8), (128, 64, 16), (256, 128, 8)):
        key = f"pieces_BK{bk}_BN{bn}_MP{mp}"
        try:
            q = to_cuda(quantize(torch.randn(bn, bk, device="cuda", generator=g) * 0.02, "nvfp4"))
            wref = dequantize("nvfp4", q.weight, q.weight_scale, q.weight_scale_2)  # [bn, bk] fp32
            wpre = wref / q.weight_scale_2[:, None] / 256.0  # what the decode should give (before ws2 * 256)
            x = torch.randn(mp, bk, device="cuda", generator=g).to(torch.bfloat16)
            a = torch.full((bn, bk), float("nan"), device="cuda", dtype=torch.bfloat16)
            b = torch.full((bk, mp), float("nan"), device="cuda", dtype=torch.bfloat16)
            c = torch.full((bn, mp), float("nan"), device="cuda", dtype=torch.float32)
            _probe_kernel[(1,)](q.weight, q.weight_scale, x, a, b, c, BN=bn, BK=bk, MP=mp, num_warps=4)
            torch.cuda.synchronize()
            k = np.arange(bk)
            s0, i0, i1, s1, r0, rhi = k & 1, (k >> 1) & 1, (k >> 2) & 1, (k >> 3) & 1, (k >> 4) & 1, k >> 5
            phys = torch.as_tensor((bk // 4) * (2 * i1 + i0) + 4 * (2 * rhi + r0) + 2 * s1 + s0, device="cuda")
            a_exp, b_exp = wpre[:, phys], x.float()[:, phys].T
            report[key] = {"a_nan": int(a.isnan().sum()), "b_nan": int(b.isnan().sum()),
                           "a_rel_vs_expected": rel(a, a_exp), "b_rel_vs_expected": rel(b, b_exp),
                           "a_rel_vs_physical_order": rel(a, wpre), "b_rel_vs_physical_order": rel(b, x.float().T),
                           "c_rel_vs_a_at_b": rel(c, a.float() @ b.float()),
                           "c_rel_vs_reference": rel(c, wpre @ x.float().T)}
            dump[key] = {"a": a.cpu(), "b": b.cpu(), "c": c.cpu(), "wpre": wpre.cpu(), "x": x.cpu(),
                         "weight": q.weight.cpu(), "weight_scale": q.weight_scale.cpu()}
        except Exception:  # noqa: BLE001 — a probe records everything
            report[key] = {"error": traceback.format_exc()[-3000:]}
        print(key, report[key], flush=True)
    for n, k_ in ((128, 256), (4096, 4096)):
        q = to_cuda(quantize(torch.randn(n, k_, device="cuda", generator=g) * 0.02, "nvfp4"))
        wref = dequantize("nvfp4", q.weight, q.weight_scale, q.weight_scale_2)
        for cfg in (CONFIGS[0], CONFIGS[10], CONFIGS[12], CONFIGS[18]):
            for m in (1, 16):
                key = f"full_N{n}_K{k_}_M{m}_" + "_".join(f"{a}{v}" for a, v in cfg.items())
                try:
                    x = torch.randn(m, k_, device="cuda", generator=g).to(torch.bfloat16)
                    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                    launch(x, q.weight, q.weight_scale, q.weight_scale_2, cfg, out=out)
                    torch.cuda.synchronize()
                    ref = x.float() @ wref.T
                    report[key] = {"out_nan": int(out.isnan().sum()), "rel": rel(out.nan_to_num(), ref),
                                   "out_norm": float(out.float().nan_to_num().norm()), "ref_norm": float(ref.norm())}
                except Exception:  # noqa: BLE001
                    report[key] = {"error": traceback.format_exc()[-3000:]}
                print(key, report[key], flush=True)
    json.dump(report, open(f"{out_dir}/gluon_probe.json", "w"), indent=1)
    torch.save(dump, f"{out_dir}/gluon_probe.pt")


_TILED = {}


def launch(x, weight, weight_scale, weight_scale_2, cfg, out=None, pdl=False):
    """y = x @ W.T through triton_gemv.launch_nvfp4_gemv with the Gluon kernel (cfg: BK, BN, NW, SPLIT_K, PIPE,
    TILED, XSMEM)."""
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    bm = gemv.gemv_bucket(x.shape[0])
    if cfg.get("TILED"):  # the tiled copy of this weight (layout.py; made on the eager check / warm-up calls)
        from atlas.plugins_trt.quant_linear.layout import tile_nvfp4
        key = weight.data_ptr()
        if key not in _TILED:
            _TILED[key] = tile_nvfp4(weight, weight_scale)
        weight, weight_scale = _TILED[key]
    return gemv.launch_nvfp4_gemv(x, weight, weight_scale, weight_scale_2, gluon_config(cfg, bm), out=out, pdl=pdl)


def gluon_config(cfg: dict, bucket: int) -> dict:
    return {"BLOCK_M": bucket, "BLOCK_N": cfg["BN"], "BLOCK_K": cfg["BK"], "SPLIT_K": cfg["SPLIT_K"],
            "num_warps": cfg["NW"], "num_stages": 1, "GLUON": True, "PIPE": cfg.get("PIPE", 1),
            **({"TILED": True} if cfg.get("TILED") else {}),
            **({"XSMEM": cfg["XSMEM"]} if cfg.get("XSMEM") else {}),
            **({"UNROLL": cfg["UNROLL"]} if cfg.get("UNROLL", 1) > 1 else {}),
            **({"PRE": cfg["PRE"]} if cfg.get("PRE") else {})}


def sass_report() -> None:
    """Compile every config for sm_90 (no GPU) and print the loop's instruction mix per weight element."""
    import collections
    import re
    import subprocess
    import tempfile

    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    for cfg in [c for c in CONFIGS if c["SPLIT_K"] == 1]:
        for mp in (8, 16):
            spec = gemv.signature_nvfp4_gemv(gluon_config(cfg, mp), 34816, 5120)
            k = gemv.compile_aot(spec)
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
            print(f"BK {cfg['BK']} BN {cfg['BN']} warps {cfg['NW']} PIPE {cfg['PIPE']} MP {mp}: "
                  f"{len(loop) / per:.2f} instructions an "
                  f"element, {usage}, LDS in loop {ops['LDS']}, STS in loop {ops['STS']}, cp.async {ops['LDGSTS']}; "
                  f"{dict(ops.most_common(8))}")


def main(splits: bool = False, tiled: bool = False, unroll: bool = False, pre: bool = False) -> None:
    """Every CONFIGS entry at M 1 / 4 / 16 beside the shipped choice; splits: the M 1 winners' tile (plain and PIPE 2)
    at SPLIT_K 2 to 17, launched with PDL as engines launch them (how the waves fall: 27B gate_up has 544 row tiles of 64, 27B down 80 with 68 blocks of 256 along K, so SPLIT_K 16 leaves two splits
    empty there); tiled: block-contiguous weights and x through shared memory beside the plain form, M 1 to 16;
    unroll: the plain form two blocks a step (UNROLL 2) beside one, and the cp.async form (its weight prologue now
    before the PDL wait), M 1 to 16; pre: weight blocks loaded before the PDL wait (PRE), M 1 to 16."""
    import torch

    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    from atlas.tools.bench.timing import copy_bandwidth, graph_time
    from atlas.tools.dev.variants import check_and_time, error_summary, nvfp4_weight

    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    shipped = {(c["shape"], c["M"]): c["nvfp4"]["config"] for c in
               json.load(open("tools/results/gemm.json"))["cases"]}
    shapes = {"qwen3.5-27b.gate_up": (34816, 5120), "qwen3.5-27b.down": (5120, 17408),
              "llama-3.1-8b.qkv": (6144, 4096), "llama-3.1-8b.gate_up": (28672, 4096)}
    bw = copy_bandwidth()
    res = {"copy_bandwidth": bw, "rows": []}
    for name, (n, k) in shapes.items():
        g, qs, wref, nbytes = nvfp4_weight(n, k)
        for m in (1,) if splits else (1, 4, 8, 16) if tiled or unroll or pre else (1, 4, 16):  # tools/bench_gemm.py: every M
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            ref = x.float() @ wref.T
            row = {"shape": name, "N": n, "K": k, "M": m, "bytes": nbytes + m * k * 2 + m * n * 2}
            cfg0 = shipped.get((name, m))
            if cfg0 is not None:
                row["shipped_us"] = graph_time([lambda qt=qt: gemv.launch_nvfp4_gemv(
                    x, qt.weight, qt.weight_scale, qt.weight_scale_2, cfg0, pdl=splits or tiled or unroll or pre) for qt in qs],
                    repeats=20) * 1e6
            configs = [dict(BK=256, BN=64, NW=4, SPLIT_K=sk, PIPE=p) for p in (1, 2)
                       for sk in (2, 3, 4, 5, 6, 8, 12, 16, 17)] if splits else [
                dict(BK=bk, BN=bn, NW=4, SPLIT_K=sk, PIPE=p, TILED=t, XSMEM=xs)
                for bk, bn, p, t, xs in ((256, 64, 1, False, 0), (256, 64, 1, True, 0), (256, 64, 1, False, 3),
                                         (256, 64, 2, False, 0), (256, 64, 2, True, 0), (256, 128, 1, False, 0),
                                         (256, 128, 1, True, 0), (256, 128, 1, False, 3), (128, 128, 1, False, 0),
                                         (128, 128, 1, True, 0), (128, 128, 1, False, 3))
                for sk in (4, 16)] if tiled else [
                dict(BK=bk, BN=bn, NW=nw, SPLIT_K=sk, PIPE=p, UNROLL=u, TILED=t)
                for bk, bn, nw, p, u, t in (
                    (256, 64, 4, 1, 1, False), (256, 64, 4, 1, 2, False), (256, 64, 4, 1, 2, True),
                    (256, 128, 4, 1, 1, False), (256, 128, 4, 1, 2, False), (128, 128, 4, 1, 1, False),
                    (128, 128, 4, 1, 2, False), (128, 128, 4, 1, 2, True), (128, 64, 4, 3, 1, False),
                    (128, 128, 4, 3, 1, False),
                    # more weight rows a warp, for M 4..16, where each warp's x tile costs as much as 16 rows
                    (128, 256, 4, 1, 1, False), (128, 256, 4, 1, 1, True), (128, 128, 2, 1, 1, True),
                    (128, 256, 4, 1, 2, True))
                for sk in (4, 8)] if unroll else [
                dict(BK=bk, BN=bn, NW=4, SPLIT_K=sk, PIPE=1, PRE=p, TILED=t)
                for bk, bn, sk, p, t in (
                    (256, 64, 4, 0, False), (256, 64, 4, 2, False), (256, 64, 4, 4, False), (256, 64, 4, 4, True),
                    (256, 64, 8, 2, False), (256, 64, 8, 2, True), (256, 64, 16, 0, False), (256, 64, 16, 2, False),
                    (256, 64, 16, 4, False), (256, 64, 16, 4, True), (128, 128, 4, 0, True), (128, 128, 4, 4, True),
                    (128, 128, 8, 4, True), (128, 128, 16, 4, True), (128, 128, 16, 4, False))] if pre else CONFIGS
            row["variants"], best = check_and_time(configs, lambda cfg, qt: launch(
                x, qt.weight, qt.weight_scale, qt.weight_scale_2, cfg, pdl=splits or tiled or unroll or pre), ref, qs)
            row["best"] = best
            errs = error_summary(row["variants"])
            keys = ('BK', 'BN', 'NW', 'SPLIT_K', 'PIPE', 'TILED', 'XSMEM', 'UNROLL', 'PRE')
            frac = row['bytes'] / (best['us'] * 1e-6) / bw if best else 0
            print(f"{name:22s} M={m:2d} shipped {row.get('shipped_us', 0):7.1f} us  gluon best "
                  f"{best['us'] if best else 0:7.1f} us (bw {frac:.2f})"
                  f" {({k: best[k] for k in keys if k in best} if best else '')} rel errors {errs[:4]}", flush=True)
            res["rows"].append(row)
            kind = "splits" if splits else "tiled" if tiled else "unroll" if unroll else "pre" if pre else "gemv"
            json.dump(res, open(f"{out_dir}/nvfp4_gluon_{kind}.json", "w"), indent=1)


if __name__ == "__main__":
    sass_report() if "--sass" in sys.argv else probe() if "--probe" in sys.argv else main(
        "--splits" in sys.argv, "--tiled" in sys.argv, "--unroll" in sys.argv, "--pre" in sys.argv)
