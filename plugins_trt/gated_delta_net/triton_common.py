"""Small @triton.jit helpers shared by the Gated DeltaNet kernels: gating, L2 normalisation, the unit
lower-triangular inverse.

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


@triton.jit
def gated_norm_vec(out, z_row, norm_w, cv, DV: tl.constexpr, NORM_EPS: tl.constexpr, O_TYPE: tl.constexpr):
    """norm_w · rmsnorm(o) · silu(z) for one token's head outputs out [DV] (fp32, at channels cv); o is rounded to
    the output dtype O_TYPE first, as the layer does; z_row points at the token's z for this head."""
    out = out.to(O_TYPE).to(tl.float32)
    zt = tl.load(z_row + cv).to(tl.float32)
    w = tl.load(norm_w + cv).to(tl.float32)
    return out * tl.rsqrt(tl.sum(out * out, axis=0) / DV + NORM_EPS) * w * (zt * tl.sigmoid(zt))


@triton.jit
def inv_unit_lower(A, LOG2N: tl.constexpr):
    """(I + A)^{-1} for a strictly lower-triangular A [n, n] (fp32, n <= 2^LOG2N) without a row-by-row loop:
    A is nilpotent (A^n = 0), so (I + A)^{-1} = sum_k (-A)^k = (I - A)(I + A^2)(I + A^4)...(I + A^(n/2)),
    2·LOG2N - 2 dependent products of [n, n] tiles (exact fp32 products) instead of n - 1 dependent
    reduction steps."""
    o = tl.arange(0, A.shape[0])
    X = (o[:, None] == o[None, :]).to(tl.float32) - A
    P = A
    for _ in tl.static_range(1, LOG2N):
        P = tl.dot(P, P, input_precision="ieee")
        X = X + tl.dot(X, P, input_precision="ieee")
    return X


def aot_signature_of(fn, types: dict[str, str], constexprs: dict, num_warps: int, num_stages: int,
                     unaligned: tuple[str, ...] = ()):
    """An AotSignature (atlas.plugins_trt.quant_linear.triton_gemv) for a GDN / conv kernel.

    types: every run-time parameter -> '*bf16' / '*fp32' / '*i32' / 'i32'. divisible_by_16 holds every pointer
    except those in `unaligned` (column views into a wider buffer, e.g. a, b, z of the fused in_proj output);
    int parameters (strides, sizes) are never assumed aligned. No grid formula: these grids depend on the
    batch (B sequences, N packed sequences, NT chunks, max_T tokens), which the launcher passes as the grid.
    """
    from atlas.plugins_trt.quant_linear.triton_gemv import AotSignature, spelled_signature

    names, sig, constexprs = spelled_signature(fn, types, constexprs)
    div = tuple(n for n in names if sig[n].startswith("*") and n not in unaligned)
    return AotSignature(fn, sig, dict(constexprs), div, num_warps, num_stages, None)
