"""atlas-compare: Atlas's engine against a reference implementation on the same tokens.

`--reference hf` runs Hugging Face transformers (fp32, CPU) on the checkpoint the engine was built
from: a prefill over the prompt, then greedy decode steps through each side's own cache. It reports
the relative error ‖a−b‖/‖b‖ of the logits (prefill positions, decode positions, all), top-1
agreement, and whether the greedy tokens match.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import click
import torch

from atlas.runtime.errors import AtlasError


@dataclass
class CompareReport:
    engine: str
    checkpoint: str
    prompt_tokens: int
    decode_steps: int
    prefill_rel_error: float
    decode_rel_error: float
    rel_error: float
    """‖engine − hf‖ / ‖hf‖ over every compared position's logits."""
    max_abs_error: float
    top1_agreement: float
    """Fraction of compared positions whose argmax agrees."""
    greedy_match: bool
    engine_tokens: list[int]
    hf_tokens: list[int]

    def summary(self) -> str:
        return (
            f"engine      {self.engine}\nreference   transformers on {self.checkpoint}\n"
            f"tokens      {self.prompt_tokens} prompt + {self.decode_steps} greedy decode steps\n"
            f"rel error   prefill {self.prefill_rel_error:.3e}   decode {self.decode_rel_error:.3e}   "
            f"all {self.rel_error:.3e}   (max abs {self.max_abs_error:.3e})\n"
            f"top-1       {self.top1_agreement * 100:.1f}% of positions agree\n"
            f"greedy      {'tokens match' if self.greedy_match else 'tokens DIFFER'}\n"
        )


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def load_hf_model(checkpoint: str):
    """transformers' own loading of the checkpoint, in fp32 on the CPU."""
    import transformers

    from atlas.build_engine.checkpoints import builtin

    if checkpoint in builtin.BUILTIN_MODELS:
        checkpoint = str(builtin.resolve(checkpoint))
    path = Path(checkpoint)
    if checkpoint.startswith("synthetic:"):
        from atlas.tools.synthetic import write_checkpoint

        path = write_checkpoint(checkpoint.removeprefix("synthetic:"), tempfile.mkdtemp(prefix="atlas-synthetic-"),
                                progress=False)
    if path.suffix == ".gguf":
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return model.eval()


@torch.inference_mode()
def hf_greedy(model, prompt_ids: list[int], steps: int) -> tuple[torch.Tensor, list[int]]:
    """Prefill + `steps` greedy decode steps through transformers' cache.

    Returns logits [len(prompt) + steps, V] and the steps + 1 greedy tokens.
    """
    out = model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
    rows = [out.logits[0].float()]
    cache = out.past_key_values
    tokens = [int(rows[-1][-1].argmax())]
    for _ in range(steps):
        out = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        rows.append(out.logits[0].float())
        tokens.append(int(rows[-1][-1].argmax()))
    return torch.cat(rows), tokens


@torch.inference_mode()
def engine_greedy(gen, prompt_ids: list[int], steps: int) -> tuple[torch.Tensor, list[int]]:
    """The same walk through Atlas's reference runtime (prefill, then one token per forward)."""
    model = gen.model
    gen.check_ids(prompt_ids)
    state = model.new_state(len(prompt_ids) + steps)
    rows = [model.forward(torch.tensor(prompt_ids), state).logits]
    tokens = [int(rows[-1][-1].argmax())]
    for _ in range(steps):
        rows.append(model.forward(torch.tensor([tokens[-1]]), state).logits)
        tokens.append(int(rows[-1][-1].argmax()))
    return torch.cat(rows), tokens


