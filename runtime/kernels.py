"""An engine's ahead-of-time compiled GPU kernels: the table format, and launching them.

`atlas-build` compiles every Triton kernel an engine needs into `kernels/sm_<arch>/<name>.cubin`
and records one table entry per kernel in the manifest (atlas.build_engine.kernels writes it).
Here the runtime loads those cubins with the CUDA driver API (cuda-python) and launches them on
torch's current stream, so the launches record into CUDA graphs. Nothing here imports Triton:
at run time Atlas compiles nothing.

The table (JSON, `manifest["kernels"]`):
    {"format": 1, "arch": 90, "triton_version": "3.6.0",
     "kernels": {name: {
        "function": "scale_add",            # the cubin's entry point (Triton's metadata.name)
        "cubin": "sm_90/<name>.cubin",      # relative to the engine's kernels/ folder
        "sha256": "...",
        "params": [["x_ptr", "*fp32"], ["n", "i32"], ...],   # launch order, constexprs removed
        "divisible_by_16": ["x_ptr", "n"],  # compiled assuming these are multiples of 16 (bytes for pointers)
        "constexprs": {"BLOCK": 1024},
        "num_warps": 4, "num_stages": 3,
        "shared": 98304,                    # dynamic shared memory bytes
        "global_scratch": [size, align], "profile_scratch": [size, align],  # bytes per program
        "grid": [8, 1, 1],                  # the grid of the shape the kernel was built for
        "grid_formula": ["cdiv(n, BLOCK)", "1", "1"] | null,  # over int params and constexprs
        "triton_version": "3.6.0"}}}

Triton 3.6's kernel ABI, which `launch` implements: the kernel's own parameters with constexprs
removed, then two pointers (global scratch, profile scratch: 0 when their size is 0, else
grid-size x size bytes); block = 32 * num_warps threads; dynamic shared memory = `shared`, which
above 48 KB must be allowed with cuFuncSetAttribute first.
"""

from __future__ import annotations

import ast
import ctypes
import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from atlas.runtime.errors import EngineError
from atlas.runtime.knobs import knob

KERNELS_DIR = "kernels"
TABLE_FORMAT = 1
# Triton versions whose launch ABI (parameter order, the two scratch pointers) `launch` implements.
SUPPORTED_TRITON = ("3.6.",)
STATIC_SHARED_LIMIT = 48 * 1024
SHARED_PREFERENCE = "large"
"""Which kernels a KernelTable loads with the carveout preferring shared memory (KernelTable._prefer_shared): "large"
(those over STATIC_SHARED_LIMIT, as Triton's launcher does), "all", or "none" (the dynamic limit alone, as Atlas
loaded them before 2026-12-08). Read when a table is made (shared_preference sets it for a block); an experiment knob
for tools/bench_decode.py --carveout-ab, which times the others beside the default in the same run."""


def shared_preference(mode: str):
    """KernelTables made inside take `mode` as their SHARED_PREFERENCE (an A/B of the loadings in one process; a
    context manager)."""
    return knob(__name__, "SHARED_PREFERENCE", mode)


SCALAR_CTYPES = {
    "i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
    "i64": ctypes.c_int64, "u1": ctypes.c_uint8, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16,
    "u32": ctypes.c_uint32, "u64": ctypes.c_uint64, "fp32": ctypes.c_float, "f32": ctypes.c_float,
    "fp64": ctypes.c_double,
}
FLOAT_TYPES = ("fp32", "f32", "fp64")


class CudaError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the CUresult."""


# ---- grid formulas: tiny integer expressions such as "cdiv(n, BLOCK)" or "B * H" ----------------

_FORMULA_NODES = (ast.Expression, ast.BinOp, ast.Name, ast.Load, ast.Constant, ast.Call,
                  ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def parse_grid_formula(expr: str, names: set[str]):
    """Compile one grid dimension's formula; only ints, the given names, + - * // % and cdiv(a, b)."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"grid formula {expr!r} is not an expression: {e.msg}") from None
    for node in ast.walk(tree):
        if not isinstance(node, _FORMULA_NODES):
            raise ValueError(f"grid formula {expr!r}: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Constant) and not isinstance(node.value, int):
            raise ValueError(f"grid formula {expr!r}: only integer constants are allowed")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id == "cdiv"):
            raise ValueError(f"grid formula {expr!r}: the only function is cdiv(a, b)")
        if isinstance(node, ast.Name) and node.id != "cdiv" and node.id not in names:
            raise ValueError(f"grid formula {expr!r}: unknown name {node.id!r} (known: {sorted(names)})")
    return compile(tree, "<grid>", "eval")


