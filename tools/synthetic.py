"""Synthetic Hugging Face checkpoints: real or tiny shapes, seeded random weights.

A synthetic checkpoint is an HF config (a preset from `synthetic_presets`) plus tensors whose HF names
and shapes are exactly what transformers' ForCausalLM declares for that config. Every tensor is drawn
independently from a seed derived from (global seed, tensor name), so any tensor can be produced on
demand, in any order, without generating the others:

    SyntheticCheckpoint("tiny-qwen3.5@3").get("model.layers.0.linear_attn.A_log")   # shape [4]
    write_checkpoint("qwen3.5-27b", "/data/q35", device="cuda")     # config.json + sharded safetensors

or from the shell: `python -m atlas.tools.synthetic qwen3.5-27b -o /data/q35 --device cuda`.

Values are drawn by torch.Generator on the generating device; CPU and CUDA generators give different
streams, so a checkpoint written with device="cuda" equals SyntheticCheckpoint(..., device="cuda"),
not the CPU one. The device is recorded in the safetensors metadata. A spec may name the drawing device
itself: `synthetic:llama-3.1-8b@0/cuda` draws on the GPU (seconds for 8B, where the CPU takes minutes)
and hands the tensors over on the checkpoint's `device` (the CPU for atlas-build), so a build and a
transformers peer opened with the same spec hold the same values.

Value scales keep activations O(1) in bfloat16: linear weights N(0, 1/fan_in), embeddings N(0, 0.02),
x*w RMSNorm weights ones, (1+w) RMSNorm weights N(0, 0.05), conv1d N(0, 1/K), A_log = log U(1, 16),
and dt_bias = softplus^-1(dt) with log-uniform dt in [1e-3, 1e-1] (the Mamba init, instead of the
HF init of ones: with ones, the Gated DeltaNet decay exp(-A softplus(a + 1)) is ~e^-20, which would
erase the recurrent state after every token and hide state-carrying bugs).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click
import torch

from atlas.build_engine.checkpoints.base import Checkpoint
from atlas.build_engine.errors import CheckpointError, UnsupportedModelError
from atlas.tools.synthetic_presets import GENERATION, PRESETS

__all__ = [
    "PRESETS",
    "SyntheticCheckpoint",
    "make_tensor",
    "parameter_count",
    "tensor_specs",
    "write_checkpoint",
]

#: name -> (shape, kind); kind picks the value distribution in `make_tensor`.
Specs = dict[str, tuple[tuple[int, ...], str]]

HYBRID_FAMILIES = ("qwen3_next", "qwen3_5_text")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


# --- shapes --------------------------------------------------------------------------------------


def text_config(config: dict) -> dict:
    """The language-model part of a config: `text_config` for the composite qwen3_5, else itself."""
    return config["text_config"] if config.get("model_type") == "qwen3_5" else config


def _layer_types(tc: dict) -> list[str]:
    if tc["model_type"] not in HYBRID_FAMILIES:
        return ["full_attention"] * tc["num_hidden_layers"]
    if tc.get("layer_types"):
        return list(tc["layer_types"])
    interval = tc.get("full_attention_interval", 4)
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(tc["num_hidden_layers"])]


def _attention_specs(tc: dict, p: str) -> Specs:
    """Full attention. Hybrids: q_proj [2*heads*head_dim, H] (query and output gate), (1+w) q/k norms."""
    family, h = tc["model_type"], tc["hidden_size"]
    heads, kv_heads = tc["num_attention_heads"], tc["num_key_value_heads"]
    head_dim = tc.get("head_dim") or h // heads
    gate = 2 if family in HYBRID_FAMILIES else 1
    out = {
        f"{p}self_attn.q_proj": (heads * head_dim * gate, h),
        f"{p}self_attn.k_proj": (kv_heads * head_dim, h),
        f"{p}self_attn.v_proj": (kv_heads * head_dim, h),
        f"{p}self_attn.o_proj": (h, heads * head_dim),
    }
    specs: Specs = {}
    for name, shape in out.items():
        specs[f"{name}.weight"] = (shape, "linear")
        if tc.get("attention_bias", False):
            specs[f"{name}.bias"] = ((shape[0],), "bias")
    if family != "llama":
        norm = "norm1p" if family in HYBRID_FAMILIES else "norm"
        specs[f"{p}self_attn.q_norm.weight"] = ((head_dim,), norm)
        specs[f"{p}self_attn.k_norm.weight"] = ((head_dim,), norm)
    return specs


def _linear_attention_specs(tc: dict, p: str) -> Specs:
    """Gated DeltaNet: conv1d [C, 1, K] with C = 2*key_dim + value_dim; norm.weight [head_v_dim] (x*w, gated)."""
    h, nv = tc["hidden_size"], tc["linear_num_value_heads"]
    key_dim = tc["linear_num_key_heads"] * tc["linear_key_head_dim"]
    value_dim = nv * tc["linear_value_head_dim"]
    conv_dim = 2 * key_dim + value_dim
    a = f"{p}linear_attn."
    if tc["model_type"] == "qwen3_next":
        proj = {"in_proj_qkvz": 2 * key_dim + 2 * value_dim, "in_proj_ba": 2 * nv}
    else:
        proj = {"in_proj_qkv": conv_dim, "in_proj_z": value_dim, "in_proj_b": nv, "in_proj_a": nv}
    specs: Specs = {f"{a}{n}.weight": ((rows, h), "linear") for n, rows in proj.items()}
    specs[f"{a}conv1d.weight"] = ((conv_dim, 1, tc["linear_conv_kernel_dim"]), "conv")
    specs[f"{a}dt_bias"] = ((nv,), "dt_bias")
    specs[f"{a}A_log"] = ((nv,), "A_log")
    specs[f"{a}norm.weight"] = ((tc["linear_value_head_dim"],), "norm")
    specs[f"{a}out_proj.weight"] = ((h, value_dim), "linear")
    return specs


def _layer_specs(tc: dict, p: str, layer_type: str) -> Specs:
    """One decoder layer: token mixer, dense SwiGLU MLP [I, H] / [H, I], two RMSNorms [H]."""
    h, inter = tc["hidden_size"], tc["intermediate_size"]
    norm = "norm1p" if tc["model_type"] in HYBRID_FAMILIES else "norm"
    specs = _attention_specs(tc, p) if layer_type == "full_attention" else _linear_attention_specs(tc, p)
    for name, shape in (("gate_proj", (inter, h)), ("up_proj", (inter, h)), ("down_proj", (h, inter))):
        specs[f"{p}mlp.{name}.weight"] = (shape, "linear")
        if tc.get("mlp_bias", False):
            specs[f"{p}mlp.{name}.bias"] = ((shape[0],), "bias")
    specs[f"{p}input_layernorm.weight"] = ((h,), norm)
    specs[f"{p}post_attention_layernorm.weight"] = ((h,), norm)
    return specs


def _check_dense(tc: dict) -> None:
    if tc["model_type"] == "qwen3_next":
        experts, step = tc.get("num_experts", 512), tc.get("decoder_sparse_step", 1)
        only = set(tc.get("mlp_only_layers") or [])
        moe = [i for i in range(tc["num_hidden_layers"]) if i not in only and experts > 0 and (i + 1) % step == 0]
        if moe:
            raise UnsupportedModelError(
                f"synthetic qwen3_next checkpoints are dense only; layers {moe} would be MoE. "
                f"Set num_experts 0 or list every layer in mlp_only_layers."
            )


def tensor_specs(config: dict) -> Specs:
    """Every tensor's HF name -> (shape, kind), in checkpoint order, for llama, qwen3, qwen3_next, qwen3_5(_text).

    Embeddings [V, H]; decoder layers; final norm [H]; lm_head [V, H] unless tied; for hybrids with
    mtp_num_hidden_layers > 0: mtp.fc [H, 2H], mtp.pre_fc_norm_{embedding,hidden} [H], mtp.layers.j.*
    (a full-attention layer with dense MLP) and mtp.norm [H]. The composite qwen3_5 prefixes the
    language model with model.language_model. (mtp.* and lm_head stay top level, as in the real files).
    """
    tc = text_config(config)
    family = tc.get("model_type")
    if family not in ("llama", "qwen3", *HYBRID_FAMILIES):
        raise UnsupportedModelError(f"no synthetic tensor layout for model_type '{family}'")
    _check_dense(tc)
    prefix = "model.language_model." if config.get("model_type") == "qwen3_5" else "model."
    h, vocab = tc["hidden_size"], tc["vocab_size"]
    norm = "norm1p" if family in HYBRID_FAMILIES else "norm"
    specs: Specs = {f"{prefix}embed_tokens.weight": ((vocab, h), "embed")}
    for i, layer_type in enumerate(_layer_types(tc)):
        specs.update(_layer_specs(tc, f"{prefix}layers.{i}.", layer_type))
    specs[f"{prefix}norm.weight"] = ((h,), norm)
    if not config.get("tie_word_embeddings", tc.get("tie_word_embeddings", False)):
        specs["lm_head.weight"] = ((vocab, h), "linear")
    n_mtp = tc.get("mtp_num_hidden_layers", 0) if family in HYBRID_FAMILIES else 0
    if n_mtp:
        specs["mtp.fc.weight"] = ((h, 2 * h), "linear")
        specs["mtp.pre_fc_norm_embedding.weight"] = ((h,), norm)
        specs["mtp.pre_fc_norm_hidden.weight"] = ((h,), norm)
        for j in range(n_mtp):
            specs.update(_layer_specs(tc, f"mtp.layers.{j}.", "full_attention"))
        specs["mtp.norm.weight"] = ((h,), norm)
    return specs


def parameter_count(config: dict) -> int:
    """Total number of values over `tensor_specs(config)` (MTP included, vision tower not)."""
    return sum(math.prod(shape) for shape, _ in tensor_specs(config).values())


def config_dtype(config: dict) -> torch.dtype:
    tc = text_config(config)
    name = config.get("torch_dtype") or config.get("dtype") or tc.get("torch_dtype") or tc.get("dtype") or "float32"
    return _DTYPES[name]


# --- values --------------------------------------------------------------------------------------


def tensor_seed(seed: int, name: str) -> int:
    """A stable 63-bit generator seed for one tensor (blake2b, not Python's salted hash())."""
    digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def make_tensor(name: str, shape: tuple[int, ...], kind: str, seed: int, dtype: torch.dtype, device="cpu") -> torch.Tensor:
    """The tensor `name` of the given shape and kind, drawn from its own generator (see module doc)."""
    device = torch.device(device)
    if kind == "norm":
        return torch.ones(shape, dtype=dtype, device=device)
    gen = torch.Generator(device=device)
    gen.manual_seed(tensor_seed(seed, name))
    std = {"embed": 0.02, "linear": shape[-1] ** -0.5, "conv": shape[-1] ** -0.5, "norm1p": 0.05, "bias": 0.02}
    if kind in std:
        return torch.empty(shape, dtype=dtype, device=device).normal_(0.0, std[kind], generator=gen)
    u = torch.empty(shape, dtype=torch.float32, device=device)
    if kind == "A_log":
        return u.uniform_(1.0, 16.0, generator=gen).log_().to(dtype)
    if kind == "dt_bias":
        dt = u.uniform_(math.log(1e-3), math.log(1e-1), generator=gen).exp_()
        return (dt + torch.log(-torch.expm1(-dt))).to(dtype)  # softplus^-1(dt)
    raise ValueError(f"unknown tensor kind '{kind}' for {name}")


# --- checkpoint ----------------------------------------------------------------------------------


def parse_spec(spec: str) -> tuple[str, int]:
    """'tiny-llama@3' -> ('tiny-llama', 3); 'tiny-llama' -> ('tiny-llama', 0) (a '/device' suffix aside)."""
    name, _, seed = spec.partition("/")[0].partition("@")
    if name not in PRESETS:
        raise CheckpointError(f"unknown synthetic preset '{name}'. Presets: {', '.join(PRESETS)}.")
    try:
        return name, int(seed) if seed else 0
    except ValueError:
        raise CheckpointError(f"bad seed in synthetic spec '{spec}': write <preset>@<integer>.") from None


def parse_draw_device(spec: str) -> torch.device | None:
    """'llama-3.1-8b@0/cuda' -> cuda; no suffix -> None (draw where the tensors are returned)."""
    _, slash, device = spec.partition("/")
    if not slash:
        return None
    if device not in ("cpu", "cuda"):
        raise CheckpointError(f"bad drawing device in synthetic spec '{spec}': write <preset>[@seed]/cpu or /cuda.")
    if device == "cuda" and not torch.cuda.is_available():
        raise CheckpointError(f"synthetic spec '{spec}' draws on CUDA, which this machine lacks; drop '/cuda'.")
    return torch.device(device)


class SyntheticCheckpoint(Checkpoint):
    """A preset's config with tensors generated on demand, returned on `device`; drawn there too unless the
    spec names the drawing device (`<preset>[@seed]/cuda`)."""

    def __init__(self, spec: str, device: str | torch.device = "cpu"):
        self.preset, self.seed = parse_spec(spec)
        self.device = torch.device(device)
        self.draw_device = parse_draw_device(spec) or self.device
        self.config = copy.deepcopy(PRESETS[self.preset])
        drawn = f"/{self.draw_device.type}" if "/" in spec else ""
        self.source = f"synthetic:{self.preset}" + (f"@{self.seed}" if self.seed else "") + drawn
        self.dtype = config_dtype(self.config)
        self.specs = tensor_specs(self.config)

    def tensor_names(self) -> list[str]:
        return list(self.specs)

    def get(self, name: str) -> torch.Tensor:
        if name not in self.specs:
            raise self.missing(name)
        shape, kind = self.specs[name]
        return make_tensor(name, shape, kind, self.seed, self.dtype, self.draw_device).to(self.device)

    def generation_config(self) -> dict:
        if self.preset in GENERATION:
            return copy.deepcopy(GENERATION[self.preset])
        tc = text_config(self.config)
        return {k: tc[k] for k in ("bos_token_id", "eos_token_id") if tc.get(k) is not None}


def _plan_shards(ckpt: SyntheticCheckpoint, shard_bytes: float) -> list[list[str]]:
    shards, size = [[]], 0
    for name, (shape, _) in ckpt.specs.items():
        nbytes = math.prod(shape) * ckpt.dtype.itemsize
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def write_checkpoint(
    preset: str,
    out_dir: str | os.PathLike,
    seed: int | None = None,
    shard_bytes: float = 5e9,
    device: str = "cpu",
    progress: bool = True,
) -> Path:
    """Write config.json, generation_config.json and the weights of `preset` into `out_dir`.

    Weights go to model.safetensors when they fit in one shard of `shard_bytes`, else to
    model-0000X-of-0000N.safetensors plus model.safetensors.index.json (HF layout). Tensors are
    generated on `device` shard by shard; one shard is written to disk while the next is generated,
    so host memory stays at about two shards. `seed` (default 0) may also come as "preset@seed".
    """
    from safetensors.torch import save_file
    from tqdm import tqdm

    name, spec_seed = parse_spec(preset)
    if seed is not None and "@" in preset and seed != spec_seed:
        raise CheckpointError(f"conflicting seeds: '{preset}' and seed={seed}")
    ckpt = SyntheticCheckpoint(f"{name}@{spec_seed if seed is None else seed}", device=device)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(ckpt.config, indent=2) + "\n")
    if gen := ckpt.generation_config():
        (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")

    shards = _plan_shards(ckpt, shard_bytes)
    n = len(shards)
    files = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    total = sum(math.prod(shape) for shape, _ in ckpt.specs.values()) * ckpt.dtype.itemsize
    metadata = {"format": "pt", "synthetic": f"{name}@{ckpt.seed}", "device": ckpt.device.type}
    # On CPU, draw tensors of a shard in parallel (each has its own generator, so order is irrelevant).
    workers = min(16, os.cpu_count() or 1) if ckpt.device.type == "cpu" else 1

    def host_tensor(tensor_name: str) -> torch.Tensor:
        return ckpt.get(tensor_name).to("cpu").contiguous()

    with (
        tqdm(total=total, unit="B", unit_scale=True, desc=f"synthetic {name}", disable=not progress) as bar,
        ThreadPoolExecutor(1) as writer,
        ThreadPoolExecutor(workers) as pool,
    ):
        pending = None
        for names, filename in zip(shards, files):
            tensors = {}
            for tensor_name, tensor in zip(names, pool.map(host_tensor, names)):
                tensors[tensor_name] = tensor
                bar.update(tensor.numel() * tensor.element_size())
            if pending is not None:
                pending.result()
            pending = writer.submit(save_file, tensors, str(out / filename), metadata)
        pending.result()

    if n > 1:
        weight_map = {t: f for names, f in zip(shards, files) for t in names}
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return out


def _human(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


@click.command()
@click.argument("preset", required=False)
@click.option("-o", "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), help="Output directory.")
@click.option("--seed", type=int, default=None, help="Global seed (default 0, or PRESET@SEED).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--shard-gb", type=float, default=5.0, show_default=True, help="Maximum shard size in GB.")
@click.option("--list", "list_presets", is_flag=True, help="List the presets with their parameter counts.")
def main(preset, out_dir, seed, device, shard_gb, list_presets):
    """Write a synthetic Hugging Face checkpoint of PRESET (e.g. tiny-llama@3) into -o DIR."""
    if list_presets:
        for name, config in PRESETS.items():
            tc = text_config(config)
            click.echo(f"{name:16} {config['model_type']:13} {_human(parameter_count(config)):>9}  {tc['num_hidden_layers']} layers, hidden {tc['hidden_size']}")
        return
    if not preset or not out_dir:
        raise click.UsageError("give PRESET and -o DIR (or --list)")
    try:
        path = write_checkpoint(preset, out_dir, seed=seed, shard_bytes=shard_gb * 1e9, device=device)
    except (CheckpointError, UnsupportedModelError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {path}")


if __name__ == "__main__":
    main()
