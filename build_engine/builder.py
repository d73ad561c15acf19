"""atlas-build's pipeline: checkpoint -> canonical config and weights -> engine directory v1."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from atlas.build_engine.checkpoints import Checkpoint, open_checkpoint
from atlas.build_engine.errors import BuildError, CheckpointError
from atlas.build_engine.families import family_for
from atlas.runtime.config import ModelConfig
from atlas.runtime.engine import FORMAT_NAME, FORMAT_VERSION, MANIFEST, sha256_file
from atlas.runtime.layout import canonical_shapes

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DEFAULT_MAX_SEQ_LEN = 8192
LIBRARIES = ("torch", "safetensors", "tokenizers", "numpy", "transformers", "gguf")


@dataclass
class BuildConfig:
    checkpoint: str | None
    """Directory, .gguf file, `synthetic:<preset>`, built-in name, or None for the default model."""
    output: Path
    dtype: str = "auto"
    """auto | float32 | bfloat16: storage dtype of the weight matrices (norms and gates stay float32)."""
    max_seq_len: int | None = None
    """Longest sequence (prompt + generated) the engine serves; default min(model limit, 8192)."""
    device: str = "cpu"
    overwrite: bool = False
    progress: bool = True

    def __post_init__(self):
        self.output = Path(self.output)
        if self.dtype not in ("auto", *DTYPES):
            raise BuildError(f"--dtype must be one of auto, {', '.join(DTYPES)}; got '{self.dtype}'.")
        if self.device != "cpu":
            raise BuildError(f"--device {self.device} is not available yet; engines run on the CPU reference path.")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise BuildError(f"--max-seq-len must be at least 2, got {self.max_seq_len}.")

    def storage_dtype(self) -> torch.dtype:
        return DTYPES["float32" if self.dtype == "auto" else self.dtype]


@dataclass
class BuildResult:
    path: Path
    manifest: dict
    seconds: float
    unused_tensors: list[str]


def _versions() -> dict[str, str]:
    out = {}
    for lib in ("atlas-engine", *LIBRARIES):
        try:
            out[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def _convert(name: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # Vectors (norm weights, A_log, dt_bias, biases) stay fp32: tiny, and precision-sensitive.
    target = dtype if tensor.dim() >= 2 else torch.float32
    return tensor.to(target).contiguous()


def _prepare_output(cfg: BuildConfig) -> Path:
    out = cfg.output
    if out.exists() and any(out.iterdir()):
        if not (out / MANIFEST).is_file():
            raise BuildError(f"{out} exists and is not an Atlas engine; choose another -o directory.")
        if not cfg.overwrite:
            raise BuildError(f"{out} already holds an engine; pass --overwrite to replace it.")
        shutil.rmtree(out)
    (out / "weights").mkdir(parents=True, exist_ok=True)
    return out


def build(cfg: BuildConfig) -> BuildResult:
    t0 = time.perf_counter()
    ckpt: Checkpoint = open_checkpoint(cfg.checkpoint)
    if "model_type" not in ckpt.config:
        raise CheckpointError(f"config of {ckpt.source} has no model_type; it is not a transformers config.")
    family = family_for(ckpt.config)
    hf = family.prepare(ckpt.config)
    names = set(ckpt.tensor_names())
    generation = ckpt.generation_config()
    config: ModelConfig = family.canonical_config(hf, generation, names)
    max_seq_len = cfg.max_seq_len or min(config.max_position_embeddings, DEFAULT_MAX_SEQ_LEN)
    if max_seq_len > config.max_position_embeddings:
        raise BuildError(
            f"--max-seq-len {max_seq_len} exceeds the model's max_position_embeddings "
            f"({config.max_position_embeddings}); pass a value up to that."
        )
    plan = family.weight_plan(config, hf, names)
    shapes = canonical_shapes(config)
    planned = {n for group in plan.groups.values() for n in group}
    if planned != set(shapes):
        raise BuildError(f"internal: weight plan and canonical layout disagree on {sorted(planned ^ set(shapes))[:5]}")

    out = _prepare_output(cfg)
    dtype = cfg.storage_dtype()
    files: dict[str, dict] = {}
    weight_files: list[str] = []
    used: set[str] = set()
    groups = plan.groups.items()
    if cfg.progress:
        from tqdm import tqdm

        groups = tqdm(list(groups), desc=f"converting {Path(ckpt.source).name}", unit="group")
    for group, sources in groups:
        tensors = {}
        for canonical, src in sources.items():
            parts = [ckpt.get(n) for n in src.hf_names]
            used.update(src.hf_names)
            try:
                tensor = src.combine(parts)
            except RuntimeError as e:
                raise CheckpointError(
                    f"cannot form '{canonical}' from {list(src.hf_names)} of {ckpt.source}: {e}. The tensors' shapes "
                    f"do not fit the config."
                ) from None
            if tuple(tensor.shape) != shapes[canonical]:
                raise CheckpointError(
                    f"'{canonical}' (from {', '.join(src.hf_names)}) has shape {tuple(tensor.shape)}, but the "
                    f"config implies {shapes[canonical]}; config.json and the weights of {ckpt.source} disagree."
                )
            tensors[canonical] = _convert(canonical, tensor, dtype)
        rel = f"weights/{group}.safetensors"
        save_file(tensors, str(out / rel))
        weight_files.append(rel)
    has_tokenizer = ckpt.export_tokenizer(out)
    for file in sorted(p for p in out.rglob("*") if p.is_file()):
        rel = str(file.relative_to(out))
        files[rel] = {"bytes": file.stat().st_size, "sha256": sha256_file(file)}

    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "name": out.name,
        "family": config.family,
        "config": config.to_dict(),
        "build": {
            "checkpoint": ckpt.source,
            "dtype": str(dtype).removeprefix("torch."),
            "max_seq_len": max_seq_len,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
        "target": {"device": cfg.device},
        "libraries": _versions(),
        "layer_plan": [{"index": i, "type": f"{kind}_mlp", "mixer": kind, "mlp": "dense"}
                       for i, kind in enumerate(config.layer_types)]
                      + ([{"index": "mtp", "type": "mtp_block", "layers": config.mtp_num_layers}]
                         if config.mtp_num_layers else []),
        "weights": weight_files,
        "tensors": sorted(shapes),
        "tokenizer": has_tokenizer,
        "generation": _generation_defaults(generation, config),
        "files": files,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return BuildResult(out, manifest, time.perf_counter() - t0, sorted(names - used))


def _generation_defaults(generation: dict, config: ModelConfig) -> dict:
    """Sampling defaults from the checkpoint's generation_config (greedy when it sets none)."""
    d = {"eos_token_ids": list(config.eos_token_ids)}
    if generation.get("do_sample"):
        for key in ("temperature", "top_p", "top_k"):
            if generation.get(key) is not None:
                d[key] = generation[key]
    return d
