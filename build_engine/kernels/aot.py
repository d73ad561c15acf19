"""Ahead-of-time Triton kernels: compile (and autotune) at build, write cubins and their table.

Every GPU plugin describes each kernel instance it needs as a `KernelSpec` for one fixed shape
(sizes that vary at run time stay int arguments). `compile_kernel` turns a spec into an sm_<arch>
cubin with Triton, which needs no GPU; `write_kernels` writes the cubins into the engine's
`kernels/` folder and returns the manifest's kernel table (format: atlas.runtime.kernels);
`autotune` picks among candidate specs by timing them on a GPU. The runtime launches the cubins
with the CUDA driver API and never compiles.

Grids: a spec records the grid of the shape it was built for (`grid`, 1 to 3 ints) and optionally
a formula per dimension over its int parameters and constexprs (`grid_formula`, e.g.
("cdiv(n, BLOCK)",)), which the runtime evaluates from a launch's int arguments. A caller that
knows the grid passes it to `KernelTable.launch` and neither is used.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import triton
import triton.testing
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from atlas.build_engine.errors import BuildError
from atlas.runtime.kernels import SCALAR_CTYPES, SUPPORTED_TRITON, TABLE_FORMAT, parse_grid_formula

# Opt-in dynamic shared memory per block (bytes), by compute capability: more fails to launch.
MAX_SHARED = {80: 166912, 86: 101376, 89: 101376, 90: 232448}
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


class KernelCompileError(BuildError):
    """A kernel spec Triton cannot compile, or whose result cannot run on the target."""


@dataclass
class KernelSpec:
    """One kernel instance to compile: a @triton.jit function, its types, constexprs and launch shape."""

    fn: Any
    """The @triton.jit function (triton.runtime.JITFunction)."""
    name: str
    """Unique key in the engine and the cubin's file name, e.g. "nvfp4_gemv.N4096.K4096.M1"."""
    signature: dict[str, str]
    """Every parameter of fn in order -> Triton type: "*bf16", "i32", "fp32", ..., or "constexpr"."""
    constexprs: dict[str, int | float | bool] = field(default_factory=dict)
    """A value for every parameter typed "constexpr"."""
    num_warps: int = 4
    num_stages: int = 3
    grid: tuple[int, ...] = (1,)
    """Grid (1 to 3 ints) of the shape this instance is built for."""
    grid_formula: tuple[str, ...] | None = None
    """Optional, per grid dimension: an integer expression over int params and constexprs, e.g. "cdiv(n, BLOCK)"."""
    divisible_by_16: tuple[str, ...] = ()
    """Params the kernel may assume are multiples of 16 (pointers: 16-byte aligned), which lets Triton
    vectorise and pipeline loads; the runtime checks them at every launch."""
    maxnreg: int | None = None
    """A register cap for the compiler (more programs an SM), or None."""

    def __post_init__(self):
        if not _NAME.match(self.name):
            raise KernelCompileError(f"kernel name {self.name!r}: use letters, digits, '.', '_' and '-' only")
        arg_names = list(getattr(self.fn, "arg_names", []))
        if list(self.signature) != arg_names:
            raise KernelCompileError(f"{self.name}: signature names {list(self.signature)} are not the "
                                     f"parameters of {getattr(self.fn, '__name__', self.fn)}, {arg_names}")
        declared = {k for k, ty in self.signature.items() if ty == "constexpr"}
        if declared != set(self.constexprs):
            raise KernelCompileError(f"{self.name}: constexprs {sorted(self.constexprs)} must give exactly the "
                                     f"parameters typed constexpr, {sorted(declared)}")
        for param, ty in self.params:
            if not ty.startswith("*") and ty not in SCALAR_CTYPES:
                raise KernelCompileError(f"{self.name}: parameter {param} has type {ty!r}, which the runtime "
                                         f"cannot pass (pointers, {', '.join(SCALAR_CTYPES)})")
        unknown = set(self.divisible_by_16) - {p for p, _ in self.params}
        if unknown:
            raise KernelCompileError(f"{self.name}: divisible_by_16 names {sorted(unknown)}, not runtime parameters")
        self.grid = tuple(int(g) for g in self.grid)
        if not 1 <= len(self.grid) <= 3 or min(self.grid) < 1:
            raise KernelCompileError(f"{self.name}: grid {self.grid} is not 1 to 3 positive ints")
        if self.grid_formula is not None:
            self.grid_formula = tuple(self.grid_formula)
            if len(self.grid_formula) != len(self.grid):
                raise KernelCompileError(f"{self.name}: grid_formula {self.grid_formula} has "
                                         f"{len(self.grid_formula)} dimensions, grid has {len(self.grid)}")
            names = {p for p, ty in self.params if not ty.startswith("*")} | set(self.constexprs)
            for expr in self.grid_formula:
                try:
                    parse_grid_formula(expr, names)
                except ValueError as e:
                    raise KernelCompileError(f"{self.name}: {e}") from None

    @property
    def params(self) -> list[tuple[str, str]]:
        """(name, type) of the launch arguments in order: the signature less its constexprs."""
        return [(k, ty) for k, ty in self.signature.items() if ty != "constexpr"]


