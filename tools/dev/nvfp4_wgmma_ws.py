"""Experiment helper (GPU box): a warp-specialized NVFP4 wgmma GEMM beside the shipped one at M 256 (the nvfp4_m256
goal), on the benchmark's six shapes, tiled + BITS weights as GPU engines run them.

The kernel and its design: plugins_trt/quant_linear/gluon_ws.py. Here: its variants, their sm_90 compile (resources,
the PTX facts its barrier counts rely on), a check on small shapes, and the sweep beside the shipped wgmma config and
cuBLAS BF16.

    python -m atlas.tools.dev.nvfp4_wgmma_ws [--m 256] [--shapes a,b]   # $OUT/nvfp4_wgmma_ws.json
    python -m atlas.tools.dev.nvfp4_wgmma_ws --sass                     # compile for sm_90 here; resources
    python -m atlas.tools.dev.nvfp4_wgmma_ws --check                    # small shapes against the reference
"""
from __future__ import annotations

import json
import os
import sys

from atlas.plugins_trt.quant_linear import gluon_gemm as gm
from atlas.plugins_trt.quant_linear.gluon_ws import launch_nvfp4_gemm_ws as launch
from atlas.plugins_trt.quant_linear.gluon_ws import nvfp4_gemm_ws_kernel
from atlas.plugins_trt.quant_linear.gluon_ws import ws_constexprs as constexprs


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
    nat = [{**out[i], "NAT": True} for i in (0, 1, 4)]  # natural k order: no permute_k launch
    return out + nat + [{**out[7], "NAT": True}]  # and with eight decoder warps (BLOCK_N >= 128)


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
            only = [int(i) for i in sys.argv[sys.argv.index("--only") + 1].split(",")] if "--only" in sys.argv else None
            cfgs += [("ws", launch, c) for i, c in enumerate(configs()) if only is None or i in only]
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
