"""Experiment helper (GPU box): do the tensor cores keep bf16 subnormal inputs and fp32 products below 2^-126?

    python -m atlas.tools.dev.mma_subnormal

An NVFP4 decode that skips the per-pair scale multiply leaves E2M1 * 2^-126 in bf16 (code 1, 0.5, is the subnormal
2^-127) for the A operand; this checks a Triton tl.dot (mma.sync at these sizes) and torch.mm (cuBLAS) on such
values against an fp64 reference, with x as is and pre-scaled by 2^64. Prints one line per case.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _dot(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    rm, rn, rk = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b))


def main() -> None:
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    codes = torch.randint(0, 16, (64, 64), device="cuda", generator=g)
    e2m1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], device="cuda")[codes]
    a = (e2m1.double() * 2.0 ** -126).to(torch.bfloat16)  # exact: 2^-127 is a bf16 subnormal
    assert torch.equal(a.double() * 2.0 ** 126, e2m1.double()), "bf16 lost a subnormal on the way in"
    for scale in (0, 64, 100):
        x = torch.randn(64, 32, device="cuda", generator=g).to(torch.bfloat16)
        xs = (x.double() * 2.0 ** scale).to(torch.bfloat16)
        ref = a.double() @ xs.double()
        c = torch.empty(64, 32, device="cuda", dtype=torch.float32)
        _dot[(1,)](a, xs, c, M=64, N=32, K=64)
        for name, y in (("triton dot", c), ("torch.mm", (a @ xs).float())):
            err = float((y.double() - ref).norm() / ref.norm()) if float(ref.norm()) > 0 else float("nan")
            print(f"x * 2^{scale:3d}: {name:10s} rel error {err:.3e}  |ref| {float(ref.abs().max()):.3e}", flush=True)


if __name__ == "__main__":
    main()
