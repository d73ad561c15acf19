"""Quantized linears through the engine's precompiled kernels (CudaLinear) against the torch reference."""

import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch
from safetensors.torch import load_file

from atlas.build_engine.builder import BuildConfig, build
from atlas.runtime.layers.linear_cuda import GEMM_BUCKETS

FORMATS = {"nvfp4": {}, "fp8": {}, "mixed": {"mlp": "fp8", "lm_head": "nvfp4"}}


@pytest.fixture(scope="module")
def cuda_engines(tmp_path_factory):
    out = {}
    for name, classes in FORMATS.items():
        dtype = "nvfp4" if name == "mixed" else name
        out[name] = build(BuildConfig("synthetic:tiny-qwen3.5-vl", tmp_path_factory.mktemp(name) / "e", dtype=dtype,
                                      class_dtypes=classes, device="cuda", autotune=False,
                                      progress=False))
    return out


@pytest.fixture(scope="module")
def library_engines(tmp_path_factory):
    """nvfp4 and fp8 engines whose GEMM buckets (M > 16) take the library ways: dequantize + cuBLAS for nvfp4
    ("DEQUANT", the only candidate while they are built), cuBLASLt's FP8 GEMM for fp8 ("CUBLAS", the first one;
    weights with N or K not a multiple of 16 fall back to an fp8_gemm_kernel tile)."""
    from atlas.plugins_trt.quant_linear import triton_gemm as GM

    mp = pytest.MonkeyPatch()
    mp.setattr(GM, "CONFIGS_nvfp4_gemm", list(GM.CONFIGS_nvfp4_dequant))
    mp.setattr(GM, "CONFIGS_fp8_gemm", GM.CONFIGS_fp8_scaled_mm + GM.CONFIGS_fp8_gemm)  # a tile where N % 16
    try:
        return {fmt: build(BuildConfig("synthetic:tiny-qwen3.5-vl", tmp_path_factory.mktemp(f"lib-{fmt}") / "e",
                                       dtype=fmt, device="cuda", autotune=False, progress=False))
                for fmt in ("nvfp4", "fp8")}
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def wgmma_engine(tmp_path_factory):
    """An nvfp4 engine whose GEMM buckets take the Gluon wgmma kernel where K allows it (K % (2 BLOCK_K) == 0: the
    tiny model's down projection, K 128) and an nvfp4_gemm_kernel tile elsewhere."""
    from atlas.plugins_trt.quant_linear import triton_gemm as GM

    # the register-prefetch form: W_SMEM needs K % 256 == 0, and the tiny model's K are 64 and 128
    wg = {**next(c for c in GM.CONFIGS_nvfp4_wgmma if c["BLOCK_K"] == 64), "W_SMEM": False}
    tile = next(c for c in GM.CONFIGS_nvfp4_gemm if not c.get("DEQUANT") and not c.get("WGMMA"))
    mp = pytest.MonkeyPatch()
    mp.setattr(GM, "CONFIGS_nvfp4_gemm", [wg, tile])
    try:
        return build(BuildConfig("synthetic:tiny-qwen3.5-vl", tmp_path_factory.mktemp("wgmma") / "e", dtype="nvfp4",
                                 device="cuda", autotune=False, progress=False))
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def tuned_engines(tmp_path_factory):
    """Autotuned builds (on the GPU: the candidates compiled in the build's process pool, timed, chosen, written to
    a tuning cache), each format's candidate lists cut to their first three to keep the test short; then a second
    build of the same model against that cache."""
    from atlas.build_engine import linear_kernels as LK
    from atlas.plugins_trt.quant_linear import triton_gemm as GM

    mp = pytest.MonkeyPatch()
    for module, name in ((LK, "nvfp4_gemv_candidates"), (LK, "gemv_candidates"), (GM, "gemm_candidates")):
        mp.setattr(module, name, lambda *a, _f=getattr(module, name), **k: _f(*a, **k)[:3])
    root = tmp_path_factory.mktemp("tuned")
    cache = root / "tuning_cache.json"
    try:
        def one(tag):
            return build(BuildConfig("synthetic:tiny-qwen3.5-vl", root / tag, dtype="nvfp4",
                                     class_dtypes={"mlp": "fp8"}, device="cuda", autotune=True, tuning_cache=cache,
                                     progress=False))
        return one("first"), one("again")
    finally:
        mp.undo()


