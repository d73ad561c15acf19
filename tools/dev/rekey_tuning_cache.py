"""Carry a tuning cache's entries from the older key (a digest of the quantized-linear files whole) to the current one
(a digest of the device code, and one of each case's candidates: build_engine/tuning_cache.py), where they still hold.

    python -m atlas.tools.dev.rekey_tuning_cache tools/results/tuning_cache.json

For every old kernel digest in the file it finds the commit whose files give that digest, and in a worktree of that
commit computes the current key of each case the Llama-3.1-8B and Qwen3.5-27B builds (nvfp4, fp8) search: the
device-code digest of that commit's kernels and the candidates its search timed (its own linear_kernel_list, with
the timing, compiles and device queries replaced; 132 SMs, as the H100 SXM and the H200 have). An old entry is added
under that key where that commit's device code is today's (entries of older kernels could serve no build of today's
code); a build then finds it where the case's candidates are today's too: the key does that check. Old entries stay
(they match nothing now). Prints, per old digest, how many entries carry and how many match today's candidates.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[2]
MODELS = [("llama-3.1-8b", "nvfp4"), ("llama-3.1-8b", "fp8"), ("qwen3.5-27b", "nvfp4"), ("qwen3.5-27b", "fp8")]
SM_COUNT = 132

WORKER = r"""
import importlib.util, json, sys, types
import torch
spec = importlib.util.spec_from_file_location("head_tuning_cache", sys.argv[1])
head = importlib.util.module_from_spec(spec)
spec.loader.exec_module(head)  # today's key functions over the code on sys.path (the commit's)
from atlas.build_engine import linear_kernels
from atlas.build_engine.families import family_for
from atlas.build_engine.precision import PrecisionPlan, tensor_class
from atlas.runtime.layout import canonical_shapes
from atlas.tools.synthetic import tensor_specs, text_config
from atlas.tools.synthetic_presets import PRESETS

cases = {}
def capture(fmt, bucket, n, k, candidates, then=None):
    cases[f"{fmt}:{n}x{k}|M{bucket}"] = head.candidates_digest(candidates, then)
    return candidates[0]
class NoPrecompile:
    def __enter__(self): return lambda jobs: None
    def __exit__(self, *exc): return False
linear_kernels._tune = capture
linear_kernels.Precompiler = NoPrecompile
linear_kernels.compile_kernels = lambda specs: []
torch.cuda.get_device_properties = lambda i: types.SimpleNamespace(multi_processor_count=int(sys.argv[2]))
for preset, dtype in json.loads(sys.argv[3]):
    hf = text_config(PRESETS[preset])
    config = family_for(hf).canonical_config(hf, {}, set(tensor_specs(PRESETS[preset])))  # MTP too
    plan = PrecisionPlan(dtype)
    formats = {name.removesuffix(".weight"): plan.format_of(name, len(shape))
               for name, shape in canonical_shapes(config).items() if tensor_class(name) is not None}
    linear_kernels.linear_kernel_list(config, formats, tune=True)
print(json.dumps({"kernels": head.kernel_digest(), "cases": cases}))
"""


def file_digest(commit: str) -> str:
    """The old key's digest of `commit`: the quantized-linear files and linear_kernels.py, whole."""
    listing = git("ls-tree", "--name-only", commit, "plugins_trt/quant_linear/").split()
    h = hashlib.sha256()
    for path in sorted(p for p in listing if p.endswith(".py")) + ["build_engine/linear_kernels.py"]:
        h.update(Path(path).name.encode())
        h.update(subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True,
                                check=True).stdout)
    return h.hexdigest()[:16]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def commit_of(digest: str, history: list[str]) -> str | None:
    return next((c for c in history if file_digest(c) == digest), None)


def keys_at(commit: str | None) -> dict:
    """{"kernels": device-code digest, "cases": {case: candidates digest}} of `commit` (None: the working tree)."""
    if commit is None:
        return run_worker(os.environ, "the working tree")
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        git("worktree", "add", "--detach", str(tree), commit)
        try:
            pkg = Path(tmp) / "path" / "atlas"
            pkg.mkdir(parents=True)
            for name in ("build_engine", "runtime", "plugins_trt", "tools"):
                (pkg / name).symlink_to(tree / name)
            # the commit's code ahead of the installed (editable) package
            return run_worker({**os.environ, "PYTHONPATH": str(pkg.parent)}, commit[:7])
        finally:
            git("worktree", "remove", "--force", str(tree))


def run_worker(env, what: str) -> dict:
    args = [str(ROOT / "build_engine" / "tuning_cache.py"), str(SM_COUNT), json.dumps(MODELS)]
    run = subprocess.run([sys.executable, "-c", WORKER, *args], env={**env, "TRITON_INTERPRET": "0"},  # as builds
                         capture_output=True, text=True)
    if run.returncode:
        raise click.ClickException(f"the worker failed on {what}:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout)


@click.command()
@click.argument("cache_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--history", default=300, show_default=True, help="How many commits back to look for old digests.")
def main(cache_file: Path, history: int) -> None:
    try:
        data = json.loads(cache_file.read_text())
        entries = data["entries"]
    except (ValueError, KeyError, TypeError) as e:
        raise click.ClickException(f"{cache_file} is not a tuning cache (atlas-build --tuning-cache writes one): {e}")
    commits = git("log", f"-{history}", "--format=%H", "--", "plugins_trt/quant_linear",
                  "build_engine/linear_kernels.py").split()
    today = keys_at(None)
    added = 0
    for prefix in sorted({"|".join(key.split("|")[:3]) for key in entries}):
        device, triton, kernels = prefix.split("|")
        old = kernels.removeprefix("kernels ")
        olds = {key.split("|", 3)[3]: cfg for key, cfg in entries.items() if key.startswith(prefix + "|")}
        if any("|candidates " in case for case in olds):
            continue  # already today's key
        commit = commit_of(old, commits)
        if commit is None:
            print(f"{prefix}: {len(olds)} entries, no commit in the last {history} gives digest {old}; "
                  f"left as they are")
            continue
        then = keys_at(commit)
        carried = found = 0
        for case, cfg in olds.items():
            if then["kernels"] != today["kernels"] or case not in then["cases"]:
                continue  # its kernels have changed since: no build of today's code (or later) can use it
            key = f"{device}|{triton}|kernels {then['kernels']}|{case}|candidates {then['cases'][case]}"
            if key not in entries:
                entries[key] = cfg
                added += 1
            carried += 1
            found += today["cases"].get(case) == then["cases"][case]
        print(f"{prefix}: commit {commit[:7]}, device-code digest {then['kernels']} (today {today['kernels']}); "
              f"{carried} of {len(olds)} entries carried, {found} of them match today's candidates")
    data["entries"] = dict(sorted(entries.items()))
    cache_file.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{added} entries added to {cache_file}")


if __name__ == "__main__":
    main()
