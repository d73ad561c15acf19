"""Triton 3.6's CPU interpreter, made to compute what the GPU computes, and the fresh-process fallback of the kernel
test modules (imported from tests/, which the modules put on sys.path).

The interpreter gets five things wrong that the kernels use (`check_patches`, which the kernel test modules run,
checks the fixes against torch):
  1. int() of a scalar tensor fails (scalars are 1-element arrays, numpy >= 2.4), so run-time loop bounds fail;
  2. tl.dot on bf16 multiplies the raw uint16 bit patterns;
  3. fp32 -> bf16 casts truncate instead of rounding to nearest even;
  4. fp32 -> e4m3 casts lose the carry when rounding up crosses a power of two (127.6 -> 64);
  5. (speed only) nested @jit calls re-patch the language on every call, ~1 ms each.
TRITON_INTERPRET=1 must hold when triton is first imported; a module that finds triton imported for compilation
reruns its CPU tests in a subprocess (`run_in_fresh_process`).
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import numpy as np
import torch


def fix_interpreter_index() -> None:
    """Fix 1 alone, for the rest of the process (applied once, whichever module asks first)."""
    from triton.runtime import interpreter
    orig = interpreter._patch_lang_tensor
    if getattr(orig, "atlas_index_fix", False):
        return

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.atlas_index_fix = True
    interpreter._patch_lang_tensor = patched


def patch_interpreter(fast_nested: bool = False):
    """Apply fixes 1-4 (and 5 with fast_nested); returns a function that undoes them."""
    import triton.language as tl
    from triton.runtime import interpreter as ti

    builder = ti.InterpreterBuilder
    orig_patch_tensor, orig_dot = ti._patch_lang_tensor, builder.create_dot
    orig_cast, orig_fp_to_fp = builder.cast_impl, builder.create_fp_to_fp

    def patch_tensor(tensor, scope):
        orig_patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    def as_f32(h):
        return (h.data.astype(np.uint32) << 16).view(np.float32) if h.dtype.scalar == tl.bfloat16 \
            else h.data.astype(np.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.scalar != tl.bfloat16 and b.dtype.scalar != tl.bfloat16:
            return orig_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        return ti.TensorHandle(np.matmul(as_f32(a), as_f32(b), dtype=np.float32) + d.data, d.dtype.scalar)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            t = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.bfloat16)  # RNE, as the GPU
            return ti.TensorHandle(t.view(torch.uint16).numpy(), tl.bfloat16)
        return orig_cast(self, src, dst_type)

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.float8e4nv:
            t = torch.from_numpy(np.ascontiguousarray(src.data)).to(torch.float8_e4m3fn)  # RNE, saturating
            return ti.TensorHandle(t.view(torch.uint8).numpy(), tl.float8e4nv)
        return orig_fp_to_fp(self, src, dst_type, rounding_mode)

    patches = [(ti, "_patch_lang_tensor", patch_tensor), (builder, "create_dot", create_dot),
               (builder, "cast_impl", cast_impl),
               (builder, "create_fp_trunc", lambda self, src, dst_type: self.cast_impl(src, dst_type)),
               (builder, "create_fp_to_fp", create_fp_to_fp)]
    if fast_nested:  # a launch patches the language for the kernel's module; nested calls need not do it again
        patched_in_launch: set = set()
        orig_grid_call = ti.GridExecutor.__call__

        def grid_call(self, *args, **kwargs):
            patched_in_launch.clear()
            return orig_grid_call(self, *args, **kwargs)

        def nested_call(self, *args, **kwargs):
            langs = frozenset(id(v) for v in self.fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))
            if langs not in patched_in_launch:
                ti._patch_lang(self.fn)
                patched_in_launch.add(langs)
            fn = self.rewrite()
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                raise ti.InterpreterError(repr(e)) from e

        patches += [(ti.GridExecutor, "__call__", grid_call), (ti.InterpretedFunction, "__call__", nested_call)]
    saved = [(obj, name, obj.__dict__[name]) for obj, name, _ in patches]
    for obj, name, value in patches:
        setattr(obj, name, value)

    def undo():
        for obj, name, value in saved:
            setattr(obj, name, value)
    return undo


def interpreter_possible() -> bool:
    """No GPU, and triton not yet imported or imported under the interpreter (its own @jit helpers interpreted): a
    kernel test module may then set TRITON_INTERPRET=1 for its imports."""
    if torch.cuda.is_available():
        return False
    if "triton" not in sys.modules:
        return True
    import triton.language as tl
    return type(tl.zeros).__name__ == "InterpretedFunction"


def restore_env(saved: str | None) -> None:
    """Put TRITON_INTERPRET back as it was (None: unset)."""
    if saved is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = saved


def fixed_interpreter(active: bool, fast_nested: bool = False):
    """Body of a module-scoped autouse fixture: while the module's tests run, TRITON_INTERPRET=1 and the fixes."""
    if not active:
        yield
        return
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    undo = patch_interpreter(fast_nested)
    yield
    undo()
    restore_env(saved)


