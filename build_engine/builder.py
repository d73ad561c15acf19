"""atlas-build's pipeline: checkpoint -> canonical config and weights -> engine directory v1."""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from atlas.build_engine.checkpoints import Checkpoint, open_checkpoint
from atlas.build_engine.errors import BuildError, CheckpointError
from atlas.build_engine.families import family_for
from atlas.build_engine.convert import Converter
from atlas.build_engine.precision import FORMATS, PrecisionPlan
from atlas.plugins_trt.attention.splits import ATTN_SPLIT_TOKENS
from atlas.plugins_trt.pdl_order import WAIT_FIRST
from atlas.runtime.config import ModelConfig
from atlas.runtime.engine import FORMAT_NAME, FORMAT_VERSION, MANIFEST, sha256_file
from atlas.runtime.layout import canonical_shapes

DEFAULT_MAX_SEQ_LEN = 8192
LIBRARIES = ("torch", "safetensors", "tokenizers", "numpy", "transformers", "gguf")


@dataclass
class BuildConfig:
    checkpoint: str | None
    """Directory, .gguf file, `synthetic:<preset>`, built-in name, or None for the default model."""
    output: Path
    dtype: str = "auto"
    """auto | float32 | bfloat16 | fp8 | fp8_block | nvfp4: the linear weights' format (see precision.py).
    auto = float32 for the CPU target, or the checkpoint's own format when it is pre-quantized."""
    class_dtypes: dict[str, str] = field(default_factory=dict)
    """Per-class overrides, e.g. {"lm_head": "bfloat16"}."""
    max_seq_len: int | None = None
    """Longest sequence (prompt + generated) the engine serves; default min(model limit, 8192)."""
    device: str = "cpu"
    onnx: bool = True
    """Export onnx/<layer_type>.onnx (one graph per canonical layer type)."""
    autotune: bool = True
    """--device cuda on a GPU machine: time candidate kernel configs per shape and M bucket (else heuristic)."""
    kv_cache_dtype: str = "bfloat16"
    """--device cuda: the paged KV cache's format, bfloat16 or fp8 (E4M3, one scale per tensor)."""
    max_batch: int = 32
    """--device cuda: the most sequences a decode step runs (the largest captured batch bucket)."""
    pdl: bool | int = WAIT_FIRST
    """--device cuda: the step's small kernels with programmatic dependent launch (RunnerOptions.pdl:
    plugins_trt/pdl_order.WAIT_FIRST, LAUNCH_FIRST, or False for none)."""
    attn_split_tokens: int = ATTN_SPLIT_TOKENS
    """--device cuda: the decode attention's shortest split of the context (RunnerOptions.attn_split_tokens)."""
    tuning_cache: Path | None = None
    """--device cuda, autotuned: a JSON file of chosen kernel configurations that this build reuses and adds to
    (build_engine/tuning_cache.py)."""
    overwrite: bool = False
    progress: bool = True

    def __post_init__(self):
        self.output = Path(self.output)
        if self.dtype not in ("auto", *FORMATS):
            raise BuildError(f"--dtype must be one of auto, {', '.join(FORMATS)}; got '{self.dtype}'.")
        if self.device not in ("cpu", "cuda"):
            raise BuildError(f"--device must be cpu or cuda, got '{self.device}'.")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise BuildError(f"--max-seq-len must be at least 2, got {self.max_seq_len}.")
        if self.kv_cache_dtype not in ("bfloat16", "fp8"):
            raise BuildError(f"--kv-cache-dtype must be bfloat16 or fp8, got '{self.kv_cache_dtype}'.")
        if not 1 <= self.max_batch <= 128:
            raise BuildError(f"--max-batch must be in 1..128, got {self.max_batch}.")
        if self.attn_split_tokens < 1:
            raise BuildError(f"--attn-split-tokens must be positive, got {self.attn_split_tokens}.")
        self.precision(None)  # validate the class overrides now

    def precision(self, prequantized: str | None) -> PrecisionPlan:
        default = "float32" if self.device == "cpu" else "bfloat16"
        dtype = self.dtype if self.dtype != "auto" else (prequantized or default)
        return PrecisionPlan(dtype, dict(self.class_dtypes))


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


