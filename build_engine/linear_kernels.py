"""Kernels for the engine's quantized linears: one per (format, weight shape, M bucket), chosen and compiled at build.

M buckets: the GEMV kernels serve M = 1, 2, 4, 8, 16 (one compiled instance each, M padded up);
the GEMM kernels serve M > 16 in three buckets (<= 64, <= 256, larger). On a CUDA machine each instance's
configuration is autotuned on random data of the real shape; without one (a CPU build for a CUDA target)
a heuristic configuration is compiled and the table says `tuned: false`. BF16 linears use cuBLAS.

The plan the runtime reads (manifest["linear_kernels"]):
    {"nvfp4:6144x4096": {"1": {"kernel": name, "reduce": name | None, "config": {...}, "tuned": bool}, ...,
                         "64": {...}, "256": {...}, "2048": {...}}}
FP8 GEMM entries also name their activation-quantization kernel ("quant"); an fp8 "CUBLAS" entry has no kernel
(cuBLASLt's FP8 GEMM, torch._scaled_mm), an nvfp4 "DEQUANT" entry names nvfp4_dequant_kernel and the weight rows
it dequantizes per cuBLAS call ("rows"), an nvfp4 "WGMMA" entry the Gluon wgmma kernel (its input is x permuted with
gluon_gemm.permute_k at the config's BLOCK_K). Autotuning checks every candidate against the fp32 reference first.

NVFP4 weights of whole 128 x 128 tiles (N % 128 == K % 128 == 0) run in the tiled order of
plugins_trt/quant_linear/layout.py: every config of such a shape has "TILED": True, the kernels are compiled to read
that order, and the runtime (CudaLinear) re-orders the weight once at load. The engine's files keep ModelOpt's
row-major order (what the CPU reference, the ONNX graphs and other tools read).

An NVFP4 qkv_proj or GDN in_proj with N off the tiles (K on them) runs as N rounded up to whole tiles
(padded_shapes): its kernels are chosen and compiled for that N, its plan entries say "pad_n", and CudaLinear pads
the weight with zero rows at load and returns the first N columns as a view (their consumers, qkv_rope and the GDN
kernels, read row-strided views). Qwen3.5's in_proj [q | k | v | z | b | a] has N = 128 k + 2 HV (27B: 16480).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

import torch

from atlas.build_engine.kernels import compile_kernels, write_kernels
from atlas.plugins_trt.quant_linear.layout import TILE_N, can_tile
from atlas.runtime.config import ModelConfig
from atlas.runtime.layers.linear_cuda import GEMM_BUCKETS, GEMV_BUCKETS
from atlas.runtime.layout import canonical_shapes

log = logging.getLogger(__name__)
KERNEL_FORMATS = ("nvfp4", "fp8")
CANDIDATES_PER_BUCKET = 16
NORM_EPS = 1e-6
"""The RMSNorm epsilon the search times the residual projections' norm with (any small value times the same)."""
"""GEMV configs timed per bucket, shared evenly over the ways (plain / pipelined CUDA cores, tensor cores, Gluon); the
Gluon ways won all 30 NVFP4 GEMV cases of tools/results/gemm.json, so it is high enough for them to get several."""
SM_COUNT = 132  # H200; the heuristic only needs the order of magnitude
GLUON_SHARE = 3
"""Candidates a Gluon way gets for each one of another way in gemv_candidates."""
STREAMK_TILES = [(256, 128, 4, 2), (128, 128, 0, 2), (128, 128, 4, 2), (128, 128, 6, 3)]
"""Stream-K GEMV configs for tiled NVFP4 weights (plugins_trt/quant_linear/gluon_streamk.py): (BLOCK_N, BLOCK_K, RING
slots (0: registers two deep), programs an SM), best first. H200 sweep of 14 forms over six shapes and M 1..16
(tools/results/nvfp4_streamk.json): 256 x 128 with a 4-slot ring at 2 programs an SM was within 3% of the best in 16
of 22 cases; it beats the split GEMV at M 4..16 on the large layers (27B gate_up M 8 43.9 -> 41.4 us, 8B lm_head M 16
134.5 -> 122.9), not at M 1 or on the 8B qkv. Not in the build's search since 2026-12-07 (seventh session): inside a
decode step the stream-K GEMV runs far slower than in any timing of it alone (the search's or a graph chain). The 27B
nvfp4 engine's gate_up at M 1 took 70 us a launch in the step (tools/results/decode_h100.json profile) against 48.8
alone; with its tuning-cache entry set to the best WK config instead (everything else the same,
tools/results/tuning_cache_wk_gate_up_h100.json) the engine went from 98.8 to 122.8 tok/s at batch 1 (0.558 -> 0.680
of the floor; tools/results/decode_h100_wk_gate_up.json, the WK launches about 39 us). The 8B nvfp4 engine's stream-K
qkv and gate_up at batch 8 ran at about 42% of the bandwidth in its step likewise (80 MB a layer in 1999 us for 32
layers, decode_h100.json profile_b8). Kept for the dev sweeps (tools/dev/nvfp4_streamk.py) and its tests."""


def shape_key(fmt: str, n: int, k: int) -> str:
    return f"{fmt}:{n}x{k}"


