"""The Triton kernel instances an engine's runtime launches, learned by calling its own launchers at build time.

The runtime launches each kernel of a step through a plugin's `launch_*` function with `aot=AotKernels(...)`
(atlas.plugins_trt.launch), which looks the instance up by `instance_key` (kernel, constexprs, warps, stages,
pointer dtypes). At build the same functions are called with `aot=KernelRecorder()` on meta tensors (shapes,
dtypes and strides, no data, no GPU): nothing runs, and each call records the instance it would launch, with its
Triton signature derived from the arguments. `compile_recorded` compiles every recorded instance for sm_<arch> and
names it; its `instances` map goes into the manifest, so that at run time the same launcher call finds exactly the
instance the build compiled for it:

    recorder = KernelRecorder()
    <call the runtime's launchers with aot=recorder on meta tensors, for every shape class it will run>
    compiled, instances = compile_recorded(recorder, arch)   # compiled: for write_kernels, with the other kernels
    manifest[...] = instances                                 # instance_key -> kernel name in the table

What an instance is compiled as, from the recorded arguments:
    tensor          a pointer to its dtype (launch.POINTER_TYPES: bfloat16 '*bf16', float8_e4m3fn '*fp8e4nv',
                    int32 '*i32', uint8 '*u8', ...); the pointer dtypes are part of the instance key.
    None            a null pointer of type '*i8' (launch.NULL_POINTER), which the table packs as address 0. Valid
                    only where a constexpr flag keeps the kernel from dereferencing it: the JIT would specialise None
                    as a constexpr instead, so a kernel that tests `ptr is None` must not be given None on this path.
                    (The launchers here pass a real tensor as the stand-in for an unused pointer.)
    bool, int       'i32', or 'i64' where a recorded value does not fit int32 (the widest recording of an instance
                    wins); the table refuses a run-time value that does not fit the compiled type.
    float           'fp32'.
    divisible_by_16 every pointer parameter the launcher does not name in `unaligned` (a 16-byte aligned base, which
                    lets Triton vectorise loads at offsets it can prove aligned; the table checks it at every launch,
                    and a recorded view at a misaligned offset is an error here). Int parameters never: a stride or a
                    size may be anything at run time. An instance recorded from several call sites keeps only the
                    pointers every one of them called aligned.
    grid            the first recorded grid becomes the table entry's `grid` (informational: the launchers always
                    pass the grid they computed), and no grid formula.
"""

from __future__ import annotations

import hashlib
import inspect
import numbers
from dataclasses import dataclass, field
from typing import Any

import torch

from atlas.build_engine.errors import BuildError
from atlas.build_engine.kernels import CompiledKernel, KernelSpec, compile_kernels
from atlas.plugins_trt.launch import instance_key, pointer_type, pointer_types

_INT_RANGES = {"i32": (-2 ** 31, 2 ** 31 - 1), "i64": (-2 ** 63, 2 ** 63 - 1)}


class KernelRecordError(BuildError):
    """A launcher call that cannot become a kernel instance (its arguments do not match the kernel's parameters, or
    a pointer it calls aligned was recorded from a misaligned view); the message names the kernel and the argument."""


def kernel_parameters(fn) -> tuple[list[str], set[str]]:
    """(every parameter name of a @triton.jit function in order, the names annotated tl.constexpr).

    Works for the JIT's and the interpreter's function objects alike (both keep the Python function as .fn); a
    parameter is a constexpr by Triton's own rule: 'constexpr' in its annotation (a string under
    `from __future__ import annotations`)."""
    params = inspect.signature(getattr(fn, "fn", fn)).parameters
    names = list(getattr(fn, "arg_names", params))

    def is_constexpr(annotation) -> bool:
        if annotation is inspect.Parameter.empty:
            return False
        text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
        return "constexpr" in text

    return names, {n for n in names if is_constexpr(params[n].annotation)}


