"""Ahead-of-time kernels: compiled at build (no GPU needed), checked and launched by the runtime.

CPU: compile for sm_90, write cubins and the table, refuse tables for another arch, Triton or
format and corrupt cubins. GPU (`pytest -m gpu`): launch through KernelTable against torch, replay
in a CUDA graph, and launch in a process where Triton cannot compile anything.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from atlas.build_engine.kernels import (  # noqa: E402
    KernelCompileError,
    KernelSpec,
    autotune,
    compile_kernel,
    write_kernels,
)
from atlas.runtime.errors import EngineError  # noqa: E402
from atlas.runtime.kernels import STATIC_SHARED_LIMIT, KernelTable  # noqa: E402


@triton.jit
def scale_add(x_ptr, y_ptr, out_ptr, alpha, n, BLOCK: tl.constexpr):
    # out[i] = alpha * x[i] + y[i] for i < n
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, alpha * x + y, mask=mask)


@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # c: [M, N] bf16 = a: [M, K] bf16 @ b: [K, N] bf16, fp32 accumulation; row-major, contiguous
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :],
                    mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :],
                    mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16), mask=(rm[:, None] < M) & (rn[None, :] < N))


N_ELEMS = 5000  # not a multiple of BLOCK: the mask matters
M, N, K = 384, 256, 320  # multiples of 16 (divisible_by_16), several K steps (pipelined)


def specs() -> list[KernelSpec]:
    return [
        KernelSpec(scale_add, "scale_add.fp32.B1024",
                   {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "alpha": "fp32", "n": "i32",
                    "BLOCK": "constexpr"},
                   constexprs={"BLOCK": 1024}, num_warps=4, num_stages=1,
                   grid=(triton.cdiv(N_ELEMS, 1024),), grid_formula=("cdiv(n, BLOCK)",)),
        # 3 stages x (128x64 + 64x128) bf16 tiles = 96 KB of shared memory: the > 48 KB path
        KernelSpec(matmul, f"matmul.bf16.M{M}.N{N}.K{K}",
                   {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
                    "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"},
                   constexprs={"BM": 128, "BN": 128, "BK": 64}, num_warps=8, num_stages=3,
                   grid=(M // 128, N // 128), grid_formula=("cdiv(M, BM)", "cdiv(N, BN)"),
                   divisible_by_16=("a_ptr", "b_ptr", "c_ptr", "M", "N", "K")),
    ]


def device_arch() -> int:
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return 10 * major + minor
    return 90


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> tuple[Path, dict]:
    """(engine dir, kernel table) with both test kernels compiled for this GPU (sm_90 without one)."""
    root = tmp_path_factory.mktemp("aot") / "engine"
    table = write_kernels([compile_kernel(s, arch=device_arch()) for s in specs()], root / "kernels")
    return root, table


# ---- CPU -----------------------------------------------------------------------------------------

def test_table_records_the_launch_abi(engine):
    root, table = engine
    assert json.loads(json.dumps(table)) == table
    assert table["arch"] == device_arch() and table["triton_version"] == triton.__version__
    add = table["kernels"]["scale_add.fp32.B1024"]
    assert add["function"] == "scale_add"
    assert add["params"] == [["x_ptr", "*fp32"], ["y_ptr", "*fp32"], ["out_ptr", "*fp32"], ["alpha", "fp32"],
                             ["n", "i32"]]  # BLOCK, a constexpr, is not passed
    assert add["grid"] == [5, 1, 1] and add["grid_formula"] == ["cdiv(n, BLOCK)", "1", "1"]
    mm = table["kernels"][f"matmul.bf16.M{M}.N{N}.K{K}"]
    assert [p for p, _ in mm["params"]] == ["a_ptr", "b_ptr", "c_ptr", "M", "N", "K"]
    assert mm["shared"] > STATIC_SHARED_LIMIT and mm["num_warps"] == 8 and mm["num_stages"] == 3
    for entry in table["kernels"].values():
        cubin = root / "kernels" / entry["cubin"]
        assert cubin.parent.name == f"sm_{device_arch()}" and cubin.read_bytes()[:4] == b"\x7fELF"
        assert entry["global_scratch"][0] == 0 and entry["profile_scratch"][0] == 0


def test_table_loads_and_evaluates_grids_without_a_gpu(engine):
    root, table = engine
    kernels = KernelTable.load(root, table, arch=table["arch"])
    assert kernels.grid("scale_add.fp32.B1024", None, None, None, 2.0, 10_000) == (10, 1, 1)
    assert kernels.grid(f"matmul.bf16.M{M}.N{N}.K{K}", None, None, None, 4096, 1024, 64) == (32, 8, 1)


@pytest.mark.parametrize("preference", ["large", "all", "none"])
def test_large_shared_kernels_load_as_triton_loads_them(preference, engine, monkeypatch):
    """A kernel over 48 KB of shared memory gets what Triton's launcher gives it (driver.c loadBinary): the cache
    preference for shared memory and the device's opt-in limit less its static shared memory as its most dynamic
    shared memory ("large", the default). The experiment knob SHARED_PREFERENCE: "all" gives every kernel that,
    "none" only the limit a large kernel's launch needs (the loading before 2026-12-08). Checked on a stand-in driver
    that records the calls (the GPU tests launch the real ones)."""
    from types import SimpleNamespace as NS

    from atlas.runtime import kernels

    ok, calls = object(), []

    def call(name, *result):  # a driver function: records its arguments, returns CUDA_SUCCESS and its result
        def f(*args):
            calls.append((name, *args))
            return (ok, *result)
        f.__name__ = name
        return f

    cu = NS(CUresult=NS(CUDA_SUCCESS=ok),
            CUfunction_attribute=NS(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES="static",
                                    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES="max dynamic"),
            CUfunc_cache=NS(CU_FUNC_CACHE_PREFER_SHARED="prefer shared"),
            CUdevice_attribute=NS(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN="optin"),
            cuFuncSetCacheConfig=call("cuFuncSetCacheConfig"), cuCtxGetDevice=call("cuCtxGetDevice", 0),
            cuDeviceGetAttribute=call("cuDeviceGetAttribute", 232448),
            cuFuncGetAttribute=call("cuFuncGetAttribute", 1024), cuFuncSetAttribute=call("cuFuncSetAttribute"))
    monkeypatch.setattr(kernels, "SHARED_PREFERENCE", preference)
    table = KernelTable.load(*engine, arch=engine[1]["arch"])
    def preferred(fn):  # the calls of Triton's loadBinary for function fn
        return [("cuFuncSetCacheConfig", fn, "prefer shared"), ("cuCtxGetDevice",),
                ("cuDeviceGetAttribute", "optin", 0), ("cuFuncGetAttribute", "static", fn),
                ("cuFuncSetAttribute", fn, "max dynamic", 232448 - 1024)]

    table._set_shared(cu, "big", 100 * 1024)
    assert calls == (preferred("big") if preference != "none" else
                     [("cuFuncSetAttribute", "big", "max dynamic", 100 * 1024)])
    calls.clear()
    table._set_shared(cu, "small", STATIC_SHARED_LIMIT)
    assert calls == (preferred("small") if preference == "all" else [])
    monkeypatch.setattr(kernels, "SHARED_PREFERENCE", "most")
    with pytest.raises(ValueError, match="large, all or none"):
        KernelTable.load(*engine, arch=engine[1]["arch"])


def _other_arch(table):
    return 80


def _other_triton(table):
    table["triton_version"] = table["kernels"]["scale_add.fp32.B1024"]["triton_version"] = "3.5.1"
    return 90


def _other_format(table):
    table["format"] = 99
    return 90


@pytest.mark.parametrize("change, message", [
    (_other_arch, "engine built for sm_90, this GPU is sm_80: rebuild with atlas-build --device cuda"),
    (_other_triton, "compiled by Triton 3.5.1"),
    (_other_format, "kernel table format 99"),
], ids=["arch", "triton", "format"])
def test_load_refuses_a_table_for_another_target(engine, change, message):
    """change(table) edits a copy of the table and returns the arch of the GPU it is loaded on."""
    root, table = engine
    table = copy.deepcopy(table)
    arch = change(table)
    with pytest.raises(EngineError, match=message):
        KernelTable.load(root, table, arch=arch)


def test_load_refuses_a_corrupt_or_missing_cubin(engine, tmp_path):
    root, table = engine
    copy_root = tmp_path / "engine"
    (copy_root / "kernels" / "sm_90").mkdir(parents=True)
    for entry in table["kernels"].values():
        (copy_root / "kernels" / entry["cubin"]).write_bytes((root / "kernels" / entry["cubin"]).read_bytes())
    cubin = copy_root / "kernels" / table["kernels"]["scale_add.fp32.B1024"]["cubin"]
    data = bytearray(cubin.read_bytes())
    data[len(data) // 2] ^= 0xFF
    cubin.write_bytes(bytes(data))
    with pytest.raises(EngineError, match="corrupt"):
        KernelTable.load(copy_root, table, arch=90)
    cubin.unlink()
    with pytest.raises(EngineError, match="missing"):
        KernelTable.load(copy_root, table, arch=90)


def test_spec_is_checked_at_build():
    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "alpha": "fp32", "n": "i32", "BLOCK": "constexpr"}
    with pytest.raises(KernelCompileError, match="not the parameters"):
        KernelSpec(scale_add, "bad", {"x_ptr": "*fp32"})
    with pytest.raises(KernelCompileError, match="typed constexpr"):
        KernelSpec(scale_add, "bad", sig)
    with pytest.raises(KernelCompileError, match="unknown name 'm'"):
        KernelSpec(scale_add, "bad", sig, {"BLOCK": 64}, grid=(1,), grid_formula=("cdiv(m, BLOCK)",))
    with pytest.raises(KernelCompileError, match="not allowed"):
        KernelSpec(scale_add, "bad", sig, {"BLOCK": 64}, grid=(1,), grid_formula=("n.real",))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where no GPU is visible")
def test_autotune_needs_a_gpu():
    with pytest.raises(RuntimeError, match="none is visible"):
        autotune(specs(), lambda spec: None)


def test_runtime_module_does_not_import_triton():
    code = "import sys, atlas.runtime.kernels; assert 'triton' not in sys.modules, 'triton was imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- GPU -----------------------------------------------------------------------------------------

def _inputs(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return {
        "x": torch.randn(N_ELEMS, device="cuda", generator=g),
        "y": torch.randn(N_ELEMS, device="cuda", generator=g),
        "a": torch.randn(M, K, device="cuda", generator=g).bfloat16(),
        "b": torch.randn(K, N, device="cuda", generator=g).bfloat16(),
    }


def _launch_all(kernels: KernelTable, t: dict, out: torch.Tensor, c: torch.Tensor, alpha: float) -> None:
    kernels.launch("scale_add.fp32.B1024", None, t["x"], t["y"], out, alpha, N_ELEMS)
    kernels.launch(f"matmul.bf16.M{M}.N{N}.K{K}", None, t["a"], t["b"], c, M, N, K)


def _check(t: dict, out: torch.Tensor, c: torch.Tensor, alpha: float) -> None:
    torch.cuda.synchronize()
    assert not out.isnan().any() and not c.isnan().any(), "an output element was not written"
    torch.testing.assert_close(out, alpha * t["x"] + t["y"])
    ref = t["a"].double() @ t["b"].double()
    err = ((c.double() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, f"matmul relative error {err:.2e}"


@pytest.mark.gpu
def test_launch_matches_torch(engine):
    root, table = engine
    kernels = KernelTable.load(root, table)
    for seed in (1, 2):
        t = _inputs(seed)
        out = torch.full((N_ELEMS,), float("nan"), device="cuda")
        c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        _launch_all(kernels, t, out, c, alpha=0.5 + seed)
        _check(t, out, c, alpha=0.5 + seed)
    with pytest.raises(ValueError, match="16-byte alignment"):
        kernels.launch(f"matmul.bf16.M{M}.N{N}.K{K}", None, t["a"].view(-1)[1:], t["b"], c, M, N, K)


@pytest.mark.gpu
def test_launch_replays_in_a_cuda_graph(engine):
    root, table = engine
    kernels = KernelTable.load(root, table)
    kernels.preload()
    static = _inputs(3)
    out = torch.empty(N_ELEMS, device="cuda")
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up off the default stream, as capture requires
        _launch_all(kernels, static, out, c, alpha=1.5)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _launch_all(kernels, static, out, c, alpha=1.5)
    for seed in (4, 5):
        fresh = _inputs(seed)
        for name, tensor in fresh.items():
            static[name].copy_(tensor)
        out.fill_(float("nan"))
        c.fill_(float("nan"))
        graph.replay()
        _check(fresh, out, c, alpha=1.5)


@pytest.mark.gpu
def test_autotune_picks_a_candidate_that_ran_and_records_failures():
    x, y = torch.randn(1 << 20, device="cuda"), torch.randn(1 << 20, device="cuda")
    out = torch.empty_like(x)
    base = specs()[0]
    candidates = [KernelSpec(base.fn, base.name, base.signature, {"BLOCK": block}, num_warps=warps, num_stages=1)
                  for block, warps in [(256, 2), (1024, 4), (3, 4)]]  # BLOCK=3 is no power of 2: fails

    def run(spec):
        grid = (triton.cdiv(x.numel(), spec.constexprs["BLOCK"]),)
        spec.fn[grid](x, y, out, 2.0, x.numel(), **spec.constexprs, num_warps=spec.num_warps,
                      num_stages=spec.num_stages)

    best, timings = autotune(candidates, run, warmup_ms=5, rep_ms=20)
    assert best.constexprs["BLOCK"] in (256, 1024)
    assert [t["ms"] is None for t in timings] == [False, False, True] and timings[2]["error"]
    assert min(t["ms"] for t in timings[:2]) == next(t["ms"] for t in timings if t["constexprs"] == best.constexprs)


NO_COMPILE = textwrap.dedent("""
    import json, sys
    from pathlib import Path

    import torch
    import triton
    import triton.compiler.compiler
    import triton.runtime.jit

    def refuse(*args, **kwargs):
        raise AssertionError("Triton was asked to compile at run time")

    # Every way into Triton's compiler raises (torch itself may import triton, so it stays importable).
    triton.compile = triton.compiler.compile = triton.compiler.compiler.compile = refuse
    triton.runtime.jit.JITFunction.run = refuse

    from atlas.runtime.kernels import KernelTable

    root = Path(sys.argv[1])
    kernels = KernelTable.load(root, json.loads((root / "table.json").read_text()))
    x, y = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
    out = torch.full((5000,), float("nan"), device="cuda")
    kernels.launch("scale_add.fp32.B1024", None, x, y, out, 2.0, 5000)
    a, b = torch.randn(384, 320, device="cuda").bfloat16(), torch.randn(320, 256, device="cuda").bfloat16()
    c = torch.full((384, 256), float("nan"), device="cuda", dtype=torch.bfloat16)
    kernels.launch("matmul.bf16.M384.N256.K320", None, a, b, c, 384, 256, 320)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, 2.0 * x + y)
    torch.testing.assert_close(c.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-1)
    print("launched without compiling")