@pytest.mark.gpu
def test_autotuned_build_chooses_caches_and_computes(tuned_engines):
    first, again = tuned_engines
    plan = first.manifest["linear_kernels"]
    cases = sum(len(entry) for entry in plan.values())
    assert {k.split(":")[0] for k in plan} == {"nvfp4", "fp8"}
    assert all(item["tuned"] for entry in plan.values() for item in entry.values())
    assert first.manifest["target"]["autotuned"] and first.manifest["target"]["tuning_cache"] == {
        "hits": 0, "misses": cases}
    assert again.manifest["target"]["tuning_cache"] == {"hits": cases, "misses": 0}
    assert ({k: {b: i["config"] for b, i in e.items()} for k, e in again.manifest["linear_kernels"].items()}
            == {k: {b: i["config"] for b, i in e.items()} for k, e in plan.items()})
    for m in (1, 8, 256):
        check_engine_linears(first, m)


def test_wgmma_way_in_the_plan(wgmma_engine):
    """WGMMA entries name a compiled Gluon kernel; weights whose K it cannot serve keep the tile."""
    table = wgmma_engine.manifest["kernels"]["kernels"]
    seen = 0
    for key, entry in wgmma_engine.manifest["linear_kernels"].items():
        k = int(key.split("x")[1])
        for bucket in map(str, GEMM_BUCKETS):
            item = entry[bucket]
            assert bool(item["config"].get("WGMMA")) == (k % 128 == 0), (key, item["config"])
            assert item["kernel"] in table
            seen += bool(item["config"].get("WGMMA"))
            if item["config"].get("WGMMA"):
                assert table[item["kernel"]]["shared"] > 0 and item["kernel"].startswith("nvfp4_wgmma.")
    assert seen


def test_library_ways_in_the_plan(library_engines):
    """DEQUANT entries name the compiled nvfp4_dequant_kernel and its rows per call; CUBLAS entries only the
    activation quantization."""
    for fmt, result in library_engines.items():
        table = result.manifest["kernels"]["kernels"]
        for key, entry in result.manifest["linear_kernels"].items():
            if not key.startswith(fmt):
                continue
            for bucket in map(str, GEMM_BUCKETS):
                item = entry[bucket]
                if fmt == "nvfp4":  # rows: a multiple of 16, or the whole weight in one call
                    n = int(key.split(":")[1].split("x")[0])
                    assert item["config"]["DEQUANT"] and item["kernel"] in table
                    assert item["rows"] == n or (item["rows"] % 16 == 0 and item["rows"] < n)
                elif all(int(d) % 16 == 0 for d in key.split(":")[1].split("x")):
                    assert item["config"].get("CUBLAS") and item["kernel"] is None and item["quant"] in table
                else:
                    assert not item["config"].get("CUBLAS") and item["kernel"] in table


def test_cuda_build_compiles_every_kernel(cuda_engines):
    """Works without a GPU too: kernels compile for sm_90 on the CPU (heuristic configs, tuned: false)."""
    for result in cuda_engines.values():
        m = result.manifest
        assert m["target"]["device"] == "cuda" and m["target"]["arch"] == 90
        plan, table = m["linear_kernels"], m["kernels"]
        assert plan and table["arch"] == 90
        for entry in plan.values():
            assert set(entry) == {str(b) for b in (1, 2, 4, 8, 16) + GEMM_BUCKETS} and "512" in entry
            for item in entry.values():
                for role in ("kernel", "reduce", "reduce_silu", "reduce_norm", "quant"):
                    if item[role]:
                        cubin = result.path / "kernels" / table["kernels"][item[role]]["cubin"]
                        assert cubin.is_file() and m["files"][f"kernels/{table['kernels'][item[role]]['cubin']}"]
        # the fused reductions exist where the runtime takes them: gate_up (SiLU-mul) and the residual
        # projections (add + RMSNorm) where a GEMV bucket splits K
        fused = {role: {key for key, entry in plan.items() for item in entry.values() if item[role]}
                 for role in ("reduce_silu", "reduce_norm")}
        assert fused["reduce_silu"] and fused["reduce_norm"] and not fused["reduce_silu"] & fused["reduce_norm"]
        fmts = {f for p, f in m["weight_formats"].items() if p != "embed"}
        assert {k.split(":")[0] for k in plan} == fmts - {"bfloat16"}


