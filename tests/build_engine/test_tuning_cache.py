"""Tuning cache (build_engine/tuning_cache.py): a build reuses the configurations an earlier build on the same GPU,
Triton and kernel sources timed, times only what is missing, and refuses an unreadable file with what to do.

CPU: the timing and the compiles are replaced (they need the GPU, or take minutes); what is tested is which
configurations the plan gets and what the file holds afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from atlas.build_engine import linear_kernels
from atlas.build_engine.errors import BuildError
from atlas.build_engine.tuning_cache import TuningCache, kernel_digest

SHAPES = [("fp8", 128, 256), ("nvfp4", 256, 128)]
BUCKETS = linear_kernels.GEMV_BUCKETS + linear_kernels.GEMM_BUCKETS


@pytest.fixture
def no_gpu_work(monkeypatch):
    """linear_kernel_list over SHAPES without a GPU: `_tune` records its calls and answers the last candidate
    (not the heuristic's first), compiles return their names."""
    class Timed(list):
        precompiled: list
        followed: list

    timed = Timed()
    timed.followed = []

    def fake_tune(fmt, bucket, n, k, candidates, then=None):
        timed.append((fmt, n, k, bucket))
        if then:
            timed.followed.append((then, fmt, n, k, bucket))
        return candidates[-1]

    monkeypatch.setattr(linear_kernels, "linear_shapes", lambda config, formats: SHAPES)
    monkeypatch.setattr(linear_kernels, "gate_up_shapes", lambda config, formats: set())
    monkeypatch.setattr(linear_kernels, "residual_shapes", lambda config, formats: set())
    monkeypatch.setattr(linear_kernels, "normed_input_shapes", lambda config, formats: set())
    monkeypatch.setattr(linear_kernels, "padded_shapes", lambda config, formats: {})
    monkeypatch.setattr(linear_kernels, "_tune", fake_tune)
    precompiled = []

    class FakePrecompiler(linear_kernels.Precompiler):
        def __call__(self, jobs):  # every job: (fmt, bucket, n, k, its candidates), all of one weight shape
            assert all(cands for *_, cands in jobs) and len({(fmt, n, k) for fmt, _, n, k, _ in jobs}) == 1
            # a shape is compiled before any of its buckets is timed
            assert not {(fmt, n, k, bucket) for fmt, bucket, n, k, _ in jobs} & set(timed)
            precompiled.extend((fmt, n, k, bucket) for fmt, bucket, n, k, _ in jobs)

    monkeypatch.setattr(linear_kernels, "Precompiler", FakePrecompiler)
    timed.precompiled = precompiled
    monkeypatch.setattr(linear_kernels, "compile_kernels", lambda specs: specs)
    monkeypatch.setattr(linear_kernels.torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(multi_processor_count=132))
    return timed


def plan(cache, config=None):
    return linear_kernels.linear_kernel_list(config, {}, tune=True, cache=cache)[1]


def configs(p):
    return {(key, b): item["config"] for key, entry in p.items() for b, item in entry.items()}


def test_a_second_build_times_nothing_and_gets_the_same_plan(no_gpu_work, tmp_path):
    path = tmp_path / "cache.json"
    first = TuningCache(path, "NVIDIA H200", "3.6.0")
    p1 = plan(first)
    assert len(no_gpu_work) == len(SHAPES) * len(BUCKETS) and first.misses == len(no_gpu_work) and first.hits == 0
    assert no_gpu_work.precompiled == no_gpu_work  # everything timed was compiled in parallel first
    no_gpu_work.clear()
    no_gpu_work.precompiled.clear()
    again = TuningCache(path, "NVIDIA H200", "3.6.0")
    p2 = plan(again)
    assert no_gpu_work == [] and no_gpu_work.precompiled == []
    assert again.hits == len(SHAPES) * len(BUCKETS) and again.misses == 0
    assert configs(p2) == configs(p1)
    # the cached choice is the timed one, not the heuristic's first candidate
    heuristic = configs(linear_kernels.linear_kernel_list(None, {}, tune=False)[1])
    assert configs(p2) != heuristic


def test_only_missing_entries_are_timed_and_added(no_gpu_work, tmp_path):
    path = tmp_path / "cache.json"
    plan(TuningCache(path, "NVIDIA H200", "3.6.0"))
    data = json.loads(path.read_text())
    dropped = next(k for k in data["entries"] if "|nvfp4:256x128|M8" in k)
    del data["entries"][dropped]
    path.write_text(json.dumps(data))
    no_gpu_work.clear()
    cache = TuningCache(path, "NVIDIA H200", "3.6.0")
    plan(cache)
    assert no_gpu_work == [("nvfp4", 256, 128, 8)] and cache.misses == 1
    assert no_gpu_work.precompiled[-1:] == no_gpu_work
    assert dropped in json.loads(path.read_text())["entries"]


@pytest.mark.parametrize("device, triton", [("NVIDIA H100 80GB HBM3", "3.6.0"), ("NVIDIA H200", "3.7.0")])
def test_entries_of_another_gpu_or_triton_are_not_used(no_gpu_work, tmp_path, device, triton):
    path = tmp_path / "cache.json"
    plan(TuningCache(path, "NVIDIA H200", "3.6.0"))
    no_gpu_work.clear()
    other = TuningCache(path, device, triton)
    plan(other)
    assert other.hits == 0 and len(no_gpu_work) == len(SHAPES) * len(BUCKETS)
    # both sets are kept
    assert len(json.loads(path.read_text())["entries"]) == 2 * len(SHAPES) * len(BUCKETS)


def test_the_key_names_the_kernel_code_and_the_candidates():
    cache = TuningCache(None, "NVIDIA H200", "3.6.0")
    cands = [{"BLOCK_N": 64}, {"BLOCK_N": 128}]
    key = cache.key("nvfp4", 1, 256, 128, cands, "silu")
    assert kernel_digest() in key and len(kernel_digest()) == 16
    # another list, order or epilogue is another key
    assert len({key, cache.key("nvfp4", 1, 256, 128, cands[:1], "silu"), cache.key("nvfp4", 1, 256, 128, cands[::-1],
                                                                                "silu"),
                cache.key("nvfp4", 1, 256, 128, cands, None)}) == 4
    cache.put("nvfp4", 1, 256, 128, cands, "silu", {"BLOCK_N": 64})  # no path: nothing is written
    assert cache.get("nvfp4", 1, 256, 128, cands, "silu") == {"BLOCK_N": 64}
    assert cache.get("nvfp4", 1, 256, 128, cands, None) is None and (cache.hits, cache.misses) == (1, 1)


def digest_of(tree=None) -> str:
    """kernel_digest() in a fresh process with Triton's interpreter off (it changes constexprs such as _PTX, as on
    the GPU builds), of a copy of plugins_trt imported from `tree` ahead of the installed package (None: this one)."""
    code = "from atlas.build_engine.tuning_cache import kernel_digest; print(kernel_digest())"
    path = os.pathsep.join([str(tree)] * (tree is not None) + [os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_the_kernel_digest_follows_device_code_not_host_code_or_lines(tmp_path):
    """An edit to a kernel, to a JIT helper it calls from another package or to a constexpr it reads changes the
    digest; an edit to host code (which also moves every kernel below it) does not: a launcher or buffer edit keeps
    the cache's entries."""
    import atlas.plugins_trt as plugins

    tree = tmp_path / "tree"
    shutil.copytree(Path(plugins.__path__[0]), tree / "atlas" / "plugins_trt",
                    ignore=shutil.ignore_patterns("__pycache__"))
    before = digest_of()
    assert digest_of(tree) == before and len(before) == 16

    def edit(rel, old, new):
        path = tree / "atlas" / "plugins_trt" / rel
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new, 1))

    edit("quant_linear/gluon_gemm.py", "\nfrom atlas.plugins_trt.buffers import grown\n",
         "\nfrom atlas.plugins_trt.buffers import grown\n\n\ndef host_helper():\n    return 1\n")
    edit("quant_linear/triton_gemv.py", '"""', '"""A longer docstring.\n\n')
    assert digest_of(tree) == before
    for rel, old, new in [
            ("rms_norm/triton_norm.py", "    tl.store(residual_out, h, mask=mask)\n",
             "    tl.store(residual_out, h, mask=mask)\n    h = h + 0.0\n"),
            ("quant_linear/triton_gemv.py", "_HI16 = tl.constexpr(", "_HI16 = tl.constexpr(1 + ")]:
        edit(rel, old, new)
        assert digest_of(tree) != before, rel
        edit(rel, new, old)


def test_a_changed_candidate_list_times_only_its_cases_again(no_gpu_work, tmp_path, monkeypatch):
    """An entry holds for the candidates it was chosen from: a build whose candidate list for one case differs
    (a config added to the search) times that case again and keeps the others."""
    path = tmp_path / "cache.json"
    plan(TuningCache(path, "NVIDIA H200", "3.6.0"))
    no_gpu_work.clear()
    gemv_candidates = linear_kernels.nvfp4_gemv_candidates

    def one_more(bucket, n, k, *rest):
        cands = gemv_candidates(bucket, n, k, *rest)
        return cands + [{**cands[0], "num_warps": 8}] if bucket == 4 else cands

    monkeypatch.setattr(linear_kernels, "nvfp4_gemv_candidates", one_more)
    cache = TuningCache(path, "NVIDIA H200", "3.6.0")
    plan(cache)
    assert no_gpu_work == [("nvfp4", 256, 128, 4)] and cache.misses == 1
    assert len(json.loads(path.read_text())["entries"]) == len(SHAPES) * len(BUCKETS) + 1


@pytest.mark.parametrize("text", ["{not json", '{"format": "other", "version": 1, "entries": {}}',
                                  '{"format": "atlas-tuning-cache", "version": 1}'])
def test_an_unreadable_cache_is_a_build_error_that_says_what_to_do(tmp_path, text):
    path = tmp_path / "cache.json"
    path.write_text(text)
    with pytest.raises(BuildError, match="delete it or pass another path"):
        TuningCache(path, "NVIDIA H200", "3.6.0")


def test_a_stopped_search_keeps_what_it_timed(no_gpu_work, tmp_path, monkeypatch):
    """The search times one weight shape after another and writes each choice at once: a build stopped in the
    second shape (a device call's time limit) leaves the first shape's choices for the next build."""
    def stopped(fmt, bucket, n, k, candidates, then=None):
        if fmt == "nvfp4":
            raise KeyboardInterrupt
        no_gpu_work.append((fmt, n, k, bucket))
        return candidates[-1]

    monkeypatch.setattr(linear_kernels, "_tune", stopped)
    path = tmp_path / "cache.json"
    with pytest.raises(KeyboardInterrupt):
        plan(TuningCache(path, "NVIDIA H200", "3.6.0"))
    kept = json.loads(path.read_text())["entries"]
    assert len(kept) == len(BUCKETS) and all("|fp8:128x256|" in key for key in kept)
    no_gpu_work.clear()
    monkeypatch.setattr(linear_kernels, "_tune", lambda fmt, bucket, n, k, c, then=None: no_gpu_work.append(bucket) or c[-1])
    cache = TuningCache(path, "NVIDIA H200", "3.6.0")
    plan(cache)
    assert cache.hits == len(BUCKETS) and cache.misses == len(BUCKETS) == len(no_gpu_work)


def test_precompile_workers_fit_the_gpu_memory(monkeypatch):
    """Each precompile worker builds a weight's inputs on the GPU: as many run at once as fit the free memory."""
    gib = 1 << 30
    pre = linear_kernels.Precompiler(workers=16)
    jobs = lambda n, k: [("nvfp4", 1, n, k, [{}]), ("nvfp4", 8, n, k, [{}])]  # noqa: E731
    monkeypatch.setattr(linear_kernels.torch.cuda, "mem_get_info", lambda: (75 * gib, 80 * gib))
    assert pre.workers_that_fit(jobs(6144, 4096)) == 16  # 0.15 GB of inputs a worker
    assert pre.workers_that_fit(jobs(248320, 5120)) == 7  # the 27B LM head: 8.1 GB a worker
    monkeypatch.setattr(linear_kernels.torch.cuda, "mem_get_info", lambda: (2 * gib, 80 * gib))
    assert pre.workers_that_fit(jobs(248320, 5120)) == 0


def test_gemv_buckets_are_timed_with_what_follows_them(no_gpu_work, tmp_path, monkeypatch):
    """A gate_up projection's GEMV buckets are timed as the runtime runs them, SiLU-mul included, and a residual
    projection's with the decoder's add + RMSNorm (fused into the split-K reduction, or after): their GEMM buckets
    are timed alone."""
    monkeypatch.setattr(linear_kernels, "gate_up_shapes", lambda config, formats: {SHAPES[1]})
    monkeypatch.setattr(linear_kernels, "residual_shapes", lambda config, formats: {SHAPES[0]})
    plan(TuningCache(tmp_path / "cache.json", "NVIDIA H200", "3.6.0"), types.SimpleNamespace(norm_offset=0.0))
    assert sorted(no_gpu_work.followed) == sorted([("norm", *SHAPES[0], b) for b in linear_kernels.GEMV_BUCKETS]
                                                  + [("silu", *SHAPES[1], b) for b in linear_kernels.GEMV_BUCKETS])


def test_a_padded_shape_is_timed_and_cached_at_its_kernels_n(no_gpu_work, monkeypatch, tmp_path):
    """A linear run padded to whole tiles (linear_kernels.padded_shapes) is timed, cached and compiled at the padded
    N once, even where two shapes pad to it; each shape's plan entry (under its own N) says pad_n."""
    monkeypatch.setattr(linear_kernels, "linear_shapes",
                        lambda config, formats: [*SHAPES, ("nvfp4", 200, 128), ("nvfp4", 240, 128)])
    monkeypatch.setattr(linear_kernels, "padded_shapes",
                        lambda config, formats: {("nvfp4", 200, 128): 256, ("nvfp4", 240, 128): 256})
    cache = TuningCache(tmp_path / "cache.json", "NVIDIA H200", "3.6.0")
    p = plan(cache)
    assert sorted(set(no_gpu_work)) == sorted(no_gpu_work) and {(f, n, k) for f, n, k, _ in no_gpu_work} == set(SHAPES)
    assert cache.misses == len(SHAPES) * len(BUCKETS)
    for n in (200, 240):
        entry = p[f"nvfp4:{n}x128"]
        assert all(item["pad_n"] == 256 for item in entry.values())
        assert configs({"x": entry}) == configs({"x": p["nvfp4:256x128"]})
        assert all(item["kernel"] == p["nvfp4:256x128"][b]["kernel"] for b, item in entry.items())
    assert not any("pad_n" in item for item in p["nvfp4:256x128"].values())


def test_the_search_times_over_weight_copies_beyond_l2():
    """_tune's chain reads each launch's weights from device memory: enough fresh copies that together they pass
    four times the L2 (tools/bench/timing.copies_for, at most 64), each equal to the original and in its own
    storage."""
    import dataclasses

    from atlas.build_engine.quantize.quantizer import quantize
    from atlas.tools.bench.timing import L2_BYTES

    qt = quantize(torch.randn(256, 512) * 0.02, "nvfp4")
    copies = linear_kernels._weight_copies(qt)
    assert copies[0] is qt and len(copies) == 64  # a small weight: the most copies
    for c in copies[1:]:
        assert torch.equal(c.weight, qt.weight) and c.weight.data_ptr() != qt.weight.data_ptr()
        assert torch.equal(c.weight_scale, qt.weight_scale) and torch.equal(c.weight_scale_2, qt.weight_scale_2)
    n, k = 2048, 16384  # about 19 MB of NVFP4 weight and scales: 14 copies pass 4x the L2, 13 do not
    big = dataclasses.replace(qt, weight=torch.zeros(n, k // 2, dtype=torch.uint8),
                              weight_scale=torch.zeros(n, k // 16, dtype=qt.weight_scale.dtype),
                              weight_scale_2=torch.ones(n))
    nbytes = n * k // 2 + n * k // 16 + n * 4
    copies = linear_kernels._weight_copies(big)
    assert len(copies) * nbytes >= 4 * L2_BYTES > (len(copies) - 1) * nbytes and len(copies) == 14


def test_the_search_skips_a_candidate_wrong_on_its_second_launch(monkeypatch):
    """_tune checks each candidate on two launches before timing it: one that leaves state behind (a counter not
    reset: the fused-norm WK GEMV's) and so computes wrong the second time is skipped however fast it runs; a
    candidate wrong on its first launch or failing to run is skipped too."""
    from atlas.tools.bench import timing

    ref = torch.ones(2, 4)
    monkeypatch.setattr(linear_kernels, "_tuning_inputs", lambda *a, **k: (object(), None, ref))
    monkeypatch.setattr(linear_kernels, "_weight_copies", lambda qt: [qt])
    launches: dict[str, int] = {}

    def call(fmt, bucket, qt, x, cfg, then=None, norm=None):
        def run():
            launches[cfg["id"]] = launches.get(cfg["id"], 0) + 1
            if cfg["id"] == "fails":
                raise RuntimeError("out of resources")
            wrong = cfg["id"] == "wrong" or (cfg["id"] == "stale" and launches[cfg["id"]] > 1)
            return ref * 0 if wrong else ref
        run.cfg = cfg
        return run

    monkeypatch.setattr(linear_kernels, "_candidate_call", call)
    times = {"stale": 1.0, "wrong": 0.5, "fails": 0.1, "right": 2.0, "slow": 3.0}
    monkeypatch.setattr(timing, "graph_time", lambda calls, repeats=10: times[calls[0].cfg["id"]])
    cands = [{"id": i} for i in ("stale", "wrong", "fails", "right", "slow")]
    assert linear_kernels._tune("nvfp4", 1, 4, 16, cands) == {"id": "right"}
    assert launches == {"stale": 2, "wrong": 2, "fails": 1, "right": 2, "slow": 2}