def run_in_fresh_process(path: str, deselect: str, timeout: int = 900) -> None:
    """Rerun a module's CPU tests (-m "not gpu", -k deselect) in a process that imports triton interpreted."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", path, "-m", "not gpu",
                           "-k", deselect], capture_output=True, text=True, env=env, timeout=timeout)
    print(proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.strip().splitlines()[-1]


def skip_unless_interpreted(request, interpreted: bool, compiles: tuple[str, ...] = ()) -> None:
    """For a kernel module's autouse fixture: without a GPU, a test that needs the interpreter is skipped when triton
    was imported for compilation first (the module's test_cpu_tests_in_fresh_process reruns it); the fresh-process
    test itself and tests whose names hold one of `compiles` (sm_90 compiles, no interpreter needed) run."""
    import pytest

    name = request.node.name
    if not torch.cuda.is_available() and not interpreted and "fresh_process" not in name \
            and not any(c in name for c in compiles):
        pytest.skip("triton was imported for compilation first; test_cpu_tests_in_fresh_process runs this")


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; non-finite output (an element left unwritten, a forbidden read) fails."""
    out, ref = out.double().cpu(), ref.double().cpu()
    assert torch.isfinite(out).all(), "non-finite values (an element left unwritten, or a forbidden read)"
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def report(name: str, err: float, tol: float = 1e-4) -> None:
    """Print the error ratio and fail above tol (default 1e-4, the fp32 kernels')."""
    print(f"  {name}: rel err {err:.2e} (tol {tol:.0e})")
    assert err < tol, f"{name}: relative error {err:.3e} over {tol:.0e}"


def check_patches() -> None:
    """Under the patched interpreter, each patched operation agrees with torch: bf16 and e4m3 casts, a bf16 tl.dot,
    a loop over run-time bounds (the module docstring's 1 to 4)."""
    import triton
    import triton.language as tl

    @triton.jit
    def probe(x_ptr, a_ptr, b_ptr, bf_ptr, q_ptr, c_ptr, n_ptr, K, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs)
        tl.store(bf_ptr + offs, x.to(tl.bfloat16))
        tl.store(q_ptr + offs, x.to(tl.float8e4nv))
        r = tl.arange(0, 16)
        a = tl.load(a_ptr + r[:, None] * 16 + r[None, :])
        b = tl.load(b_ptr + r[:, None] * 16 + r[None, :])
        tl.store(c_ptr + r[:, None] * 16 + r[None, :], tl.dot(a, b))
        count = 0
        for _ in range(tl.program_id(0), K):
            count += 1
        tl.store(n_ptr, count)

    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.tensor([127.6, -31.9, 7.9, 1.0 + 3 * 2.0 ** -9]), torch.randn(60, generator=g) * 50])
    a, b = (torch.randn(16, 16, generator=g).bfloat16() for _ in range(2))
    bf, q = torch.empty(64, dtype=torch.bfloat16), torch.empty(64, dtype=torch.float8_e4m3fn)
    c, n = torch.empty(16, 16), torch.zeros(1, dtype=torch.int32)
    probe[(1,)](x, a, b, bf, q, c, n, 5, BLOCK=64)
    assert torch.equal(bf, x.bfloat16())
    assert torch.equal(q.view(torch.uint8), x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8))
    assert rel(c, a.float() @ b.float()) < 1e-6
    assert int(n) == 5