def _check_output(cfg: BuildConfig) -> None:
    out = cfg.output
    if out.exists() and any(out.iterdir()):
        if not (out / MANIFEST).is_file():
            raise BuildError(f"{out} exists and is not an Atlas engine; choose another -o directory.")
        if not cfg.overwrite:
            raise BuildError(f"{out} already holds an engine; pass --overwrite to replace it.")


def build(cfg: BuildConfig) -> BuildResult:
    """Build into a scratch directory beside the output and move it into place only when complete,
    so a failed build leaves no half-written engine and an engine it would replace stays intact."""
    _check_output(cfg)
    scratch = cfg.output.with_name(f".{cfg.output.name}.partial-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    (scratch / "weights").mkdir(parents=True)
    try:
        result = _build(cfg, scratch)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    if cfg.output.exists():
        shutil.rmtree(cfg.output)
    scratch.rename(cfg.output)
    result.manifest["name"] = cfg.output.name
    (cfg.output / MANIFEST).write_text(json.dumps(result.manifest, indent=2) + "\n")
    result.path = cfg.output
    return result


def _build(cfg: BuildConfig, out: Path) -> BuildResult:
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
    prequantized = None
    if ckpt.config.get("quantization_config"):
        from atlas.build_engine.quantize.prequantized import prequantized_format

        prequantized = prequantized_format(ckpt.config)
    precision = cfg.precision(prequantized)
    if config.tie_word_embeddings and precision.format_of("lm_head.weight", 2) != precision.format_of("embed.weight", 2):
        # A quantized LM head cannot share the float embedding table: store it as its own tensor.
        config = dataclasses.replace(config, tie_word_embeddings=False)
        plan.groups["head"]["lm_head.weight"] = plan.groups["embedding"]["embed.weight"]
    shapes = canonical_shapes(config)
    planned = {n for group in plan.groups.values() for n in group}
    if planned != set(shapes):
        raise BuildError(f"internal: weight plan and canonical layout disagree on {sorted(planned ^ set(shapes))[:5]}")

    on_gpu = cfg.device == "cuda" and torch.cuda.is_available()  # quantized there (see quantize)
    converter = Converter(ckpt, precision, prequantized, keep_source=prequantized is not None and cfg.dtype == "auto",
                          device="cuda" if on_gpu else "cpu")
    files: dict[str, dict] = {}
    weight_files: list[str] = []
    used: set[str] = set()
    groups = plan.groups.items()
    if cfg.progress:
        from tqdm import tqdm

        label = ckpt.source if ckpt.source.startswith("synthetic:") else Path(ckpt.source).name
        groups = tqdm(list(groups), desc=f"converting {label}", unit="group")
    for group, sources in groups:
        tensors = {}
        for canonical, src in sources.items():
            tensors.update(converter.convert(canonical, src, shapes[canonical]))
            used.update(src.hf_names)
            for n in src.hf_names:  # scales read alongside pre-quantized weights count as used
                stem = n.removesuffix(".weight")
                used.update(f"{stem}.{s}" for s in ("weight_scale", "weight_scale_2", "weight_scale_inv", "input_scale"))
        rel = f"weights/{group}.safetensors"
        save_file(tensors, str(out / rel))
        weight_files.append(rel)
    onnx_graphs = {}
    if cfg.onnx:
        from atlas.build_engine.onnx_export import export_onnx

        try:
            onnx_graphs = export_onnx(config, out / "onnx", converter.formats)
        except ValueError as e:
            raise BuildError(f"cannot export the ONNX graphs: {e}. Pass --no-onnx to build without them.") from None
    kernels, linear_kernels, gdn_kernels, step_kernels, target = {}, {}, {}, {}, {"device": cfg.device}
    if cfg.device == "cuda":
        from atlas.runtime.model_runner import RunnerOptions

        options = RunnerOptions(max_batch=cfg.max_batch, kv_cache_dtype=cfg.kv_cache_dtype, max_seq_len=max_seq_len,
                                pdl=cfg.pdl, attn_split_tokens=cfg.attn_split_tokens)
        kernels, linear_kernels, gdn_kernels, step_kernels, target = _compile_kernels(
            config, converter.formats, out, cfg.autotune, options, cfg.tuning_cache)
    has_tokenizer = ckpt.export_tokenizer(out)
    written = sorted(p for p in out.rglob("*") if p.is_file())
    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:  # hashlib releases the GIL: 27B hashes in seconds
        for file, digest in zip(written, pool.map(sha256_file, written)):
            files[str(file.relative_to(out))] = {"bytes": file.stat().st_size, "sha256": digest}

    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "name": out.name,
        "family": config.family,
        "config": config.to_dict(),
        "build": {
            "checkpoint": ckpt.source,
            "dtype": precision.dtype,
            "class_dtypes": precision.overrides,
            "max_seq_len": max_seq_len,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        },
        "target": target,
        "libraries": _versions(),
        "layer_plan": [{"index": i, "type": f"{kind}_mlp", "mixer": kind, "mlp": "dense"}
                       for i, kind in enumerate(config.layer_types)]
                      + ([{"index": "mtp", "type": "mtp_block", "layers": config.mtp_num_layers}]
                         if config.mtp_num_layers else []),
        "weights": weight_files,
        "tensors": sorted(shapes),
        "weight_formats": converter.formats,
        "onnx": onnx_graphs,
        "kernels": kernels,
        "linear_kernels": linear_kernels,
        **({"gdn_kernels": gdn_kernels} if gdn_kernels else {}),
        **({"step_kernels": step_kernels} if step_kernels else {}),
        "tokenizer": has_tokenizer,
        "generation": _generation_defaults(generation, config),
        "files": files,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return BuildResult(out, manifest, time.perf_counter() - t0, sorted(names - used))


def _compile_kernels(config: ModelConfig, formats: dict[str, str], out: Path, autotune: bool,
                     options, tuning_cache: Path | None = None) -> tuple[dict, dict, dict, dict, dict]:
    """Every GPU kernel the engine needs, compiled for sm_90 into one table; the quantized linears' kernels
    autotuned when this machine has the GPU. options: the model runner's (RunnerOptions), which fix the step
    kernels. Returns (kernel table, linear plan, GDN plan, step kernels, target)."""
    from atlas.build_engine.gdn_kernels import compile_gdn_kernels
    from atlas.build_engine.kernels import write_kernels
    from atlas.build_engine.linear_kernels import linear_kernel_list
    from atlas.build_engine.step_kernels import compile_step_kernels

    arch = 90
    tune = autotune and torch.cuda.is_available()
    if tune:
        major, minor = torch.cuda.get_device_capability()
        arch = 10 * major + minor
        if arch != 90:
            raise BuildError(f"this GPU is sm_{arch}; Atlas's kernels target Hopper (sm_90) for now.")
    cache = None
    if tune and tuning_cache is not None:
        from atlas.build_engine.tuning_cache import TuningCache
        cache = TuningCache.for_this_gpu(tuning_cache)
    compiled, plan = linear_kernel_list(config, formats, tune=tune, cache=cache)
    gdn_compiled, gdn_plan = compile_gdn_kernels(config, out / "kernels", arch=arch)
    compiled += gdn_compiled
    step_compiled, step_plan = compile_step_kernels(config, options, arch=arch)
    compiled += step_compiled
    table = write_kernels(compiled, out / "kernels") if compiled else {}
    target = {"device": "cuda", "arch": arch, "autotuned": tune}
    if cache is not None:
        target["tuning_cache"] = {"hits": cache.hits, "misses": cache.misses}
    return table, plan, gdn_plan, step_plan, target


def _generation_defaults(generation: dict, config: ModelConfig) -> dict:
    """Sampling defaults from the checkpoint's generation_config (greedy when it sets none)."""
    d = {"eos_token_ids": list(config.eos_token_ids)}
    if generation.get("do_sample"):
        for key in ("temperature", "top_p", "top_k"):
            if generation.get(key) is not None:
                d[key] = generation[key]
    return d
