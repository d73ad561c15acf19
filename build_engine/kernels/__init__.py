"""GPU kernels compiled ahead of time into the engine's kernels/ folder (needs the `gpu` extra: Triton)."""

from atlas.build_engine.kernels.aot import (
    CompiledKernel,
    KernelCompileError,
    KernelSpec,
    autotune,
    compile_kernel,
    compile_kernels,
    write_kernels,
)

__all__ = [
    "CompiledKernel", "KernelCompileError", "KernelSpec", "autotune", "compile_kernel", "compile_kernels",
    "write_kernels",
]
