"""Experiment helper (GPU box): a warp-specialized NVFP4 wgmma GEMM beside the shipped one at M 256 (the nvfp4_m256
goal), on the benchmark's six shapes, tiled + BITS weights as GPU engines run them.

The kernel and its design: plugins_trt/quant_linear/gluon_ws.py. Here: its variants, their sm_90 compile (resources,
the PTX facts its barrier counts rely on), a check on small shapes, and the sweep beside the shipped wgmma config and
cuBLAS BF16.

    python -m atlas.tools.dev.nvfp4_wgmma_ws [--m 256] [--shapes a,b] [--only i,j]   # $OUT/nvfp4_wgmma_ws.json
    python -m atlas.tools.dev.nvfp4_wgmma_ws --sass    # compile for sm_90 here; resources
    python -m atlas.tools.dev.nvfp4_wgmma_ws --check [--only i,j]   # small shapes against the reference

--only i,j: only those indices of configs() (beside the shipped and plain configs).
"""
from __future__ import annotations

import os
import sys

from atlas.plugins_trt.quant_linear import gluon_gemm as gm
from atlas.plugins_trt.quant_linear import triton_gemm as GM
from atlas.plugins_trt.quant_linear import gluon_ws as W


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
    out = [{"WS": True, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": st, "num_warps": w, "num_stages": 1,
            "SPLIT_K": sp, "TILED": True, "BITS": True, "DW": dw, **regs} for bm, bn, bk, st, w, sp, dw, regs in plan]
    nat = [{**out[i], "NAT": True} for i in (0, 1, 4)] + [{**out[7], "NAT": True}]  # natural k order (no permute_k
    # launch); the last one with eight decoder warps (BLOCK_N >= 128)
    rs = [{"WS": True, "RS": True, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": st, "num_warps": w,
           "num_stages": 1, "SPLIT_K": 1, "TILED": True, "BITS": True, "DW": 4, "DREGS": dr}
          for bm, bn, bk, st, w, dr in [(128, 128, 128, 4, 8, 64), (256, 64, 64, 4, 4, 64), (128, 128, 64, 5, 8, 64),
                                        (256, 128, 64, 4, 8, 64), (64, 64, 128, 3, 4, 64), (128, 64, 64, 4, 4, 64)]]
    ks = [{**rs[i], "KS": 2, "STAGES": st, "KREGS": kr, "DREGS": dr} for i, st, kr, dr in
          [(1, 4, 224, 56), (5, 4, 224, 56), (1, 3, 224, 56)]]
    ks += [{**ks[0], "SPLIT_K": 2}, {**ks[1], "SPLIT_K": 2}]
    pp = [{**ks[0], "PP": True}, {**ks[1], "PP": True}, {**ks[0], "PP": True, "STAGES": 3},
          {**ks[0], "PP": True, "SPLIT_K": 2}]
    xp = [{**rs[0], "XP": True, "DREGS": 96}, {**rs[1], "XP": True, "DREGS": 152},
          {**rs[3], "XP": True, "DREGS": 152}, {**pp[0], "XP": True, "DREGS": 152, "KREGS": 176}]
    sk = [{**rs[0], "SK": 132, "DP": dp, "DREGS": 72} for dp in (0, 1)] + [{**rs[3], "SK": 132, "DP": 1},
                                                                           {**rs[1], "SK": 132, "DP": 1}]
    # Indices: 0-9 decoder partition (SS wgmma), 10-13 NAT; 14-19 RS (the consumers decode into the register A
    # operand, four loader warps copy packed blocks); 20-24 KS 2 (two one-warpgroup consumers on the even and odd
    # blocks of a 64-row tile; 23, 24 also SPLIT_K 2); 25-28 KS 2 with PP (each consumer waits for its own wgmma:
    # one slot held, not two); 29 RS SPLIT_K 2; 30-33 XP (x permuted by the loader's 4-byte copies, no permute_k
    # launch; the loader needs 96-152 registers, 64 spill); 34, 35 KS 2 at 128 x 64 with six slots, without and with
    # PP; 36-39 RS on the persistent stream-K grid (132 programs: an H100 / H200's SMs; DP: sk_dp_tiles' mode);
    # 40-42 TA (every consumer thread releases its slots itself: no partition barrier before the release) on RS
    # 128 x 128 x 128, RS-SK 128 x 128 x 128 and RS 256 x 128 x 64; 43-46 the RS build candidates
    # (triton_gemm.CONFIGS_nvfp4_ws_rs), 47-50 the same with PDL (launched as programmatic dependents of permute_k,
    # their first weight blocks copied before the wait for it); 51-53 RS + TA + PDL with a 128-register cap, two CTAs
    # an SM (128 x 64 x 64 S4: 75 KB, 128 x 64 x 128 S3: 112 KB, 64 x 64 x 128 S4: 84 KB; sm_90 compile, no spills).
    ta = [{**rs[0], "TA": True}, {**sk[1], "TA": True}, {**rs[3], "TA": True}]
    cand = [{**c, "TILED": True, "BITS": True} for c in GM.CONFIGS_nvfp4_ws_rs[:4]]
    return (out + nat + rs + ks + pp + [{**rs[0], "SPLIT_K": 2}] + xp
            + [{**ks[1], "STAGES": 6}, {**ks[1], "STAGES": 6, "PP": True}] + sk + ta
            + cand + [{**c, "PDL": True} for c in cand]
            + [{**cand[0], "PDL": True, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "STAGES": st, "num_warps": 4,
                "MAXNREG": 128} for bm, bn, bk, st in ((128, 64, 64, 4), (128, 64, 128, 3), (64, 64, 128, 4))])


