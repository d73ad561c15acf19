"""Experiment helper (GPU box): at M 32 (decode's batch-32 bucket), the shipped M-64 NVFP4 GEMM against the shipped
M-16 GEMV launched over the rows 16 at a time.

    python -m atlas.tools.dev.nvfp4_m32_rows   # $OUT/nvfp4_m32_rows.json

Why: the 8B nvfp4 decode step at batch 32 (9.09 ms, H100) is slower than the bf16 engine's (7.53 ms): its M-64 bucket
GEMMs decode every weight once whatever M is and run far from their bytes (gate_up 103.8 us a launch against ~19 us;
tools/results/decode_h100.json, profile_b32), while the M-16 GEMVs of the same shapes take 36.4 us (gemm_h100.json),
so ceil(M / 16) of them might win up to M 32 or 48. Each case: both forms checked against the fp32 reference, then
timed as CUDA-graph replays over rotated tiled (BITS) weight copies (variants.check_and_time), the GEMVs with PDL as
engines launch them; the
shipped configs are the benchmark's (variants.shipped_results: gemm_h100.json on an H100, gemm.json on an H200).
"""
from __future__ import annotations

MS = (24, 32, 48, 64)
"""64: the bucket the GEMM is tuned at (gemm_h100.json times it there), beside the M 32 that decode runs in it."""


def main() -> None:
    import json

    import torch

    from atlas.plugins_trt.quant_linear import triton_gemm as gemm
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    from atlas.tools.dev.nvfp4_streamk import SHAPES
    from atlas.tools.dev.variants import check_and_time, nvfp4_tiled_copies, sweep_start

    out_dir, shipped, bw, res = sweep_start("nvfp4")
    for name, (n, k) in SHAPES.items():
        if "lm_head" in name:  # the step's LM head is cuBLAS's in every engine
            continue
        g, copies, ref_w, nbytes = nvfp4_tiled_copies(n, k)
        gemm_cfg, gemv_cfg = shipped[(name, 64)], shipped[(name, 16)]
        for m in MS:
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            # an output each, NaN until written: a row either form leaves unwritten fails its error check
            outs = [torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(2)]

            def run(cfg, qt, x=x, outs=outs, m=m):
                if cfg is gemm_cfg:
                    return gemm.launch_nvfp4_gemm(x, *qt, cfg, out=outs[0])
                for i in range(0, m, 16):  # the GEMV over the rows, 16 at a time
                    gemv.launch_nvfp4_gemv(x[i:i + 16], *qt, cfg, out=outs[1][i:i + 16], pdl=True)
                return outs[1]

            (as_gemm, as_gemvs), _ = check_and_time([gemm_cfg, gemv_cfg], run, x.float() @ ref_w.T, copies)
            row = {"shape": name, "N": n, "K": k, "M": m, "bytes": nbytes + m * k * 2 + m * n * 2, "gemm": as_gemm,
                   "gemvs": as_gemvs}
            res["rows"].append(row)
            print(f"{name:22s} M={m:2d} gemm (M 64 bucket) {as_gemm.get('us', 0):7.1f} us, {-(-m // 16)} x M-16 GEMV "
                  f"{as_gemvs.get('us', 0):7.1f} us; errors {as_gemm.get('rel_error', '-')}, "
                  f"{as_gemvs.get('rel_error', '-')} {as_gemm.get('error', '')}{as_gemvs.get('error', '')}", flush=True)
            json.dump(res, open(f"{out_dir}/nvfp4_m32_rows.json", "w"), indent=1)
        del copies, ref_w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
