"""Decode benchmark on the GPU box: Atlas engines of real-shape synthetic checkpoints beside Hugging Face transformers
on the same weights, in the same run (issue 6's figures; writes tools/results/decode.json).

    python -m atlas.tools.bench_decode --out $OUT/decode.json [--cases llama-3.1-8b:bfloat16,...] [--work /tmp/atlas]
        [--part atlas|hf|both] [--merge tools/results/decode.json]   # one device call a case or two, merged

For each case: build the engine from `synthetic:<preset>/cuda` (tensors drawn on the GPU on demand, no checkpoint
on disk),
run `atlas-run bench`'s measurement (runtime/bench.py: batch sizes, 512-token prompts, 256 generated tokens,
median of repeats, against the copy bandwidth measured in the run), delete the engine; then, once per preset, the
peer: transformers' model in bfloat16 with the same tensors (SyntheticCheckpoint of the same seed; the hybrid's
Gated DeltaNet layers through flash-linear-attention when it is importable, as the results record), greedy
`generate` at batch 1 with the same prompt and generated lengths.
"""

from __future__ import annotations

import gc
import json
import logging
import shutil
import statistics
import time
from pathlib import Path

import click
import torch

from atlas.build_engine.cli import pdl_order
from atlas.plugins_trt.attention.splits import ATTN_SPLIT_TOKENS
from atlas.plugins_trt.pdl_order import WAIT_FIRST
from atlas.runtime.kernels import SHARED_PREFERENCE

CASES = ("llama-3.1-8b:bfloat16", "llama-3.1-8b:fp8", "llama-3.1-8b:nvfp4", "qwen3.5-27b:bfloat16",
         "qwen3.5-27b:nvfp4")
HYBRID = ("qwen3.5-27b",)
SUMMARY = {  # summary key -> (case, batch)
    "bf16_b1_floor_fraction": ("llama-3.1-8b:bfloat16", 1),
    "nvfp4_b1_floor_fraction": ("llama-3.1-8b:nvfp4", 1),
    "hybrid_bf16_b1_floor_fraction": ("qwen3.5-27b:bfloat16", 1),
    "hybrid_nvfp4_b1_floor_fraction": ("qwen3.5-27b:nvfp4", 1),
}


def case_name(case: str, pdl: bool | int, attn_split_tokens: int = ATTN_SPLIT_TOKENS) -> str:
    """How a case is recorded: an A/B run without the small kernels' programmatic dependent launch is
    '<case>+no-pdl', one with their launch-first order (plugins_trt/pdl.py LAUNCH_FIRST) '<case>+pdl-launch-first',
    one with another shortest attention split '<case>+split-<tokens>'; all kept beside the default one (WAIT_FIRST,
    ATTN_SPLIT_TOKENS) and out of the summary. (Before 2026-12-07's seventh session the default was launch-first, and
    results files of that time record it under the plain name, "pdl": true; before the tenth session the default split
was 256 tokens: entries of that time record "attn_split_tokens": 256 or, older still, nothing.)"""
    if pdl is False:
        case = f"{case}+no-pdl"
    elif pdl != WAIT_FIRST:
        case = f"{case}+pdl-launch-first"
    return case if attn_split_tokens == ATTN_SPLIT_TOKENS else f"{case}+split-{attn_split_tokens}"


def engine_dir(work: Path, case: str) -> Path:
    """Where atlas_case builds a case's engine (deleted after, unless kept for reload_case)."""
    return work / case.replace(":", "-")


def step_profiles(runner, batches: tuple[int, ...], batch_sizes: list[int], prompt_len: int) -> dict:
    """runtime/bench.kernel_profile of the decode step at each of `batches` the run has (batch 1 always), as
    "profile" (batch 1) and "profile_b<batch>"."""
    from atlas.runtime.bench import kernel_profile

    return {"profile" if b == 1 else f"profile_b{b}": kernel_profile(runner, b, prompt_len)
            for b in batches if b == 1 or b in batch_sizes}


def reload_case(path: Path, switch, batch_sizes: list[int], prompt_len: int, gen_len: int, repeats: int,
                eager_prefill: bool = False) -> dict:
    """The built engine loaded again inside `switch`, a runtime knob's context manager (runtime/kernels
    shared_preference(mode): another shared-memory carveout preference, "none" as engines were loaded before
    2026-12-08; runtime/cuda_ops.deferred_norm(enabled): the norms deferred into the next projections or not): bench's
    figures and the decode-step profiles at batch 1 and 32, for the A/B against the case's default in the same run."""
    from atlas.runtime.bench import bench
    from atlas.runtime.cuda_engine import load_cuda_engine
    from atlas.runtime.model_runner import ModelRunner

    runner = None
    try:
        with switch:  # the kernel tables and the ops are made here (their functions load on first launch)
            runner = ModelRunner(load_cuda_engine(path, verify_checksums=False))
        runner.capture(prefill=not eager_prefill)
        return {**bench(runner, batch_sizes, prompt_len, gen_len, repeats),
                **step_profiles(runner, (1, 32), batch_sizes, prompt_len)}
    finally:
        runner = None
        gc.collect()
        torch.cuda.empty_cache()


