"""Experiment, not used by Atlas: conv_varlen_kernel tile configurations at the Qwen3.5-27B prefill shape
(C 10240, T 32768 and 4096) beside flash-linear-attention's causal_conv1d, as CUDA-graph replays.

    python -m atlas.tools.dev.conv_tiles      # on the GPU box; writes $OUT/conv_probe.json

Findings in plugins_trt/gated_delta_net/NOTES.md (prefill).
"""

from __future__ import annotations

import json
import os

TILES = [(32, 64, 4), (64, 128, 4), (128, 128, 4), (128, 128, 8), (64, 256, 4), (128, 256, 8), (256, 128, 8),
         (32, 256, 4), (16, 512, 4)]  # (BT, BC, num_warps); the launcher's default is the first


def main() -> None:
    import torch
    import triton

    from atlas.plugins_trt.causal_conv1d.triton_conv import conv_varlen_kernel
    from atlas.tools.bench.timing import copy_bandwidth, graph_time

    C, KW = 10240, 4
    bw = copy_bandwidth()
    out = []
    for T in (32768, 4096):
        x = torch.randn(T, C, device="cuda").to(torch.bfloat16)
        w = (torch.randn(C, KW, device="cuda") * 0.5).to(torch.bfloat16)
        win = torch.randn(1, C, KW - 1, device="cuda").to(torch.bfloat16)
        y = torch.empty_like(x)
        cu = torch.tensor([0, T], dtype=torch.int32, device="cuda")
        slots = torch.zeros(1, dtype=torch.int32, device="cuda")
        floor_us = 2 * T * C * 2 / bw * 1e6  # x read and y written once
        for BT, BC, nw in TILES:
            grid = (1, triton.cdiv(T, BT), triton.cdiv(C, BC))

            def run(BT=BT, BC=BC, nw=nw, grid=grid):
                conv_varlen_kernel[grid](x, C, y, C, w, w, win, cu, slots, C, KW=KW, WP=4, BT=BT, BC=BC,
                                         HAS_BIAS=False, num_warps=nw)

            us = graph_time([run], repeats=20) * 1e6
            out.append(dict(T=T, BT=BT, BC=BC, num_warps=nw, us=us, floor_fraction=floor_us / us))
            print(json.dumps(out[-1]), flush=True)
        try:
            from fla.modules.causal_conv1d import causal_conv1d
        except ImportError as e:
            print(f"fla not importable ({e}): Atlas only", flush=True)
            continue
        cache = torch.randn(1, C, KW, device="cuda").to(torch.bfloat16)
        us = graph_time([lambda: causal_conv1d(x.view(1, T, C), weight=w, initial_state=cache,
                                               output_final_state=True, activation="silu")], repeats=20) * 1e6
        out.append(dict(T=T, fla_us=us, floor_fraction=floor_us / us))
        print(json.dumps(out[-1]), flush=True)
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "conv_probe.json"), "w") as f:
        json.dump({"copy_bandwidth_Bps": bw, "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