def test_cuda_engine_refused_by_the_cpu_runtime(cuda_engines):
    from atlas.runtime.engine import load_engine
    from atlas.runtime.errors import EngineError

    with pytest.raises(EngineError, match="built for target 'cuda'"):
        load_engine(cuda_engines["nvfp4"].path)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 16, 17, 64, 200, 256, 300, 512, 2048])
def test_cuda_linear_matches_reference(name, m, cuda_engines):
    check_engine_linears(cuda_engines[name], m)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8"])
@pytest.mark.parametrize("m", [17, 64, 300, 2048])
def test_cuda_linear_library_ways_match_reference(fmt, m, library_engines):
    check_engine_linears(library_engines[fmt], m)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [17, 64, 300, 2048])
def test_cuda_linear_wgmma_way_matches_reference(m, wgmma_engine):
    check_engine_linears(wgmma_engine, m)


def check_engine_linears(result, m):
    """Every nvfp4 / fp8 linear of the engine through CudaLinear at M = m against the fp32 reference."""
    from atlas.plugins_trt.quant_linear.reference import dequantize
    from atlas.runtime.kernels import KernelTable
    from atlas.runtime.layers.linear_cuda import CudaLinear

    m_ = result.manifest
    table = KernelTable.load(result.path, m_["kernels"])
    stored = {}
    for f in m_["weights"]:
        stored.update(load_file(str(result.path / f)))
    g = torch.Generator(device="cuda").manual_seed(m)
    for prefix, fmt in m_["weight_formats"].items():
        if prefix == "embed" or fmt not in ("nvfp4", "fp8"):
            continue
        t = {s: stored[f"{prefix}.{s}"].cuda() for s in ("weight", "weight_scale", "weight_scale_2")
             if f"{prefix}.{s}" in stored}
        n = t["weight"].shape[0]
        k = t["weight"].shape[1] * (2 if fmt == "nvfp4" else 1)
        bias = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16) if prefix.endswith("qkv_proj") else None
        layer = CudaLinear(fmt, t, table, m_["linear_kernels"][f"{fmt}:{n}x{k}"], bias)
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        ref = x.float() @ dequantize(fmt, t["weight"], t.get("weight_scale"), t.get("weight_scale_2")).T
        ref = ref if bias is None else ref + bias.float()  # an attention bias (Llama's attention_bias)
        y = layer(x)
        err = float((y.float() - ref).norm() / ref.norm())
        bound = 5e-2 if (fmt == "fp8" and m > 16) else 1e-2  # W8A8 rounds the activations too
        assert err < bound, (prefix, fmt, m, err)


@pytest.mark.gpu
def test_cuda_linear_compiles_nothing_at_run_time(cuda_engines, tmp_path):
    """In a fresh process whose Triton cache is an empty read-only folder and whose Triton compiler raises,
    the engine's kernels still launch and compute the right result."""
    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o555)
    script = textwrap.dedent(f"""
        import json, torch, triton, triton.compiler
        def refuse(*a, **k): raise RuntimeError("compilation at run time")
        triton.compile = triton.compiler.compile = refuse
        from safetensors.torch import load_file
        from atlas.runtime.kernels import KernelTable
        from atlas.runtime.layers.linear_cuda import CudaLinear
        from atlas.plugins_trt.quant_linear.reference import dequantize
        path = {str(cuda_engines['nvfp4'].path)!r}
        m = json.load(open(path + "/manifest.json"))
        table = KernelTable.load(path, m["kernels"])
        w = load_file(path + "/weights/layer_000.safetensors")
        p = "layers.0.mlp.gate_up_proj"
        t = {{s: w[p + "." + s].cuda() for s in ("weight", "weight_scale", "weight_scale_2")}}
        n, k = t["weight"].shape[0], t["weight"].shape[1] * 2
        layer = CudaLinear("nvfp4", t, table, m["linear_kernels"][f"nvfp4:{{n}}x{{k}}"])
        for mm in (1, 16, 256):
            x = torch.randn(mm, k, device="cuda").to(torch.bfloat16)
            ref = x.float() @ dequantize("nvfp4", t["weight"], t["weight_scale"], t["weight_scale_2"]).T
            err = float((layer(x).float() - ref).norm() / ref.norm())
            assert err < 1e-2, err
        print("ok")
    """)
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert run.returncode == 0 and "ok" in run.stdout, run.stdout + run.stderr
    assert not any(cache.iterdir())


