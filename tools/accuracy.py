"""Accuracy of the weight formats on the default model: perplexity and KL divergence vs float32.

    python -m atlas.tools.accuracy [--checkpoint smollm2-135m-instruct] [--out tools/results/accuracy.json]

Builds one engine per format (float32, bfloat16, fp8, fp8_block, nvfp4, each with the LM head in bfloat16
as by default, then with the LM head quantized too, and NVFP4 with FP8 MLPs), runs each over the text sample shipped in tools/data/eval_sample.txt (teacher forcing,
one forward over the whole text), and reports perplexity and the mean KL(p_float32 ‖ p_format) of the
next-token distributions. The CPU reference runtime dequantizes weights to fp32 and computes in fp32,
so the figures isolate the weight format's error.
"""

from __future__ import annotations

import json
import math
import platform
import tempfile
import time
from pathlib import Path

import click
import torch

from atlas.build_engine.builder import BuildConfig, build
from atlas.runtime.generator import Generator

SAMPLE = Path(__file__).parent / "data" / "eval_sample.txt"

# name -> (--dtype, --class-dtype); quantized formats keep the LM head in bfloat16 unless told otherwise
VARIANTS = {
    "float32": ("float32", {}),
    "bfloat16": ("bfloat16", {}),
    "fp8": ("fp8", {}),
    "fp8_block": ("fp8_block", {}),
    "nvfp4": ("nvfp4", {}),
    "fp8 + fp8 lm_head": ("fp8", {"lm_head": "fp8"}),
    "nvfp4 + nvfp4 lm_head": ("nvfp4", {"lm_head": "nvfp4"}),
    "nvfp4 + fp8 mlp": ("nvfp4", {"mlp": "fp8"}),
}


def evaluate(gen: Generator, ids: list[int]) -> torch.Tensor:
    """Log-probabilities [T-1, V] of tokens 1..T-1 given their prefixes."""
    state = gen.model.new_state(len(ids))
    logits = gen.model.forward(torch.tensor(ids), state).logits[:-1]
    return torch.log_softmax(logits.double(), dim=-1)


def run(checkpoint: str, variants: list[str], max_tokens: int) -> dict:
    text = SAMPLE.read_text()
    results = {}
    reference = None
    ids = None
    with tempfile.TemporaryDirectory(prefix="atlas-accuracy-") as tmp:
        for name in variants:
            dtype, classes = VARIANTS[name]
            t0 = time.perf_counter()
            built = build(BuildConfig(checkpoint, Path(tmp) / f"engine{len(results)}", dtype=dtype,
                                      class_dtypes=classes, max_seq_len=max_tokens + 1, progress=False))
            weight_bytes = sum(f["bytes"] for k, f in built.manifest["files"].items() if k.startswith("weights/"))
            gen = Generator.load(built.path)
            if ids is None:
                ids = gen.tokenizer.encode(text, add_special_tokens=False)[:max_tokens]
            logp = evaluate(gen, ids)
            targets = torch.tensor(ids[1:])
            nll = -logp[torch.arange(len(targets)), targets]
            row = {"dtype": dtype, "class_dtypes": classes, "weight_bytes": weight_bytes,
                   "perplexity": math.exp(float(nll.mean()))}
            if reference is None:
                reference = logp
                row["mean_kl_vs_float32"] = 0.0
            else:
                kl = (reference.exp() * (reference - logp)).sum(-1)
                row["mean_kl_vs_float32"] = float(kl.mean())
                row["top1_agreement_vs_float32"] = float((reference.argmax(-1) == logp.argmax(-1)).double().mean())
            row["seconds"] = round(time.perf_counter() - t0, 1)
            results[name] = row
            click.echo(f"{name:24s} ppl {row['perplexity']:8.4f}  KL {row['mean_kl_vs_float32']:.5f}  "
                       f"weights {weight_bytes / 2**20:7.1f} MiB", err=True)
            del gen
    return {"checkpoint": checkpoint, "sample": str(SAMPLE.name), "tokens": len(ids),
            "device": platform.processor() or platform.machine(), "torch": torch.__version__,
            "results": results}


@click.command()
@click.option("--checkpoint", default="smollm2-135m-instruct", show_default=True)
@click.option("--variants", default=",".join(VARIANTS), show_default=True, help="Comma-separated variant names.")
@click.option("--max-tokens", default=2048, show_default=True, type=int)
@click.option("--out", type=click.Path(path_type=Path), default=Path("tools/results/accuracy.json"), show_default=True)
def main(checkpoint, variants, max_tokens, out):
    names = [v.strip() for v in variants.split(",")]
    if names[0] != "float32":
        names.insert(0, "float32")  # the reference for KL
    report = run(checkpoint, names, max_tokens)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    click.echo(f"wrote {out}", err=True)


if __name__ == "__main__":
    main()
