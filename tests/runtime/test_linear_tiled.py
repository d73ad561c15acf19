"""NVFP4 linears in the tiled weight order (plugins_trt/quant_linear/layout.py): the build's plan, CudaLinear's
re-ordering at load, and (GPU) every kernel way that reads the order against the fp32 reference."""

import pytest
import torch

from atlas.build_engine.builder import BuildConfig, build
from atlas.build_engine import linear_kernels as LK
from atlas.build_engine.linear_kernels import (gemv_candidates, is_tiled, streamk_candidates, tiled_configs,
                                               wk_candidates)
from atlas.plugins_trt.quant_linear import triton_gemm as GM
from atlas.plugins_trt.quant_linear import triton_gemv as GV
from atlas.runtime.layers.linear_cuda import GEMM_BUCKETS
from atlas.tools.dev.nvfp4_wk import configs as wk_configs
from atlas.tools.dev.variants import nvfp4_tiled_weight


@pytest.fixture(scope="module")
def tiled_engine(tmp_path_factory):
    """tiny-llama-wide: every linear of whole 128 x 128 tiles, so every one runs tiled."""
    return build(BuildConfig("synthetic:tiny-llama-wide", tmp_path_factory.mktemp("tiled") / "e", dtype="nvfp4",
                             device="cuda", autotune=False, progress=False))


@pytest.fixture(scope="module")
def padded_engine(tmp_path_factory):
    """tiny-qwen3.5-wide: K on the tiles everywhere; the GDN in_proj (N 200) and the attention qkv (N 320) off them,
    run padded to whole tiles (256, 384)."""
    return build(BuildConfig("synthetic:tiny-qwen3.5-wide", tmp_path_factory.mktemp("padded") / "e", dtype="nvfp4",
                             device="cuda", autotune=False, onnx=False, progress=False))


@pytest.fixture(scope="module")
def split_engine(tmp_path_factory):
    """tiny-llama-wide whose GEMM buckets take the wgmma kernel split in two along K where K allows it (K 256, the
    down projection) and the packed dequantization elsewhere."""
    wg = {**next(c for c in GM.CONFIGS_nvfp4_wgmma if c.get("SPLIT_K") == 2 and c["BLOCK_K"] == 64)}
    tile = next(c for c in GM.CONFIGS_nvfp4_gemm if c.get("DEQUANT") and c.get("PACK"))
    mp = pytest.MonkeyPatch()
    mp.setattr(GM, "CONFIGS_nvfp4_gemm", [wg, tile])
    try:
        return build(BuildConfig("synthetic:tiny-llama-wide", tmp_path_factory.mktemp("split") / "e", dtype="nvfp4",
                                 device="cuda", autotune=False, progress=False))
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def sk_engine(tmp_path_factory):
    """Four tiny-llama-wide engines whose GEMM buckets take a persistent stream-K GEMM where K allows it (K a
    multiple of 256): the wgmma one with the reduction launch, the wgmma one with the in-kernel sums (FIX), RS
    (gluon_ws.nvfp4_gemm_rs_sk_kernel, BLOCK_K 128) with the reduction launch, and RS with FIX launched as a
    programmatic dependent of the permutation (PDL); the packed dequantization elsewhere."""
    red = GM.CONFIGS_nvfp4_wgmma_sk[0]
    fix = {**red, "FIX": True}
    rs = next(c for c in GM.CONFIGS_nvfp4_ws_rs_sk if c["BLOCK_K"] == 128)
    rs_fix = next(c for c in GM.CONFIGS_nvfp4_ws_rs_sk_fix if c["BLOCK_K"] == 128)
    tile = next(c for c in GM.CONFIGS_nvfp4_gemm if c.get("DEQUANT") and c.get("PACK"))
    mp = pytest.MonkeyPatch()
    engines = []
    try:
        for name, cfg in (("sk", red), ("skfix", fix), ("rssk", rs), ("rsskfix", rs_fix)):
            mp.setattr(GM, "CONFIGS_nvfp4_gemm", [cfg, tile])
            engines.append(build(BuildConfig("synthetic:tiny-llama-wide", tmp_path_factory.mktemp(name) / "e",
                                             dtype="nvfp4", device="cuda", autotune=False, progress=False)))
    finally:
        mp.undo()
    return engines


@pytest.fixture(scope="module")
def ws_engine(tmp_path_factory):
    """Five tiny-llama-wide engines whose GEMM buckets take the warp-specialized GEMM (gluon_ws): in natural k order,
    in the decode's order split in two along K, RS with two consumer partitions (KS 2), RS with x permuted by its
    loader (XP), and RS launched as a programmatic dependent of the permutation (PDL); the packed dequantization
    where K does not allow it."""
    nat = next(c for c in GM.CONFIGS_nvfp4_ws if c.get("NAT"))
    split = next(c for c in GM.CONFIGS_nvfp4_ws if c.get("SPLIT_K", 1) > 1 and not c.get("NAT"))
    ks = next(c for c in GM.CONFIGS_nvfp4_ws if c.get("KS") == 2 and c["SPLIT_K"] == 1)
    xp = next(c for c in GM.CONFIGS_nvfp4_ws if c.get("XP"))
    pdl = {**GM.CONFIGS_nvfp4_ws_rs[0], "PDL": True}
    tile = next(c for c in GM.CONFIGS_nvfp4_gemm if c.get("DEQUANT") and c.get("PACK"))
    mp = pytest.MonkeyPatch()
    engines = []
    try:
        for name, cfg in (("ws", nat), ("wssplit", split), ("wsks", ks), ("wsxp", xp), ("wspdl", pdl)):
            mp.setattr(GM, "CONFIGS_nvfp4_gemm", [cfg, tile])
            engines.append(build(BuildConfig("synthetic:tiny-llama-wide", tmp_path_factory.mktemp(name) / "e",
                                             dtype="nvfp4", device="cuda", autotune=False, progress=False)))
    finally:
        mp.undo()
    return engines