def test_gemv_candidates_keep_every_way():
    """The M = 1 bucket of fp8 is timed on CUDA-core configs with plain and pipelined loads, on tensor-core
    configs and on PRE configs, an equal share each; other buckets on tensor cores (with and without PRE). nvfp4
    M = 1: the two CUDA-core ways."""
    from atlas.build_engine.linear_kernels import gemv_candidates
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv

    def way(c):
        return bool(c.get("TC")), c.get("PIPE", 1) > 1

    one = gemv_candidates(gemv.CONFIGS_fp8_gemv, 1, 28672, 8)
    assert len(one) == 8 and all(c["BLOCK_M"] == 1 for c in one)
    plain = [way(c) for c in one if not c.get("PRE")]  # fp8's PRE configs (weights before the PDL wait): a way too
    assert sorted(plain) == sorted([(False, False), (False, True), (True, False)] * 2)
    assert sum(bool(c.get("PRE")) for c in one) == 2
    sixteen = gemv_candidates(gemv.CONFIGS_fp8_gemv, 16, 28672, 6)
    assert sixteen and all(c["TC"] and c["BLOCK_M"] == 16 for c in sixteen)
    assert any(c.get("PRE") for c in sixteen) and not all(c.get("PRE") for c in sixteen)
    nv = gemv_candidates(gemv.CONFIGS_nvfp4_gemv, 1, 28672, 6)
    assert all("TC" not in c for c in nv) and sorted(way(c) for c in nv) == [(False, False)] * 3 + [(False, True)] * 3
    # with K given, the Gluon mma.sync configs (plain and register-prefetch) are two more ways, never the first
    # pick, GLUON_SHARE a round each; only those K % BLOCK_K allows. 9 candidates: a round of 1 + 1 + 3 + 3, then
    # the first CUDA-core way again
    nv = gemv_candidates(gemv.CONFIGS_nvfp4_gemv, 1, 28672, 9, k=4096)
    gl_ways = [c.get("PIPE", 1) > 1 for c in nv if c.get("GLUON")]
    assert not nv[0].get("GLUON") and sorted(gl_ways) == [False] * 3 + [True] * 3 and len(nv) == 9
    assert all(4096 % c["BLOCK_K"] == 0 for c in nv if c.get("GLUON"))
    odd = gemv_candidates(gemv.CONFIGS_nvfp4_gemv, 4, 28672, 9, k=4096 + 64)
    assert odd and not any(c.get("GLUON") for c in odd)  # 4160 is no multiple of the Gluon BLOCK_K (128, 256)


def test_rows_take_the_smallest_bucket_the_plan_has():
    """A prefill chunk of up to 512 rows takes the 512 bucket's kernel; an engine built before that bucket (no "512"
    in its plan) takes its 2048 one, as it did."""
    from atlas.runtime.layers.linear_cuda import CudaLinear

    launched = []

    class Kernels:
        def params(self, name):
            return []

        def launch(self, name, grid, *args):
            launched.append(name)

    t = {"weight": torch.zeros(128, 32, dtype=torch.uint8), "weight_scale": torch.ones(128, 4),
         "weight_scale_2": torch.ones(128)}
    gemv = {"config": {}, "kernel": "gemv"}
    plan = {**{str(b): gemv for b in (1, 2, 4, 8, 16)}, **{str(b): {"config": {}, "kernel": f"gemm{b}"}
                                                          for b in GEMM_BUCKETS}}
    older = {b: e for b, e in plan.items() if b != "512"}
    for p, want in ((plan, ["gemm256", "gemm512", "gemm512", "gemm2048", "gemm2048"]),
                    (older, ["gemm256", "gemm2048", "gemm2048", "gemm2048", "gemm2048"])):
        launched.clear()
        layer = CudaLinear("nvfp4", t, Kernels(), p)
        for m in (256, 257, 512, 513, 4096):
            layer(torch.zeros(m, 64, dtype=torch.bfloat16))
        assert launched == want, (sorted(p, key=int), launched)