# ---- the driver ----------------------------------------------------------------------------------

def _driver():
    try:
        from cuda.bindings import driver  # cuda-python 12.6+ / 13.x
    except ImportError:
        try:
            from cuda import cuda as driver  # older cuda-python
        except ImportError:
            raise EngineError("launching GPU kernels needs cuda-python: pip install cuda-python") from None
    return driver


def _check(cu, call, *args):
    """Call a cuda-python driver function; raise CudaError unless it returned CUDA_SUCCESS."""
    err, *out = call(*args)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        raise CudaError(f"{call.__name__} failed: {name.decode() if name else err}")
    return out[0] if len(out) == 1 else tuple(out)


@dataclass
class _Kernel:
    """One table entry, checked; the CUDA function is loaded on first use."""

    name: str
    entry: dict
    cubin: bytes
    formula: list | None
    function: object = None
    scratch: torch.Tensor | None = None


class KernelTable:
    """The compiled kernels of one engine, launched by name."""

    def __init__(self, kernels: dict[str, _Kernel], arch: int):
        self.kernels = kernels
        self.arch = arch
        self._cu = None
        self._no_pdl = False
        self._retired: list[torch.Tensor] = []  # outgrown scratch buffers, which captured graphs may still use
        if SHARED_PREFERENCE not in ("large", "all", "none"):
            raise ValueError(f"SHARED_PREFERENCE must be large, all or none, got {SHARED_PREFERENCE!r}")
        self.shared_preference = SHARED_PREFERENCE

    @classmethod
    def load(cls, engine_dir: Path, table: dict, arch: int | None = None) -> "KernelTable":
        """Check `table` (manifest["kernels"]) against this machine and read and verify every cubin.

        arch: the device's compute capability as 10*major + minor; None asks the current CUDA device.
        """
        if table.get("format") != TABLE_FORMAT:
            raise EngineError(f"kernel table format {table.get('format')} is not {TABLE_FORMAT}, the one this "
                              f"runtime reads: rebuild the engine with this version of atlas-build")
        if arch is None:
            major, minor = torch.cuda.get_device_capability()
            arch = 10 * major + minor
        if table.get("arch") != arch:
            raise EngineError(f"engine built for sm_{table.get('arch')}, this GPU is sm_{arch}: "
                              f"rebuild with atlas-build --device cuda on this machine")
        kernels = {}
        for name, entry in table.get("kernels", {}).items():
            version = entry.get("triton_version", "")
            if table.get("triton_version") != version or not version.startswith(SUPPORTED_TRITON):
                raise EngineError(f"kernel {name} was compiled by Triton {version or '?'}; this runtime launches "
                                  f"kernels of Triton {' or '.join(v + 'x' for v in SUPPORTED_TRITON)}: rebuild "
                                  f"with atlas-build --device cuda using that Triton")
            path = Path(engine_dir) / KERNELS_DIR / entry["cubin"]
            if not path.is_file():
                raise EngineError(f"kernel file {path} is missing: rebuild the engine with atlas-build --device cuda")
            cubin = path.read_bytes()
            if hashlib.sha256(cubin).hexdigest() != entry["sha256"]:
                raise EngineError(f"kernel file {path} is corrupt (sha256 mismatch): "
                                  f"rebuild the engine with atlas-build --device cuda")
            names = {p for p, ty in entry["params"] if not ty.startswith("*")} | set(entry["constexprs"])
            formula = entry.get("grid_formula")
            formula = [parse_grid_formula(f, names) for f in formula] if formula else None
            kernels[name] = _Kernel(name, entry, cubin, formula)
        return cls(kernels, arch)

    def __contains__(self, name: str) -> bool:
        return name in self.kernels

    def params(self, name: str) -> list[tuple[str, str]]:
        """(name, type) of kernel `name`'s launch arguments, in order (constexprs removed)."""
        if name not in self.kernels:
            raise EngineError(f"the engine's kernel plan names kernel {name!r}, which its kernels/ table lacks; "
                              f"rebuild the engine with atlas-build --device cuda.")
        return [tuple(p) for p in self.kernels[name].entry["params"]]

    def preload(self) -> None:
        """Load every module now (call before capturing CUDA graphs: loading is no stream work)."""
        for kernel in self.kernels.values():
            self._function(kernel)

    def _function(self, kernel: _Kernel):
        if kernel.function is None:
            cu = self._cu = self._cu or _driver()
            torch.cuda.init()
            _check(cu, cu.cuInit, 0)
            # Modules load into the current context; make it torch's (the device's primary context).
            if not int(_check(cu, cu.cuCtxGetCurrent)):
                device = _check(cu, cu.cuDeviceGet, torch.cuda.current_device())
                _check(cu, cu.cuCtxSetCurrent, _check(cu, cu.cuDevicePrimaryCtxRetain, device))
            module = _check(cu, cu.cuModuleLoadData, kernel.cubin)
            function = _check(cu, cu.cuModuleGetFunction, module, kernel.entry["function"].encode())
            self._set_shared(cu, function, kernel.entry["shared"])
            kernel.function = function
        return kernel.function

    def _set_shared(self, cu, function, shared: int) -> None:
        """A loaded function's shared memory settings, by self.shared_preference (SHARED_PREFERENCE)."""
        large = shared > STATIC_SHARED_LIMIT
        if self.shared_preference == "all" or (large and self.shared_preference == "large"):
            self._prefer_shared(cu, function)
        elif large:  # "none": only the limit the launch needs
            _check(cu, cu.cuFuncSetAttribute, function,
                   cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)

    @staticmethod
    def _prefer_shared(cu, function) -> None:
        """What Triton's launcher does to a kernel of more than 48 KB of shared memory (its driver.c loadBinary), so
        that a cubin runs as the build timed it through Triton: the carveout preferring shared memory over L1, and
        the device's opt-in limit as the most dynamic shared memory. Without the preference the driver may pick a
        carveout that fits fewer programs an SM than Triton's launches had."""
        attr = cu.CUfunction_attribute
        _check(cu, cu.cuFuncSetCacheConfig, function, cu.CUfunc_cache.CU_FUNC_CACHE_PREFER_SHARED)
        device = _check(cu, cu.cuCtxGetDevice)
        optin = _check(cu, cu.cuDeviceGetAttribute,
                       cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device)
        static = _check(cu, cu.cuFuncGetAttribute, attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function)
        _check(cu, cu.cuFuncSetAttribute, function, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
               optin - static)

    def grid(self, name: str, *args) -> tuple[int, int, int]:
        """The grid `launch` uses when given none: the formula over the int args, else the build-time grid."""
        kernel = self.kernels[name]
        if kernel.formula is None:
            return tuple(kernel.entry["grid"])
        env = {"cdiv": cdiv, "__builtins__": {}, **kernel.entry["constexprs"]}
        env.update((p, a) for (p, ty), a in zip(kernel.entry["params"], args) if not ty.startswith("*"))
        return tuple(int(eval(f, env)) for f in kernel.formula)

    def launch(self, name: str, grid, *args, stream=None) -> None:
        """Launch kernel `name` with its non-constexpr arguments in signature order.

        grid: an int or a tuple of up to 3 ints; None evaluates the recorded formula over the int
        args (or takes the build-time grid). args: torch CUDA tensors (or None) for pointers, ints,
        floats. stream: a torch.cuda.Stream; default torch.cuda.current_stream().
        """
        if name not in self.kernels:
            raise KeyError(f"no kernel {name!r} in this engine (it has {sorted(self.kernels)})")
        kernel = self.kernels[name]
        entry = kernel.entry
        params = entry["params"]
        if len(args) != len(params):
            raise TypeError(f"{name} takes {len(params)} arguments ({', '.join(p for p, _ in params)}), "
                            f"got {len(args)}")
        grid = self.grid(name, *args) if grid is None else (grid,) if isinstance(grid, int) else tuple(grid)
        grid = grid + (1,) * (3 - len(grid))
        if len(grid) != 3 or min(grid) < 1:
            raise ValueError(f"{name}: grid {grid} is not 1 to 3 positive ints")
        stream = stream or torch.cuda.current_stream()
        function = self._function(kernel)
        cu = self._cu

        values = [self._pack(name, p, ty, a, p in entry["divisible_by_16"]) for (p, ty), a in zip(params, args)]
        programs = grid[0] * grid[1] * grid[2]
        values.append(ctypes.c_uint64(self._scratch(kernel, programs, stream)))
        values.append(ctypes.c_uint64(0))  # profile scratch: only instrumented builds use it (checked at build)
        # kernelParams: an array of pointers to each value; the driver copies them at launch.
        pointers = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        if not entry["constexprs"].get("PDL") or self._no_pdl:
            _check(cu, cu.cuLaunchKernel, function, *grid, 32 * entry["num_warps"], 1, 1, entry["shared"],
                   cu.CUstream(stream.cuda_stream), ctypes.addressof(pointers), 0)
            return
        try:
            self._launch_pdl(cu, function, grid, entry, stream, pointers)
        except (AttributeError, TypeError, CudaError) as e:  # a driver binding without cuLaunchKernelEx
            # the griddepcontrol instructions are no-ops in a plain launch: same results, no overlap
            warnings.warn(f"programmatic dependent launch unavailable ({e}); launching plainly", stacklevel=2)
            self._no_pdl = True
            self.launch(name, grid, *args, stream=stream)

    @staticmethod
    def _launch_pdl(cu, function, grid, entry, stream, pointers) -> None:
        # compiled for programmatic dependent launch (its griddepcontrol.wait guards every read of an earlier
        # kernel's output): launched with the attribute, it may start while the kernel before it drains
        config = cu.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = 32 * entry["num_warps"], 1, 1
        config.sharedMemBytes = entry["shared"]
        config.hStream = cu.CUstream(stream.cuda_stream)
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        config.attrs = [attr]
        config.numAttrs = 1
        _check(cu, cu.cuLaunchKernelEx, config, function, ctypes.addressof(pointers), 0)

    @staticmethod
    def _pack(name: str, param: str, ty: str, value, aligned: bool):
        if ty.startswith("*"):
            if value is None:
                ptr = 0
            elif isinstance(value, torch.Tensor):
                if not value.is_cuda:
                    raise ValueError(f"{name}: {param} is a {value.device} tensor, the kernel needs a CUDA tensor")
                ptr = value.data_ptr()
            else:
                raise TypeError(f"{name}: {param} ({ty}) takes a torch tensor, got {type(value).__name__}")
            if aligned and ptr % 16:
                raise ValueError(f"{name}: {param} was compiled assuming 16-byte alignment; got address {ptr:#x}")
            return ctypes.c_uint64(ptr)
        ctype = SCALAR_CTYPES[ty]
        if ty in FLOAT_TYPES:
            return ctype(float(value))
        packed = ctype(int(value))
        if packed.value != value:
            raise ValueError(f"{name}: {param}={value} does not fit {ty}")
        if aligned and value % 16:
            raise ValueError(f"{name}: {param} was compiled assuming a multiple of 16; got {value}")
        return packed

    def _scratch(self, kernel: _Kernel, programs: int, stream) -> int:
        """Global scratch for `programs` programs (0 when the kernel needs none), reused between launches."""
        size, align = kernel.entry["global_scratch"]
        if size == 0:
            return 0
        need = programs * size + align
        if kernel.scratch is None or kernel.scratch.numel() < need:
            if kernel.scratch is not None:
                self._retired.append(kernel.scratch)
            kernel.scratch = torch.empty(need, dtype=torch.uint8, device=torch.device("cuda", stream.device.index))
        ptr = kernel.scratch.data_ptr()
        return ptr + (-ptr) % align
