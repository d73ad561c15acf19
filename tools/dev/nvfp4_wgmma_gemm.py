"""Experiment helper: check and time the Gluon wgmma NVFP4 GEMM (plugins_trt/quant_linear/gluon_gemm.py) on the GPU
beside the shipped NVFP4 GEMM and cuBLAS BF16, or print its sm_90 resources and wgmma hazards (no GPU needed).

    python -m atlas.tools.dev.nvfp4_wgmma_gemm          # GPU box: $OUT/nvfp4_wgmma_gemm.json
    python -m atlas.tools.dev.nvfp4_wgmma_gemm --sass   # CPU: registers, spills, HGMMA count, in-flight A overwrites
    [--w-smem]: only the configs with the weights through the shared-memory ring
    [--m256]: M 256 only, on the benchmark's six shapes (the nvfp4_m256 goal)
"""
from __future__ import annotations

import json
import os
import sys

def _configs() -> list[dict]:
    """The shipped wgmma configs (weights through the shared-memory ring, W_SMEM), then each with its weights
    prefetched into registers instead; --w-smem: the shipped ones only."""
    from atlas.plugins_trt.quant_linear.triton_gemm import CONFIGS_nvfp4_wgmma
    smem = [{**c, "W_SMEM": True} for c in CONFIGS_nvfp4_wgmma]
    return smem if "--w-smem" in sys.argv else smem + [{**c, "W_SMEM": False} for c in smem]


def a_register_hazards(sass: str) -> list[str]:
    """Instructions of the K loop (walked twice, for the back-edge) that write a register an HGMMA still in flight
    reads as its A fragment (4 registers from the one it names). A group of HGMMA ends with the one marked gsb0;
    `WARPGROUP.DEPBAR.LE gsb0, n` leaves the n newest groups in flight."""
    import re

    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4})\*/\s+(.*?)\s*;", sass)]
    back = [(a, int(t, 16)) for a, b in ins for t in re.findall(r"BRA (0x[0-9a-f]+)", b) if int(t, 16) < a]
    loops = [(a, t) for a, t in back if any(t <= x <= a and "HGMMA" in b for x, b in ins)]
    if not loops:
        return ["no K loop with wgmma"]
    end, top = max(loops, key=lambda x: x[0] - x[1])
    body = [(a, b) for a, b in ins if top <= a <= end]
    flight, current, found = [], set(), []
    for lap in range(2):
        for addr, text in body:
            t = re.sub(r"^@!?U?P\w+\s+", "", text)
            op = t.split()[0]
            if op.startswith("HGMMA"):
                m = re.match(r"HGMMA\S*\s+R\d+, R(\d+),", t)
                if m:
                    current |= {int(m.group(1)) + i for i in range(4)}
                if "gsb0" in t:
                    flight.append(current)
                    current = set()
                continue
            m = re.match(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)", t)
            if m:
                keep = int(m.group(1), 16)
                flight = flight[len(flight) - keep:] if keep else []
                continue
            if op.startswith(("ST", "BAR", "BRA", "WARPGROUP", "DEPBAR", "LDGSTS", "RED", "ATOM", "EXIT", "NOP")):
                continue
            m = re.match(r"\S+\s+R(\d+)\b", t)
            if not m:
                continue
            width = 4 if ".128" in op else 2 if ".64" in op else 1
            dst = {int(m.group(1)) + i for i in range(width)}
            if any(dst & g for g in flight):
                found.append(f"lap {lap} 0x{addr:04x} {t}")
    return found