""")


@pytest.mark.gpu
def test_launch_compiles_nothing(engine, tmp_path):
    root, table = engine
    (root / "table.json").write_text(json.dumps(table))
    cache = tmp_path / "triton-cache"
    cache.mkdir()
    cache.chmod(0o555)
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    result = subprocess.run([sys.executable, "-c", NO_COMPILE, str(root)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "launched without compiling" in result.stdout
    assert not any(cache.iterdir()), "something wrote to the Triton cache"


def test_compile_threads_retry_the_ast_race_only(monkeypatch):
    """CPython's ast is not thread-safe (python/cpython#106905): a compile in the build's threads that fails with its
    spurious "AST constructor recursion depth mismatch" SystemError is compiled again; any other failure is raised
    at once."""
    from atlas.build_engine.kernels import aot

    calls = []

    def flaky(spec, arch):
        calls.append(spec)
        if len(calls) == 1:
            try:
                raise SystemError("AST constructor recursion depth mismatch (before=180, after=237)")
            except SystemError as e:
                raise KernelCompileError(f"{spec}: Triton could not compile it") from e
        return "compiled"

    monkeypatch.setattr(aot, "compile_kernel", flaky)
    assert aot._compile_in_thread("k", 90) == "compiled" and calls == ["k", "k"]

    def broken(spec, arch):
        calls.append(spec)
        raise KernelCompileError(f"{spec}: needs 300000 bytes of shared memory")

    calls.clear()
    monkeypatch.setattr(aot, "compile_kernel", broken)
    with pytest.raises(KernelCompileError, match="shared memory"):
        aot._compile_in_thread("k", 90)
    assert calls == ["k"]