@pytest.fixture(scope="module")
def streamk_engine(tmp_path_factory):
    """tiny-llama-wide whose GEMV buckets all take a stream-K config (the first that fits each shape)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(LK, "nvfp4_gemv_candidates", lambda bucket, n, k, most: streamk_candidates(bucket, n, k)[::-1])
    try:
        return build(BuildConfig("synthetic:tiny-llama-wide", tmp_path_factory.mktemp("streamk") / "e",
                                 dtype="nvfp4", device="cuda", autotune=False, progress=False))
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def wk_engine(tmp_path_factory):
    """tiny-llama-wide whose GEMV buckets 1..4 take a WK config (the first that fits each shape), 8 and 16 the
    usual first candidate."""
    mp = pytest.MonkeyPatch()
    usual = LK.nvfp4_gemv_candidates
    mp.setattr(LK, "nvfp4_gemv_candidates", lambda bucket, n, k, most:
               wk_candidates(bucket, n, k) or usual(bucket, n, k, most))
    try:
        return build(BuildConfig("synthetic:tiny-llama-wide", tmp_path_factory.mktemp("wk") / "e",
                                 dtype="nvfp4", device="cuda", autotune=False, progress=False))
    finally:
        mp.undo()


def test_wk_engine_plan(wk_engine):
    """A WK bucket names one kernel compiled for PDL, with the GEMV grid and no split-K reduction; CudaLinear launches
    it alone, on x as given."""
    table = wk_engine.manifest["kernels"]["kernels"]
    seen = 0
    for key, entry in wk_engine.manifest["linear_kernels"].items():
        n = int(key.split(":")[1].split("x")[0])
        for bucket in ("1", "2", "4"):
            item = entry[bucket]
            cfg = item["config"]
            assert cfg.get("WK") and item["reduce"] is None and item["perm"] is None, (key, bucket, cfg)
            k = table[item["kernel"]]
            assert k["constexprs"]["WK"] == cfg["WK"] and k["constexprs"]["PDL"] is True
            assert k["grid"] == [-(-n // cfg["BLOCK_N"]), 1, 1] and k["num_warps"] == cfg["num_warps"]
            seen += 1
    assert seen
    for m in (1, 3):
        item, (n, k), x, calls = _recorded_launches(wk_engine, m, "WK")
        (name, grid, args), = calls
        assert name == item["kernel"] and grid == (-(-n // item["config"]["BLOCK_N"]), 1, 1)
        assert args["x_ptr"] is x and args["M"] == m and tuple(args["out_ptr"].shape) == (m, n)


def test_wk_residual_projections_fuse_the_norm(wk_engine):
    """A residual projection's WK bucket (o_proj, down_proj: N = hidden) also names the WK GEMV with the add + RMSNorm
    after it (nvfp4_gemv_wk_norm_kernel, the engine's norm offset, the same grid); CudaLinear(x, norm=...) launches
    it alone, on the residual in place, with the layer's counter."""
    m_ = wk_engine.manifest
    table = m_["kernels"]["kernels"]
    hidden = m_["config"]["hidden_size"]
    seen = 0
    for key, entry in m_["linear_kernels"].items():
        n = int(key.split(":")[1].split("x")[0])
        for bucket in ("1", "2", "4"):
            item = entry[bucket]
            if n != hidden:
                assert item["kernel_norm"] is None, key
                continue
            fused = table[item["kernel_norm"]]
            assert fused["constexprs"]["WK"] == item["config"]["WK"] and fused["constexprs"]["PDL"] is True
            assert fused["constexprs"]["OFFSET"] == int(m_["config"].get("norm_offset", 0))
            assert fused["grid"] == [n // item["config"]["BLOCK_N"], 1, 1]
            seen += 1
        assert entry["8"]["kernel_norm"] is None  # no WK config there
    assert seen
    from atlas.runtime.layers.linear_cuda import CudaLinear

    key = next(k for k, e in m_["linear_kernels"].items() if e["1"]["kernel_norm"])
    n, k = (int(v) for v in key.split(":")[1].split("x"))
    calls = []
    layer = CudaLinear("nvfp4", _linear_tensors(wk_engine, n, k), _recorder(wk_engine, calls),
                       m_["linear_kernels"][key])
    assert layer.fuses_norm(1) and layer.fuses_norm(4)
    x, residual, weight = torch.randn(3, k).to(torch.bfloat16), torch.randn(3, n).to(torch.bfloat16), torch.ones(n)
    out = layer(x, norm=(residual, weight, 1e-5))
    (name, args), = calls
    assert name == m_["linear_kernels"][key]["4"]["kernel_norm"] and args["res_ptr"] is residual
    assert args["nw_ptr"] is weight and args["cnt_ptr"] is layer.norm_counter and int(layer.norm_counter) == 0
    assert args["eps"] == 1e-5 and args["out_ptr"] is out and tuple(out.shape) == (3, n) and args["stride_om"] == n


def test_wk_gate_up_fuses_silu(wk_engine):
    """A gate_up projection's WK bucket also names the WK GEMV compiled with SILU (silu(gate) * up in its epilogue,
    the same grid); the other projections' none. CudaLinear(x, silu=True) launches it alone into [M, N / 2]."""
    table = wk_engine.manifest["kernels"]["kernels"]
    gate_up = {k for k in wk_engine.manifest["linear_kernels"]
               if int(k.split(":")[1].split("x")[0]) == 2 * wk_engine.manifest["config"]["intermediate_size"]}
    assert gate_up
    for key, entry in wk_engine.manifest["linear_kernels"].items():
        for bucket in ("1", "2", "4"):
            item = entry[bucket]
            if key not in gate_up:
                assert item["kernel_silu"] is None, key
                continue
            fused, plain = table[item["kernel_silu"]], table[item["kernel"]]
            assert fused["constexprs"]["SILU"] is True and not plain["constexprs"].get("SILU"), key
            assert fused["grid"] == plain["grid"] and fused["constexprs"]["WK"] == item["config"]["WK"]
        assert entry["8"]["kernel_silu"] is None  # no WK config there
    for m in (1, 3):
        item, (n, k), x, calls = _recorded_launches(wk_engine, m, "WK", silu=True)
        (name, grid, args), = calls
        assert name == item["kernel_silu"] and grid == (-(-n // item["config"]["BLOCK_N"]), 1, 1)
        assert tuple(args["out_ptr"].shape) == (m, n // 2) and args["stride_om"] == n // 2 and args["N"] == n


def test_wk_engine_defers_the_norm(wk_engine):
    """The deferred norm in a plan (plugins_trt/rms_norm/deferred.py): a residual projection's WK bucket (N = hidden)
    also names the producer (kernel_defer: the engine's norm offset, the GEMV grid), a projection of the normed
    stream (qkv, gate_up: K = hidden) the consumer (kernel_rstd, parts tile for the narrowest producer; gate_up also
    kernel_silu_rstd); their split-K buckets (8, 16) the reductions' forms (reduce_defer; reduce_rstd, and
    reduce_silu_rstd for gate_up). CudaLinear: the producer's launches update the residual in place and return a
    DeferredNorm (hw, a part a program), which a consumer reads (its WK GEMV, or its split GEMV on hw then the rstd
    reduction) and the down projection (no consumer form) normalizes first (materialize) and multiplies as any x."""
    from atlas.plugins_trt.rms_norm.deferred import DeferredNorm, parts_bound
    from atlas.runtime.layers.linear_cuda import CudaLinear

    m_ = wk_engine.manifest
    table, plan = m_["kernels"]["kernels"], m_["linear_kernels"]
    hidden = m_["config"]["hidden_size"]
    shape = {key: tuple(int(v) for v in key.split(":")[1].split("x")) for key in plan}
    producers = {key for key, (n, k) in shape.items() if n == hidden}
    consumers = {key for key, (n, k) in shape.items() if k == hidden and n != hidden}
    assert producers and consumers and not producers & consumers
    for key, entry in plan.items():
        n, k = shape[key]
        for bucket in ("1", "2", "4"):
            item = entry[bucket]
            assert bool(item["kernel_defer"]) == (key in producers), (key, bucket)
            assert bool(item["kernel_rstd"]) == (key in consumers), (key, bucket)
            assert bool(item["kernel_silu_rstd"]) == (key in consumers and bool(item["kernel_silu"])), (key, bucket)
            if item["kernel_defer"]:
                d = table[item["kernel_defer"]]
                assert d["constexprs"]["OFFSET"] == int(m_["config"].get("norm_offset", 0))
                assert d["grid"] == [n // item["config"]["BLOCK_N"], 1, 1] and d["constexprs"]["PDL"] is True
            for name in (item["kernel_rstd"], item["kernel_silu_rstd"]):
                if name:
                    assert table[name]["constexprs"]["PP"] == parts_bound(k) and table[name]["constexprs"]["PDL"]
        for bucket in ("8", "16"):  # split GEMVs there: the reductions' forms
            item = entry[bucket]
            assert not any(item[f] for f in ("kernel_defer", "kernel_rstd", "kernel_silu_rstd")), (key, bucket)
            assert item["config"]["SPLIT_K"] > 1 and bool(item["reduce_defer"]) == (key in producers), (key, bucket)
            assert bool(item["reduce_rstd"]) == (key in consumers), (key, bucket)
            assert bool(item["reduce_silu_rstd"]) == (key in consumers and bool(item["reduce_silu"])), (key, bucket)
            if item["reduce_rstd"]:
                assert table[item["reduce_rstd"]]["constexprs"]["PP"] == parts_bound(k)

    calls = []

    def layer(key):
        return CudaLinear("nvfp4", _linear_tensors(wk_engine, *shape[key]), _recorder(wk_engine, calls), plan[key])

    o_proj = layer(next(key for key in producers if shape[key][1] == hidden))
    gate_up = layer(next(k for k in consumers if plan[k]["1"]["kernel_silu"]))
    down_key = next(key for key in producers if shape[key][1] != hidden)
    down = layer(down_key)
    m, g = 3, torch.Generator().manual_seed(5)
    x = torch.randn(m, o_proj.k, generator=g).to(torch.bfloat16)
    residual, weight = torch.randn(m, hidden, generator=g).to(torch.bfloat16), torch.rand(hidden, generator=g)
    assert o_proj.defers_norm(m) and gate_up.takes_deferred(m) and not down.takes_deferred(m)
    deferred = o_proj(x, norm=(residual, weight, 1e-5), defer=True)
    (name, args), = calls
    item = plan[next(key for key in producers if shape[key][1] == hidden)]["4"]
    assert isinstance(deferred, DeferredNorm) and name == item["kernel_defer"] and args["res_ptr"] is residual
    assert args["nw_ptr"] is weight and args["out_ptr"] is deferred.hw and args["ss_ptr"] is deferred.parts
    assert tuple(deferred.parts.shape) == (m, hidden // item["config"]["BLOCK_N"]) and deferred.eps == 1e-5
    deferred.hw.copy_(torch.randn(m, hidden, generator=g).to(torch.bfloat16))  # what the kernel would have written
    deferred.parts.copy_(torch.rand(m, deferred.parts.shape[1], generator=g) * 10)
    for silu in (False, True):
        calls.clear()
        out = gate_up(deferred, silu=silu)
        (name, args), = calls
        kind = "kernel_silu_rstd" if silu else "kernel_rstd"
        assert name == plan[next(k for k in consumers if plan[k]["1"]["kernel_silu"])]["4"][kind]
        assert args["x_ptr"] is deferred.hw and args["ss_ptr"] is deferred.parts and args["eps"] == 1e-5
        assert args["P"] == deferred.parts.shape[1] and args["K"] == hidden
        assert tuple(out.shape) == (m, gate_up.n // 2 if silu else gate_up.n) and args["stride_om"] == out.shape[1]
    calls.clear()
    down_x = DeferredNorm(torch.randn(m, down.k, generator=g).to(torch.bfloat16),
                          torch.rand(m, 4, generator=g) * 10, 1e-5)
    down(down_x)
    (name, args), = calls
    assert name == plan[down_key]["4"]["kernel"]
    assert torch.equal(args["x_ptr"], down_x.materialize())

    m = 5  # bucket 8: the split GEMV, then the reduction into the residual stream with hw and the parts
    x = torch.randn(m, o_proj.k, generator=g).to(torch.bfloat16)
    residual = torch.randn(m, hidden, generator=g).to(torch.bfloat16)
    calls.clear()
    assert o_proj.defers_norm(m) and gate_up.takes_deferred(m)
    deferred = o_proj(x, norm=(residual, weight, 1e-5), defer=True)
    (gemv, gargs), (red, rargs) = calls
    item = plan[next(key for key in producers if shape[key][1] == hidden)]["8"]
    assert gemv == item["kernel"] and red == item["reduce_defer"] and rargs["part_ptr"] is gargs["out_ptr"]
    assert rargs["res_ptr"] is residual and rargs["w_ptr"] is weight and rargs["out_ptr"] is deferred.hw
    columns = table[item["reduce_defer"]]["constexprs"]["BLOCK_N"]
    assert rargs["ss_ptr"] is deferred.parts and deferred.parts.shape == (m, -(-hidden // columns))
    calls.clear()
    out = gate_up(deferred, silu=True)
    (gemv, gargs), (red, rargs) = calls
    item = plan[next(k for k in consumers if plan[k]["1"]["kernel_silu"])]["8"]
    assert gemv == item["kernel"] and gargs["x_ptr"] is deferred.hw and red == item["reduce_silu_rstd"]
    assert rargs["part_ptr"] is gargs["out_ptr"] and rargs["ss_ptr"] is deferred.parts and rargs["out_ptr"] is out
    assert rargs["P"] == deferred.parts.shape[1] and rargs["K"] == hidden and out.shape == (m, gate_up.n // 2)


@pytest.mark.gpu
def test_deferred_norm_engine_decodes_as_the_fused_form(wk_engine):
    """wk_engine's decode (graphs captured) with the norms deferred into the next projections
    (runtime/cuda_ops.deferred_norm(True)) and with the fused forms (the default), fed the same tokens, at batch 1
    (the WK GEMVs' forms) and 5 (bucket 8: the split-K reductions' forms): every step's logits within bf16 noise of
    each other (relative error < 2e-2) and most greedy choices alike."""
    from atlas.runtime import cuda_ops
    from atlas.runtime.cuda_engine import load_cuda_engine
    from atlas.runtime.model_runner import ModelRunner
    from atlas.runtime.step import StepBatch

    engine = load_cuda_engine(wk_engine.path)
    runners = []
    for enabled in (True, False):
        with cuda_ops.deferred_norm(enabled):
            runners.append(ModelRunner(engine, num_blocks=128))
        runners[-1].capture(prefill=False)
    deferred, fused = runners
    assert deferred.ops.defer_norm and not fused.ops.defer_norm
    layer = deferred.model.layers[0]
    for m in (1, 5):
        assert layer.o_proj.defers_norm(m) and layer.gate_up_proj.takes_deferred(m) and layer.qkv_proj.takes_deferred(m)
    g = torch.Generator().manual_seed(11)
    for batch in (1, 5):
        seqs = tuple(range(10 * batch, 10 * batch + batch))
        prompts = tuple(tuple(torch.randint(0, engine.config.vocab_size, (7,), generator=g).tolist())
                        for _ in seqs)
        tokens = [r.step(StepBatch(seqs, prompts)) for r in runners][1]
        worst, alike = 0.0, 0
        for _ in range(8):
            ids = [r.step(StepBatch(seqs, tuple((t,) for t in tokens))) for r in runners]
            a, b = (r.logits[:batch].float() for r in runners)
            worst = max(worst, float((a - b).norm() / b.norm()))
            alike += sum(x == y for x, y in zip(*ids))
            tokens = ids[1]
        assert worst < 2e-2 and alike >= 0.8 * 8 * batch, (batch, worst, alike)
        print(f"batch {batch}, deferred against fused norm, 8 decode steps: worst logits error ratio {worst:.1e}, "
              f"{alike} of {8 * batch} tokens alike")
        for r in runners:
            for s_ in seqs:
                r.free(s_)


def test_tiled_order_only_for_whole_tiles():
    assert is_tiled("nvfp4", 6144, 4096) and is_tiled("nvfp4", 128, 256)
    assert not is_tiled("nvfp4", 192, 4096) and not is_tiled("nvfp4", 4096, 4160) and not is_tiled("fp8", 128, 128)


def test_tiled_configs_read_whole_tile_rows():
    """What tiled_configs keeps: the ways that read the tiled order with NVFP4_BITS words (reads_bits: Gluon GEMVs of
    whole tile rows without a cp.async ring, the wgmma GEMM, the packed dequantization), every one marked TILED and
    BITS; the Triton GEMV / GEMM tiles are left out."""
    from atlas.build_engine.linear_kernels import reads_bits

    gemv = tiled_configs(GV.CONFIGS_nvfp4_gemv)
    assert gemv and all(c["TILED"] and c["BITS"] and c["BLOCK_K"] % 128 == 0 and c.get("GLUON") for c in gemv)
    assert not any(c.get("PIPE", 1) > 2 or c.get("XSMEM") for c in gemv)
    assert {c["BLOCK_M"] for c in gemv} == {1, 2, 4, 8, 16} and any(c.get("MAXNREG") for c in gemv)
    assert not reads_bits({"BLOCK_K": 256, "PIPE": 1}) and not reads_bits({"DEQUANT": True, "BLOCK_K": 256})
    gemm = tiled_configs(GM.gemm_candidates("nvfp4", 4096, 4096))
    assert all(c["TILED"] and c["BITS"] for c in gemm)
    assert any(c.get("WGMMA") for c in gemm) and any(c.get("DEQUANT") and c.get("PACK") for c in gemm)
    assert not any(not (c.get("WGMMA") or c.get("WS")) and not c.get("DEQUANT") for c in gemm)


def test_tiled_engine_plan(tiled_engine):
    """Every bucket of every linear of the engine is compiled for the tiled order; the weights on disk stay
    row-major (the CPU reference reads them)."""
    plan = tiled_engine.manifest["linear_kernels"]
    assert plan
    for key, entry in plan.items():
        for bucket, item in entry.items():
            assert item["config"].get("TILED") and item["config"].get("BITS"), (key, bucket)
            if item["config"].get("DEQUANT"):
                assert item["rows"] % 128 == 0, item
    table = tiled_engine.manifest["kernels"]["kernels"]
    gemvs = [table[e["1"]["kernel"]] for e in plan.values()]
    assert all(k["constexprs"].get("TILED") for k in gemvs)


def test_split_wgmma_in_the_plan(split_engine):
    """A split wgmma bucket names the kernel (fp32 partials) and the split-K reduction; K that two even halves of
    BLOCK_K pairs cannot split takes the dequantization."""
    table = split_engine.manifest["kernels"]["kernels"]
    seen = 0
    for key, entry in split_engine.manifest["linear_kernels"].items():
        k = int(key.split("x")[1])
        for bucket in map(str, GEMM_BUCKETS):
            item = entry[bucket]
            split = item["config"].get("SPLIT_K", 1)
            assert (split == 2) == (k % 256 == 0), (key, item["config"])
            if split == 2:
                seen += 1
                assert item["kernel"].startswith("nvfp4_wgmma.") and item["reduce"] in table
                assert dict(table[item["kernel"]]["params"])["out_ptr"] == "*fp32"
    assert seen


def test_sk_wgmma_in_the_plan(sk_engine):
    """A persistent bucket names its kernel (wgmma, or RS with the consumers and the loader's four warps; its grid:
    the chip's programs) and, without FIX, the stream-K reduction; K that the kernel cannot take (K % 256) falls back
    to the dequantization."""
    seen = set()
    for result in sk_engine:
        table = result.manifest["kernels"]["kernels"]
        for key, entry in result.manifest["linear_kernels"].items():
            k = int(key.split("x")[1])
            for bucket in map(str, GEMM_BUCKETS):
                item = entry[bucket]
                cfg = item["config"]
                assert bool(cfg.get("SK")) == (k % 256 == 0), (key, cfg)
                if cfg.get("SK"):
                    seen.add((bool(cfg.get("FIX")), bool(cfg.get("WS"))))
                    name = "nvfp4_rs_sk." if cfg.get("WS") else "nvfp4_wgmma_sk."
                    assert item["kernel"].startswith(name) and table[item["kernel"]]["grid"][0] == cfg["SK"]
                    assert table[item["kernel"]]["num_warps"] == cfg["num_warps"] + 4 * bool(cfg.get("WS"))
                    assert (item["reduce"] in table) != bool(cfg.get("FIX")), item
    assert seen == {(True, False), (False, False), (False, True), (True, True)}


@pytest.mark.parametrize("m", [64, 200, 300, 2048])
def test_sk_launch_arguments(m, sk_engine):
    """CudaLinear's launches of a persistent wgmma bucket, recorded on the CPU against the engine's kernel table: the
    kernel's arguments by name (DP as sk_dp_tiles gives it), its grid (the config's programs) and, without FIX, the
    reduction's grid from its recorded formula (tiles - DP, BLOCK_N / ROWS), launched only where tiles are shared."""
    from atlas.plugins_trt.quant_linear import gluon_gemm as gm

    for result in sk_engine:
        item, (n, k), x, calls = _recorded_launches(result, m, "SK")
        cfg = item["config"]
        dp = gm.sk_dp_tiles(cfg, m, n)
        xp, calls = _permutation_launch(item, x, k, calls)
        (name, grid, args), *rest = calls
        assert name == item["kernel"] and grid == (cfg["SK"], 1, 1) and args["DP"] == dp and args["M"] == m
        assert args["x_ptr"] is xp
        assert args["part_ptr"].shape == gm.sk_partials_shape(cfg)
        assert "cnt_ptr" in args  # FIX's counters: both persistent kernels take them (RS-SK since FIX came to it)
        assert gm.sk_counters(cfg, m, n) > 0  # these shapes share tiles at every M (fewer tiles than programs)
        if cfg.get("FIX"):
            assert rest == []
        else:
            (rname, rgrid, rargs), = rest
            assert rname == item["reduce"] and rgrid == gm.grid_sk_reduce(cfg, m, n) and rargs["DP"] == dp
            assert rargs["G"] == cfg["SK"] and rargs["part_ptr"] is args["part_ptr"]


def _permutation_launch(item: dict, x: torch.Tensor, k: int, calls: list) -> tuple[torch.Tensor, list]:
    """The first recorded launch is the plan's permute_k_words_kernel on x (its grid from its recorded formula, no
    index table, an [M, K] output): returns that output buffer (what the next launch must read) and the launches
    after it."""
    (name, grid, args), *rest = calls
    bk = item["config"]["BLOCK_K"]
    assert name == item["perm"] == f"permute_k.{k}.{bk}" and grid == GM.grid_permute_k(bk, x.shape[0], k)
    assert args["x_ptr"] is x and "idx_ptr" not in args and args["K"] == k
    out = args["out_ptr"]
    assert out.shape == x.shape and args["stride_xm"] == args["stride_om"] == k
    return out, rest


def _linear_tensors(result, n: int, k: int) -> dict:
    """The stored weight, weight_scale and weight_scale_2 of the engine's first nvfp4 linear of shape [n, k]."""
    from safetensors.torch import load_file

    stored = {}
    for f in result.manifest["weights"]:
        stored.update(load_file(str(result.path / f)))
    prefix = next(p for p, t in stored.items() if p.endswith(".weight") and tuple(t.shape) == (n, k // 2))[:-7]
    return {s: stored[f"{prefix}.{s}"] for s in ("weight", "weight_scale", "weight_scale_2")}


def _recorder(result, calls: list):
    """A stand-in for the engine's KernelTable (its kernels and parameters, compiled here for sm_90) that appends
    each launch to `calls` as (kernel, arguments by name) instead of launching it."""
    from atlas.runtime.kernels import KernelTable

    kt = KernelTable.load(result.path, result.manifest["kernels"], arch=90)

    class Recorder:
        kernels = kt.kernels

        def params(self, name):
            return kt.params(name)

        def launch(self, name, grid, *args):
            calls.append((name, dict(zip((p for p, _ in self.params(name)), args))))

    return Recorder()


def _recorded_launches(result, m: int, way: str, drop_perm: bool = False, gather_perm: bool = False,
                       silu: bool = False):
    """CudaLinear's launches for M rows on the first linear whose plan takes `way` at that M, recorded on the CPU
    against the engine's kernel table: (plan item, the linear's N and K, x, [(kernel, grid, arguments by name)]).
    gather_perm: the plan's permutation kernel takes the parameters of permute_k_kernel, as in engines built before
    permute_k_words_kernel (its grid then goes unrecorded: None). silu: the first whose item has a GEMV that fuses
    SiLU-mul, called with silu=True."""
    from atlas.runtime.kernels import KernelTable
    from atlas.runtime.layers.linear_cuda import CudaLinear, bucket_for

    m_ = result.manifest
    table = KernelTable.load(result.path, m_["kernels"], arch=90)
    gather = [(p, t) for p, t in GM.signature_permute_k(64, 4096, words=False).signature.items() if t != "constexpr"]

    def params(name):
        return gather if gather_perm and name.startswith("permute_k.") else table.params(name)

    class Recorder:
        kernels, calls = table.kernels, []

        def params(self, name):
            return params(name)

        def launch(self, name, grid, *args):
            g = None if params(name) is gather else table.grid(name, *args)
            self.calls.append((name, g, dict(zip((p for p, _ in params(name)), args))))

    key, plan = next((k, e) for k, e in m_["linear_kernels"].items() if e[str(bucket_for(m))]["config"].get(way)
                     and (not silu or e[str(bucket_for(m))].get("kernel_silu")))
    if drop_perm:  # a plan as engines built before permute_k_kernel wrote it
        plan = {b: {n: v for n, v in item.items() if n != "perm"} for b, item in plan.items()}
    n, k = (int(v) for v in key.split(":")[1].split("x"))
    t = _linear_tensors(result, n, k)
    rec = Recorder()
    x = torch.randn(m, k).to(torch.bfloat16)
    CudaLinear("nvfp4", t, rec, plan)(x, silu=silu)
    return plan[str(bucket_for(m))], (n, k), x, rec.calls


def test_ws_in_the_plan(ws_engine):
    """A warp-specialized bucket names its kernel (12 warps: the consumers and the decoder partition) and, split, the
    split-K reduction; K the config cannot take falls back to the dequantization."""
    seen = set()
    for result in ws_engine:
        table = result.manifest["kernels"]["kernels"]
        for key, entry in result.manifest["linear_kernels"].items():
            k = int(key.split("x")[1])
            for bucket in map(str, GEMM_BUCKETS):
                item = entry[bucket]
                cfg = item["config"]
                if not cfg.get("WS"):
                    assert cfg.get("DEQUANT") and k % (64 * 2 * 2), (key, cfg)  # (KS 2 needs K % 256 == 0)
                    continue
                seen.add((bool(cfg.get("NAT")), cfg.get("KS", 1), bool(cfg.get("XP")), bool(cfg.get("PDL"))))
                assert item["kernel"].startswith("nvfp4_ws.") and table[item["kernel"]]["num_warps"] == 12
                assert (item["reduce"] in table) == (cfg.get("SPLIT_K", 1) > 1), item
                # the runtime launches a kernel compiled with PDL as a programmatic dependent (runtime/kernels.py)
                assert table[item["kernel"]]["constexprs"]["PDL"] == bool(cfg.get("PDL")), item
                if item["perm"]:
                    assert table[item["perm"]]["constexprs"]["PDL"] is True, item
    assert seen == {(True, 1, False, False), (False, 1, False, False), (False, 2, False, False),
                    (False, 1, True, False), (False, 1, False, True)}


@pytest.mark.parametrize("m", [64, 300])
def test_ws_launch_arguments(m, ws_engine):
    """CudaLinear hands the NAT and XP kernels x itself and the others x in the decode's k order (the plan's
    permute_k_kernel launched first), with the grid of the wgmma kernel; a split bucket's partials go to the
    reduction."""
    from atlas.plugins_trt.quant_linear import gluon_gemm as gm

    for result in ws_engine:
        item, (n, k), x, calls = _recorded_launches(result, m, "WS")
        cfg = item["config"]
        if GM.permutes_x(cfg):
            want, calls = _permutation_launch(item, x, k, calls)
        else:
            want = x
            assert item["perm"] is None
        (name, grid, args), *rest = calls
        assert name == item["kernel"] and grid == gm.grid_wgmma(cfg, m, n) and args["M"] == m
        assert args["x_ptr"] is want and args["stride_xm"] == k
        if cfg.get("SPLIT_K", 1) > 1:
            (rname, _, rargs), = rest
            assert rname == item["reduce"] and rargs["part_ptr"] is args["out_ptr"]
            assert args["out_ptr"].shape == (cfg["SPLIT_K"], m, n)
        else:
            assert rest == []


def test_engine_with_the_gather_permutation_gets_its_index_table(ws_engine):
    """An engine built before permute_k_words_kernel names permute_k_kernel as its permutation, which takes the
    block's k order as idx_ptr: CudaLinear hands it that table, then the GEMM the permuted x."""
    from atlas.plugins_trt.quant_linear import gluon_gemm as gm

    result = next(r for r in ws_engine if any(GM.permutes_x(e["256"]["config"])
                                              for e in r.manifest["linear_kernels"].values()))
    item, (n, k), x, calls = _recorded_launches(result, 256, "WS", gather_perm=True)
    (name, _, args), (gname, _, gargs), *_ = calls
    bk = item["config"]["BLOCK_K"]
    assert name == item["perm"] and args["x_ptr"] is x and torch.equal(args["idx_ptr"], gm.block_index(bk, "cpu"))
    assert gname == item["kernel"] and gargs["x_ptr"] is args["out_ptr"]


def test_engine_without_the_permutation_kernel_gathers(ws_engine):
    """An engine whose plan names no permute_k_kernel (built before it) still runs: CudaLinear permutes x with the
    torch gather and launches the GEMM alone."""
    from atlas.plugins_trt.quant_linear import gluon_gemm as gm

    result = next(r for r in ws_engine if any(GM.permutes_x(e["256"]["config"])
                                              for e in r.manifest["linear_kernels"].values()))
    item, _, x, calls = _recorded_launches(result, 256, "WS", drop_perm=True)
    (name, _, args), *_ = calls  # (then the split-K reduction, if any)
    assert name == item["kernel"] and torch.equal(args["x_ptr"], gm.gather_k(x, item["config"]["BLOCK_K"]))


def test_the_build_searches_no_streamk_config():
    """The build's NVFP4 GEMV search (nvfp4_gemv_candidates) leaves the stream-K configs out (they ran far slower in a
    decode step than alone: linear_kernels.STREAMK_TILES), keeps the split GEMVs and, up to bucket 4, the WK ones."""
    for bucket in (1, 4, 8, 16):
        cands = LK.nvfp4_gemv_candidates(bucket, 34816, 5120, LK.CANDIDATES_PER_BUCKET)
        assert cands and not any(c.get("STREAMK") for c in cands), bucket
        assert streamk_candidates(bucket, 34816, 5120, 132)  # the shape has stream-K configs to leave out
        assert any(c.get("WK") for c in cands) == (bucket <= 4)


def test_streamk_candidates():
    """Stream-K configs only for tiled weights, each with whole row tiles and at most one program a block."""
    from atlas.plugins_trt.quant_linear.gluon_streamk import blocks, check_streamk

    assert streamk_candidates(1, 6144, 4160) == [] and streamk_candidates(1, 192, 4096) == []
    cands = streamk_candidates(16, 6144, 4096, 132)
    assert {c["BLOCK_N"] for c in cands} == {128, 256} and all(c["TILED"] and c["BLOCK_M"] == 16 for c in cands)
    for c in cands:
        check_streamk(c, 6144, 4096)
        assert c["PROGRAMS"] == min(c["STREAMK"] * 132, blocks(c, 6144, 4096))
    small = streamk_candidates(1, 256, 256, 132)[0]
    assert small["PROGRAMS"] == blocks(small, 256, 256) <= 4  # a tiny layer: one program a block
    with pytest.raises(ValueError, match="tiled order"):
        check_streamk({**cands[0], "TILED": False}, 6144, 4096)
    with pytest.raises(ValueError, match="PROGRAMS"):
        check_streamk({**cands[0], "PROGRAMS": 10 ** 6}, 6144, 4096)


@pytest.mark.parametrize("bucket", [1, 16])
def test_streamk_kernel_compiles_for_sm90(bucket):
    """Every stream-K candidate (BITS words) compiles for sm_90 on the CPU, with the pieces its reduction relies on:
    one acq_rel GPU-scope atomic on the tile counter (one thread), a GPU-scope fence before it and before the
    partials are read back, the partials read past L1 (ld.global.cg), the PDL wait and launch, and no local memory."""
    from atlas.plugins_trt.quant_linear.gluon_streamk import signature_nvfp4_gemv_streamk
    from atlas.plugins_trt.quant_linear.triton_gemv import compile_aot

    for cfg in streamk_candidates(bucket, 6144, 4096, 132):
        ptx = compile_aot(signature_nvfp4_gemv_streamk(cfg, 6144, 4096, pdl=True)).asm["ptx"]
        atoms = [line for line in ptx.splitlines() if "atom." in line]
        assert len(atoms) == 1 and "atom.global.gpu.acq_rel.add" in atoms[0] and atoms[0].strip().startswith("@"), atoms
        assert ptx.count("fence.acq_rel.gpu") == 2 and "ld.global.cg" in ptx, cfg
        assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx, cfg
        assert "mma.sync" in ptx and ".local" not in ptx, cfg


def test_streamk_engine_plan(streamk_engine):
    """A stream-K bucket names one kernel (grid PROGRAMS, partials and counters as parameters), no reduction; the
    runtime's partials shape is the kernel's."""
    from atlas.runtime.layers.linear_cuda import streamk_partials_shape

    table = streamk_engine.manifest["kernels"]["kernels"]
    seen = 0
    for key, entry in streamk_engine.manifest["linear_kernels"].items():
        for bucket in ("1", "2", "4", "8", "16"):
            item = entry[bucket]
            cfg = item["config"]
            assert cfg.get("STREAMK") and item["reduce"] is None, (key, bucket, cfg)
            k = table[item["kernel"]]
            assert k["grid"] == [cfg["PROGRAMS"], 1, 1] and k["grid_formula"] == ["PROGRAMS", "1", "1"]
            params = dict(k["params"])
            assert params["part_ptr"] == "*fp32" and params["cnt_ptr"] == "*i32" and params["out_ptr"] == "*bf16"
            assert streamk_partials_shape(cfg)[:3] == (cfg["PROGRAMS"], 2, cfg["BLOCK_N"])
            seen += 1
    assert seen


def test_padded_engine_plan(padded_engine):
    """The qkv and GDN in_proj shapes off the 128-row tiles are planned at N rounded up to whole tiles: every bucket
    says pad_n, is tiled, runs kernels compiled for that N and fuses no reduction; no other shape is padded."""
    plan = padded_engine.manifest["linear_kernels"]
    table = padded_engine.manifest["kernels"]["kernels"]
    padded = {key: {item.get("pad_n") for item in entry.values()} for key, entry in plan.items()}
    assert padded.pop("nvfp4:200x128") == {256} and padded.pop("nvfp4:320x128") == {384}
    assert all(p == {None} for p in padded.values()), padded
    for key, n in (("nvfp4:200x128", 256), ("nvfp4:320x128", 384)):
        for bucket, item in plan[key].items():
            assert item["config"].get("TILED") and not item["reduce_silu"] and not item["reduce_norm"], (key, bucket)
            assert item["kernel"].split(".")[1] == f"{n}x128", item["kernel"]
            assert table[item["kernel"]]["constexprs"].get("TILED") or item["config"].get("DEQUANT")


def test_padded_shapes_only_for_views(padded_engine):
    """Only NVFP4 shapes of qkv_proj / GDN in_proj alone, K on the tiles and N off them, are padded."""
    from atlas.runtime.config import ModelConfig

    config = ModelConfig.from_dict(padded_engine.manifest["config"])
    formats = {"layers.0.gdn.in_proj": "nvfp4", "layers.3.attn.qkv_proj": "nvfp4", "layers.0.mlp.gate_up_proj": "nvfp4",
               "layers.0.gdn.out_proj": "nvfp4"}
    assert LK.padded_shapes(config, formats) == {("nvfp4", 200, 128): 256, ("nvfp4", 320, 128): 384}
    assert LK.padded_shapes(config, {**formats, "layers.0.gdn.in_proj": "fp8"}) == {("nvfp4", 320, 128): 384}


def test_cuda_linear_pads_to_its_plan():
    """A plan with pad_n: the weight, its scales and the bias get zero rows up to pad_n (then the tiled order), the
    layer keeps its N for its output; a plan whose buckets disagree is refused."""
    from atlas.runtime.errors import EngineError
    from atlas.runtime.layers.linear_cuda import CudaLinear

    g = torch.Generator().manual_seed(0)
    w = torch.randint(0, 256, (200, 64), generator=g, dtype=torch.uint8)
    ws = torch.rand(200, 8, generator=g).to(torch.float8_e4m3fn)
    t = {"weight": w, "weight_scale": ws, "weight_scale_2": torch.rand(200, generator=g) + 0.5}
    bias = torch.randn(200, generator=g).to(torch.bfloat16)
    cfg = {"TILED": True, "BITS": False}
    layer = CudaLinear("nvfp4", t, object(), {"1": {"config": cfg, "pad_n": 256}, "64": {"config": cfg, "pad_n": 256}},
                       bias)
    assert (layer.n, layer.n_out, layer.k) == (256, 200, 128)
    from atlas.plugins_trt.quant_linear.layout import tile_nvfp4
    pw = torch.cat([w, torch.zeros(56, 64, dtype=torch.uint8)])
    pws = torch.cat([ws, torch.zeros(56, 8).to(torch.float8_e4m3fn)])
    tw, tws = tile_nvfp4(pw, pws)
    assert torch.equal(layer.weight, tw) and torch.equal(layer.weight_scale.view(torch.uint8), tws.view(torch.uint8))
    assert torch.equal(layer.weight_scale_2[:200], t["weight_scale_2"]) and not layer.weight_scale_2[200:].any()
    assert torch.equal(layer.bias[:200], bias) and not layer.bias[200:].any()
    with pytest.raises(EngineError, match="pads its rows inconsistently"):
        CudaLinear("nvfp4", t, object(), {"1": {"config": cfg, "pad_n": 256}, "64": {"config": cfg}})


def test_cuda_linear_refuses_a_mixed_plan():
    from atlas.runtime.errors import EngineError
    from atlas.runtime.layers.linear_cuda import CudaLinear

    t = {"weight": torch.zeros(128, 64, dtype=torch.uint8),
         "weight_scale": torch.zeros(128, 8, dtype=torch.uint8).view(torch.float8_e4m3fn),
         "weight_scale_2": torch.ones(128)}
    plan = {"1": {"config": {"TILED": True}}, "64": {"config": {}}}
    with pytest.raises(EngineError, match="mixes tiled and row-major"):
        CudaLinear("nvfp4", t, object(), plan)
    plan = {"1": {"config": {"TILED": True, "BITS": True}}, "64": {"config": {"TILED": True}}}
    with pytest.raises(EngineError, match="mixes the NVFP4_BITS word order"):
        CudaLinear("nvfp4", t, object(), plan)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 16, 64, 300])
def test_tiled_engine_linears_match_reference(m, tiled_engine):
    from test_linear_cuda import check_engine_linears  # same folder (pytest prepends it to sys.path)

    check_engine_linears(tiled_engine, m)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 3, 8, 16, 17, 64, 300])
def test_padded_engine_linears_match_reference(m, padded_engine):
    """The padded qkv and in_proj through CudaLinear: their N columns (a view of the padded output) against the
    fp32 reference, at every GEMV bucket and the GEMM ones."""
    from test_linear_cuda import check_engine_linears  # same folder (pytest prepends it to sys.path)

    check_engine_linears(padded_engine, m)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [64, 300])
def test_split_engine_linears_match_reference(m, split_engine):
    from test_linear_cuda import check_engine_linears  # same folder (pytest prepends it to sys.path)

    check_engine_linears(split_engine, m)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [64, 200, 300])
@pytest.mark.parametrize("which", [0, 1, 2, 3], ids=["reduce", "fix", "rs", "rsfix"])
def test_sk_engine_linears_match_reference(m, which, sk_engine):
    """Through CudaLinear (the AOT kernels): wgmma with the reduction launch or FIX, RS with the reduction launch or
    with FIX and PDL; twice, so that the second call sees FIX's counters back at zero."""
    from test_linear_cuda import check_engine_linears  # same folder (pytest prepends it to sys.path)

    for _ in range(2):
        check_engine_linears(sk_engine[which], m)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 4, 16])
def test_wk_engine_linears_match_reference(m, wk_engine):
    """Through CudaLinear (the AOT kernels, PDL launches): the WK GEMV at M 1..4, the usual configs above."""
    from test_linear_cuda import check_engine_linears  # same folder (pytest prepends it to sys.path)

    for _ in range(2):
        check_engine_linears(wk_engine, m)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [64, 200, 300])
@pytest.mark.parametrize("which", [0, 1, 2, 3, 4], ids=["nat", "split", "ks", "xp", "pdl"])
def test_ws_engine_linears_match_reference(m, which, ws_engine):
    """Through CudaLinear (the AOT kernels): the warp-specialized GEMM in natural k order, split along K, RS with two
    consumer partitions, RS with x permuted by its loader, and RS launched with PDL after the permutation kernel."""
    from test_linear_cuda import check_engine_linears  # same folder (pytest prepends it to sys.path)

    check_engine_linears(ws_engine[which], m)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 16])
def test_streamk_engine_linears_match_reference(m, streamk_engine):
    from test_linear_cuda import check_engine_linears  # same folder (pytest prepends it to sys.path)

    check_engine_linears(streamk_engine, m)


def _ids(configs):
    return ["-".join(f"{k}{v}" for k, v in c.items() if k not in ("TILED", "num_stages")) for c in configs]


_GEMV = [c for b in (1, 4, 16) for c in gemv_candidates(tiled_configs(GV.CONFIGS_nvfp4_gemv), b, 6144, 16, 4096)]
_GEMM = tiled_configs(GM.gemm_candidates("nvfp4", 6144, 4096))


@pytest.mark.gpu
@pytest.mark.parametrize("config", _GEMV, ids=_ids(_GEMV))
def test_tiled_gemv_gpu(config):
    """Each tiled GEMV candidate the build would time, at a real shape (Llama-3.1-8B qkv) and at N = 384 (the
    last row tile of a 256-row program is past N), with PDL, against the fp32 reference; output poisoned first."""
    for n, k in ((6144, 4096), (384, 2048)):
        g, w, ws, ws2, ref_w = nvfp4_tiled_weight(n, k, bool(config.get("BITS")))
        m = config["BLOCK_M"] - (config["BLOCK_M"] > 2)  # a partial bucket where there is one
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        y = GV.launch_nvfp4_gemv(x, w, ws, ws2, config, out=out, pdl=True)
        ref = x.float() @ ref_w.T
        err = float((y.float() - ref).norm() / ref.norm())
        assert err < 1e-2, (n, k, err)


@pytest.mark.gpu
@pytest.mark.parametrize("config", _GEMM, ids=_ids(_GEMM))
def test_tiled_gemm_gpu(config):
    """Each tiled GEMM candidate (Triton tiles, dequantize + cuBLAS, the wgmma kernel) at a real shape, M 300."""
    n, k, m = 6144, 4096, 300
    g, w, ws, ws2, ref_w = nvfp4_tiled_weight(n, k, bool(config.get("BITS")))
    x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
    y = GM.launch_nvfp4_gemm(x, w, ws, ws2, config)
    ref = x.float() @ ref_w.T
    err = float((y.float() - ref).norm() / ref.norm())
    assert err < 1e-2, err


_XC = [c for c in _GEMV if c.get("GLUON") and c.get("PIPE", 1) == 1 and not (c.get("XSMEM") or c.get("STAGE"))]
_XCLAMP = [c for c in _XC if c["BLOCK_M"] == 16] + [next(c for c in _XC if c["BLOCK_M"] == 4)]


@pytest.mark.gpu
@pytest.mark.parametrize("config", _XCLAMP, ids=_ids(_XCLAMP))
def test_xclamp_gemv_gpu(config):
    """XCLAMP (the x rows past M clamped, not masked) gives the masked form's outputs bit for bit, at a partial and a
    full bucket, with PDL; past M nothing is written (output poisoned first)."""
    n, k = 6144, 4096
    g, w, ws, ws2, _ = nvfp4_tiled_weight(n, k, bool(config.get("BITS")))
    for m in sorted({config["BLOCK_M"] // 2 + 1, config["BLOCK_M"]}):
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        want = GV.launch_nvfp4_gemv(x, w, ws, ws2, config, pdl=True)
        out = torch.full((m + 1, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        got = GV.launch_nvfp4_gemv(x, w, ws, ws2, {**config, "XCLAMP": True}, out=out[:m], pdl=True)
        assert torch.equal(got, want), m
        assert out[m].isnan().all()


_WK = [c for b in (1, 8, 16) for c in wk_configs(b, 6144, 4096)]
_WK += [c for b in (1, 4) for c in wk_candidates(b, 6144, 4096) if c.get("LA")]  # the build's look-ahead forms


@pytest.mark.gpu
@pytest.mark.parametrize("config", _WK, ids=_ids(_WK))
def test_wk_gemv_gpu(config):
    """Each WK GEMV variant (the K range over groups of a program's warps, tools/dev/nvfp4_wk.py, and the build's LA
    forms, which must give their plain loop's bits) at a real shape and
    at K = 2304 (9 blocks of 256 or 18 of 128: groups with unequal block counts, and steps past the split's end),
    with PDL, a partial bucket, bias and residual at the small shape, against the fp32 reference; output poisoned
    first."""
    for n, k, fused in ((6144, 4096, False), (384, 2304, True)):
        if k % config["BLOCK_K"]:
            continue
        g, w, ws, ws2, ref_w = nvfp4_tiled_weight(n, k, True)
        m = config["BLOCK_M"] - (config["BLOCK_M"] > 2)
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        bias = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16) if fused else None
        res = torch.randn(m, n, device="cuda", generator=g).to(torch.bfloat16) if fused else None
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        y = GV.launch_nvfp4_gemv(x, w, ws, ws2, config, bias=bias, residual=res, out=out, pdl=True)
        ref = x.float() @ ref_w.T + (bias.float() + res.float() if fused else 0)
        err = float((y.float() - ref).norm() / ref.norm())
        assert err < 1e-2, (n, k, err)
        assert torch.equal(y, GV.launch_nvfp4_gemv(x, w, ws, ws2, config, bias=bias, residual=res, pdl=True))
        if config.get("LA"):  # loading a block ahead changes no operation: the plain loop's bits
            plain = {**config, "LA": 0}
            assert torch.equal(y, GV.launch_nvfp4_gemv(x, w, ws, ws2, plain, bias=bias, residual=res, pdl=True))


@pytest.mark.gpu
@pytest.mark.parametrize("config", _WK, ids=_ids(_WK))
def test_wk_gemv_silu_is_the_plain_way_to_the_bit(config):
    """The WK GEMV compiled with SILU on a [gate | up] weight (6144 rows: 3072 of each; and 384) gives the plain WK
    GEMV's output then silu_mul exactly, at a partial and a full bucket, with PDL; nothing written past M."""
    from atlas.plugins_trt.activation.triton_silu import launch_silu_mul

    for n, k in ((6144, 4096), (384, 2304)):
        if k % config["BLOCK_K"]:
            continue
        g, w, ws, ws2, _ = nvfp4_tiled_weight(n, k, True)
        for m in sorted({max(1, config["BLOCK_M"] - 1), config["BLOCK_M"]}):
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            want = launch_silu_mul(GV.launch_nvfp4_gemv(x, w, ws, ws2, config, pdl=True))
            out = torch.full((m + 1, n // 2), float("nan"), device="cuda", dtype=torch.bfloat16)
            got = GV.launch_nvfp4_gemv(x, w, ws, ws2, config, out=out[:m], pdl=True, silu=True)
            assert torch.equal(got, want), (n, k, m)
            assert out[m].isnan().all()


@pytest.mark.gpu
@pytest.mark.parametrize("config", _WK, ids=_ids(_WK))
def test_wk_gemv_norm_is_the_plain_way(config):
    """The WK GEMV with the decoder's add + RMSNorm after it (nvfp4_gemv_wk_norm_kernel, through launch_nvfp4_gemv's
    norm) against the plain WK GEMV then rms_norm with the residual, both offsets, at 8B o_proj's shape and a short K,
    a partial and a full bucket, with PDL: the residual stream to the bit, the output within a bf16 ulp (its sum of
    squares runs in another order), nothing written past M, the counter back to zero, twice in a row alike."""
    from atlas.plugins_trt.rms_norm.triton_norm import launch_rms_norm

    for (n, k), offset in zip(((4096, 4096), (384, 2304)), (0.0, 1.0)):
        if k % config["BLOCK_K"]:
            continue
        g, w, ws, ws2, _ = nvfp4_tiled_weight(n, k, True)
        weight = (torch.rand(n, device="cuda", generator=g) + 0.5).to(torch.bfloat16)
        for m in sorted({max(1, config["BLOCK_M"] - 1), config["BLOCK_M"]}):
            x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
            residual = torch.randn(m, n, device="cuda", generator=g).to(torch.bfloat16)
            want_res = residual.clone()
            want = launch_rms_norm(GV.launch_nvfp4_gemv(x, w, ws, ws2, config, pdl=True), weight, 1e-5, offset,
                                   residual=want_res, pdl=True)
            for _ in range(2):
                got_res = residual.clone()
                out = torch.full((m + 1, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                got = GV.launch_nvfp4_gemv(x, w, ws, ws2, config, out=out[:m], pdl=True,
                                           norm=(got_res, weight, 1e-5, offset))
                torch.cuda.synchronize()
                assert torch.equal(got_res, want_res), (n, k, m)
                assert out[m].isnan().all()
                diff = (got.float() - want.float()).abs()
                assert float(diff.max()) <= float(want.float().abs().max()) * 2 ** -7, (n, k, m)
                assert float((diff == 0).float().mean()) > 0.95, (n, k, m)
                assert int(GV._NORM_COUNTERS.get(x.device, torch.zeros(1)).sum()) == 0  # SPLIT_K 2: never made


_STREAMK = [c for b in (1, 8, 16) for c in streamk_candidates(b, 6144, 4096, 132)]


@pytest.mark.gpu
@pytest.mark.parametrize("config", _STREAMK, ids=_ids(_STREAMK))
def test_streamk_gemv_gpu(config):
    """Each stream-K candidate with the grid of this GPU, at a real shape (8B qkv: row tiles split over up to three
    programs), at N 384 / K 2048 (few blocks), and at N 256 / K 256 (one program a block, every tile reduced), with
    bias and residual, against the fp32 reference: deterministic (two launches bit-identical), counters back to 0."""
    from atlas.plugins_trt.quant_linear import gluon_streamk as sk

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n, k in ((6144, 4096), (384, 2048), (256, 256)):
        if n % config["BLOCK_N"]:
            continue
        cfg = {**config, "PROGRAMS": sk.programs_for(config, n, k, sms)}
        g, w, ws, ws2, ref_w = nvfp4_tiled_weight(n, k, bool(config.get("BITS")))
        m = config["BLOCK_M"] - (config["BLOCK_M"] > 2)
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        bias = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
        res = torch.randn(m, n, device="cuda", generator=g).to(torch.bfloat16)
        cnt = torch.zeros(n // cfg["BLOCK_N"], dtype=torch.int32, device="cuda")
        outs = []
        for _ in range(2):
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            outs.append(sk.launch_nvfp4_gemv_streamk(x, w, ws, ws2, cfg, cnt, bias=bias, residual=res, out=out,
                                                     pdl=True))
        ref = x.float() @ ref_w.T + bias.float() + res.float()
        err = float((outs[0].float() - ref).norm() / ref.norm())
        assert err < 1e-2, (n, k, err)
        assert torch.equal(outs[0], outs[1]), (n, k)
        assert int(cnt.abs().sum()) == 0, (n, k)


_SK_GEMM = [{"WGMMA": True, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "STAGES": st, "num_warps": w, "num_stages": 1,
             "W_SMEM": True, "TILED": True, "BITS": True, "SK": g, "DP": dp, **({"FIX": True} if fix else {})}
            for bm, bn, st, w, g, dp, fix in [(256, 128, 4, 8, 132, 1, False), (256, 128, 4, 8, 132, 0, True),
                                              (256, 128, 4, 8, 132, 2, True), (128, 64, 4, 4, 264, 1, True)]]


@pytest.mark.gpu
@pytest.mark.parametrize("config", _SK_GEMM, ids=_ids(_SK_GEMM))
def test_wgmma_streamk_gpu(config):
    """The persistent stream-K wgmma GEMM (gluon_gemm.nvfp4_gemm_wgmma_sk_kernel; with the reduction launch, or FIX:
    the parts summed inside) at 8B qkv (48 tiles of 256 x 128 over 132 programs: every tile shared), 27B down (K
    17408), a shape with more stream-K programs than block pairs (N 256, K 512: 2 x 4 pairs on 132 programs) and M
    300 (a partial M tile), with bias and residual, against the fp32 reference; deterministic (two launches
    bit-identical), FIX's counters back to zero."""
    from atlas.plugins_trt.quant_linear import gluon_gemm as gm

    cnt = torch.zeros(4096, dtype=torch.int32, device="cuda")
    for n, k, m in ((6144, 4096, 256), (5120, 17408, 256), (256, 512, 256), (6144, 4096, 300)):
        g, w, ws, ws2, ref_w = nvfp4_tiled_weight(n, k, True)
        x = torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)
        bias = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
        res = torch.randn(m, n, device="cuda", generator=g).to(torch.bfloat16)
        outs = []
        for _ in range(2):
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            part = torch.full(gm.sk_partials_shape(config), float("nan"), device="cuda")
            outs.append(gm.launch_nvfp4_gemm_wgmma_sk(x, w, ws, ws2, config, bias=bias, residual=res, out=out,
                                                      part=part, counters=cnt))
        ref = x.float() @ ref_w.T + bias.float() + res.float()
        err = float((outs[0].float() - ref).norm() / ref.norm())
        assert err < 1e-2, (n, k, m, err)
        assert torch.equal(outs[0], outs[1]), (n, k, m)
        assert int(cnt.abs().sum()) == 0, (n, k, m)


def test_plan_naming_a_missing_permutation_kernel_is_a_clear_error(ws_engine):
    """A plan whose permutation kernel is not in the engine's kernel table (a damaged engine) fails at load with an
    EngineError that says to rebuild, not with a KeyError at the first launch."""
    from atlas.runtime.errors import EngineError
    from atlas.runtime.kernels import KernelTable
    from atlas.runtime.layers.linear_cuda import CudaLinear

    result = next(r for r in ws_engine if any(e["256"].get("perm") for e in r.manifest["linear_kernels"].values()))
    m_ = result.manifest
    table = KernelTable.load(result.path, m_["kernels"], arch=90)
    key, plan = next((k, e) for k, e in m_["linear_kernels"].items() if e["256"].get("perm"))
    plan = {b: ({**item, "perm": "permute_k.missing"} if item.get("perm") else item) for b, item in plan.items()}
    n, k = (int(v) for v in key.split(":")[1].split("x"))
    with pytest.raises(EngineError, match="permute_k.missing.*rebuild"):
        CudaLinear("nvfp4", _linear_tensors(result, n, k), table, plan)