def scalar_type(value) -> str:
    """The Triton type a scalar run-time argument is compiled as: bool and int -> 'i32' ('i64' past int32),
    float -> 'fp32'."""
    if isinstance(value, numbers.Integral):  # bool included: passed as 0 / 1
        v = int(value)
        for ty, (lo, hi) in _INT_RANGES.items():
            if lo <= v <= hi:
                return ty
        raise ValueError(f"{v} does not fit a 64-bit int")
    if isinstance(value, numbers.Real):
        return "fp32"
    raise TypeError(f"a {type(value).__name__} cannot be a kernel argument (tensors, None, bool, int, float)")


def _wider(a: str, b: str) -> str | None:
    """The type that holds values of both scalar types a and b, or None if one is an int and the other a float."""
    if a == b:
        return a
    if {a, b} == {"i32", "i64"}:
        return "i64"
    return None


@dataclass
class RecordedInstance:
    """One kernel instance the runtime will ask for: what compile_kernel needs, learned from launcher calls."""

    fn: Any
    """The @triton.jit function."""
    key: str
    """Its instance_key (atlas.plugins_trt.launch): what AotKernels looks it up by at run time."""
    constexprs: dict
    """Every constexpr parameter -> its value."""
    num_warps: int
    num_stages: int
    params: list[tuple[str, str]]
    """The run-time parameters in launch order -> Triton type ('*bf16', 'i32', 'fp32', ...)."""
    divisible_by_16: tuple[str, ...]
    """Pointer parameters compiled as 16-byte aligned (the table checks them at each launch)."""
    grids: list[tuple[int, ...]] = field(default_factory=list)
    """Every distinct grid it was recorded with, first first."""
    launches: int = 0
    """How many launcher calls asked for it."""

    @property
    def kernel(self) -> str:
        return self.fn.__name__

    @property
    def name(self) -> str:
        """Its name in the engine's kernel table: the kernel and a hash of the key (stable across builds, and a
        valid KernelSpec name: letters, digits, '_' and '.')."""
        return f"{self.kernel}.{hashlib.sha256(self.key.encode()).hexdigest()[:12]}"

    def signature(self) -> dict[str, str]:
        """Every parameter of fn in order -> its Triton type, or 'constexpr'."""
        types = dict(self.params)
        names, _ = kernel_parameters(self.fn)
        return {n: types.get(n, "constexpr") for n in names}

    def kernel_spec(self) -> KernelSpec:
        """The build stage's KernelSpec for this instance (compile_kernel / write_kernels take it)."""
        return KernelSpec(fn=self.fn, name=self.name, signature=self.signature(), constexprs=dict(self.constexprs),
                          num_warps=self.num_warps, num_stages=self.num_stages, grid=self.grids[0],
                          divisible_by_16=self.divisible_by_16)


