"""Small @triton.jit helpers shared by the Gated DeltaNet kernels: gating and L2 normalisation.

They mirror `reference.gdn_gating` and `reference.l2norm` (fp32 math).
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def softplus(x):
    """torch.nn.functional.softplus (beta 1, threshold 20)."""
    return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))


@triton.jit
def gdn_gate(a, b, neg_A, dt_bias):
    """g = -exp(A_log) · softplus(a + dt_bias) (natural-log decay), beta = sigmoid(b); neg_A = -exp(A_log)."""
    return neg_A * softplus(a.to(tl.float32) + dt_bias), tl.sigmoid(b.to(tl.float32))


@triton.jit
def l2norm_vec(x):
    """x * rsqrt(sum(x²) + 1e-6), fp32; x: [D]."""
    return x * tl.rsqrt(tl.sum(x * x, axis=0) + 1e-6)


@triton.jit
def l2norm_rows(x):
    """Row-wise l2norm_vec; x: [rows, D] fp32."""
    return x * tl.rsqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]
