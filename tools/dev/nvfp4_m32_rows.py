"""Experiment helper (GPU box): at M 32 (decode's batch-32 bucket), the shipped M-64 NVFP4 GEMM against the shipped
M-16 GEMV launched over the rows 16 at a time.

    python -m atlas.tools.dev.nvfp4_m32_rows   # $OUT/nvfp4_m32_rows.json

Why: the 8B nvfp4 decode step at batch 32 (9.09 ms, H100) is slower than the bf16 engine's (7.53 ms): its M-64 bucket
GEMMs decode every weight once whatever M is and run far from their bytes (gate_up 103.8 us a launch against ~19 us;
tools/results/decode_h100.json, profile_b32), while the M-16 GEMVs of the same shapes take 36.4 us (gemm_h100.json),
so ceil(M / 16) of them might win up to M 32 or 48. Each case: both forms checked against the fp32 reference, then
timed as CUDA-graph replays over rotated tiled (BITS) weight copies, the GEMVs with PDL as engines launch them; the
shipped configs are the benchmark's (variants.shipped_results: gemm_h100.json on an H100, gemm.json on an H200).
"""
from __future__ import annotations

MS = (24, 32, 48)


def main() -> None:
    import json

    import torch

    from atlas.plugins_trt.quant_linear import triton_gemm as gemm
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    from atlas.tools.bench.timing import graph_time
    from atlas.tools.bench_gemm import rel
    from atlas.tools.dev.nvfp4_streamk import SHAPES
    from atlas.tools.dev.variants import nvfp4_tiled_copies, sweep_start

    out_dir, shipped, bw, res = sweep_start("nvfp4")
    for name, (n, k) in SHAPES.items():
        if "lm_head" in name:  # the step's LM head is cuBLAS's in every engine
            continue
        g, copies, ref_w, nbytes = nvfp4_tiled_copies(n, k)
        gemm_cfg, gemv_cfg = shipped[(name, 64)], shipped[(name, 16)]
        for m in MS:
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            ref = x.float() @ ref_w.T

            def as_gemm(qt, x=x, out=out):
                return gemm.launch_nvfp4_gemm(x, *qt, gemm_cfg, out=out)

            def as_gemvs(qt, x=x, out=out, m=m):
                for i in range(0, m, 16):
                    gemv.launch_nvfp4_gemv(x[i:i + 16], *qt, gemv_cfg, out=out[i:i + 16], pdl=True)
                return out

            row = {"shape": name, "N": n, "K": k, "M": m, "bytes": nbytes + m * k * 2 + m * n * 2,
                   "gemm_config": gemm_cfg, "gemv_config": gemv_cfg}
            for label, run in (("gemm", as_gemm), ("gemvs", as_gemvs)):
                try:
                    out.fill_(float("nan"))
                    row[label + "_rel_error"] = rel(run(copies[0]), ref)
                    if row[label + "_rel_error"] < 1e-2:
                        row[label + "_us"] = graph_time([lambda qt=qt, run=run: run(qt) for qt in copies],
                                                        repeats=20) * 1e6
                except Exception as e:  # noqa: BLE001 — record and go on
                    row[label + "_error"] = f"{type(e).__name__}: {e}"[:300]
            res["rows"].append(row)
            print(f"{name:22s} M={m:2d} gemm (M 64 bucket) {row.get('gemm_us', 0):7.1f} us, "
                  f"{-(-m // 16)} x M-16 GEMV {row.get('gemvs_us', 0):7.1f} us; errors "
                  f"{row.get('gemm_rel_error', '-')}, {row.get('gemvs_rel_error', '-')} "
                  f"{row.get('gemm_error', '')}{row.get('gemvs_error', '')}", flush=True)
            json.dump(res, open(f"{out_dir}/nvfp4_m32_rows.json", "w"), indent=1)
        del copies, ref_w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