def linear_shapes(config: ModelConfig, weight_formats: dict[str, str]) -> list[tuple[str, int, int]]:
    """Distinct (format, N, K) of the linears that run on Atlas kernels."""
    shapes = canonical_shapes(config)
    out = set()
    for prefix, fmt in weight_formats.items():
        if fmt in KERNEL_FORMATS and prefix != "embed":
            n, k = shapes[f"{prefix}.weight"]
            out.add((fmt, n, k))
    return sorted(out)


def gate_up_shapes(config: ModelConfig, weight_formats: dict[str, str]) -> set[tuple[str, int, int]]:
    """(format, N, K) of the [gate | up] projections, whose split-K GEMVs also get a reduction with SiLU-mul fused."""
    shapes = canonical_shapes(config)
    return {(fmt, *shapes[f"{prefix}.weight"]) for prefix, fmt in weight_formats.items()
            if fmt in KERNEL_FORMATS and prefix.endswith("mlp.gate_up_proj")}


def residual_shapes(config: ModelConfig, weight_formats: dict[str, str]) -> set[tuple[str, int, int]]:
    """(format, N, K) of the projections into the residual stream (o_proj, down_proj, the GDN out_proj), whose
    split-K GEMVs also get a reduction with the decoder's add + RMSNorm fused."""
    shapes = canonical_shapes(config)
    return {(fmt, *shapes[f"{prefix}.weight"]) for prefix, fmt in weight_formats.items()
            if fmt in KERNEL_FORMATS and prefix.endswith(("attn.o_proj", "mlp.down_proj", "gdn.out_proj"))}


NORMED_INPUT_LINEARS = ("attn.qkv_proj", "mlp.gate_up_proj", "gdn.in_proj")
"""The linears of the decoder that read the normed residual stream (a norm can be deferred into them)."""


def normed_input_shapes(config: ModelConfig, weight_formats: dict[str, str]) -> set[tuple[str, int, int]]:
    """(format, N, K) of the projections that read the normed residual stream, whose WK GEMVs also get the forms
    that read a deferred norm (plugins_trt/rms_norm/deferred.py)."""
    shapes = canonical_shapes(config)
    return {(fmt, *shapes[f"{prefix}.weight"]) for prefix, fmt in weight_formats.items()
            if fmt in KERNEL_FORMATS and prefix.startswith("layers.") and prefix.endswith(NORMED_INPUT_LINEARS)}


PADDED_LINEARS = ("attn.qkv_proj", "gdn.in_proj")
"""The linears whose output every consumer reads as a row-strided view, so that it may come from wider kernels."""


