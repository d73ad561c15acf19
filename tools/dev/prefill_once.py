"""Experiment, not used by Atlas: one chunked Gated DeltaNet prefill at Qwen3.5-27B's shape (conv left out), for
profilers. On the GPU box:

    ncu --kernel-name regex:"chunk_wy|chunk_state|chunk_out" --launch-count 3 --section SpeedOfLight \\
        --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \\
        python -m atlas.tools.dev.prefill_once 32768
"""

from __future__ import annotations

import sys


def main(T: int) -> None:
    import torch

    from atlas.plugins_trt.gated_delta_net.triton_chunk import launch_chunk_gdn

    HK, HV, D = 16, 48, 128
    qkv = torch.randn(T, 2 * HK * D + HV * D, device="cuda").to(torch.bfloat16)
    q, k, v = qkv[:, :HK * D], qkv[:, HK * D:2 * HK * D], qkv[:, 2 * HK * D:]
    ab = torch.randn(T, 2 * HV, device="cuda").to(torch.bfloat16)
    A_log, dt_bias = torch.randn(HV, device="cuda") * 0.5, torch.randn(HV, device="cuda")
    state = torch.randn(1, HV, D, D, device="cuda") * 0.1
    slots = torch.zeros(1, dtype=torch.int32, device="cuda")
    cu = torch.tensor([0, T], dtype=torch.int32, device="cuda")
    for _ in range(2):
        launch_chunk_gdn(q, k, v, ab[:, :HV], ab[:, HV:], A_log, dt_bias, state, slots, cu, cu_seqlens_host=[0, T])
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 32768)
