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
    from atlas.tools.dev.variants import nvfp4_gemv_sweep

    nvfp4_gemv_sweep("nvfp4_waitlate.json", (1, 16), configs)


if __name__ == "__main__":
    main()