def test_fused_silu_only_where_the_plan_compiled_it():
    """CudaLinear.fuses_silu: a quantized GEMV bucket whose plan names a reduction with SiLU-mul fused, no bias, not
    the stream-K form; CudaOps.gate_up_silu takes it there and the plain projection + silu_mul elsewhere."""
    from atlas.runtime.cuda_ops import CudaOps
    from atlas.runtime.layers.linear_cuda import CudaLinear

    split = {"config": {"SPLIT_K": 4}, "kernel": "k", "reduce": "r", "reduce_silu": "rs"}
    plan = {"1": split, "2": {**split, "reduce_silu": None}, "4": {"config": {"STREAMK": 2, "BLOCK_N": 64},
                                                                  "kernel": "s", "reduce_silu": "rs"},
            "8": split, "16": split, "64": {"config": {}, "kernel": "g"}}
    t = {"weight": torch.zeros(128, 32, dtype=torch.uint8), "weight_scale": torch.ones(128, 4),
         "weight_scale_2": torch.ones(128)}
    layer = CudaLinear("nvfp4", t, object(), plan)
    assert [layer.fuses_silu(m) for m in (1, 2, 3, 5, 16, 17)] == [True, False, False, True, True, False]
    assert not CudaLinear("nvfp4", t, object(), plan, bias=torch.zeros(128)).fuses_silu(1)
    wk = {"config": {"WK": 2, "SPLIT_K": 1, "BLOCK_N": 64}, "kernel": "w", "reduce": None, "reduce_silu": None}
    layer = CudaLinear("nvfp4", t, object(),
                       {**plan, "2": {**wk, "kernel_silu": "ws"}, "4": {**wk, "kernel_silu": None}})
    assert [layer.fuses_silu(m) for m in (2, 3, 4)] == [True, False, False]  # a WK GEMV compiled with SILU
    assert not CudaLinear("nvfp4", t, object(), {**plan, "2": {**wk, "kernel_silu": "ws"}},
                          bias=torch.zeros(128)).fuses_silu(2)

    calls = []

    class Proj:
        def fuses_silu(self, m):
            return m == 1

        def __call__(self, h, silu=False):
            calls.append(silu)
            return torch.full((h.shape[0], 8), 2.0)

    ops = CudaOps.__new__(CudaOps)
    ops.silu_mul = lambda gate_up: gate_up[:, :4] * 3
    assert ops.gate_up_silu(Proj(), torch.zeros(1, 4)).shape == (1, 8) and calls == [True]
    assert torch.equal(ops.gate_up_silu(Proj(), torch.zeros(2, 4)), torch.full((2, 4), 6.0)) and calls[-1] is False