class KernelRecorder:
    """Pass as a launcher's `aot=`: records the instance each call asks for instead of launching it.

    Launchers called with meta tensors run their checks and compute grids and arguments as they do on the GPU
    (they never read a tensor's values on the host), so a build records the runtime's launches without a GPU.
    """

    def __init__(self):
        self.instances: dict[str, RecordedInstance] = {}
        """instance_key -> the instance, in the order first recorded."""
        self._params: dict[int, tuple[Any, list[str], set[str]]] = {}  # id(fn) -> (fn, names, constexpr names)

    def __len__(self) -> int:
        return len(self.instances)

    def _parameters(self, fn) -> tuple[list[str], set[str]]:
        cached = self._params.get(id(fn))
        if cached is None:
            cached = self._params[id(fn)] = (fn, *kernel_parameters(fn))  # fn kept: its id stays its own
        return cached[1], cached[2]

    def launch(self, fn: Any, constexprs: dict, num_warps: int, num_stages: int, grid, args,
               unaligned: tuple[str, ...] = ()) -> None:
        """Record one launcher call (the signature of AotKernels.launch): fn over `grid` with the run-time `args`
        in parameter order, every constexpr in `constexprs`; `unaligned` pointers are not compiled as aligned."""
        kernel = fn.__name__
        names, constexpr_names = self._parameters(fn)
        if set(constexprs) != constexpr_names:
            missing, extra = sorted(constexpr_names - set(constexprs)), sorted(set(constexprs) - constexpr_names)
            raise KernelRecordError(f"{kernel}: the launcher must give every constexpr (an AOT instance spells each "
                                    f"one out); missing {missing}, not constexprs of the kernel {extra}")
        runtime = [n for n in names if n not in constexpr_names]
        if len(args) != len(runtime):
            raise KernelRecordError(f"{kernel}: {len(args)} run-time arguments for the {len(runtime)} parameters "
                                    f"{runtime}")
        unknown = set(unaligned) - set(runtime)
        if unknown:
            raise KernelRecordError(f"{kernel}: unaligned names {sorted(unknown)}, not run-time parameters")
        grid = (grid,) if isinstance(grid, numbers.Integral) else tuple(grid)
        if not 1 <= len(grid) <= 3 or any(not isinstance(g, numbers.Integral) or g < 1 for g in grid):
            raise KernelRecordError(f"{kernel}: grid {grid} is not 1 to 3 positive ints")
        grid = tuple(int(g) for g in grid)

        params, aligned = [], []
        for name, value in zip(runtime, args):
            try:
                if value is None or isinstance(value, torch.Tensor):
                    params.append((name, pointer_type(value)))
                    if name not in unaligned:
                        self._check_aligned(kernel, name, value)
                        aligned.append(name)
                else:
                    params.append((name, scalar_type(value)))
            except (TypeError, ValueError) as e:
                raise KernelRecordError(f"{kernel}: argument {name}: {e}") from None

        key = instance_key(kernel, constexprs, num_warps, num_stages, pointer_types(args))
        inst = self.instances.get(key)
        if inst is None:
            inst = self.instances[key] = RecordedInstance(fn, key, dict(constexprs), num_warps, num_stages, params,
                                                          tuple(aligned))
        else:
            inst.params = self._merged(kernel, inst.params, params)
            inst.divisible_by_16 = tuple(n for n in inst.divisible_by_16 if n in aligned)
        if grid not in inst.grids:
            inst.grids.append(grid)
        inst.launches += 1

    @staticmethod
    def _check_aligned(kernel: str, name: str, value: torch.Tensor | None) -> None:
        """A pointer compiled as aligned must not be recorded from a view at a misaligned offset: the table would
        refuse it at run time (and on a real device, from a misaligned allocation)."""
        if value is None:  # the null pointer: address 0
            return
        offset = value.storage_offset() * value.element_size()
        if offset % 16 or (value.device.type != "meta" and value.data_ptr() % 16):
            raise KernelRecordError(f"{kernel}: {name} is a view {offset} bytes into its storage, not 16-byte "
                                    f"aligned, but the launcher compiles it as aligned: name it in `unaligned`")

    @staticmethod
    def _merged(kernel: str, old: list, new: list) -> list:
        """One instance's scalar types over two recordings: an int param that once needed int64 stays int64."""
        out = []
        for (name, a), (_, b) in zip(old, new):
            ty = a if a.startswith("*") else _wider(a, b)  # pointer types are in the key: equal by construction
            if ty is None:
                raise KernelRecordError(f"{kernel}: argument {name} was recorded as {a} and as {b}; pass one kind "
                                        f"(int or float) for it")
            out.append((name, ty))
        return out

    def kernel_specs(self) -> list[tuple[str, KernelSpec]]:
        """(instance_key, KernelSpec) of every recorded instance, in the order first recorded."""
        specs = [(key, inst.kernel_spec()) for key, inst in self.instances.items()]
        names = [s.name for _, s in specs]
        if len(set(names)) != len(names):  # a 48-bit hash collision between two keys of one kernel
            raise KernelRecordError(f"two recorded instances share a table name: {sorted(names)}")
        return specs


def compile_recorded(recorder: KernelRecorder, arch: int = 90) -> tuple[list[CompiledKernel], dict[str, str]]:
    """Compile every instance the recorder saw for sm_<arch> (no GPU needed).

    Returns (compiled kernels, to pass to write_kernels together with the engine's other kernels so that they
    share one table; instances: instance_key -> kernel name in that table, for the manifest and AotKernels).
    """
    specs = recorder.kernel_specs()
    return compile_kernels([spec for _, spec in specs], arch), {key: spec.name for key, spec in specs}


__all__ = ["KernelRecordError", "KernelRecorder", "RecordedInstance", "compile_recorded", "kernel_parameters",
           "scalar_type"]