def compile_wgmma_sm90(cfg: dict):
    """gluon_gemm.nvfp4_gemm_wgmma_kernel compiled for sm_90 here (no GPU needed): triton's CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from atlas.plugins_trt.quant_linear import gluon_gemm as gm

    fn = gm.nvfp4_gemm_wgmma_kernel
    types = {"x_ptr": "*bf16", "w_ptr": "*u8", "ws_ptr": "*fp8e4nv", "ws2_ptr": "*fp32", "bias_ptr": "*bf16",
             "res_ptr": "*bf16", "out_ptr": "*bf16"}
    aligned = ("N", "K", "stride_xm", "stride_wn", "stride_sn", "stride_rm", "stride_om")
    cx = gm.wgmma_constexprs(cfg, False, False)
    sig = {n: ("constexpr" if n in cx else types.get(n, "i32")) for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*") or n in aligned}
    return triton.compile(GluonASTSource(fn=fn, signature=sig, constexprs=cx, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg["num_warps"]})


def sass_report() -> None:
    """Compile every config for sm_90 and report resources and whether an in-flight wgmma's A registers get
    overwritten before the next wait (tools/dev/swap_ab_sass.analyse)."""
    import subprocess
    import tempfile

    import triton

    from atlas.tools.dev.swap_ab_sass import analyse

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    for cfg in _configs():
        c = compile_wgmma_sm90(cfg)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(c.asm["cubin"])
            f.flush()
            sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
            res = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        usage = " ".join(w for line in res.splitlines() if "REG:" in line for w in line.split()
                         if w.startswith(("REG:", "STACK:", "LOCAL:")))
        hz = a_register_hazards(sass)
        print(f"{cfg}: {usage}, shared {c.metadata.shared} B, HGMMA {sass.count('HGMMA')}; {analyse(sass)}; "
              f"A registers written while their wgmma is in flight: {len(hz)} {hz[:2]}")


def main() -> None:
    import torch

    from atlas.plugins_trt.quant_linear import gluon_gemm as gm
    from atlas.tools.bench.timing import graph_time
    from atlas.tools.dev.variants import check_and_time, error_summary, nvfp4_weight

    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    shipped = {(c["shape"], c["M"]): c for c in json.load(open("tools/results/gemm.json"))["cases"]}
    shapes = {"qwen3.5-27b.gate_up": (34816, 5120), "qwen3.5-27b.down": (5120, 17408),
              "llama-3.1-8b.gate_up": (28672, 4096), "llama-3.1-8b.down": (4096, 14336)}
    ms = (64, 256, 2048)
    if "--m256" in sys.argv:  # the benchmark's M = 256 goal, every shape of tools/bench_gemm.py
        shapes = {**shapes, "llama-3.1-8b.qkv": (6144, 4096), "llama-3.1-8b.lm_head": (128256, 4096)}
        ms = (256,)
    res = {"rows": []}
    for name, (n, k) in shapes.items():
        g, qs, wref, _ = nvfp4_weight(n, k)
        wbf = wref.to(torch.bfloat16)
        for m in ms:
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            ref = x.float() @ wref.T
            row = {"shape": name, "N": n, "K": k, "M": m,
                   "cublas_us": graph_time([lambda: x @ wbf.T], repeats=20) * 1e6}
            c0 = shipped.get((name, m))
            if c0 is not None:
                row["shipped_us"] = c0["nvfp4"]["seconds"] * 1e6
                row["shipped_cublas_us"] = c0["cublas_bf16"]["seconds"] * 1e6
            xp = torch.empty_like(x)
            row["variants"], best = check_and_time(_configs(), lambda cfg, qt: gm.launch_nvfp4_gemm_wgmma(
                x, qt.weight, qt.weight_scale, qt.weight_scale_2, cfg, x_perm=xp), ref, qs)
            row["best"] = best
            errs = error_summary(row["variants"])
            print(f"{name:22s} M={m:5d} cublas {row['cublas_us']:8.1f} us  shipped {row.get('shipped_us', 0):8.1f} us"
                  f"  wgmma best {best['us'] if best else 0:8.1f} us "
                  f"{({k: best[k] for k in ('BLOCK_M', 'BLOCK_N', 'BLOCK_K', 'STAGES', 'num_warps', 'W_SMEM', 'SPLIT_K') if k in best} if best else '')}"
                  f" rel errors {errs[:4]}", flush=True)
            res["rows"].append(row)
            json.dump(res, open(f"{out_dir}/nvfp4_wgmma_gemm.json", "w"), indent=1)


if __name__ == "__main__":
    sass_report() if "--sass" in sys.argv else main()