def atlas_case(case: str, work: Path, batch_sizes: list[int], prompt_len: int, gen_len: int, repeats: int,
               tuning_cache: Path | None = None, pdl: bool | int = WAIT_FIRST,
               attn_split_tokens: int = ATTN_SPLIT_TOKENS, keep_engine: bool = False,
               eager_prefill: bool = False) -> dict:
    from atlas.build_engine.builder import BuildConfig, build
    from atlas.runtime.bench import bench, prefill_profile, profile_text
    from atlas.runtime.cuda_engine import load_cuda_engine
    from atlas.runtime.model_runner import ModelRunner

    preset, dtype = case.split(":")
    out = engine_dir(work, case)
    t0 = time.perf_counter()
    built = build(BuildConfig(f"synthetic:{preset}/cuda", out, dtype=dtype, device="cuda", onnx=False,
                              overwrite=True, max_seq_len=prompt_len + gen_len + 64, max_batch=max(batch_sizes),
                              tuning_cache=tuning_cache, pdl=pdl, attn_split_tokens=attn_split_tokens,
                              progress=False))
    # the kernel configuration each quantized linear got a bucket (what the figures below ran)
    plan = {key: {b: item["config"] for b, item in entry.items()}
            for key, entry in built.manifest.get("linear_kernels", {}).items()}
    build_s = time.perf_counter() - t0
    click.echo(f"{case}: built in {build_s:.0f} s", err=True)
    runner = None
    try:
        runner = ModelRunner(load_cuda_engine(out, verify_checksums=False))
        runner_defers = runner.ops.defer_norm  # runtime/cuda_ops.DEFER_NORM (--no-defer-norm)
        runner.capture(prefill=not eager_prefill)  # eager_prefill: atlas-run bench's --eager-prefill
        click.echo(f"{case}: loaded and captured in {time.perf_counter() - t0 - build_s:.0f} s", err=True)
        result = bench(runner, batch_sizes, prompt_len, gen_len, repeats)
        # where a step's time goes, at batch 1, at 8 (where the quantized engines fall off: 8B nvfp4 0.58 of its
        # floor at batch 1, 0.39 at 8 on the H100) and at 32 (where the 8B nvfp4 step, 8.48 ms, was slower than
        # bf16's, 7.53)
        result.update(step_profiles(runner, (1, 8, 32), batch_sizes, prompt_len))
        for key in ("profile", "profile_b8", "profile_b32"):
            if key in result:
                click.echo(profile_text(result[key]), err=True)
        # and the TTFT: a batch-1 prefill's spread (from the prefill graphs, and eager) and its kernels against its
        # wall time (eager, the GPU idled two thirds of an 8B 512-token prefill: decode_h100.json of 2026-12-07)
        result["prefill_profile"] = p = prefill_profile(runner, prompt_len)
        click.echo(f"{case}: prefill of {prompt_len} tokens, TTFT ms " + " ".join(f"{t:.1f}" for t in p["ttft_ms"])
                   + (" (eager: " + " ".join(f"{t:.1f}" for t in p["eager_ttft_ms"]) + ")"
                      if "eager_ttft_ms" in p else "")
                   + (f"; profiled: kernels {p['kernel_us'] / 1e3:.1f} ms of {p['step_us'] / 1e3:.1f} ms, GPU idle "
                      f"{p['idle_fraction']:.0%}; " + ", ".join(f"{k['name'][:40]} {k['us'] / 1e3:.2f} ms"
                                                              for k in p["kernels"][:6])
                      if "error" not in p else f"; {p['error']}"), err=True)
    finally:
        if not keep_engine:
            shutil.rmtree(out, ignore_errors=True)
        runner = None
        gc.collect()
        torch.cuda.empty_cache()
    return {"case": case_name(case, pdl, attn_split_tokens), "preset": preset, "dtype": dtype, "pdl": pdl,
            "attn_split_tokens": attn_split_tokens, "shared_preference": SHARED_PREFERENCE,
            "defer_norm": runner_defers, "prefill_graphs": not eager_prefill, "build_seconds": build_s,
            "tuning_cache": built.manifest["target"].get("tuning_cache"), "linear_plan": plan, **result}


