"""atlas-build: turn a checkpoint into an engine directory."""

from __future__ import annotations

from pathlib import Path

import click

from atlas.build_engine.errors import BuildError
from atlas.plugins_trt.attention.splits import ATTN_SPLIT_TOKENS
from atlas.plugins_trt.pdl_order import LAUNCH_FIRST, WAIT_FIRST


def pdl_order(pdl: bool, launch_first: bool) -> bool | int:
    """RunnerOptions.pdl from --pdl/--no-pdl and --pdl-launch-first (plugins_trt/pdl.py: WAIT_FIRST by default,
    True for the launch-first order, False for plain launches)."""
    if launch_first:
        if not pdl:
            raise click.UsageError("--pdl-launch-first is an order of programmatic dependent launch: not with --no-pdl")
        return LAUNCH_FIRST
    return WAIT_FIRST if pdl else False

EXAMPLES = """
Examples:

  atlas-build -o engines/smollm2                      # the embedded default model (SmolLM2-135M-Instruct)

  atlas-build ./Llama-3.2-1B -o engines/llama --dtype bfloat16 --max-seq-len 4096

  atlas-build model.Q4_1.gguf -o engines/gguf-model

  atlas-build -o engines/smollm2-nvfp4 --dtype nvfp4 --class-dtype lm_head=bfloat16

  atlas-build synthetic:tiny-qwen3.5 -o engines/tiny   # seeded random weights, no files needed
"""


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


@click.command(epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("checkpoint", required=False)
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Engine directory to write (default: engines/<checkpoint name>).")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "fp8", "fp8_block", "nvfp4"]),
              default="auto", show_default=True,
              help="Format of the linear weights: float32, bfloat16, fp8 (E4M3, per-channel scales), fp8_block "
                   "(E4M3, 128x128 block scales) or nvfp4 (E2M1 + E4M3 scale per 16 + FP32 global). auto = float32 for "
                   "the CPU target, bfloat16 for cuda, or the checkpoint's own format when it is pre-quantized.")
@click.option("--class-dtype", "class_dtypes", multiple=True, metavar="CLASS=FORMAT",
              help="Override the format of one class of weights: embed, attn, gdn, mlp, lm_head, mtp "
                   "(e.g. --class-dtype lm_head=bfloat16). Repeatable.")
@click.option("--max-seq-len", type=int, default=None,
              help="Longest sequence (prompt + generated) the engine serves [default: min(model limit, 8192)].")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Target: cpu (the reference runtime) or cuda (Hopper, sm_90): compiles the engine's GPU "
                   "kernels into kernels/, autotuned when run on the GPU, heuristic configs otherwise.")
@click.option("--kv-cache-dtype", type=click.Choice(["bfloat16", "fp8"]), default="bfloat16", show_default=True,
              help="--device cuda: format of the paged KV cache (fp8: E4M3 with one scale per tensor).")
@click.option("--max-batch", type=int, default=32, show_default=True,
              help="--device cuda: most sequences in one decode step (the largest CUDA graph batch bucket).")
@click.option("--autotune/--no-autotune", default=True, show_default=True,
              help="--device cuda: time candidate kernel configurations on this machine's GPU.")
@click.option("--pdl/--no-pdl", default=True, show_default=True,
              help="--device cuda: compile the decode step's small kernels for programmatic dependent launch (each "
                   "launch overlaps the kernel before it).")
@click.option("--pdl-launch-first", is_flag=True,
              help="--device cuda: the small kernels let the next one launch, then wait for the kernel before them "
                   "(the default waits first; plugins_trt/pdl.py). An A/B option.")
@click.option("--attn-split-tokens", type=int, default=ATTN_SPLIT_TOKENS, show_default=True,
              help="--device cuda: the decode attention's shortest split of the context, in tokens of "
                   "--max-seq-len (fewer: more programs a sequence, fewer key tiles each).")
@click.option("--tuning-cache", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="--device cuda: reuse the kernel configurations in this JSON file and add the ones this build "
                   "times (entries are per GPU, Triton version and kernel source).")
@click.option("--onnx/--no-onnx", default=True, show_default=True,
              help="Export one ONNX graph per layer type into onnx/ (for atlas-compare --reference onnx).")
