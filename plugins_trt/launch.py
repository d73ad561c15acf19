"""One launch path for a plugin's Triton kernel: JIT (tests, tools) or an engine's precompiled cubin (the runtime).

A plugin's `launch_*` function computes its grid, its run-time arguments (in the kernel's parameter order, the
constexprs left out) and every one of its constexprs, then calls `launch`. Without `aot`, Triton compiles and runs
the kernel (JIT). With `aot` (an `AotKernels` over the engine's kernel table), the instance built for exactly that
kernel, those constexprs, warps and stages and those pointer dtypes is launched from its cubin, and nothing is
compiled; an instance the engine lacks is an error that says to rebuild. At build time `aot` is a
`atlas.build_engine.recorded_kernels.KernelRecorder` (same `launch` method), which records the instances instead
of launching them. So the runtime, the build and the tests go through the same argument code, and the build
compiles exactly the instances the runtime asks for.

An instance's key (`instance_key`) holds the pointer arguments' Triton types as well as the constexprs: the same
constexprs over other dtypes (bf16 or fp32 activations, int32 or int64 ids) are other machine code. Scalar
arguments are not in the key: the table packs them by the compiled type and refuses a value that does not fit.
A None pointer is a null pointer of type `NULL_POINTER` (the table packs None as address 0); it is valid only
where a constexpr flag keeps the kernel from dereferencing it (the JIT would make it a constexpr None instead).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from atlas.runtime.errors import EngineError

POINTER_TYPES = {
    torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.float64: "*fp64",
    torch.float8_e4m3fn: "*fp8e4nv", torch.float8_e5m2: "*fp8e5",
    torch.bool: "*i1", torch.int8: "*i8", torch.int16: "*i16", torch.int32: "*i32", torch.int64: "*i64",
    torch.uint8: "*u8", torch.uint16: "*u16", torch.uint32: "*u32", torch.uint64: "*u64",
}
"""torch dtype of a tensor argument -> the Triton type of the pointer parameter it is passed to."""
NULL_POINTER = "*i8"
"""The type a None pointer argument is compiled as (never dereferenced: see the module docstring)."""
JIT_DEFAULT_STAGES = 3
"""Triton's default num_stages for CUDA: what the launchers' JIT launches used before they spelled it out. Kernels
without loops compile to the same code whatever the stages; the loops of attention and sampling are pipelined."""


def pointer_type(value) -> str:
    """The Triton pointer type of a tensor (or None) argument, e.g. '*bf16'."""
    if value is None:
        return NULL_POINTER
    try:
        return POINTER_TYPES[value.dtype]
    except KeyError:
        raise TypeError(f"a {value.dtype} tensor cannot be a kernel argument (supported: "
                        f"{', '.join(str(d) for d in POINTER_TYPES)})") from None


def pointer_types(args) -> tuple[str, ...]:
    """The pointer types of the tensor and None arguments among `args`, in order (scalars skipped)."""
    return tuple(pointer_type(a) for a in args if a is None or isinstance(a, torch.Tensor))


def instance_key(kernel: str, constexprs: dict, num_warps: int, num_stages: int,
                 pointer_types: tuple[str, ...] = ()) -> str:
    """What identifies a compiled instance: the kernel's name, its constexprs, warps and stages, and the Triton
    types of its pointer arguments in order, e.g. 'silu_mul_kernel(BLOCK=1024)w4s3[*bf16,*bf16]'."""
    body = ",".join(f"{k}={constexprs[k]!r}" for k in sorted(constexprs))
    types = f"[{','.join(pointer_types)}]" if pointer_types else ""
    return f"{kernel}({body})w{num_warps}s{num_stages}{types}"


class AotKernels:
    """An engine's compiled instances, found by `instance_key`, launched through its KernelTable."""

    def __init__(self, table, instances: dict[str, str]):
        """table: atlas.runtime.kernels.KernelTable (anything with `launch(name, grid, *args)`);
        instances: instance_key -> kernel name in the table (the build's compile_recorded gives it)."""
        self.table = table
        self.instances = dict(instances)
        # (kernel, constexpr items as the launcher orders them, warps, stages, pointer types) -> table name, so
        # that a launch after the first formats no key string
        self._found: dict[tuple, str] = {}

    def name_of(self, fn: Any, constexprs: dict, num_warps: int, num_stages: int, args) -> str:
        """The table name of the instance these arguments need; EngineError (rebuild) if the engine lacks it."""
        types = pointer_types(args)
        fast = (fn.__name__, tuple(constexprs.items()), num_warps, num_stages, types)
        name = self._found.get(fast)
        if name is not None:
            return name
        key = instance_key(fn.__name__, constexprs, num_warps, num_stages, types)
        name = self.instances.get(key)
        if name is None:
            have = sorted(k for k in self.instances if k.startswith(fn.__name__ + "("))
            listed = "; ".join(have[:4]) + (f"; and {len(have) - 4} more" if len(have) > 4 else "")
            raise EngineError(f"the engine has no compiled {fn.__name__} for {key} (it has "
                              f"{listed or 'none'}); it was built for other shapes, dtypes or options, or by another "
                              f"version of atlas-build: rebuild it with atlas-build --device cuda")
        self._found[fast] = name
        return name

    def launch(self, fn: Any, constexprs: dict, num_warps: int, num_stages: int, grid, args,
               unaligned: tuple[str, ...] = ()) -> None:
        """Launch the engine's instance of `fn` for these constexprs and argument dtypes over `grid`.

        unaligned is the build's business (it decided what the instance assumes); the table checks every
        pointer the instance was compiled to assume 16-byte aligned at each launch."""
        del unaligned
        self.table.launch(self.name_of(fn, constexprs, num_warps, num_stages, args), grid, *args)


def launch(fn: Any, grid: tuple[int, ...], args: tuple, constexprs: dict, num_warps: int, num_stages: int = 1,
           aot: AotKernels | None = None, unaligned: tuple[str, ...] = ()) -> None:
    """Run `fn` (a @triton.jit function) over `grid` with its run-time `args` in parameter order.

    constexprs: every constexpr parameter of fn, defaults included (an AOT instance spells each one out).
    aot: None (JIT), an AotKernels (the engine's cubins) or a KernelRecorder (the build: record, don't launch).
    A true "PDL" constexpr launches with programmatic dependent launch (plugins_trt/pdl.py).
    unaligned: pointer parameters that may be views not 16-byte aligned (e.g. column slices of a fused
    projection); every other pointer is compiled as 16-byte aligned ahead of time (the runtime checks it).
    """
    if aot is not None:
        aot.launch(fn, constexprs, num_warps, num_stages, grid, args, unaligned)
        return
    pdl = {}
    if constexprs.get("PDL"):  # programmatic dependent launch (plugins_trt/pdl.py); the interpreter has none
        if os.environ.get("TRITON_INTERPRET") == "1":
            constexprs = {**constexprs, "PDL": False}
        else:
            pdl = {"launch_pdl": True}
    fn[grid](*args, **constexprs, num_warps=num_warps, num_stages=num_stages, **pdl)