def hf_model(preset: str, device: str = "cuda"):
    """transformers' model for the preset in bfloat16 on `device`, with the synthetic checkpoint's tensors."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from atlas.tools.synthetic import SyntheticCheckpoint

    # drawn where the engine's were (bench: the GPU; the CPU test: the CPU)
    ckpt = SyntheticCheckpoint(f"{preset}/{torch.device(device).type}", device=device)
    # the text model alone (a vision-language preset's tower is not what either side runs)
    config = AutoConfig.for_model(**ckpt.config).get_text_config()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    names = set(ckpt.tensor_names())

    def source(name: str) -> str | None:  # a VL checkpoint keeps the text model under model.language_model.
        for cand in (name, name.replace("model.", "model.language_model.", 1)):
            if cand in names:
                return cand
        return None

    params = dict(model.named_parameters())
    missing = sorted(n for n in params if source(n) is None)
    if missing:
        raise RuntimeError(f"transformers' model has parameters the synthetic checkpoint lacks: {missing[:5]}")
    with torch.no_grad():
        for name, param in params.items():  # one tensor at a time: the 27B model fits once, not twice
            param.copy_(ckpt.get(source(name)))
    return model.eval()


def hf_case(preset: str, prompt_len: int, gen_len: int, repeats: int) -> dict:
    """Greedy generation at batch 1: TTFT (one new token) and decode tok/s (the rest), medians over repeats."""
    model = hf_model(preset)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.get_text_config().vocab_size, (1, prompt_len), generator=g).cuda()
    kwargs = dict(do_sample=False, min_new_tokens=gen_len, max_new_tokens=gen_len, pad_token_id=0)
    model.generate(ids, **{**kwargs, "min_new_tokens": 4, "max_new_tokens": 4})  # warm-up
    ttfts, tpots = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, **{**kwargs, "min_new_tokens": 1, "max_new_tokens": 1})
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        model.generate(ids, **kwargs)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        ttfts.append(t1 - t0)
        tpots.append((t2 - t1 - (t1 - t0)) / (gen_len - 1))
    fla = _fla_version() if preset in HYBRID else None
    del model
    gc.collect()
    torch.cuda.empty_cache()
    tpot = statistics.median(tpots)
    return {"preset": preset, "batch": 1, "ttft_s": statistics.median(ttfts), "tpot_s": tpot,
            "tokens_per_s": 1 / tpot, "flash_linear_attention": fla}


def _fla_version() -> str | None:
    try:
        import fla
    except ImportError:
        return None
    return getattr(fla, "__version__", "?")


def summarize(atlas: list[dict], hf: dict[str, dict]) -> dict:
    """The issue's summary keys (absent where their case did not run) and the smallest speedup over transformers."""
    def case(name: str, batch: int):
        for r in atlas:
            for c in r["cases"]:
                if r["case"] == name and c["batch"] == batch:
                    return c
        return None

    out = {}
    for key, (name, batch) in SUMMARY.items():
        c = case(name, batch)
        if c is not None:
            out[key] = c["floor_fraction"]
    speedups = {r["case"]: case(r["case"], 1)["tokens_per_s"] / hf[r["preset"]]["tokens_per_s"]
                for r in atlas if r["preset"] in hf and case(r["case"], 1) and "+" not in r["case"]}
    if speedups:
        out["min_speedup_vs_hf"] = min(speedups.values())
        out["speedup_vs_hf"] = speedups
    return out