@click.option("--overwrite", is_flag=True, help="Replace an existing engine in the output directory.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def main(checkpoint, output, dtype, class_dtypes, max_seq_len, device, kv_cache_dtype, max_batch, autotune,
         pdl, pdl_launch_first, attn_split_tokens, tuning_cache, onnx, overwrite, quiet):
    """Build an Atlas engine from CHECKPOINT: a Hugging Face directory, a .gguf file, synthetic:<preset>,
    or a built-in model name. Without CHECKPOINT, the embedded default model is built."""
    from atlas.build_engine.builder import BuildConfig, build
    from atlas.build_engine.checkpoints.builtin import DEFAULT_MODEL
    from atlas.build_engine.precision import parse_class_dtypes

    pdl = pdl_order(pdl, pdl_launch_first)
    name = Path(checkpoint or DEFAULT_MODEL).name.removesuffix(".gguf").replace("synthetic:", "synthetic-")
    output = output or Path("engines") / name
    try:
        result = build(BuildConfig(checkpoint, output, dtype=dtype, class_dtypes=parse_class_dtypes(class_dtypes),
                                   max_seq_len=max_seq_len, device=device, kv_cache_dtype=kv_cache_dtype,
                                   max_batch=max_batch, autotune=autotune, pdl=pdl,
                                   attn_split_tokens=attn_split_tokens, tuning_cache=tuning_cache, onnx=onnx,
                                   overwrite=overwrite, progress=not quiet))
    except BuildError as e:
        raise click.ClickException(str(e)) from None
    m = result.manifest
    c = m["config"]
    total = sum(f["bytes"] for f in m["files"].values())
    kinds = ", ".join(f"{c['layer_types'].count(k)} {k}" for k in dict.fromkeys(c["layer_types"]))
    click.echo(
        f"\nBuilt engine {result.path} in {result.seconds:.1f} s\n"
        f"  model     {m['family']}: {c['num_layers']} layers ({kinds}), hidden {c['hidden_size']}, vocab {c['vocab_size']}"
        + (f", {c['mtp_num_layers']} MTP layer(s)" if c["mtp_num_layers"] else "") + "\n"
        f"  weights   {_formats(m)}, {_size(total)} on disk; max sequence {m['build']['max_seq_len']} tokens\n"
        f"  tokenizer {'yes' + (' (with chat template)' if _has_template(result.path) else '') if m['tokenizer'] else 'none'}"
    )
    if m.get("kernels"):
        tuned = "autotuned" if m["target"].get("autotuned") else "heuristic configs, not autotuned"
        if "tuning_cache" in m["target"]:
            tc = m["target"]["tuning_cache"]
            tuned += f"; {tc['hits']} configurations from the tuning cache, {tc['misses']} timed"
        click.echo(f"  kernels   {len(m['kernels']['kernels'])} for sm_{m['target']['arch']} ({tuned})")
    if m["onnx"]:
        click.echo(f"  onnx      {', '.join(m['onnx'])} (opset {next(iter(m['onnx'].values()))['opset']})")
    if result.unused_tensors:
        click.echo(f"  note      {len(result.unused_tensors)} checkpoint tensors are not used "
                   f"(e.g. {result.unused_tensors[0]})")
    if m["tokenizer"]:
        click.echo(f"\nNext: atlas-run generate {result.path} --prompt \"What is the capital of France?\"")
    else:
        click.echo(f"\nNext: atlas-run logits {result.path} --token-ids 1,2,3 --output logits.npy")


def _formats(manifest: dict) -> str:
    """'nvfp4 (lm_head bfloat16)' style summary of the weight formats."""
    dtype = manifest["build"]["dtype"]
    overrides = manifest["build"].get("class_dtypes") or {}
    return dtype + (f" ({', '.join(f'{k} {v}' for k, v in overrides.items())})" if overrides else "")


def _has_template(path: Path) -> bool:
    import json

    cfg = path / "tokenizer_config.json"
    return (cfg.is_file() and bool(json.loads(cfg.read_text()).get("chat_template"))) or (path / "chat_template.jinja").is_file()


if __name__ == "__main__":
    main()