def test_fused_norm_only_where_the_plan_compiled_it():
    """CudaLinear.fuses_norm: a quantized GEMV bucket whose plan names a reduction with the add + RMSNorm fused, no
    bias, not the stream-K form; CudaOps.project_add_rms_norm takes it there (the residual updated by the
    projection's reduction) and the plain projection + add_rms_norm elsewhere."""
    from atlas.runtime.cuda_ops import CudaOps
    from atlas.runtime.layers.linear_cuda import CudaLinear

    split = {"config": {"SPLIT_K": 4}, "kernel": "k", "reduce": "r", "reduce_norm": "rn"}
    plan = {"1": split, "2": {**split, "reduce_norm": None}, "4": {"config": {"STREAMK": 2, "BLOCK_N": 64},
                                                                  "kernel": "s", "reduce_norm": "rn"},
            "8": {"config": {"SPLIT_K": 1}, "kernel": "k", "reduce_norm": None}, "16": split,
            "64": {"config": {}, "kernel": "g"}}
    t = {"weight": torch.zeros(128, 32, dtype=torch.uint8), "weight_scale": torch.ones(128, 4),
         "weight_scale_2": torch.ones(128)}
    layer = CudaLinear("nvfp4", t, object(), plan)
    assert [layer.fuses_norm(m) for m in (1, 2, 3, 5, 16, 17)] == [True, False, False, False, True, False]
    assert not CudaLinear("nvfp4", t, object(), plan, bias=torch.zeros(128)).fuses_norm(1)
    assert not layer.fuses_silu(1)  # each reduction is its own
    wk = {"config": {"WK": 2, "SPLIT_K": 1, "BLOCK_N": 64}, "kernel": "w", "reduce": None, "reduce_norm": None}
    layer = CudaLinear("nvfp4", t, object(),
                       {**plan, "2": {**wk, "kernel_norm": "wn"}, "4": {**wk, "kernel_norm": None}})
    assert [layer.fuses_norm(m) for m in (2, 3, 4)] == [True, False, False]  # a WK GEMV compiled with the norm
    assert not layer.fuses_silu(2) and int(layer.norm_counter) == 0  # its counter, zero
    assert CudaLinear("nvfp4", t, object(), plan).norm_counter is None

    calls = []

    class Proj:
        def fuses_norm(self, m):
            return m == 1

        def __call__(self, x, norm=None):
            calls.append(norm)
            if norm is not None:
                norm[0].add_(1.0)
            return torch.full((x.shape[0], 8), 2.0)

    ops = CudaOps.__new__(CudaOps)
    ops.c = types.SimpleNamespace(rms_norm_eps=1e-5)
    ops.add_rms_norm = lambda x, residual, weight: (x * weight, residual.add_(x))
    residual, weight = torch.zeros(1, 8), torch.full((8,), 3.0)
    y, r = ops.project_add_rms_norm(Proj(), torch.zeros(1, 4), residual, weight)
    assert r is residual and torch.equal(residual, torch.ones(1, 8)) and calls[0][1:] == (weight, 1e-5)
    residual = torch.zeros(2, 8)
    y, r = ops.project_add_rms_norm(Proj(), torch.zeros(2, 4), residual, weight)
    assert calls[-1] is None and torch.equal(y, torch.full((2, 8), 6.0)) and torch.equal(r, torch.full((2, 8), 2.0))