@click.command()
@click.option("--out", "out_path", type=click.Path(path_type=Path), required=True)
@click.option("--cases", default=",".join(CASES), show_default=True, help="preset:dtype, comma-separated.")
@click.option("--batch-sizes", default="1,8,32", show_default=True)
@click.option("--prompt-len", type=int, default=512, show_default=True)
@click.option("--gen-len", type=int, default=256, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option("--work", type=click.Path(path_type=Path), default=Path("/tmp/atlas-bench"), show_default=True)
@click.option("--part", type=click.Choice(["both", "atlas", "hf"]), default="both", show_default=True,
              help="Run the Atlas engines, the transformers peers, or both (a 27B case takes most of a device call).")
@click.option("--tuning-cache", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="atlas-build's --tuning-cache: kernel configurations chosen by an earlier build on this GPU.")
@click.option("--pdl/--no-pdl", default=True, show_default=True,
              help="atlas-build's --pdl; a --no-pdl case is recorded as '<case>+no-pdl' beside the default one.")
@click.option("--pdl-launch-first", is_flag=True,
              help="atlas-build's --pdl-launch-first: recorded as '<case>+pdl-launch-first' beside the default one.")
@click.option("--attn-split-tokens", type=int, default=ATTN_SPLIT_TOKENS, show_default=True,
              help="atlas-build's --attn-split-tokens: another value is recorded as '<case>+split-<tokens>'.")
@click.option("--carveout-ab", default="", show_default=True,
              help="Comma-separated shared-memory preferences (none, all; runtime/kernels.SHARED_PREFERENCE) to load "
                   "each built engine with again after its default run: recorded under the case's 'carveout_ab'.")
@click.option("--defer-norm/--no-defer-norm", default=False, show_default=True,
              help="Whether the runs leave each residual projection's RMSNorm to the next projection where both have "
                   "the forms (runtime/cuda_ops.DEFER_NORM, recorded as each case's 'defer_norm').")
@click.option("--defer-ab", is_flag=True,
              help="Load each built engine again with the other --defer-norm setting after its default run (runtime/"
                   "cuda_ops.deferred_norm: the norms deferred into the next projections, or the fused-norm WK GEMVs): "
                   "recorded under the case's 'defer_ab' as 'on' or 'off'.")
@click.option("--eager-prefill", is_flag=True,
              help="atlas-run bench's --eager-prefill: prefill chunks without CUDA graphs (recorded: prefill_graphs).")
@click.option("--merge", "merge_path", type=click.Path(path_type=Path), default=None,
              help="An earlier results file (same device, lengths and repeats) to add this run's cases to.")
def main(out_path, cases, batch_sizes, prompt_len, gen_len, repeats, work, part, tuning_cache, pdl, pdl_launch_first,
         attn_split_tokens, carveout_ab, defer_norm, defer_ab, eager_prefill, merge_path):
    from atlas.tools.bench.timing import device_info

    pdl = pdl_order(pdl, pdl_launch_first)
    from atlas.runtime import cuda_ops, kernels

    cuda_ops.DEFER_NORM = defer_norm
    modes = tuple(m.strip() for m in carveout_ab.split(",") if m.strip())
    if set(modes) - {"none", "all", "large"}:
        raise click.ClickException(f"--carveout-ab takes none, all or large, got {carveout_ab!r}")
    # (result key, label, the knob's context manager) of each reload after a case's default run
    reloads = [("carveout_ab", mode, lambda mode=mode: kernels.shared_preference(mode)) for mode in modes]
    reloads += [("defer_ab", "off" if defer_norm else "on", lambda: cuda_ops.deferred_norm(not defer_norm))] * defer_ab

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    sizes = [int(b) for b in batch_sizes.split(",")]
    names = [c.strip() for c in cases.split(",") if c.strip()]
    result = {**device_info(), "prompt_len": prompt_len, "gen_len": gen_len, "repeats": repeats,
              "atlas": [], "hf": {}}
    if merge_path is not None and merge_path.is_file():
        earlier = json.loads(merge_path.read_text())
        for key in ("device", "prompt_len", "gen_len", "repeats"):
            if earlier.get(key) != result[key]:
                raise click.ClickException(f"{merge_path} has {key} {earlier.get(key)!r}, this run {result[key]!r}: "
                                           f"results of different runs cannot be merged")
        ran = {case_name(n, pdl, attn_split_tokens) for n in names}
        result["atlas"] = [r for r in earlier["atlas"] if r["case"] not in ran or part == "hf"]
        result["hf"] = dict(earlier["hf"])
    for name in names:  # written after every case: a later failure keeps what ran
        if part in ("both", "atlas"):
            result["atlas"].append(atlas_case(name, work, sizes, prompt_len, gen_len, repeats, tuning_cache,
                                              pdl, attn_split_tokens, keep_engine=bool(reloads),
                                              eager_prefill=eager_prefill))
            click.echo(f"{result['atlas'][-1]['case']}: " + ", ".join(f"B{c['batch']} {c['tokens_per_s']:.1f} tok/s ({c['floor_fraction']:.1%}"
                                               f" of floor)" for c in result["atlas"][-1]["cases"]))
            result["summary"] = summarize(result["atlas"], result["hf"])
            out_path.write_text(json.dumps(result, indent=2) + "\n")  # kept if the peer runs out of time
            try:  # the same engine again under each other runtime knob, written after each
                for key, label, switch in reloads:
                    ab = reload_case(engine_dir(work, name), switch(), sizes, prompt_len, gen_len, repeats,
                                     eager_prefill)
                    result["atlas"][-1].setdefault(key, {})[label] = ab
                    click.echo(f"{name} {key} {label!r}: " + ", ".join(
                        f"B{c['batch']} {c['tokens_per_s']:.1f} tok/s" for c in ab["cases"]))
                    out_path.write_text(json.dumps(result, indent=2) + "\n")
            finally:
                shutil.rmtree(engine_dir(work, name), ignore_errors=True)
        preset = name.split(":")[0]
        if part in ("both", "hf") and preset not in result["hf"]:
            result["hf"][preset] = hf_case(preset, prompt_len, gen_len, repeats)
            click.echo(f"transformers {preset}: {result['hf'][preset]['tokens_per_s']:.1f} tok/s")
        result["summary"] = summarize(result["atlas"], result["hf"])
        out_path.write_text(json.dumps(result, indent=2) + "\n")
    click.echo(json.dumps(result.get("summary", {}), indent=2))


if __name__ == "__main__":
    main()
