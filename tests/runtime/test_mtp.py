"""The MTP draft block against the same math composed from transformers' own Qwen3.5 modules."""

import torch

from atlas.build_engine.builder import BuildConfig, build
from atlas.runtime.engine import load_engine
from atlas.runtime.model import Model
from atlas.tools.synthetic import SyntheticCheckpoint


@torch.inference_mode()
def test_mtp_block_matches_transformers_modules(tmp_path):
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    spec = "tiny-qwen3.5@5"
    engine = load_engine(build(BuildConfig(f"synthetic:{spec}", tmp_path / "e", progress=False)).path)
    model = Model(engine.config, engine.weights)
    ckpt = SyntheticCheckpoint(spec)
    config = Qwen3_5TextConfig(**{k: v for k, v in ckpt.config.items() if k not in ("architectures", "model_type")})
    config._attn_implementation = "sdpa"
    full = next(i for i, t in enumerate(config.layer_types) if t == "full_attention")

    # transformers' modules, loaded with the checkpoint's mtp.* tensors
    layer = hf.Qwen3_5DecoderLayer(config, full).eval()
    layer.load_state_dict({k.removeprefix("mtp.layers.0."): ckpt.get(k) for k in ckpt.tensor_names()
                           if k.startswith("mtp.layers.0.")})
    norms = {}
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        norms[name] = hf.Qwen3_5RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        norms[name].weight.copy_(ckpt.get(f"mtp.{name}.weight"))
    fc = ckpt.get("mtp.fc.weight")
    rotary = hf.Qwen3_5TextRotaryEmbedding(config)

    g = torch.Generator().manual_seed(0)
    T = 12
    tokens = torch.randint(0, config.vocab_size, (T,), generator=g)
    hidden = torch.randn(T, config.hidden_size, generator=g)
    embeds = model.embed[tokens]

    x = torch.cat([norms["pre_fc_norm_embedding"](embeds), norms["pre_fc_norm_hidden"](hidden)], -1) @ fc.T
    positions = torch.arange(T)[None].expand(3, 1, T)
    cos_sin = rotary(x[None], positions)
    expected = norms["norm"](layer(x[None], position_embeddings=cos_sin, attention_mask=None)[0])

    from atlas.plugins_trt.rope.reference import rope_cos_sin
    from atlas.runtime.state import SequenceState

    state = SequenceState.new(engine.config, T)
    cos, sin = rope_cos_sin(torch.arange(T), model.inv_freq)
    ours = model.mtp(embeds, hidden, state.mtp, 0, cos, sin)
    err = float((ours - expected).norm() / expected.norm())
    assert err < 1e-5, err
