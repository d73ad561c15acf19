"""Run one NVFP4 linear kernel a few times on fresh random tiled weights, for Nsight Compute to profile (GPU box).

    ncu --clock-control none --kernel-name regex:nvfp4 --launch-skip 2 --launch-count 1 \
        python3 -m atlas.tools.dev.profile_linear SHAPE M CONFIG_JSON

SHAPE is a tools/bench_gemm.py shape name, CONFIG_JSON a GEMV or GEMM config as the build writes it for that shape
(all six are whole tiles, so the config has "TILED": true and the weights are tiled). The result is checked against
the fp32 reference, so a profile is of a kernel that computes the right thing.
"""

from __future__ import annotations

import json
import sys


def main(shape: str, m: int, config: dict, launches: int = 4) -> None:
    import torch

    from atlas.plugins_trt.quant_linear import triton_gemm as gemm
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    from atlas.tools.bench_gemm import SHAPES
    from atlas.tools.dev.variants import nvfp4_tiled_weight

    if not config.get("TILED"):
        raise SystemExit(f"profile_linear runs tiled weights (as GPU engines do): give a config with \"TILED\": true, "
                         f"got {config}")
    n, k = SHAPES[shape]
    g, w, ws, ws2, ref = nvfp4_tiled_weight(n, k)
    if config.get("BITS"):  # the words' bits in layout.NVFP4_BITS order, as that form reads them
        from atlas.plugins_trt.quant_linear.layout import bits_nvfp4
        w = bits_nvfp4(w)
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    for _ in range(launches):
        if m <= 16:
            y = gemv.launch_nvfp4_gemv(x, w, ws, ws2, config)
        else:
            y = gemm.launch_nvfp4_gemm(x, w, ws, ws2, config)
    r = x.float() @ ref.T
    err = float((y.float() - r).norm() / r.norm())
    print(f"{shape} M={m} {config}: rel error {err:.2e}", flush=True)
    assert err < 1e-2


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]))
