"""atlas-compare --reference onnx: each layer type's ONNX graph (ONNX Runtime) against Atlas's runtime
execution of the same layer on the same inputs, through Polygraphy's Comparator and its simple
comparison (`CompareFunc.simple`, named SimpleCompareFunc since Polygraphy 0.53): an output passes when
every element has |a - b| <= atol or |a - b| / |b| <= rtol.

Inputs per layer type: the engine's stored weights of one layer of that type (as stored: bfloat16,
FP8 or NVFP4 tensors included), and fresh random activations and state (B=2 sequences, T=5 new tokens
over S_past=3 cached ones), seeded.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from atlas.runtime.config import ModelConfig
from atlas.runtime.engine import read_manifest
from atlas.runtime.errors import EngineError

BATCH, TOKENS, PAST = 2, 5, 3


@dataclass
class OutputResult:
    layer_type: str
    output: str
    max_abs_error: float
    max_rel_error: float
    rel_error: float
    """‖onnx − atlas‖ / ‖atlas‖ over the whole output."""
    passed: bool


def _engine_tensors(engine_dir: Path, manifest: dict) -> dict[str, torch.Tensor]:
    stored = {}
    for name in manifest["weights"]:
        stored.update(load_file(str(engine_dir / name)))
    return stored


def make_feed(config: ModelConfig, fragment: dict, stored: dict[str, torch.Tensor], layer: int | None,
              seed: int) -> dict:
    """Graph inputs: stored weights of `layer` (or the model-level tensors) + seeded random activations/state."""
    from atlas.tools.onnx_runners import to_numpy

    g = torch.Generator().manual_seed(seed)
    dims = {"B": BATCH, "T": TOKENS, "S_past": PAST}
    prefix = fragment["weight_prefix"].format(i=layer) if layer is not None else ""
    feed = {}
    for spec in fragment["inputs"]:
        name = spec["name"]
        shape = [d if isinstance(d, int) else dims[d] for d in spec["shape"]]
        if prefix + name in stored:
            feed[name] = to_numpy(stored[prefix + name])
        elif name == "token_ids":
            feed[name] = torch.randint(0, config.vocab_size, shape, generator=g).numpy()
        elif name == "positions":
            feed[name] = (PAST + torch.arange(TOKENS)).expand(BATCH, TOKENS).contiguous().numpy()
        elif name == "recurrent_state":
            feed[name] = (torch.randn(shape, generator=g) * 0.1).numpy()
        elif spec["dtype"] == "float":
            feed[name] = torch.randn(shape, generator=g).numpy()
        else:
            raise EngineError(f"the engine has no tensor '{prefix + name}' for input {name} of {fragment['file']}; "
                              f"rebuild the engine.")
    return feed


def compare_onnx(engine_dir: str | Path, atol: float = 1e-4, rtol: float = 1e-3, seed: int = 0,
                 save_inputs: Path | None = None) -> list[OutputResult]:
    from polygraphy.comparator import Comparator, SimpleCompareFunc
    from polygraphy.json import save_json
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.WARNING  # keep Polygraphy's per-runner chatter out of the report

    from atlas.tools.onnx_runners import AtlasLayerRunner, OnnxrtGraphRunner

    engine_dir = Path(engine_dir)
    manifest = read_manifest(engine_dir)
    graphs = manifest.get("onnx") or {}
    if not graphs:
        raise EngineError(f"engine {engine_dir} has no ONNX graphs; rebuild it with atlas-build (without --no-onnx).")
    config = ModelConfig.from_dict(manifest["config"])
    stored = _engine_tensors(engine_dir, manifest)
    results = []
    for layer_type, fragment in graphs.items():
        layer = fragment["layers"][0] if fragment["layers"] else None
        feed = make_feed(config, fragment, stored, layer, seed)
        if save_inputs is not None:
            save_inputs.mkdir(parents=True, exist_ok=True)
            save_json([feed], save_inputs / f"{layer_type}_inputs.json", description=f"{layer_type} inputs")
        runners = [OnnxrtGraphRunner(engine_dir / "onnx" / fragment["file"], fragment),
                   AtlasLayerRunner(config, layer_type, fragment, layer)]
        run = Comparator.run(runners, data_loader=[feed])
        accuracy = Comparator.compare_accuracy(run, compare_func=SimpleCompareFunc(atol=atol, rtol=rtol))
        per_output = next(iter(accuracy[0].values()))[0]  # one compare func, one runner pair, one iteration
        onnx_out, atlas_out = run[0][1][0], run[1][1][0]
        for name, outcome in per_output.items():
            a, b = torch.from_numpy(onnx_out[name]).double(), torch.from_numpy(atlas_out[name]).double()
            results.append(OutputResult(layer_type, name, float(outcome.max_absdiff), float(outcome.max_reldiff),
                                        float((a - b).norm() / b.norm().clamp_min(1e-30)), bool(outcome)))
    return results


def summary(results: list[OutputResult], atol: float, rtol: float) -> str:
    lines = [f"{'layer type':18s} {'output':20s} {'max abs':>10s} {'max rel':>10s} {'rel err':>10s}  result",]
    for r in results:
        lines.append(f"{r.layer_type:18s} {r.output:20s} {r.max_abs_error:10.3e} {r.max_rel_error:10.3e} "
                     f"{r.rel_error:10.3e}  {'PASS' if r.passed else 'FAIL'}")
    ok = all(r.passed for r in results)
    lines.append(f"\nPolygraphy simple comparison (SimpleCompareFunc, atol={atol:g}, rtol={rtol:g}): "
                 f"{'all outputs pass' if ok else 'SOME OUTPUTS FAIL'}")
    return "\n".join(lines) + "\n"


def to_json(results: list[OutputResult]) -> str:
    return json.dumps({"passed": all(r.passed for r in results), "outputs": [asdict(r) for r in results]}, indent=2)