def test_the_norm_is_deferred_only_where_both_projections_have_the_forms():
    """CudaOps.project_add_rms_norm leaves the norm to the next projection (CudaLinear(x, norm=..., defer=True), a
    DeferredNorm) only where the residual projection defers it at that M, the next one takes it, and DEFER_NORM was
    on when the ops were made (`deferred_norm(True)`; off by default until its GPU tests pass); CudaLinear's
    defers_norm / takes_deferred follow the plan's WK forms (kernel_defer; kernel_rstd, and kernel_silu_rstd beside a
    kernel_silu) and split-K reductions' (reduce_defer; reduce_rstd, and reduce_silu_rstd beside a reduce_silu), at
    GEMV buckets only."""
    from atlas.runtime import cuda_ops
    from atlas.runtime.layers.linear_cuda import CudaLinear

    t = {"weight": torch.zeros(128, 32, dtype=torch.uint8), "weight_scale": torch.ones(128, 4),
         "weight_scale_2": torch.ones(128)}
    wk = {"config": {"WK": 2, "SPLIT_K": 1, "BLOCK_N": 64}, "kernel": "w", "reduce": None}
    plan = {"1": {**wk, "kernel_norm": "wn", "kernel_defer": "wd", "kernel_rstd": "wr"},
            "2": {**wk, "kernel_rstd": "wr", "kernel_silu": "ws"},
            "4": {**wk, "kernel_rstd": "wr", "kernel_silu": "ws", "kernel_silu_rstd": "wsr"},
            "8": {"config": {"SPLIT_K": 4}, "kernel": "k", "reduce": "r"},
            "16": {"config": {"SPLIT_K": 4}, "kernel": "k", "reduce": "r", "reduce_defer": "rd", "reduce_rstd": "rr"},
            "64": {"config": {"SPLIT_K": 2}, "kernel": "g", "reduce_defer": "rd", "reduce_rstd": "rr"}}
    layer = CudaLinear("nvfp4", t, object(), plan)
    assert [layer.defers_norm(m) for m in (1, 2, 4, 8, 16, 64)] == [True, False, False, False, True, False]
    assert [layer.takes_deferred(m) for m in (1, 2, 3, 8, 16, 64)] == [True, False, True, False, True, False]
    silu_split = {"16": {**plan["16"], "reduce_silu": "rs"}}
    assert not CudaLinear("nvfp4", t, object(), silu_split).takes_deferred(16)  # no reduce_silu_rstd beside it
    assert CudaLinear("nvfp4", t, object(), {"16": {**silu_split["16"], "reduce_silu_rstd": "rsr"}}).takes_deferred(9)
    with pytest.raises(ValueError, match="cannot defer"):
        layer(torch.zeros(2, 64, dtype=torch.bfloat16), defer=True)

    calls = []

    class Proj:
        def __init__(self, defers=True, takes=True):
            self.defers, self.takes = defers, takes

        def fuses_norm(self, m):
            return True

        def defers_norm(self, m):
            return self.defers

        def takes_deferred(self, m):
            return self.takes

        def __call__(self, x, norm=None, defer=False):
            calls.append(defer)
            return "deferred" if defer else torch.zeros(x.shape[0], 8)

    def made(enabled):
        with cuda_ops.deferred_norm(enabled):
            ops = cuda_ops.CudaOps.__new__(cuda_ops.CudaOps)
            ops.defer_norm = cuda_ops.DEFER_NORM  # what __init__ reads
        ops.c = types.SimpleNamespace(rms_norm_eps=1e-5)
        return ops

    assert not cuda_ops.DEFER_NORM
    x, residual, weight = torch.zeros(1, 4), torch.zeros(1, 8), torch.ones(8)
    assert made(True).project_add_rms_norm(Proj(), x, residual, weight, then=Proj())[0] == "deferred"
    for ops, proj, then in [(made(False), Proj(), Proj()), (made(True), Proj(defers=False), Proj()),
                            (made(True), Proj(), Proj(takes=False)), (made(True), Proj(), None),
                            (made(True), Proj(), object())]:
        calls.clear()
        y, r = ops.project_add_rms_norm(proj, x, residual, weight, then=then)
        assert calls == [False] and isinstance(y, torch.Tensor) and r is residual


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["nvfp4", "fp8"])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_fused_silu_is_the_plain_way_to_the_bit(name, m, cuda_engines):
    """Every gate_up projection whose bucket fuses SiLU-mul into its split-K reduction gives silu_mul of its plain
    output exactly (the engines' heuristic GEMV configs split K)."""
    from atlas.plugins_trt.activation.triton_silu import launch_silu_mul
    from atlas.runtime.cuda_engine import load_cuda_engine

    engine = load_cuda_engine(cuda_engines[name].path)
    fused = 0
    for prefix in (p for p in engine.manifest["weight_formats"] if p.endswith("mlp.gate_up_proj")):
        layer = engine.linear(engine.weights, prefix)
        x = torch.randn(m, layer.k, device="cuda", generator=torch.Generator("cuda").manual_seed(m)).to(torch.bfloat16)
        if layer.fuses_silu(m):
            assert torch.equal(layer(x, silu=True), launch_silu_mul(layer(x))), prefix
            fused += 1
    assert fused


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["nvfp4", "fp8"])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_fused_norm_is_the_plain_way_to_the_bit(name, m, cuda_engines):
    """Every residual projection (o_proj, down_proj, the GDN out_proj) whose bucket fuses the add + RMSNorm into its split-K reduction
    gives the plain projection then CudaOps.add_rms_norm exactly, the residual stream alike."""
    from atlas.runtime.cuda_engine import load_cuda_engine
    from atlas.runtime.cuda_ops import CudaOps

    engine = load_cuda_engine(cuda_engines[name].path)
    ops = CudaOps(engine.config, engine.aot)
    fused = 0
    for prefix in (p for p in engine.manifest["weight_formats"] if p.endswith(("o_proj", "down_proj", "out_proj"))):
        layer = engine.linear(engine.weights, prefix)
        g = torch.Generator("cuda").manual_seed(m)
        x = torch.randn(m, layer.k, device="cuda", generator=g).to(torch.bfloat16)
        residual = torch.randn(m, layer.n, device="cuda", generator=g).to(torch.bfloat16)
        weight = engine.weights[prefix.rsplit(".", 2)[0] + ".post_norm.weight"]
        if layer.fuses_norm(m):
            fused_res, plain_res = residual.clone(), residual.clone()
            got = layer(x, norm=(fused_res, weight, engine.config.rms_norm_eps))
            want, _ = ops.add_rms_norm(layer(x), plain_res, weight)
            assert torch.equal(got, want) and torch.equal(fused_res, plain_res), prefix
            fused += 1
    assert fused
