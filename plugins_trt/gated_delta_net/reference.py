"""Gated DeltaNet references: gating and the delta-rule recurrence, token by token (fp32).

Per value head, with state S [Dk, Dv]:
    S <- exp(g_t) · S
    u  = beta_t · (v_t - Sᵀ k_t)
    S <- S + k_t uᵀ
    o_t = Sᵀ q_t,   with q, k L2-normalised and q scaled by 1/sqrt(Dk).
"""

import torch
import torch.nn.functional as F


def gdn_gating(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor):
    """g = -exp(A_log) · softplus(a + dt_bias) (log decay), beta = sigmoid(b).

    a, b: [T, Hv]; A_log, dt_bias: [Hv]. Returns g, beta: [T, Hv] fp32.
    """
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, b.float().sigmoid()


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the recurrence over T tokens from `state`.

    q, k: [T, Hk, Dk] (raw, normalised here); v: [T, Hv, Dv]; g, beta: [T, Hv]; state: [Hv, Dk, Dv].
    Value head h reads key head h // (Hv / Hk). Returns o [T, Hv, Dv] (fp32) and the final state (fp32).
    """
    T, Hk, Dk = q.shape
    Hv = v.shape[1]
    group = Hv // Hk
    q = l2norm(q.float()).repeat_interleave(group, dim=1) * Dk**-0.5  # q: [T, Hv, Dk]
    k = l2norm(k.float()).repeat_interleave(group, dim=1)
    v = v.float()
    S = state.float().clone()
    out = torch.empty(T, Hv, v.shape[-1])
    for t in range(T):
        S = S * g[t].exp()[:, None, None]
        kv_mem = torch.einsum("hkv,hk->hv", S, k[t])
        u = (v[t] - kv_mem) * beta[t][:, None]
        S = S + k[t][:, :, None] * u[:, None, :]
        out[t] = torch.einsum("hkv,hk->hv", S, q[t])
    return out, S
