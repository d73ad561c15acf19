"""Registers and spills of every step kernel a real-shape engine compiles, on this machine (no GPU).

    python -m atlas.tools.dev.step_spills [--preset qwen3.5-27b] [--max-batch 32] [--out FILE.json]

Records the runner's steps for the preset's config as `atlas-build --device cuda` does (build_engine/step_kernels.py:
every decode bucket, the prefill tiers), compiles each instance for sm_90 and reads its resource usage with
cuobjdump: registers, stack (spills live there), shared memory. Why: the 27B engine's Gated DeltaNet decode kernel ran
3.5x slower in the step (H100) than its tiles in bench_gdn (H200), and its instance turned out to take 255 registers
and a 1000-byte stack a thread (runtime/NOTES.md, 2026-12-07 sixth session); a kernel with stack > 0 is the first
place to look.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path

import click


def resource_usage(cubin: bytes) -> dict[str, int]:
    """REG / STACK / SHARED / LOCAL of a cubin's kernel (cuobjdump -res-usage), {} without cuobjdump."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True).stdout
    return {k.lower(): int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", text)}


@click.command()
@click.option("--preset", default="qwen3.5-27b", show_default=True, help="A synthetic preset of real shape.")
@click.option("--max-batch", type=int, default=32, show_default=True)
@click.option("--max-seq-len", type=int, default=832, show_default=True, help="bench_decode's: prompt + gen + 64.")
@click.option("--out", "out_path", type=click.Path(path_type=Path), default=None)
def main(preset: str, max_batch: int, max_seq_len: int, out_path: Path | None) -> None:
    from atlas.build_engine.families import family_for
    from atlas.build_engine.recorded_kernels import compile_recorded
    from atlas.build_engine.step_kernels import record_step_kernels
    from atlas.runtime.model_runner import RunnerOptions
    from atlas.tools.synthetic import text_config
    from atlas.tools.synthetic_presets import GENERATION, PRESETS

    hf = PRESETS[preset]
    config = family_for(hf).canonical_config(text_config(hf), GENERATION, set())
    compiled, instances = compile_recorded(record_step_kernels(config, RunnerOptions(max_batch=max_batch,
                                                                                     max_seq_len=max_seq_len)))
    by_name = {k.spec.name: k for k in compiled}
    rows = []
    for key, name in sorted(instances.items(), key=lambda kv: kv[1]):
        usage = resource_usage(by_name[name].cubin)
        rows.append({"instance": key, "kernel": name, **usage})
        flag = "  <- spills" if usage.get("stack", 0) > 64 else ""
        click.echo(f"{name[:60]:60s} reg {usage.get('reg')} stack {usage.get('stack')} shared {usage.get('shared')}"
                   f"{flag}")
    if out_path:
        out_path.write_text(json.dumps({"preset": preset, "max_batch": max_batch, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