@dataclass
class CompiledKernel:
    """A spec compiled for one architecture."""

    spec: KernelSpec
    arch: int
    cubin: bytes
    metadata: Any
    """Triton's KernelMetadata (name, shared, num_warps, global/profile scratch sizes, triton_version, ...)."""


def compile_kernel(spec: KernelSpec, arch: int = 90) -> CompiledKernel:
    """Compile `spec` into an sm_<arch> cubin; needs no GPU."""
    index = {k: i for i, k in enumerate(spec.signature)}
    attrs = {(index[k],): [["tt.divisibility", 16]] for k in spec.divisible_by_16}
    source = ASTSource
    if getattr(spec.fn, "is_gluon", lambda: False)():  # a @gluon.jit kernel (explicit layouts)
        from triton.experimental.gluon._runtime import GluonASTSource as source
    src = source(fn=spec.fn, signature=spec.signature, constexprs=spec.constexprs, attrs=attrs)
    try:
        options = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
        if spec.maxnreg:
            options["maxnreg"] = spec.maxnreg
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    except Exception as e:  # Triton raises CompilationError, PTXASError, assertion errors, ...
        raise KernelCompileError(f"{spec.name}: Triton could not compile it for sm_{arch}: "
                                 f"{type(e).__name__}: {e}") from e
    md = compiled.metadata
    if md.shared > MAX_SHARED.get(arch, 48 * 1024):
        raise KernelCompileError(f"{spec.name}: needs {md.shared} bytes of shared memory, sm_{arch} has "
                                 f"{MAX_SHARED.get(arch, 48 * 1024)}: fewer stages or smaller blocks")
    unsupported = {"num_ctas": md.num_ctas != 1, "launch_cooperative_grid": md.launch_cooperative_grid,
                   "launch_pdl": md.launch_pdl, "tensordesc_meta": bool(md.tensordesc_meta),
                   "profile_scratch_size": md.profile_scratch_size > 0}
    if any(unsupported.values()):
        raise KernelCompileError(f"{spec.name}: the runtime launcher does not support "
                                 f"{[k for k, v in unsupported.items() if v]}")
    if not md.triton_version.startswith(SUPPORTED_TRITON):
        raise KernelCompileError(f"{spec.name}: compiled by Triton {md.triton_version}; the runtime launches "
                                 f"the ABI of Triton {SUPPORTED_TRITON}")
    return CompiledKernel(spec, arch, compiled.asm["cubin"], md)


def compile_kernels(specs: list[KernelSpec], arch: int = 90, workers: int | None = None) -> list[CompiledKernel]:
    """compile_kernel over `specs` in threads, in their order (Triton releases the GIL while it lowers and runs
    ptxas, and compiles in threads itself under triton.AsyncCompileMode); the first failure is raised."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    workers = workers or min(16, os.cpu_count() or 1)
    if workers < 2 or len(specs) < 2:
        return [compile_kernel(s, arch) for s in specs]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda s: _compile_in_thread(s, arch), specs))


def _ast_race(e: BaseException | None) -> bool:
    """Whether e (or what caused it) is CPython's spurious "AST constructor recursion depth mismatch" SystemError:
    the ast module's recursion counter is shared by threads parsing at once (python/cpython#106905; seen in CI,
    2026-12-07, on a Gluon kernel's source). Nothing is wrong with the kernel."""
    while e is not None:
        if isinstance(e, SystemError) and "recursion depth mismatch" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