def padded_shapes(config: ModelConfig, weight_formats: dict[str, str]) -> dict[tuple[str, int, int], int]:
    """(format, N, K) -> the N its kernels run at, for the NVFP4 shapes of PADDED_LINEARS alone (no other linear
    of the same shape) with N off the 128-row tiles and K on them: N rounded up to whole tiles, so that the tiled
    kernels (every way that won an NVFP4 case of tools/results/gemm.json) serve them."""
    shapes = canonical_shapes(config)
    users: dict[tuple[str, int, int], list[str]] = {}
    for prefix, fmt in weight_formats.items():
        if fmt in KERNEL_FORMATS and prefix != "embed":
            users.setdefault((fmt, *shapes[f"{prefix}.weight"]), []).append(prefix)
    return {(fmt, n, k): -(-n // TILE_N) * TILE_N for (fmt, n, k), prefixes in users.items()
            if fmt == "nvfp4" and n % TILE_N and can_tile(TILE_N, k)
            and all(p.endswith(PADDED_LINEARS) for p in prefixes)}


def is_tiled(fmt: str, n: int, k: int) -> bool:
    """Whether a linear's GPU kernels read its weight in the tiled order (layout.py): NVFP4 of whole tiles."""
    return fmt == "nvfp4" and can_tile(n, k)


def reads_bits(config: dict) -> bool:
    """Whether an NVFP4 config's kernel can read the tiled order with each word's bits in layout.NVFP4_BITS order:
    the Gluon GEMVs (blocks of whole tile rows, registers: PIPE <= 2, no XSMEM), the stream-K GEMV, the wgmma GEMM
    (and its warp-specialized form) and the packed dequantization; not the Triton GEMV / GEMM tiles (their decode reads ModelOpt's nibbles)."""
    if config.get("WGMMA") or config.get("STREAMK") or config.get("WS"):
        return True
    if config.get("DEQUANT"):
        return bool(config.get("PACK"))
    return bool(config.get("GLUON")) and config["BLOCK_K"] % 128 == 0 and config.get("PIPE", 1) <= 2 \
        and not config.get("XSMEM")


def tiled_configs(configs: list[dict]) -> list[dict]:
    """The configs that can read the GPU order of a weight of whole tiles (layout.tile_nvfp4, then bits_nvfp4),
    marked "TILED" and "BITS" (reads_bits). Measured on the H200 (tools/results/nvfp4_bits.json,
    nvfp4_bits_regcap.json): the bit order takes the GEMV decode from 13 to 7 integer-pipe operations a word, 5-13%
    at M 4..8 and, with a 72-register cap, up to 15% at M 1 (27B gate_up 36.3 -> 32.5 us; 27B down unchanged); every
    NVFP4 case of gemm.json was won by a way that reads it (Gluon GEMV, stream-K, wgmma, packed dequantization)."""
    return [{**c, "TILED": True, "BITS": True} for c in configs if reads_bits(c)]


def gemv_candidates(configs: list[dict], bucket: int, n: int, most: int, k: int | None = None) -> list[dict]:
    """Configs of the bucket whose grid gives the chip enough programs, best guess first. The Gluon configs
    (K % BLOCK_K == 0 only) are kept when k is given, as the last way: a build without timing takes the first."""
    same = [c for c in configs if c["BLOCK_M"] == bucket
            and not (c.get("GLUON") and (k is None or k % c["BLOCK_K"]))]

    def programs(c):
        return math.ceil(n / c["BLOCK_N"]) * c["SPLIT_K"]

    fit = [c for c in same if SM_COUNT <= programs(c) <= 64 * SM_COUNT] or same
    # ranked by how near their grid is to 4 programs an SM; the Gluon configs keep their listed order (measured)
    ranked = sorted(fit, key=lambda c: 0.0 if c.get("GLUON") else abs(math.log(programs(c) / (4 * SM_COUNT))))
    # the ways a config can run: CUDA cores with plain or pipelined loads, tensor cores, either with PRE (fp8), Gluon with plain or
    # register-prefetched loads; a round takes one of each CUDA-core / tensor-core way and GLUON_SHARE of each Gluon
    # way (Gluon won all 30 NVFP4 GEMV cases of tools/results/gemm.json since 2026-12-03), Gluon last in each round
    ways = {}
    for c in ranked:
        ways.setdefault((bool(c.get("GLUON")), bool(c.get("TC")), c.get("PIPE", 1) > 1,
                         bool(c.get("PRE")) and not c.get("GLUON")), []).append(c)  # PRE: fp8_gemv_kernel's
    taken = {w: 0 for w in ways}
    picked = []
    while len(picked) < most and any(taken[w] < len(ways[w]) for w in ways):
        for w in sorted(ways, key=lambda w: w[0]):
            for _ in range(GLUON_SHARE if w[0] else 1):
                if taken[w] < len(ways[w]) and len(picked) < most:
                    picked.append(ways[w][taken[w]])
                    taken[w] += 1
    return picked


def streamk_candidates(bucket: int, n: int, k: int, sm_count: int = SM_COUNT) -> list[dict]:
    """The stream-K GEMV configs (STREAMK_TILES) that fit a tiled NVFP4 [n, k] weight at this M bucket, with their
    grid (PROGRAMS) for a chip of sm_count SMs; none for a weight that is not tiled."""
    from atlas.plugins_trt.quant_linear.gluon_streamk import programs_for

    out = []
    for bn, bk, ring, per_sm in STREAMK_TILES:
        if not is_tiled("nvfp4", n, k) or n % bn or k % bk:
            continue
        cfg = {"BLOCK_M": bucket, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": 4, "num_stages": 1, "TILED": True,
               "BITS": True, "STREAMK": per_sm, "RING": ring}
        out.append({**cfg, "PROGRAMS": programs_for(cfg, n, k, sm_count)})
    return out


WK_TILES = {1: [(16, 256, 4, 4, 4), (16, 256, 4, 4, 2), (16, 128, 4, 4, 4), (16, 256, 8, 8, 2), (16, 256, 8, 8, 2, 1),
                (16, 256, 4, 4, 2, 1), (16, 256, 8, 8, 2, 2), (16, 256, 4, 4, 2, 2)],
            4: [(16, 128, 4, 4, 4), (16, 256, 4, 4, 4), (16, 256, 8, 8, 2), (16, 256, 8, 8, 2, 1)]}
"""WK GEMV configs (gluon_gemv.nvfp4_gemv_wk_kernel: a program's K range over WK groups of its warps, one launch, no
split-K reduction) by the largest M bucket they serve: (BLOCK_N, BLOCK_K, num_warps, WK, PRE), SPLIT_K 1, tiled +
BITS. H100 sweep beside the shipped configs (tools/results/nvfp4_wk_h100.json, `python -m atlas.tools.dev.nvfp4_wk`):
faster at M 1 on five of six shapes (8B lm_head 122.8 -> 103.7 us, 27B gate_up 47.5 -> 42.6, 8B qkv 8.1 -> 7.4) and at
M 4 on three, slower at M 8 / 16 (each warp reads the whole x tile for its 16 rows). A sixth element LA: the loop
loads a block's weights (1) or weights and x (2) a step ahead (written 2026-12-07, tenth session, for the long-K
residual projections: the 8B down's fused-norm WK GEMV ran at about half its floor on the H100, a step's DRAM load
and x's L2 load in series each step; GPU-untested, the search times them beside the others)."""


def wk_candidates(bucket: int, n: int, k: int) -> list[dict]:
    """The WK GEMV configs (WK_TILES) for a tiled NVFP4 [n, k] weight at this M bucket; none for a weight that is not
    tiled or a bucket above 4."""
    tiles = next((WK_TILES[b] for b in sorted(WK_TILES) if bucket <= b), [])
    if not is_tiled("nvfp4", n, k):
        return []
    return [{"BLOCK_M": bucket, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": 1, "num_warps": nw, "num_stages": 1,
             "GLUON": True, "PIPE": 1, "TILED": True, "BITS": True, "WK": wk, "PRE": pre, **({"LA": la[0]} if la else {})}
            for bn, bk, nw, wk, pre, *la in tiles if n % bn == 0 and k % bk == 0]


def nvfp4_gemv_candidates(bucket: int, n: int, k: int, most: int) -> list[dict]:
    """What the build times for an NVFP4 GEMV bucket: gemv_candidates' split GEMVs (tiled when the weight is), then
    the WK ones (not the stream-K configs: STREAMK_TILES says why). A build without timing takes the first."""
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv

    tiled = is_tiled("nvfp4", n, k)
    configs = tiled_configs(gemv.CONFIGS_nvfp4_gemv) if tiled else gemv.CONFIGS_nvfp4_gemv
    return gemv_candidates(configs, bucket, n, most, k) + wk_candidates(bucket, n, k)


def _random_weights(fmt: str, n: int, k: int):
    from atlas.build_engine.quantize.quantizer import quantize

    g = torch.Generator(device="cuda").manual_seed(n * 31 + k)
    return quantize(torch.randn(n, k, device="cuda", generator=g) * 0.02, fmt, device="cuda")


def _tuning_inputs(fmt: str, bucket: int, n: int, k: int, candidates: list[dict], reference: bool = True):
    """(weights as the candidates read them, x, fp32 reference or None) on random data of the real shape."""
    from atlas.plugins_trt.quant_linear.reference import dequantize

    qt = _random_weights(fmt, n, k)
    x = torch.randn(bucket, k, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ dequantize(fmt, qt.weight, qt.weight_scale, qt.weight_scale_2).T if reference else None
    if candidates and candidates[0].get("TILED"):  # the candidates read the GPU order, as the runtime will give it
        from atlas.plugins_trt.quant_linear.layout import gpu_order
        w, ws = gpu_order(qt.weight, qt.weight_scale, bool(candidates[0].get("BITS")))
        qt = dataclasses.replace(qt, weight=w, weight_scale=ws)
    return qt, x, ref


def _candidate_call(fmt: str, bucket: int, qt, x, cfg: dict, then: str | None = None, norm: tuple | None = None):
    """The launch the build times for one candidate (a function of no arguments returning y). then: what follows
    a GEMV at run time, timed with it as the runtime runs it (fused into a split-K reduction where the candidate
    splits, else a kernel after): "silu" (a gate_up projection: SiLU-mul) or "norm" (a projection into the residual
    stream: the decoder's add + RMSNorm, norm = (residual, weight, eps, offset))."""
    from atlas.plugins_trt.quant_linear import triton_gemm as gemm
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv

    if bucket in GEMV_BUCKETS:
        extra = {"silu": then == "silu", "norm": norm if then == "norm" else None}
        if fmt == "nvfp4":
            return lambda: gemv.launch_nvfp4_gemv(x, qt.weight, qt.weight_scale, qt.weight_scale_2, cfg, pdl=True,
                                                  **extra)
        return lambda: gemv.launch_fp8_gemv(x, qt.weight, qt.weight_scale, cfg, pdl=True, **extra)
    if fmt == "nvfp4":
        return lambda: gemm.launch_nvfp4_gemm(x, qt.weight, qt.weight_scale, qt.weight_scale_2, cfg)
    return lambda: gemm.w8a8_linear(x, qt.weight, qt.weight_scale, cfg)


def _weight_copies(qt) -> list:
    """qt and enough fresh copies of its tensors that a chain of launches over them reads every weight from device
    memory, not L2 (tools/bench/timing.copies_for)."""
    from atlas.tools.bench.timing import copies_for

    tensors = {f: getattr(qt, f) for f in ("weight", "weight_scale", "weight_scale_2") if getattr(qt, f) is not None}
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    return [qt] + [dataclasses.replace(qt, **{f: t.clone() for f, t in tensors.items()})
                   for _ in range(copies_for(nbytes) - 1)]


def _tune(fmt: str, bucket: int, n: int, k: int, candidates: list[dict], then: str | None = None) -> dict:
    """The fastest correct candidate on random data of the real shape. then: "silu" or "norm", a GEMV bucket timed and
    checked with what follows it (_candidate_call).

    Timed as the runtime runs it: a chain of launches (programmatic dependent launch for the GEMVs) over copies of
    the weights enough to read them from device memory, captured in a CUDA graph and replayed (median;
    tools/bench/timing.graph_time, as tools/bench_gemm.py times its search). Until 2026-12-07 the search took
    triton.testing.do_bench's median (one launch at a time, the L2 flushed between), which ranked the stream-K GEMV
    first for the 27B gate_up at M 1 where the graph chain (tools/results/gemm_h100.json: WK 42.8 us, stream-K 48.8)
    and the decode step (decode_h100_wk_gate_up.json) put the WK GEMV ahead."""
    from atlas.plugins_trt.rms_norm.reference import rms_norm
    from atlas.tools.bench.timing import graph_time

    qt, x, ref = _tuning_inputs(fmt, bucket, n, k, candidates)
    residual = weight = None
    if then == "silu":
        ref = torch.nn.functional.silu(ref[:, :n // 2]) * ref[:, n // 2:]
    elif then == "norm":  # a residual stream and a norm weight of the real size, the norm of their sum
        residual = torch.randn(bucket, n, device="cuda", dtype=torch.bfloat16)
        weight = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
        ref = rms_norm(ref + residual.float(), weight, NORM_EPS)
    qts = _weight_copies(qt)
    bound = 5e-2 if (fmt == "fp8" and bucket not in GEMV_BUCKETS) else 1e-2  # W8A8 also rounds the activations
    best, best_t = None, float("inf")
    for cfg in candidates:
        # a config that computes wrong here is skipped; checked on two launches, so that a kernel keeping state between
        # launches (the fused-norm WK GEMV's counter) must leave it as it found it. The norm updates its residual in
        # place: each check starts from the same one.
        norms = [(residual.clone(), weight, NORM_EPS, 0.0) if then == "norm" else None for _ in range(2)]
        try:
            ys = [_candidate_call(fmt, bucket, qt, x, cfg, then, norm)().float() for norm in norms]
            if not all(float((y - ref).norm() / ref.norm()) < bound for y in ys):
                continue
            t = graph_time([_candidate_call(fmt, bucket, q, x, cfg, then, norms[-1]) for q in qts], repeats=10)
        except Exception:  # a config the chip cannot run is skipped
            continue
        if t < best_t:
            best, best_t = cfg, t
    if best is None:
        raise RuntimeError(f"no kernel configuration ran for {fmt} {n}x{k} at M={bucket}")
    return best


_WORKER_INPUTS: dict = {}


def _precompile_one(job: tuple) -> bool:
    """In a worker process: launch one candidate once, so that Triton compiles it into its on-disk cache (shared
    with the build's process, which then loads instead of compiling). False where it cannot run."""
    fmt, bucket, n, k, candidates, i = job
    key = (fmt, bucket, n, k)  # one job's candidates share their inputs
    try:
        if key not in _WORKER_INPUTS:
            _WORKER_INPUTS.clear()  # one shape's tensors at a time, their memory back to the driver (workers_that_fit)
            torch.cuda.empty_cache()
            _WORKER_INPUTS[key] = _tuning_inputs(fmt, bucket, n, k, candidates, reference=False)
        qt, x, _ = _WORKER_INPUTS[key]
        _candidate_call(fmt, bucket, qt, x, candidates[i])()
        torch.cuda.synchronize()
        return True
    except Exception:
        return False


class Precompiler:
    """Compiles candidates in spawned processes before they are timed one by one (Triton compiles a kernel on its
    first launch, about a second each; a quantized 8B model has some 900 candidates). The pool lives as long as the
    `with` block, so a build hands it one weight shape at a time and times that shape while nothing else runs on the
    GPU. A broken pool only means the timing compiles what is left itself."""

    def __init__(self, workers: int | None = None):
        import os

        self.workers = workers or min(16, os.cpu_count() or 1)
        self.pool = None

    def __enter__(self) -> Precompiler:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None

    def __call__(self, jobs: list[tuple[str, int, int, int, list[dict]]]) -> int:
        """Compile every candidate of the (fmt, bucket, n, k, candidates) jobs; returns how many ran."""
        import concurrent.futures
        import multiprocessing

        tasks = [(fmt, b, n, k, cands, i) for fmt, b, n, k, cands in jobs for i in range(len(cands))]
        busy = self.workers_that_fit(jobs) if tasks else 0
        if busy < 2 or self.pool is False:
            return 0
        t0 = time.perf_counter()
        try:
            if self.pool is None:  # spawn: CUDA cannot be used in a forked child
                self.pool = concurrent.futures.ProcessPoolExecutor(
                    self.workers, mp_context=multiprocessing.get_context("spawn"))
            # tasks of one shape and bucket go to one worker in a row (its inputs are made once); `busy` chunks at
            # least, so that no more than `busy` workers hold a large weight's inputs at once
            chunk = max(len(tasks) // (4 * self.workers), -(-len(tasks) // busy) if busy < self.workers else 1)
            ran = sum(self.pool.map(_precompile_one, tasks, chunksize=max(1, chunk)))
        except Exception as e:  # noqa: BLE001 (a broken pool: the timing compiles everything itself)
            import warnings

            warnings.warn(f"parallel precompile failed ({type(e).__name__}: {e}); compiling while timing instead",
                          stacklevel=2)
            if self.pool:
                self.pool.shutdown(cancel_futures=True)
            self.pool = False
            return 0
        log.info("precompiled %d of %d candidates in %.0f s on %d processes", ran, len(tasks),
                 time.perf_counter() - t0, busy)
        return ran

    def workers_that_fit(self, jobs: list[tuple[str, int, int, int, list[dict]]]) -> int:
        """How many workers may build their inputs at once in the GPU memory free now: each holds its largest
        job's random fp32 weight, its quantization's chunk temporaries and a CUDA context (about 6 bytes a weight
        element and 1 GB; the 27B LM head: 8 GB)."""
        need = max(n * k for _, _, n, k, _ in jobs) * 6 + (1 << 30)
        free, _ = torch.cuda.mem_get_info()
        return max(0, min(self.workers, int(0.8 * free) // need))


def compile_linear_kernels(config: ModelConfig, weight_formats: dict[str, str], kernels_dir, tune: bool,
                           candidates_per_bucket: int = CANDIDATES_PER_BUCKET) -> tuple[dict, dict]:
    """Choose, compile and write every kernel the engine's quantized linears need.

    Returns (kernel table for manifest["kernels"], plan for manifest["linear_kernels"]).
    """
    compiled, plan = linear_kernel_list(config, weight_formats, tune, candidates_per_bucket)
    table = write_kernels(compiled, kernels_dir) if compiled else {}
    return table, plan


def plan_item(fmt: str, bucket: int, n: int, k: int, cfg: dict, add, tune: bool, silu: bool = False,
              norm_offset: int | None = None, normed_input: bool = False) -> dict:
    """The plan entry of one (format, M bucket, N, K) for its chosen config: the kernels it launches, each given to
    add(signature, name, grid) (which records the kernel to compile and returns its name). silu: a gate_up
    projection (its GEMV bucket also gets the SiLU-mul forms); norm_offset: a projection into the residual stream
    (its GEMV bucket also gets the add + RMSNorm forms, for a norm weight of that offset, and the forms that defer
    the norm to the next projection: the WK GEMV's "kernel_defer", the split-K reduction's "reduce_defer"), None
    otherwise; normed_input: a projection of the normed residual stream (its GEMV bucket also gets the forms that
    read a deferred norm: "kernel_rstd" / "reduce_rstd", and "kernel_silu_rstd" / "reduce_silu_rstd" beside a SiLU
    form; plugins_trt/rms_norm/deferred.py)."""
    from atlas.plugins_trt.quant_linear import triton_gemm as gemm
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv
    from atlas.plugins_trt.rms_norm import deferred

    tag = "_".join(f"{v}" for v in cfg.values())
    item = {"config": cfg, "tuned": tune, "kernel": None, "reduce": None, "reduce_silu": None,
            "kernel_silu": None, "reduce_norm": None, "kernel_norm": None, "kernel_defer": None, "kernel_rstd": None,
            "kernel_silu_rstd": None, "reduce_defer": None, "reduce_rstd": None, "reduce_silu_rstd": None,
            "quant": None, "perm": None}
    if bucket in GEMV_BUCKETS and cfg.get("STREAMK"):  # one launch, its reduction inside (gluon_streamk)
        from atlas.plugins_trt.quant_linear import gluon_streamk
        item["kernel"] = add(gluon_streamk.signature_nvfp4_gemv_streamk(cfg, n, k, pdl=True),
                             f"nvfp4_gemv_streamk.{n}x{k}.{tag}", gluon_streamk.grid_streamk(cfg))
    elif bucket in GEMV_BUCKETS:
        # programmatic dependent launch: the GEMV's launch and ramp-up overlap the kernel before it
        sig = (gemv.signature_nvfp4_gemv if fmt == "nvfp4" else gemv.signature_fp8_gemv)(cfg, n, k, pdl=True)
        item["kernel"] = add(sig, f"{fmt}_gemv.{n}x{k}.{tag}", gemv.grid_gemv(cfg, n))
        if silu and gemv.fuses_silu_gemv(cfg, n):  # the WK GEMV ending in SiLU-mul
            item["kernel_silu"] = add(gemv.signature_nvfp4_gemv(cfg, n, k, pdl=True, silu=True),
                                      f"{fmt}_gemv_silu.{n}x{k}.{tag}", gemv.grid_gemv(cfg, n))
        if norm_offset is not None and gemv.fuses_norm_gemv(cfg, n):  # ... in the add + RMSNorm
            item["kernel_norm"] = add(gemv.signature_nvfp4_gemv_wk_norm(cfg, n, k, norm_offset, pdl=True),
                                      f"{fmt}_gemv_norm.{n}x{k}.{norm_offset}.{tag}", (n // cfg["BLOCK_N"], 1, 1))
            item["kernel_defer"] = add(deferred.signature_wk_defer(cfg, n, k, norm_offset, pdl=True),
                                       f"{fmt}_gemv_defer.{n}x{k}.{norm_offset}.{tag}", (n // cfg["BLOCK_N"], 1, 1))
        if normed_input and gemv.fuses_norm_gemv(cfg, n):  # the WK GEMV reading a deferred norm
            item["kernel_rstd"] = add(deferred.signature_wk_rstd(cfg, n, k, pdl=True), f"{fmt}_gemv_rstd.{n}x{k}.{tag}",
                                      (n // cfg["BLOCK_N"], 1, 1))
            if item["kernel_silu"]:
                item["kernel_silu_rstd"] = add(deferred.signature_wk_rstd(cfg, n, k, pdl=True, silu=True),
                                               f"{fmt}_gemv_silu_rstd.{n}x{k}.{tag}", (n // cfg["BLOCK_N"], 1, 1))
    elif cfg.get("SK"):  # a persistent form (wgmma, or RS): x permuted, the kernel, the reduction
        from atlas.plugins_trt.quant_linear import gluon_gemm, gluon_ws
        if cfg.get("WS"):
            item["kernel"] = add(gluon_ws.signature_nvfp4_gemm_rs_sk(cfg, n, k), f"nvfp4_rs_sk.{n}x{k}.{tag}",
                                 (cfg["SK"], 1, 1))
        else:
            item["kernel"] = add(gluon_gemm.signature_nvfp4_gemm_wgmma_sk(cfg, n, k),
                                 f"nvfp4_wgmma_sk.{n}x{k}.{tag}", (cfg["SK"], 1, 1))
        if not cfg.get("FIX"):
            item["reduce"] = add(gluon_gemm.signature_sk_reduce(cfg, n, k), f"sk_reduce.{n}x{k}.{tag}",
                                 gluon_gemm.grid_sk_reduce(cfg, bucket, n))
    elif cfg.get("WGMMA"):  # x permuted into the decode's k order (gluon_gemm.permute_k), then the kernel
        from atlas.plugins_trt.quant_linear import gluon_gemm
        item["kernel"] = add(gluon_gemm.signature_nvfp4_gemm_wgmma(cfg, n, k), f"nvfp4_wgmma.{n}x{k}.{tag}",
                             gluon_gemm.grid_wgmma(cfg, bucket, n))
    elif cfg.get("WS"):  # x as given (NAT) or permuted (gluon_ws.x_operand), then the kernel
        from atlas.plugins_trt.quant_linear import gluon_gemm, gluon_ws
        item["kernel"] = add(gluon_ws.signature_nvfp4_gemm_ws(cfg, n, k), f"nvfp4_ws.{n}x{k}.{tag}",
                             gluon_gemm.grid_wgmma(cfg, bucket, n))
    elif cfg.get("DEQUANT"):  # nvfp4 rows -> bf16 workspace, then cuBLAS (gemm.nvfp4_dequant_linear)
        rows = min(gemm.dequant_rows(cfg, k), n)
        item["rows"] = rows
        item["kernel"] = add(gemm.signature_nvfp4_dequant(cfg, n, k), f"nvfp4_dequant.{n}x{k}.{tag}",
                             gemm.grid_nvfp4_dequant(cfg, rows, k))
    else:
        if not cfg.get("CUBLAS"):  # fp8 CUBLAS: only the activation quantization is an Atlas kernel
            sig = (gemm.signature_nvfp4_gemm if fmt == "nvfp4" else gemm.signature_fp8_gemm)(cfg, n, k)
            item["kernel"] = add(sig, f"{fmt}_gemm.{n}x{k}.{tag}", gemm.grid_gemm(cfg, bucket, n))
        if fmt == "fp8":
            qcfg = gemm.CONFIGS_quantize_rows_fp8[0]
            item["quant"] = add(gemm.signature_quantize_rows_fp8(qcfg, k), f"quantize_rows_fp8.{k}",
                                gemm.grid_quantize_rows_fp8(qcfg, bucket))
    if cfg.get("SPLIT_K", 1) > 1:  # fp32 partials, summed (+ bias) by the split-K reduction
        rcfg = gemv.CONFIGS_splitk_reduce[0]
        rsig = gemv.signature_splitk_reduce(rcfg, cfg["SPLIT_K"], n, pdl=True)
        item["reduce"] = add(rsig, f"splitk_reduce.{cfg['SPLIT_K']}x{n}",
                             gemv.grid_splitk_reduce(rcfg, bucket, n))
        if bucket in GEMV_BUCKETS and silu:  # CudaLinear.fuses_silu
            ssig = gemv.signature_splitk_reduce(rcfg, cfg["SPLIT_K"], n // 2, pdl=True, silu=True)
            item["reduce_silu"] = add(ssig, f"splitk_reduce_silu.{cfg['SPLIT_K']}x{n // 2}",
                                      gemv.grid_splitk_reduce(rcfg, bucket, n // 2))
        if bucket in GEMV_BUCKETS and norm_offset is not None:  # CudaLinear.fuses_norm
            nsig = gemv.signature_splitk_reduce_norm(cfg["SPLIT_K"], n, norm_offset, pdl=True)
            item["reduce_norm"] = add(nsig, f"splitk_reduce_norm.{cfg['SPLIT_K']}x{n}.{norm_offset}",
                                      (bucket, 1, 1))
            dsig = deferred.signature_splitk_reduce_defer(cfg["SPLIT_K"], n, norm_offset, pdl=True)
            item["reduce_defer"] = add(dsig, f"splitk_reduce_defer.{cfg['SPLIT_K']}x{n}.{norm_offset}",
                                       gemv.grid_splitk_reduce(deferred.reduce_defer_config(), bucket, n))
        if bucket in GEMV_BUCKETS and normed_input:  # the reductions of a GEMV on a deferred norm's hw
            item["reduce_rstd"] = add(deferred.signature_splitk_reduce_rstd(cfg["SPLIT_K"], n, k, pdl=True),
                                      f"splitk_reduce_rstd.{cfg['SPLIT_K']}x{n}.{k}",
                                      gemv.grid_splitk_reduce(rcfg, bucket, n))
            if silu:
                item["reduce_silu_rstd"] = add(
                    deferred.signature_splitk_reduce_rstd(cfg["SPLIT_K"], n // 2, k, pdl=True, silu=True),
                    f"splitk_reduce_silu_rstd.{cfg['SPLIT_K']}x{n // 2}.{k}",
                    gemv.grid_splitk_reduce(rcfg, bucket, n // 2))
    if bucket not in GEMV_BUCKETS and gemm.permutes_x(cfg):  # x into the kernel's k order first (one launch)
        bk = cfg["BLOCK_K"]
        item["perm"] = add(gemm.signature_permute_k(bk, k), f"permute_k.{k}.{bk}",
                           gemm.grid_permute_k(bk, bucket, k))
    return item


def linear_kernel_list(config: ModelConfig, weight_formats: dict[str, str], tune: bool,
                       candidates_per_bucket: int = CANDIDATES_PER_BUCKET, cache=None) -> tuple[list, dict]:
    """Choose and compile (without writing) every kernel the quantized linears need: (compiled, plan).
    cache: a TuningCache (build_engine/tuning_cache.py) whose entries replace timing and which gets what was timed."""
    from atlas.plugins_trt.quant_linear import triton_gemm as gemm
    from atlas.plugins_trt.quant_linear import triton_gemv as gemv

    specs, plan, seen = [], {}, set()  # compiled together at the end (threads)
    # the persistent GEMMs' grids are a few programs an SM of the chip they are tuned on
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count if tune else SM_COUNT

    def add(sig, name, grid):
        if name not in seen:
            seen.add(name)
            specs.append(sig.kernel_spec(name, grid))
        return name

    def candidates(fmt, bucket, n, k):
        if bucket in GEMV_BUCKETS and fmt == "nvfp4":
            cands = nvfp4_gemv_candidates(bucket, n, k, candidates_per_bucket)
        elif bucket in GEMV_BUCKETS:
            cands = gemv_candidates(gemv.CONFIGS_fp8_gemv, bucket, n, candidates_per_bucket, k)
        else:
            cands = gemm.gemm_candidates(fmt, n, k, sm_count)
            cands = tiled_configs(cands) if is_tiled(fmt, n, k) else cands
        if not cands:
            raise RuntimeError(f"no {fmt} kernel configuration fits {n}x{k} at M bucket {bucket}")
        return cands

    shapes = linear_shapes(config, weight_formats)
    pads = padded_shapes(config, weight_formats)
    # the cases timed and compiled: (format, bucket, the kernels' N, K), a padded linear's N rounded up to tiles
    cases = list(dict.fromkeys((fmt, bucket, pads.get((fmt, n, k), n), k) for fmt, n, k in shapes
                               for bucket in GEMV_BUCKETS + GEMM_BUCKETS))
    silu_shapes = gate_up_shapes(config, weight_formats)
    norm_shapes = residual_shapes(config, weight_formats)
    followed = {**{sh: "norm" for sh in norm_shapes}, **{sh: "silu" for sh in silu_shapes}}  # what a GEMV is timed with

    def timed_with(fmt, bucket, n, k):  # the fused epilogue a GEMV case is timed with (it changes the winner)
        return followed.get((fmt, n, k)) if bucket in GEMV_BUCKETS else None

    cands = {c: candidates(*c) for c in cases}
    cached = {c: cache.get(*c, cands[c], timed_with(*c)) for c in cases} if (tune and cache is not None) else {}
    todo = {c: cands[c] for c in cases if cached.get(c) is None}  # what is timed (or, untuned, taken first)
    chosen = {c: cfg for c, cfg in cached.items() if cfg is not None}
    t0 = time.perf_counter()
    if tune and todo:
        with Precompiler() as precompile:
            for shape in dict.fromkeys((fmt, n, k) for fmt, _, n, k in todo):  # one weight shape at a time
                group = [c for c in todo if (c[0], c[2], c[3]) == shape]
                torch.cuda.empty_cache()  # this process's cached blocks back to the driver, for the workers
                precompile([(*c, todo[c]) for c in group])
                for c in group:  # timed and written to the cache as it goes: a stopped build keeps them
                    chosen[c] = _tune(*c, todo[c], then=timed_with(*c))
                    if cache is not None:
                        cache.put(*c, todo[c], timed_with(*c), chosen[c])
                log.info("%s %dx%d: %d buckets chosen, %.0f s into the search", *shape, len(group),
                         time.perf_counter() - t0)
    else:
        chosen.update({c: options[0] for c, options in todo.items()})
    def offset(fmt, n, k):  # the norm weight's offset, for a projection into the residual stream
        return int(config.norm_offset) if (fmt, n, k) in norm_shapes else None

    normed = {(fmt, pads.get((fmt, n, k), n), k) for fmt, n, k in normed_input_shapes(config, weight_formats)}
    items = {(fmt, b, n, k): plan_item(fmt, b, n, k, chosen[(fmt, b, n, k)], add, tune, silu=(fmt, n, k) in silu_shapes,
                                       norm_offset=offset(fmt, n, k), normed_input=(fmt, n, k) in normed)
             for fmt, b, n, k in cases}
    for fmt, n, k in shapes:  # a padded linear: its wider kernels, no fused reduction (they are not its consumers)
        kn = pads.get((fmt, n, k), n)
        plan[shape_key(fmt, n, k)] = {
            str(b): items[(fmt, b, kn, k)] if kn == n else
            {**items[(fmt, b, kn, k)], "pad_n": kn, "reduce_silu": None, "kernel_silu": None, "reduce_norm": None,
             "kernel_norm": None, "kernel_defer": None, "kernel_silu_rstd": None, "reduce_defer": None,
             "reduce_silu_rstd": None}
            for b in GEMV_BUCKETS + GEMM_BUCKETS}
    if tune:
        log.info("chose %d linear kernel configurations (%d timed) in %.0f s", len(cases), len(todo),
                 time.perf_counter() - t0)
    t1 = time.perf_counter()
    compiled = compile_kernels(specs)
    log.info("compiled %d linear kernels in %.0f s", len(compiled), time.perf_counter() - t1)
    return compiled, plan
