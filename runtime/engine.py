"""Engine directories: the format constants, and loading one for the runtime.

An engine directory holds manifest.json, weights/*.safetensors (canonical names), and tokenizer
files. The runtime reads nothing else. It refuses an engine of another format version or target,
and one with a missing, truncated or corrupt file, saying what to rebuild.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from atlas.plugins_trt.quant_linear.reference import dequantize
from atlas.runtime.config import ModelConfig
from atlas.runtime.errors import EngineError

FORMAT_NAME = "atlas-engine"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def rebuild_hint(manifest: dict | None) -> str:
    source = (manifest or {}).get("build", {}).get("checkpoint")
    return f"rebuild it with: atlas-build {source} -o <engine-dir>" if source else "rebuild it with atlas-build"


@dataclass
class Engine:
    path: Path
    manifest: dict
    config: ModelConfig
    weights: dict[str, torch.Tensor]
    """Canonical name -> tensor, in the runtime's compute dtype."""

    @property
    def max_seq_len(self) -> int:
        return int(self.manifest["build"]["max_seq_len"])

    @property
    def generation_defaults(self) -> dict:
        return dict(self.manifest.get("generation", {}))

    @property
    def has_tokenizer(self) -> bool:
        return (self.path / "tokenizer.json").is_file()


def read_manifest(path: Path) -> dict:
    path = Path(path)
    manifest_path = path / MANIFEST
    if not path.is_dir():
        raise EngineError(f"no engine directory at {path}. Build one with: atlas-build -o {path}")
    if not manifest_path.is_file():
        raise EngineError(f"{path} has no {MANIFEST}, so it is not an Atlas engine. Build one with: atlas-build -o {path}")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as e:
        raise EngineError(f"{manifest_path} is corrupt ({e}); rebuild the engine with atlas-build.") from None
    if manifest.get("format") != FORMAT_NAME:
        raise EngineError(f"{manifest_path} is not an Atlas engine manifest; rebuild the engine with atlas-build.")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise EngineError(
            f"engine {path} has format version {version}, but this Atlas reads version {FORMAT_VERSION}; "
            f"{rebuild_hint(manifest)}"
        )
    return manifest


def check_files(path: Path, manifest: dict, verify_checksums: bool) -> None:
    """Every file the manifest lists exists with its size (and, if asked, its SHA-256)."""
    for name, meta in manifest.get("files", {}).items():
        file = path / name
        if not file.is_file():
            raise EngineError(f"engine file {name} is missing from {path}; {rebuild_hint(manifest)}")
        size = file.stat().st_size
        if size != meta["bytes"]:
            raise EngineError(
                f"engine file {name} has {size} bytes, the manifest says {meta['bytes']}: it is truncated or "
                f"was changed; {rebuild_hint(manifest)}"
            )
        if verify_checksums and sha256_file(file) != meta["sha256"]:
            raise EngineError(f"engine file {name} fails its SHA-256 check: it is corrupt; {rebuild_hint(manifest)}")


SCALE_SUFFIXES = (".weight_scale", ".weight_scale_2", ".input_scale")


def materialize(stored: dict[str, torch.Tensor], formats: dict[str, str]) -> dict[str, torch.Tensor]:
    """Stored tensors -> fp32 compute weights for the reference runtime (quantized linears dequantized).

    formats: canonical linear prefix -> storage format, from the manifest.
    """
    out = {k: v.float() for k, v in stored.items() if not k.endswith(SCALE_SUFFIXES)}
    for prefix, fmt in formats.items():
        if fmt not in ("float32", "bfloat16"):
            out[f"{prefix}.weight"] = dequantize(fmt, stored[f"{prefix}.weight"], stored.get(f"{prefix}.weight_scale"),
                                                 stored.get(f"{prefix}.weight_scale_2"))
    return out


def load_engine(path: str | Path, device: str = "cpu", verify_checksums: bool = True) -> Engine:
    """Load an engine for the reference runtime (fp32 compute on the CPU)."""
    path = Path(path)
    manifest = read_manifest(path)
    target = manifest.get("target", {}).get("device", "cpu")
    if target != device:
        raise EngineError(
            f"engine {path} was built for target '{target}', not '{device}'; "
            f"rebuild it with atlas-build --device {device}."
        )
    check_files(path, manifest, verify_checksums)
    try:
        config = ModelConfig.from_dict(manifest["config"])
    except (KeyError, TypeError, ValueError) as e:
        raise EngineError(f"engine {path} has an invalid model config ({e}); {rebuild_hint(manifest)}") from None
    stored: dict[str, torch.Tensor] = {}
    for name in manifest["weights"]:
        try:
            stored.update(load_file(str(path / name)))
        except (SafetensorError, OSError) as e:
            raise EngineError(f"cannot read engine file {name}: {e}; {rebuild_hint(manifest)}") from None
    weights = materialize(stored, manifest.get("weight_formats", {}))
    missing = sorted(set(manifest.get("tensors", [])) - set(weights))
    if missing:
        raise EngineError(f"engine {path} lacks tensors {missing[:5]}; {rebuild_hint(manifest)}")
    return Engine(path=path, manifest=manifest, config=config, weights=weights)
