"""Experiment helper (GPU box): XCLAMP (gluon_gemv: the x rows past M clamped to row M - 1 instead of masked, so the
x loads lose their row mask and the zeroing of their registers: 27.0 -> 26.2 instructions a word of 8 weights in the
8B qkv M 16 loop, tests/tools/test_nvfp4_xclamp.py) beside the config gemm.json shipped, where that is a Gluon split
GEMV of PIPE 1, at M 4, 8 and 16 (the mask also runs where no row is past M: M is a run-time argument), in the
benchmark's PDL chain over rotated BITS weight copies, every output checked.

    python -m atlas.tools.dev.nvfp4_xclamp      # $OUT/nvfp4_xclamp.json
"""
from __future__ import annotations

import json

from atlas.tools.dev.nvfp4_streamk import SHAPES


def configs(shipped: dict) -> list[tuple[str, dict]]:
    """(label, config): the shipped config, and its XCLAMP form where it has one."""
    out = [("shipped", shipped)]
    if shipped.get("GLUON") and shipped.get("PIPE", 1) == 1 and not (shipped.get("XSMEM") or shipped.get("STAGE")
                                                                     or shipped.get("WK")):
        out.append(("xclamp", {**shipped, "XCLAMP": True}))
    return out


def main() -> None:
    import torch

    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    from atlas.tools.dev.variants import labelled_row, nvfp4_tiled_copies, sweep_start

    out_dir, shipped, bw, res = sweep_start("nvfp4")
    for name, (n, k) in SHAPES.items():
        g, copies, ref_w, nbytes = nvfp4_tiled_copies(n, k)
        for m in (4, 8, 16):
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            res["rows"].append(labelled_row(
                name, n, k, m, nbytes + m * k * 2 + m * n * 2, configs(shipped[(name, m)]),
                lambda cfg, qt: gemv.launch_nvfp4_gemv(x, *qt, cfg, pdl=True), x.float() @ ref_w.T, copies, bw))
            json.dump(res, open(f"{out_dir}/nvfp4_xclamp.json", "w"), indent=1)
        del copies, ref_w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
