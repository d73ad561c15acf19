"""atlas-run: load an engine and generate (or dump logits). Compiles nothing."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click
import numpy as np

from atlas.runtime.errors import AtlasError

GENERATE_EXAMPLES = """
Examples:

  atlas-run generate engines/smollm2-135m-instruct --prompt "What is the capital of France?"

  atlas-run generate engines/smollm2-135m-instruct --prompt "Once upon a time" --no-chat \\
      --temperature 0.8 --top-p 0.95 --seed 1 --max-tokens 64
"""

LOGITS_EXAMPLES = """
Example:

  atlas-run logits engines/smollm2-135m-instruct --token-ids 1,2,3 --output logits.npy
"""


def _load(engine_dir: Path, verify: bool, prefill_graphs: bool = True):
    from atlas.runtime.generator import Generator

    return Generator.load(engine_dir, verify_checksums=verify, prefill_graphs=prefill_graphs)


EAGER_PREFILL_HELP = ("GPU engines: run prefill chunks eagerly instead of replaying CUDA graphs (less start-up time "
                      "and graph memory, a longer time to first token). Decode steps are always graphs.")


def _fail(e: Exception):
    raise click.ClickException(str(e)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Run an Atlas engine built by atlas-build."""


@main.command(epilog=GENERATE_EXAMPLES)
@click.argument("engine_dir", type=click.Path(path_type=Path))
@click.option("--prompt", required=True, help="The prompt (a user message when --chat is on).")
@click.option("--max-tokens", type=int, default=256, show_default=True, help="Most tokens to generate.")
@click.option("--temperature", type=float, default=None,
              help="Sampling temperature; 0 is greedy [default: the engine's generation default, else 0].")
@click.option("--top-p", type=float, default=None, help="Nucleus sampling mass in (0, 1] [default: 1].")
@click.option("--top-k", type=int, default=None, help="Sample among the K most likely tokens; 0 = all [default: 0].")
@click.option("--seed", type=int, default=None, help="Random seed for sampling (reproducible output).")
@click.option("--chat/--no-chat", default=None,
              help="Format the prompt with the engine's chat template [default: on when the engine has one].")
@click.option("--system", default=None, help="System message for --chat.")
@click.option("--no-verify", is_flag=True, help="Skip the SHA-256 check of the engine's files at load.")
@click.option("--eager-prefill", is_flag=True, help=EAGER_PREFILL_HELP)
def generate(engine_dir, prompt, max_tokens, temperature, top_p, top_k, seed, chat, system, no_verify, eager_prefill):
    """Generate text from a prompt, streaming it to stdout; tokens/s goes to stderr."""
    from atlas.runtime.generator import SamplingParams

    try:
        # Check what the user typed before spending time on loading the engine.
        SamplingParams(max_tokens=max_tokens, temperature=temperature or 0.0,
                       top_p=1.0 if top_p is None else top_p, top_k=top_k or 0, seed=seed)
        gen = _load(engine_dir, not no_verify, prefill_graphs=not eager_prefill)
        defaults = gen.engine.generation_defaults
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=defaults.get("temperature", 0.0) if temperature is None else temperature,
            top_p=defaults.get("top_p", 1.0) if top_p is None else top_p,
            top_k=defaults.get("top_k", 0) if top_k is None else top_k,
            seed=seed,
        )
        if gen.tokenizer is None:
            from atlas.runtime.errors import EngineError

            raise EngineError(f"engine {engine_dir} has no tokenizer; use atlas-run logits with --token-ids.")
        use_chat = gen.tokenizer.chat_template is not None if chat is None else chat
        if use_chat:
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
            ids = gen.tokenizer.encode_chat(messages)
        else:
            ids = gen.tokenizer.encode(prompt)
        stream = gen.tokenizer.stream()
        t0 = time.perf_counter()
        first = None
        n = 0
        for token in gen.generate(ids, params):
            if first is None:
                first = time.perf_counter()
            n += 1
            sys.stdout.write(stream.push(token))
            sys.stdout.flush()
        end = time.perf_counter()
    except AtlasError as e:
        _fail(e)
    sys.stdout.write("\n")
    decode = f", {(n - 1) / (end - first):.1f} tok/s decode" if n > 1 else ""
    click.echo(f"[{len(ids)} prompt tokens, {n} generated in {end - t0:.2f} s: {n / (end - t0):.1f} tok/s overall"
               f"{decode}; time to first token {((first or end) - t0) * 1000:.0f} ms]", err=True)


