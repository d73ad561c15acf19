"""An engine built with `atlas-build --device cuda`, loaded onto the GPU: weights in their stored formats, the kernel
table, the linears' kernel plans and the step kernels' instances. Nothing is compiled or converted beyond the dtype
of unquantized tensors: bf16 (the activations' dtype), except the Gated DeltaNet vectors the kernels read in fp32
(GDN_FP32)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from atlas.plugins_trt.launch import AotKernels
from atlas.runtime.config import ModelConfig
from atlas.runtime.engine import Engine, check_files, read_manifest, rebuild_hint
from atlas.runtime.errors import EngineError
from atlas.runtime.kernels import KernelTable
from atlas.runtime.layers.linear_cuda import CudaLinear

ACT_DTYPE = torch.bfloat16
SCALES = ("weight_scale", "weight_scale_2")
GDN_FP32 = (".gdn.A_log", ".gdn.dt_bias", ".gdn.norm.weight")
"""Name endings of the GDN tensors kept fp32: the decay and gate constants and the gated norm's weight, which the
GDN kernels were compiled to read as fp32 (build_engine/gdn_kernels.py, step_kernels.py); the conv weight is bf16."""


def loaded_dtype(key: str, stored: torch.dtype, quantized: set[str]) -> torch.dtype:
    """The dtype an engine tensor is kept in on the GPU: as stored for a quantized linear's weight and scales
    (quantized: those linears' prefixes) and for integer tensors, fp32 for GDN_FP32, bf16 for every other float."""
    prefix, _, leaf = key.rpartition(".")
    if (prefix in quantized and leaf in ("weight", *SCALES)) or not stored.is_floating_point:
        return stored
    return torch.float32 if key.endswith(GDN_FP32) else ACT_DTYPE


@dataclass
class CudaEngine(Engine):
    """An engine on the GPU. weights: canonical name -> GPU tensor, quantized linears as stored (packed weight +
    scales), GDN_FP32 tensors fp32, the rest bf16."""

    kernels: KernelTable | None = None
    aot: AotKernels | None = None
    """The step kernels' compiled instances (manifest["step_kernels"]["instances"])."""

    @property
    def runtime_options(self) -> dict:
        """What the step kernels were built for: block_size, kv_cache_dtype, max_batch."""
        return self.manifest["step_kernels"]["options"]

    def linear(self, weights: dict[str, torch.Tensor], prefix: str) -> CudaLinear:
        """The linear `prefix` (weights: this engine's, or {"lm_head.weight": embedding} for a tied head)."""
        fmt = self.manifest.get("weight_formats", {}).get(prefix, "bfloat16")
        tensors = {"weight": weights[f"{prefix}.weight"]}
        tensors.update({s: weights[f"{prefix}.{s}"] for s in SCALES if f"{prefix}.{s}" in weights})
        plan = None
        if fmt in ("nvfp4", "fp8"):
            n, k = tensors["weight"].shape[0], tensors["weight"].shape[1] * (2 if fmt == "nvfp4" else 1)
            plan = self.manifest.get("linear_kernels", {}).get(f"{fmt}:{n}x{k}")
        return CudaLinear(fmt, tensors, self.kernels, plan, weights.get(f"{prefix}.bias"))


def load_cuda_engine(path: str | Path, verify_checksums: bool = True) -> CudaEngine:
    path = Path(path)
    manifest = read_manifest(path)
    target = manifest.get("target", {})
    if target.get("device") != "cuda":
        raise EngineError(f"engine {path} was built for target '{target.get('device', 'cpu')}', not 'cuda'; rebuild "
                          f"it with atlas-build --device cuda, or run it on the CPU path.")
    if not torch.cuda.is_available():
        raise EngineError(f"engine {path} was built for target 'cuda' and no CUDA GPU is visible here; run it on a GPU "
                          f"machine, or rebuild it with atlas-build --device cpu.")
    if "step_kernels" not in manifest:
        raise EngineError(f"engine {path} has no step kernels (built by an older atlas-build); "
                          f"{rebuild_hint(manifest)} --device cuda")
    check_files(path, manifest, verify_checksums)
    try:
        config = ModelConfig.from_dict(manifest["config"])
    except (KeyError, TypeError, ValueError) as e:
        raise EngineError(f"engine {path} has an invalid model config ({e}); {rebuild_hint(manifest)}") from None
    kernels = KernelTable.load(path, manifest["kernels"])
    quantized = {p for p, f in manifest.get("weight_formats", {}).items() if f in ("nvfp4", "fp8")}
    weights: dict[str, torch.Tensor] = {}
    for name in manifest["weights"]:
        try:
            stored = load_file(str(path / name))
        except (SafetensorError, OSError) as e:
            raise EngineError(f"cannot read engine file {name}: {e}; {rebuild_hint(manifest)}") from None
        for key, t in stored.items():
            weights[key] = t.to(loaded_dtype(key, t.dtype, quantized)).cuda()
    aot = AotKernels(kernels, manifest["step_kernels"]["instances"])
    return CudaEngine(path, manifest, config, weights, kernels, aot)