def compile_sm90(config: dict):
    """The kernel compiled for sm_90 here (no GPU needed): triton's CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = W.nvfp4_gemm_rs_sk_kernel if "SK" in config else W.nvfp4_gemm_ws_kernel
    types = {"x_ptr": "*bf16", "w_ptr": "*u8", "ws_ptr": "*fp8e4nv", "ws2_ptr": "*fp32", "bias_ptr": "*bf16",
             "res_ptr": "*bf16", "out_ptr": "*bf16" if config.get("SPLIT_K", 1) == 1 else "*fp32", "part_ptr": "*fp32"}
    cx = W.rs_sk_constexprs(config) if "SK" in config else W.ws_constexprs(config)
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


def k_loop(sass: str) -> tuple[int, int]:
    """(instructions, HGMMAs) of the shortest loop of a kernel's sm_90 SASS that issues wgmma: the K loop of the
    partition that multiplies."""
    import re

    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4})\*/\s+(.*?)\s*;", sass)]
    loops = [[b for a, b in ins if int(t, 16) <= a <= end] for end, line in ins
             for t in re.findall(r"BRA (0x[0-9a-f]+)", line) if int(t, 16) < end]
    body = min((lp for lp in loops if any("HGMMA" in b for b in lp)), key=len, default=[])
    return len(body), sum("HGMMA" in b for b in body)


def sass_report() -> None:
    """Each config's resources and K loop for sm_90 (no GPU needed), after the shipped wgmma kernel's 128 x 128 x 128
    tile for reference (`> tools/results/nvfp4_wgmma_ws_sass.txt`)."""
    import subprocess
    import tempfile

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")

    def dump(c, *flags):
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(c.asm["cubin"])
            f.flush()
            return subprocess.run([tool, *flags, f.name], capture_output=True, text=True).stdout

    from atlas.tools.dev.nvfp4_wgmma_gemm import compile_wgmma_sm90

    shipped = {"WGMMA": True, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "STAGES": 4, "num_warps": 8,
               "num_stages": 1, "W_SMEM": True, "TILED": True, "BITS": True}
    n, h = k_loop(dump(compile_wgmma_sm90(shipped), "-sass"))
    print(f"shipped wgmma 128x128x128 S4 w8 W_SMEM: K loop {n} instructions, {h} HGMMA")
    for cfg in configs():
        try:
            c = compile_sm90(cfg)
        except Exception as e:  # noqa: BLE001 — report and go on
            print(f"{cfg}: compile failed: {type(e).__name__}: {str(e)[:2000]}")
            continue
        res = dump(c, "--dump-resource-usage")
        usage = " ".join(w for line in res.splitlines() if "REG:" in line for w in line.split()
                         if w.startswith(("REG:", "STACK:", "LOCAL:")))
        n, h = k_loop(dump(c, "-sass"))
        print(f"{cfg}: {usage}, shared {c.metadata.shared} B, K loop {n} instructions, {h} HGMMA")


def picked_configs() -> list[dict]:
    """configs(), or those of `--only i,j` (indices into configs())."""
    picked = [int(i) for i in sys.argv[sys.argv.index("--only") + 1].split(",")] if "--only" in sys.argv else None
    if picked is not None and not set(picked) <= set(range(len(configs()))):
        raise SystemExit(f"--only: indices of configs() are 0..{len(configs()) - 1}, got {picked}")
    return [c for i, c in enumerate(configs()) if picked is None or i in picked]


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
            for cfg in picked_configs():
                y1 = GM.launch_nvfp4_gemm(x, w, ws, ws2, cfg)  # the dispatcher: RS-SK with "SK", else WS
                y2 = GM.launch_nvfp4_gemm(x, w, ws, ws2, cfg)
                torch.cuda.synchronize()
                err, same = rel(y1, ref), bool(torch.equal(y1, y2))
                ok &= err < 1e-2 and same
                print(f"check N {n} K {k} M {m} {cfg}: err {err:.5f} det {same}", flush=True)
    return ok


def main() -> None:
    from atlas.tools.dev.variants import nvfp4_gemm_sweep

    ws = picked_configs()
    plain = {"WGMMA": True, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "STAGES": 3, "num_warps": 4,
             "num_stages": 1, "W_SMEM": True, "TILED": True, "BITS": True}

    def variants_for(name, m, case):
        cfgs = []
        if case is not None:  # whichever way gemm.json shipped (the dispatcher launches any)
            cfgs.append(("shipped", GM.launch_nvfp4_gemm, case["nvfp4"]["config"]))
        return cfgs + [("plain", gm.launch_nvfp4_gemm_wgmma, plain)] + [("ws", GM.launch_nvfp4_gemm, c) for c in ws]

    def tag(kind, cfg):
        form = "".join(f" {f}" for f in ("RS", "NAT") if cfg.get(f)) + (f" dw{cfg['DW']}" if "DW" in cfg else "") \
            + (f" ks{cfg['KS']}" if "KS" in cfg else "") + (" pp" if cfg.get("PP") else "") \
            + (" xp" if cfg.get("XP") else "") + (f" sk{cfg['SK']} dp{cfg['DP']}" if "SK" in cfg else "") \
            + (" ta" if cfg.get("TA") else "") + (" pdl" if cfg.get("PDL") else "")
        return (f"{kind}{form} {cfg['BLOCK_M']}x{cfg['BLOCK_N']}x{cfg['BLOCK_K']} S{cfg['STAGES']} "
                f"w{cfg['num_warps']} sk{cfg.get('SPLIT_K', 1)}")

    nvfp4_gemm_sweep("nvfp4_wgmma_ws.json", variants_for, tag)


if __name__ == "__main__":
    if "--sass" in sys.argv:
        sass_report()
    elif "--check" in sys.argv:
        raise SystemExit(0 if check() else 1)
    else:
        main()
