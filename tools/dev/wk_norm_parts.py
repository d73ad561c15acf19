"""Experiment helper (GPU box): where the fused-norm WK GEMV's time goes, on the 8B's residual projections at M 1.

    python -m atlas.tools.dev.wk_norm_parts   # $OUT/wk_norm_parts.json

Why: in the 8B nvfp4 decode step the o_proj and down GEMVs with the decoder's add + RMSNorm fused in
(gluon_gemv.nvfp4_gemv_wk_norm_kernel) ran 13.1 us a launch on the H100, 26.2 us a layer against ~14 us of bytes at
the copy bandwidth (tools/results/decode_h100.json's profile), and the look-ahead forms (LA 1 / 2) did not change
that (the search kept neither for these shapes). Three timings a config split it: the plain WK GEMV (no norm), the
same with the norm (the tail: a counter, then the last program normalizes the row), and a read-only kernel over
the same bytes (tools/bench/read.py: what the bytes cost alone), every one chained with PDL in CUDA-graph replays
over rotated weight copies, as engines launch them (variants.check_and_time: each output checked against the fp32
reference first). The configs are the build's WK candidates at M 1 (build_engine/linear_kernels.wk_candidates).
"""
from __future__ import annotations

SHAPES = {"llama-3.1-8b.o_proj": (4096, 4096), "llama-3.1-8b.down": (4096, 14336)}


def main() -> None:
    import json

    import torch

    from atlas.build_engine.linear_kernels import wk_candidates
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    from atlas.tools.bench.read import read_ceiling
    from atlas.tools.dev.variants import check_and_time, nvfp4_tiled_copies, sweep_start

    out_dir, _, bw, res = sweep_start("nvfp4")
    eps = 1e-5
    for name, (n, k) in SHAPES.items():
        g, copies, ref_w, nbytes = nvfp4_tiled_copies(n, k)
        x = torch.randn(1, k, device="cuda", generator=g).to(torch.bfloat16)
        weight = (torch.rand(n, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
        start = torch.randn(1, n, device="cuda", generator=g).to(torch.bfloat16)
        y = x.float() @ ref_w.T
        h = start.float() + y
        want = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
        total = nbytes + k * 2 + n * 2 * 3  # weights, x; the norm's residual read and write and its output
        row = {"shape": name, "N": n, "K": k, "bytes": total, "read_ceiling": read_ceiling(total, bw)}
        residual = start.clone()  # the norm form's residual stream: it grows by x W^T each replay, as in a step

        def plain(cfg, qt):
            return gemv.launch_nvfp4_gemv(x, *qt, cfg, pdl=True)

        def normed(cfg, qt):
            return gemv.launch_nvfp4_gemv(x, *qt, cfg, pdl=True, norm=(residual, weight, eps, 0.0))

        configs = wk_candidates(1, n, k)
        row["plain"], _ = check_and_time(configs, plain, y, copies)
        row["norm"] = []
        for cfg in configs:  # one at a time: the error check needs the residual at its start
            residual.copy_(start)
            row["norm"] += check_and_time([cfg], normed, want, copies)[0]
        for p, q in zip(row["plain"], row["norm"]):
            c = {key: p[key] for key in ("BLOCK_K", "num_warps", "WK", "PRE", "LA") if key in p}
            frac = [total / (r["us"] * 1e-6) / bw if "us" in r else 0.0 for r in (p, q)]
            print(f"{name:20s} {c} plain {p.get('us', 0):6.2f} us ({frac[0]:.2f}), with norm {q.get('us', 0):6.2f} "
                  f"us ({frac[1]:.2f}); read ceiling {row['read_ceiling']:.2f}; errors {p.get('rel_error', '-')}, "
                  f"{q.get('rel_error', '-')} {p.get('error', '')}{q.get('error', '')}", flush=True)
        res["rows"].append(row)
        json.dump(res, open(f"{out_dir}/wk_norm_parts.json", "w"), indent=1)
        del copies, ref_w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
