"""Tuning cache: the kernel configurations an autotuned build chose, kept in a JSON file that later builds reuse
(like TensorRT's timing cache), so that building the same shapes again on the same kind of GPU times nothing.

    atlas-build CKPT --device cuda --tuning-cache tuning.json   # reads the file if present, adds what it tuned

An entry is keyed by everything its choice depends on: the GPU's name, the Triton version, a digest of the GEMV /
GEMM kernels (`kernel_digest`), the format, the weight shape, the M bucket, and a digest of the candidates the search
timed for that case (their configurations and the fused epilogue they were timed with). An entry whose key does not
match exactly (another GPU, an upgraded Triton, an edited kernel, another candidate list) is not used; the build
times the candidates again.

The kernel digest covers the device code only: the source of every @triton.jit / @gluon.jit function (and
constexpr function) that the quantized-linear modules hold or import, with the constexpr globals they read, and the
weight layout (layout.py). Host code (launchers, buffers, the search's timing) and line numbers are not in it, so a
host-side edit keeps the entries; one that changes what a candidate does on the GPU without changing its source
(a grid, a launch option) does not retune by itself: pass a new --tuning-cache file for that.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from atlas.build_engine.errors import BuildError

FORMAT = "atlas-tuning-cache"
VERSION = 1


def kernel_digest() -> str:
    """sha256 (first 16 hex digits) of the quantized-linear device code (see the module docstring)."""
    h = hashlib.sha256()
    for name, src in sorted(_device_sources().items()):
        h.update(f"{name}\n{src}\n".encode())
    return h.hexdigest()[:16]


def _device_sources() -> dict[str, str]:
    """{qualified name: text} for every JIT function of the quantized-linear modules and of the modules they import
    JIT functions from (to a fixed point), each with the constexpr globals it names; and layout.py whole. The same
    with Triton's interpreter on (TRITON_INTERPRET=1 makes triton.jit functions InterpretedFunction objects)."""
    import importlib
    import inspect
    import pkgutil
    import sys

    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITCallable

    from atlas.plugins_trt import quant_linear
    from atlas.plugins_trt.quant_linear import layout

    modules = [importlib.import_module(f"{quant_linear.__name__}.{m.name}")
               for m in pkgutil.iter_modules(quant_linear.__path__)]
    out, seen = {"layout.py": Path(layout.__file__).read_text()}, set()
    while modules:
        module = modules.pop()
        if module.__name__ in seen:
            continue
        seen.add(module.__name__)
        for obj in vars(module).values():
            if not isinstance(obj, (JITCallable, InterpretedFunction)):
                continue
            fn = obj.fn
            home = sys.modules[fn.__module__]
            if home.__name__ not in seen:
                modules.append(home)
            if home is not module:
                continue
            src = inspect.getsource(fn)
            src = src[src.index("def "):]  # as Triton keeps it: from the def (no decorators)
            used = sorted((name, repr(fn.__globals__[name])) for name in fn.__code__.co_names
                          if isinstance(fn.__globals__.get(name), tl.constexpr))
            out[f"{module.__name__}.{fn.__qualname__}"] = src + "".join(f"\n{g} = {v}" for g, v in used)
    return out


def candidates_digest(candidates: list[dict], then: str | None) -> str:
    """sha256 (first 12 hex digits) of one case's candidate configurations, in order, and what they were timed with
    (a fused epilogue: "silu", "norm", or None)."""
    text = json.dumps({"candidates": candidates, "then": then}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


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

    def key(self, fmt: str, bucket: int, n: int, k: int, candidates: list[dict], then: str | None = None) -> str:
        return f"{self.prefix}|{fmt}:{n}x{k}|M{bucket}|candidates {candidates_digest(candidates, then)}"

    def get(self, fmt: str, bucket: int, n: int, k: int, candidates: list[dict],
            then: str | None = None) -> dict | None:
        """The configuration chosen from exactly these candidates for this case, or None (counted as a miss)."""
        cfg = self.entries.get(self.key(fmt, bucket, n, k, candidates, then))
        if cfg is None:
            self.misses += 1
        else:
            self.hits += 1
        return dict(cfg) if cfg is not None else None

    def put(self, fmt: str, bucket: int, n: int, k: int, candidates: list[dict], then: str | None,
            cfg: dict) -> None:
        """Add a timed choice and write the file at once (a build stopped midway keeps what it timed)."""
        self.entries[self.key(fmt, bucket, n, k, candidates, then)] = dict(cfg)
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