@main.command(epilog=LOGITS_EXAMPLES)
@click.argument("engine_dir", type=click.Path(path_type=Path))
@click.option("--token-ids", required=True, help="Comma-separated token ids.")
@click.option("--output", required=True, type=click.Path(path_type=Path), help="Where to write the .npy file.")
@click.option("--no-verify", is_flag=True, help="Skip the SHA-256 check of the engine's files at load.")
def logits(engine_dir, token_ids, output, no_verify):
    """Write float32 logits of every position, shape [num_tokens, vocab], to a .npy file."""
    from atlas.tools.compare import parse_token_ids

    ids = parse_token_ids(token_ids)
    try:
        gen = _load(engine_dir, not no_verify)
        values = gen.logits(ids).numpy().astype(np.float32)
    except AtlasError as e:
        _fail(e)
    np.save(output, values)
    click.echo(f"wrote logits {list(values.shape)} to {output}", err=True)


BENCH_EXAMPLES = """
Example (an engine built with --device cuda):

  atlas-run bench engines/llama-8b-nvfp4 --batch-sizes 1,8,32 --prompt-len 512 --gen-len 256 --json > bench.json
"""


@main.command(epilog=BENCH_EXAMPLES)
@click.argument("engine_dir", type=click.Path(path_type=Path))
@click.option("--batch-sizes", default="1,8,32", show_default=True, help="Comma-separated batch sizes.")
@click.option("--prompt-len", type=int, default=512, show_default=True, help="Prompt tokens a sequence.")
@click.option("--gen-len", type=int, default=256, show_default=True, help="Generated tokens a sequence.")
@click.option("--repeats", type=int, default=3, show_default=True, help="Runs per batch size (medians reported).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--no-verify", is_flag=True, help="Skip the SHA-256 check of the engine's files at load.")
@click.option("--profile", is_flag=True,
              help="Also profile the smallest batch's decode step: each GPU kernel's time a step, and the idle share.")
@click.option("--eager-prefill", is_flag=True, help=EAGER_PREFILL_HELP)
def bench(engine_dir, batch_sizes, prompt_len, gen_len, repeats, as_json, no_verify, profile, eager_prefill):
    """Decode speed of a GPU engine: TTFT, TPOT, tokens/s and the fraction of the memory-bandwidth floor."""
    import json

    from atlas.runtime.bench import bench as run_bench
    from atlas.runtime.bench import kernel_profile, profile_text
    from atlas.runtime.block_manager import OutOfBlocks
    from atlas.runtime.cuda_engine import load_cuda_engine
    from atlas.runtime.model_runner import ModelRunner

    try:
        sizes = [int(b) for b in batch_sizes.split(",") if b.strip()]
    except ValueError:
        _fail(ValueError(f"--batch-sizes takes comma-separated integers, got {batch_sizes!r}"))
    if not sizes or min(sizes) < 1 or prompt_len < 1 or gen_len < 1 or repeats < 1:
        _fail(ValueError("batch sizes, --prompt-len, --gen-len and --repeats must be positive"))
    try:
        runner = ModelRunner(load_cuda_engine(engine_dir, verify_checksums=not no_verify))
        if max(sizes) > runner.options.buckets[-1]:
            _fail(ValueError(f"batch size {max(sizes)} exceeds the engine's --max-batch "
                             f"{runner.options.max_batch}; rebuild with a larger --max-batch"))
        runner.capture(prefill=not eager_prefill)
        result = run_bench(runner, sizes, prompt_len, gen_len, repeats)
        if profile:
            result["profile"] = kernel_profile(runner, min(sizes), prompt_len)
    except OutOfBlocks as e:
        _fail(ValueError(f"{e}: the batch's sequences do not fit the KV pool; lower --batch-sizes or the lengths"))
    except (AtlasError, ValueError) as e:
        _fail(e)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"{result['device']}, copy bandwidth {result['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s")
    click.echo(f"{'batch':>5} {'TTFT ms':>9} {'TPOT ms':>9} {'tok/s':>9} {'floor':>7}")
    for c in result["cases"]:
        click.echo(f"{c['batch']:>5} {c['ttft_s'] * 1e3:>9.1f} {c['tpot_s'] * 1e3:>9.2f} {c['tokens_per_s']:>9.1f} "
                   f"{c['floor_fraction']:>7.1%}")
    if profile:
        click.echo(profile_text(result["profile"]))


if __name__ == "__main__":
    main()