def _compile_in_thread(spec: KernelSpec, arch: int, attempts: int = 3) -> CompiledKernel:
    """compile_kernel, compiled again where the failure was the threads' ast race (_ast_race), up to `attempts`."""
    for _ in range(attempts - 1):
        try:
            return compile_kernel(spec, arch)
        except KernelCompileError as e:
            if not _ast_race(e):
                raise
    return compile_kernel(spec, arch)


def write_kernels(compiled: list[CompiledKernel], out_dir: Path) -> dict:
    """Write `out_dir/sm_<arch>/<name>.cubin` for each kernel; return the manifest's kernel table."""
    archs = {c.arch for c in compiled}
    versions = {c.metadata.triton_version for c in compiled}
    if len(archs) > 1 or len(versions) > 1:
        raise KernelCompileError(f"one engine's kernels share one arch and Triton; got {archs}, {versions}")
    names = [c.spec.name for c in compiled]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise KernelCompileError(f"kernel names must be unique; repeated: {duplicates}")
    arch = archs.pop() if archs else None
    table = {"format": TABLE_FORMAT, "arch": arch, "triton_version": versions.pop() if versions else None,
             "kernels": {}}
    for c in compiled:
        spec, md = c.spec, c.metadata
        rel = f"sm_{c.arch}/{spec.name}.cubin"
        path = Path(out_dir) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(c.cubin)
        table["kernels"][spec.name] = {
            "function": md.name,
            "cubin": rel,
            "sha256": hashlib.sha256(c.cubin).hexdigest(),
            "params": [list(p) for p in spec.params],
            "divisible_by_16": list(spec.divisible_by_16),
            "constexprs": dict(spec.constexprs),
            "num_warps": md.num_warps,
            "num_stages": md.num_stages,
            "shared": md.shared,
            "global_scratch": [md.global_scratch_size, md.global_scratch_align],
            "profile_scratch": [md.profile_scratch_size, md.profile_scratch_align],
            "grid": list(spec.grid) + [1] * (3 - len(spec.grid)),
            "grid_formula": list(spec.grid_formula) + ["1"] * (3 - len(spec.grid)) if spec.grid_formula else None,
            "triton_version": md.triton_version,
        }
    return table


def autotune(candidates: list[KernelSpec], run: Callable[[KernelSpec], None],
             warmup_ms: float = 25, rep_ms: float = 100) -> tuple[KernelSpec, list[dict]]:
    """Time each candidate on the current GPU and return (fastest, timings).

    run(spec) launches spec.fn through Triton's JIT on real tensors, with spec's constexprs,
    num_warps and num_stages. Each is timed by triton.testing.do_bench (median, after warm-up).
    A candidate that fails (compile error, out of resources) is skipped and its reason recorded.
    The JIT specialises on alignment by itself; give the winner divisible_by_16 to match.
    timings: [{"name", "constexprs", "num_warps", "num_stages", "ms" (None if it failed),
    "error" (None if it ran)}], in candidate order (candidates may share a name).
    """
    if not torch.cuda.is_available():
        raise RuntimeError("autotune times kernels on a GPU and none is visible: run atlas-build --device cuda "
                           "on the CUDA machine the engine is for")
    timings = []
    for spec in candidates:
        row = {"name": spec.name, "constexprs": dict(spec.constexprs), "num_warps": spec.num_warps,
               "num_stages": spec.num_stages, "ms": None, "error": None}
        try:
            row["ms"] = float(triton.testing.do_bench(lambda: run(spec), warmup=warmup_ms, rep=rep_ms,
                                                      return_mode="median"))
        except Exception as e:  # noqa: BLE001 — any failing candidate is skipped, with its reason kept
            row["error"] = f"{type(e).__name__}: {e}"
        timings.append(row)
    ran = [(t["ms"], spec) for t, spec in zip(timings, candidates) if t["ms"] is not None]
    if not ran:
        reasons = "; ".join(f"{t['name']} {t['constexprs']} warps={t['num_warps']}: {t['error']}" for t in timings)
        raise KernelCompileError(f"no autotune candidate ran: {reasons}")
    return min(ran, key=lambda r: r[0])[1], timings
