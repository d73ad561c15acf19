"""Experiment helper (GPU box), a bound, not a kernel: how fast would the split Gluon NVFP4 GEMV be if all of its
work (x, decode, mma) ran before the PDL wait and only the store after it? The WAIT_LATE probe (gluon_gemv) reads x
without waiting, which is right here only because the benchmark chain never rewrites x. Timed beside the config
gemm.json shipped, in the same PDL chain over rotated BITS weight copies, for the shipped Gluon config and SPLIT_K 1
(no reduction launch) forms.

    python -m atlas.tools.dev.nvfp4_waitlate      # $OUT/nvfp4_waitlate.json

If the probe is much faster than the shipped config, the per-kernel cost is the post-wait critical path (x, decode,
mma, the reduction launch); if not, the GEMV's own instruction throughput is. A bound only: in the probe a kernel's
whole work overlaps the kernels before it, which a real layer (x the previous layer's output) cannot do.
"""
from __future__ import annotations

import json

from atlas.tools.dev.nvfp4_streamk import SHAPES

GLUON = {"num_warps": 4, "num_stages": 1, "GLUON": True, "PIPE": 1, "TILED": True, "BITS": True}
EXTRA = {  # (BLOCK_N, BLOCK_K, SPLIT_K, PRE) probed beside the shipped config, by bucket
    1: [(64, 256, 4, 4), (64, 256, 1, 0), (128, 128, 8, 4), (64, 128, 16, 0)],
    16: [(128, 128, 8, 4), (128, 128, 8, 0), (128, 256, 1, 0)]}


def configs(shipped: dict, m: int, n: int, k: int) -> list[tuple[str, dict]]:
    """(label, config): the shipped config (and its probe, where it is a Gluon split GEMV), then EXTRA's pairs."""
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv

    bm = gemv.gemv_bucket(m)
    out = [("shipped", shipped)]
    if shipped.get("GLUON") and not shipped.get("XSMEM") and shipped.get("PIPE", 1) == 1:
        out.append(("shipped late", {**shipped, "WAIT_LATE": True}))
    for bn, bk, split, pre in EXTRA[1 if bm <= 8 else 16]:
        if n % bn or k % bk:
            continue
        c = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, **GLUON, **({"PRE": pre} if pre else {})}
        out += [(f"{bn}x{bk} s{split} pre{pre}", c), (f"{bn}x{bk} s{split} pre{pre} late", {**c, "WAIT_LATE": True})]
    return out


def main() -> None:
    import torch

    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    from atlas.tools.dev.variants import labelled_row, nvfp4_tiled_copies, sweep_start

    out_dir, shipped, bw, res = sweep_start("nvfp4")
    for name, (n, k) in SHAPES.items():
        g, copies, ref_w, nbytes = nvfp4_tiled_copies(n, k)
        for m in (1, 16):
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            res["rows"].append(labelled_row(
                name, n, k, m, nbytes + m * k * 2 + m * n * 2, configs(shipped[(name, m)], m, n, k),
                lambda cfg, qt: gemv.launch_nvfp4_gemv(x, *qt, cfg, pdl=True), x.float() @ ref_w.T, copies, bw))
            json.dump(res, open(f"{out_dir}/nvfp4_waitlate.json", "w"), indent=1)
        del copies, ref_w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