def compare_with_hf(engine_dir: str | Path, checkpoint: str, prompt_ids: list[int], steps: int = 16,
                    hf_model=None) -> CompareReport:
    from atlas.runtime.engine import load_engine
    from atlas.runtime.generator import Generator

    gen = Generator(load_engine(engine_dir))  # the reference runtime: a cuda engine is refused with what to rebuild
    model = hf_model if hf_model is not None else load_hf_model(checkpoint)
    ours, our_tokens = engine_greedy(gen, prompt_ids, steps)
    theirs, their_tokens = hf_greedy(model, prompt_ids, steps)
    T = len(prompt_ids)
    return CompareReport(
        engine=str(engine_dir), checkpoint=str(checkpoint), prompt_tokens=T, decode_steps=steps,
        prefill_rel_error=rel_error(ours[:T], theirs[:T]),
        decode_rel_error=rel_error(ours[T:], theirs[T:]) if steps else 0.0,
        rel_error=rel_error(ours, theirs),
        max_abs_error=float((ours - theirs).abs().max()),
        top1_agreement=float((ours.argmax(-1) == theirs.argmax(-1)).float().mean()),
        greedy_match=our_tokens == their_tokens,
        engine_tokens=our_tokens, hf_tokens=their_tokens,
    )


EXAMPLES = """
Examples:

  atlas-compare engines/smollm2 --reference hf --checkpoint smollm2-135m-instruct

  atlas-compare engines/tiny --reference hf --checkpoint ./tiny-llama --prompt "Hello" --json

  atlas-compare engines/smollm2 --reference onnx --save-inputs polygraphy-inputs/
"""


@click.command(epilog=EXAMPLES)
@click.argument("engine_dir", type=click.Path(path_type=Path))
@click.option("--reference", type=click.Choice(["hf", "onnx"]), default="hf", show_default=True,
              help="hf: Hugging Face transformers on the source checkpoint, whole model. onnx: each layer "
                   "type's ONNX graph in ONNX Runtime against Atlas's execution of that layer (Polygraphy).")
@click.option("--checkpoint", help="The checkpoint the engine was built from (default: the one in its manifest).")
@click.option("--prompt", default="The capital of France is", show_default=True, help="Prompt text (tokenized by the engine).")
@click.option("--token-ids", help="Comma-separated prompt token ids instead of --prompt.")
@click.option("--steps", default=16, show_default=True, type=click.IntRange(0, 4096), help="Greedy decode steps.")
@click.option("--atol", default=1e-4, show_default=True, help="--reference onnx: absolute tolerance.")
@click.option("--rtol", default=1e-3, show_default=True, help="--reference onnx: relative tolerance.")
@click.option("--save-inputs", type=click.Path(path_type=Path),
              help="--reference onnx: also write each layer type's inputs as Polygraphy JSON into this folder.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def main(engine_dir, reference, checkpoint, prompt, token_ids, steps, atol, rtol, save_inputs, as_json):
    """Compare an Atlas engine with a reference implementation: the whole model against transformers
    (logits and greedy tokens), or every layer type against its ONNX graph."""
    if reference == "onnx":
        from atlas.tools.compare_onnx import compare_onnx, summary, to_json

        try:
            results = compare_onnx(engine_dir, atol, rtol, save_inputs=save_inputs)
        except AtlasError as e:
            raise click.ClickException(str(e)) from None
        click.echo(to_json(results) if as_json else summary(results, atol, rtol))
        sys.exit(0 if all(r.passed for r in results) else 1)
    from atlas.build_engine.errors import BuildError
    from atlas.runtime.engine import read_manifest
    from atlas.runtime.tokenizer import EngineTokenizer

    try:
        manifest = read_manifest(engine_dir)
        checkpoint = checkpoint or manifest["build"]["checkpoint"]
        if token_ids:
            ids = parse_token_ids(token_ids)
        else:
            ids = EngineTokenizer(engine_dir).encode(prompt)
        report = compare_with_hf(engine_dir, checkpoint, ids, steps)
    except (AtlasError, BuildError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps(asdict(report), indent=2) if as_json else report.summary())
    sys.exit(0 if report.greedy_match else 1)


def parse_token_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got '{text}'", param_hint="--token-ids") from None
