"""Tuning cache: the kernel configurations an autotuned build chose, kept in a JSON file that later builds reuse
(like TensorRT's timing cache), so that building the same shapes again on the same kind of GPU times nothing.

    atlas-build CKPT --device cuda --tuning-cache tuning.json   # reads the file if present, adds what it tuned

An entry is keyed by everything its choice depends on: the GPU's name, the Triton version, a digest of the GEMV /
GEMM kernels' sources, the format, the weight shape and the M bucket. An entry whose key does not match exactly
(another GPU, an upgraded Triton, an edited kernel) is not used; the build times the candidates again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from atlas.build_engine.errors import BuildError

FORMAT = "atlas-tuning-cache"
VERSION = 1


def kernel_digest() -> str:
    """sha256 (first 16 hex digits) of the quantized-linear kernels' sources and the candidate lists."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted((root / "plugins_trt" / "quant_linear").glob("*.py")) + [Path(__file__).with_name(
            "linear_kernels.py")]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


class TuningCache:
    """Chosen configurations by key; `get` / `put` per (format, M bucket, N, K) on the current GPU."""

    def __init__(self, path: Path | None, device_name: str, triton_version: str):
        self.path = Path(path) if path is not None else None
        self.prefix = f"{device_name}|triton {triton_version}|kernels {kernel_digest()}"
        self.entries: dict[str, dict] = {}
        self.hits = self.misses = 0
        if self.path is not None and self.path.is_file():
            try:
                data = json.loads(self.path.read_text())
                if data.get("format") != FORMAT or data.get("version") != VERSION:
                    raise ValueError(f"not an {FORMAT} file of version {VERSION}")
                self.entries = dict(data["entries"])
            except (ValueError, KeyError, TypeError) as e:
                raise BuildError(f"--tuning-cache {self.path} cannot be read ({e}); delete it or pass another "
                                 f"path, and the build will time the kernels again.") from None

    @classmethod
    def for_this_gpu(cls, path: Path | None) -> "TuningCache":
        import torch
        import triton

        return cls(path, torch.cuda.get_device_name(), triton.__version__)

    def key(self, fmt: str, bucket: int, n: int, k: int) -> str:
        return f"{self.prefix}|{fmt}:{n}x{k}|M{bucket}"

    def get(self, fmt: str, bucket: int, n: int, k: int) -> dict | None:
        cfg = self.entries.get(self.key(fmt, bucket, n, k))
        if cfg is None:
            self.misses += 1
        else:
            self.hits += 1
        return dict(cfg) if cfg is not None else None

    def put(self, fmt: str, bucket: int, n: int, k: int, cfg: dict) -> None:
        """Add a timed choice and write the file at once (a build stopped midway keeps what it timed)."""
        self.entries[self.key(fmt, bucket, n, k)] = dict(cfg)
        self.save()

    def save(self) -> None:
        """Write the file (entries of other GPUs and versions are kept); nothing without a path."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"format": FORMAT, "version": VERSION,
                                   "entries": dict(sorted(self.entries.items()))}, indent=1) + "\n")
        tmp.replace(self.path)
