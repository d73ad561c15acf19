"""The reference ops against independent implementations (transformers' own functions) on random inputs."""

import pytest
import torch

from atlas.plugins_trt.causal_conv1d.reference import causal_conv1d
from atlas.plugins_trt.gated_delta_net.reference import gated_delta_rule
from atlas.plugins_trt.rope.reference import rope_inv_freq
from atlas.plugins_trt.sampling.reference import sample


def rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("T,Hk,Hv,D", [(1, 2, 2, 16), (63, 2, 4, 32), (130, 1, 3, 8)],
                         ids=lambda v: str(v))
def test_gated_delta_rule_matches_transformers_chunked(T, Hk, Hv, D):
    """Our token-by-token recurrence vs transformers' chunked torch form (a different algorithm)."""
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    g = torch.Generator().manual_seed(T)
    q, k = (torch.randn(T, Hk, D, generator=g) for _ in range(2))
    v = torch.randn(T, Hv, D, generator=g)
    gate = -torch.rand(T, Hv, generator=g) * 2
    beta = torch.rand(T, Hv, generator=g)
    s0 = torch.randn(Hv, D, D, generator=g) * 0.1
    ours, s_ours = gated_delta_rule(q, k, v, gate, beta, s0)
    r = Hv // Hk
    theirs, s_theirs = torch_chunk_gated_delta_rule(
        q.repeat_interleave(r, 1)[None], k.repeat_interleave(r, 1)[None], v[None], gate[None], beta[None],
        initial_state=s0[None], output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert rel(ours, theirs[0]) < 1e-5
    assert rel(s_ours, s_theirs[0]) < 1e-5


def test_causal_conv1d_window_continues_the_sequence():
    g = torch.Generator().manual_seed(0)
    C, K, T = 12, 4, 20
    x = torch.randn(T, C, generator=g)
    w = torch.randn(C, K, generator=g)
    full, _ = causal_conv1d(x, torch.zeros(C, K - 1), w)
    expected = torch.nn.functional.silu(torch.nn.functional.conv1d(
        x.T[None], w[:, None], padding=K - 1, groups=C)[0, :, :T].T)
    assert rel(full, expected) < 1e-6
    y1, win = causal_conv1d(x[:7], torch.zeros(C, K - 1), w)
    parts = [y1]
    for t in range(7, T):
        y, win = causal_conv1d(x[t:t + 1], win, w)
        parts.append(y)
    assert rel(torch.cat(parts), full) < 1e-6


@pytest.mark.parametrize("scaling", [
    None,
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8192},
], ids=["default", "linear", "llama3"])
def test_rope_inv_freq_matches_transformers(scaling):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    params = {"rope_type": "default", "rope_theta": 500000.0, **(scaling or {})}
    config = LlamaConfig(hidden_size=512, num_attention_heads=4, rope_parameters=params)
    if params["rope_type"] == "default":
        expected, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        expected, _ = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")
    torch.testing.assert_close(rope_inv_freq(128, 500000.0, scaling), expected, rtol=1e-6, atol=0)


def test_sampling():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1000, generator=g)
    best = int(logits.argmax())
    assert sample(logits, 0.0, 0, 1.0) == best
    assert sample(logits, 1.0, 1, 1.0, torch.Generator().manual_seed(5)) == best  # top_k=1 is greedy
    assert sample(logits, 1.0, 0, 1e-6, torch.Generator().manual_seed(5)) == best  # tiny top_p keeps the top token
    draws = [sample(logits, 1.0, 5, 1.0, torch.Generator().manual_seed(i)) for i in range(200)]
    assert set(draws) <= set(torch.topk(logits, 5).indices.tolist()) and len(set(draws)) > 1
    seeded = [sample(logits, 0.8, 0, 0.9, torch.Generator().manual_seed(7)) for _ in range(2)]
    assert seeded[0] == seeded[1]
    # top_p keeps the smallest prefix of the sorted distribution whose mass reaches p
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    kept = {sample(probs, 1.0, 0, 0.75, torch.Generator().manual_seed(i)) for i in range(300)}
    assert kept == {0, 1}
