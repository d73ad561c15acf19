"""Experiment helper (GPU box): PRE on the FP8 GEMV (triton_gemv.fp8_gemv_kernel): the split's first one or two
weight blocks loaded before the PDL wait, their dots after it, as the NVFP4 Gluon GEMV's PRE does. Timed in the
benchmark's PDL chain over rotated weight copies, beside the config gemm.json shipped (same run), on the six
benchmark shapes at M 1, 2, 8, 16. Every config is checked against the fp32 reference first.

    python -m atlas.tools.dev.fp8_pre      # $OUT/fp8_pre.json
"""
from __future__ import annotations

import json

SHAPES = {"llama-3.1-8b.qkv": (6144, 4096), "llama-3.1-8b.down": (4096, 14336),
          "qwen3.5-27b.down": (5120, 17408), "llama-3.1-8b.gate_up": (28672, 4096),
          "qwen3.5-27b.gate_up": (34816, 5120), "llama-3.1-8b.lm_head": (128256, 4096)}
EXTRA = {  # (BLOCK_N, BLOCK_K, num_warps, num_stages, SPLIT_K, TC) tried with PRE 0 / 1 / 2 beside the shipped one
    1: [(32, 256, 4, 1, 4, False), (32, 256, 4, 1, 8, False), (64, 256, 4, 1, 8, False)],
    2: [(128, 128, 4, 3, 4, True), (128, 128, 4, 3, 8, True), (64, 128, 4, 3, 8, True)]}


def configs(shipped: dict, m: int) -> list[tuple[str, dict]]:
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv

    bm = gemv.gemv_bucket(m)
    out = [("shipped", shipped)] + [(f"shipped pre{p}", {**shipped, "PRE": p}) for p in (1, 2)]
    for bn, bk, w, st, split, tc in EXTRA[1 if bm == 1 else 2]:
        c = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "num_warps": w, "num_stages": st,
             "TC": tc}
        if all(shipped.get(key) == v for key, v in c.items()):
            continue  # the shipped one, done above
        out += [(f"{bn}x{bk} s{split} pre{p}", {**c, **({"PRE": p} if p else {})}) for p in (0, 2)]
    return out


def main() -> None:
    import torch

    from atlas.build_engine.quantize.quantizer import quantize
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    from atlas.plugins_trt.quant_linear.reference import dequantize
    from atlas.tools.bench.timing import copies_for
    from atlas.tools.bench_gemm import to_cuda
    from atlas.tools.dev.variants import labelled_row, sweep_start

    out_dir, shipped, bw, res = sweep_start("fp8")
    for name, (n, k) in SHAPES.items():
        g = torch.Generator(device="cuda").manual_seed(n + k)
        q = to_cuda(quantize(torch.randn(n, k, device="cuda", generator=g) * 0.02, "fp8"))
        ref_w = dequantize("fp8", q.weight, q.weight_scale)
        nbytes = n * k + n * 4
        copies = [q] + [to_cuda(q) for _ in range(copies_for(nbytes) - 1)]
        for m in (1, 2, 8, 16):
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            res["rows"].append(labelled_row(
                name, n, k, m, nbytes + m * k * 2 + m * n * 2, configs(shipped[(name, m)], m),
                lambda cfg, qt: gemv.launch_fp8_gemv(x, qt.weight, qt.weight_scale, cfg, pdl=True),
                x.float() @ ref_w.T, copies, bw))
            json.dump(res, open(f"{out_dir}/fp8_pre.json", "w"), indent=1)
        del copies, ref_w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
