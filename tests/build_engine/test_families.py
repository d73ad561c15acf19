"""Every family, built from a random tiny transformers checkpoint, matches transformers (fp32)."""

import pytest

from atlas.tools.compare import compare_with_hf
from conftest import PARITY_FAMILIES


@pytest.mark.parametrize("family", PARITY_FAMILIES)
def test_matches_transformers(family, tiny_checkpoint, tiny_engine, prompt_ids):
    report = compare_with_hf(tiny_engine(family), str(tiny_checkpoint(family)), prompt_ids, steps=16)
    print(report.summary())
    assert report.prefill_rel_error < 1e-4
    assert report.decode_rel_error < 1e-4
    assert report.top1_agreement == 1.0
    assert report.greedy_match, (report.engine_tokens, report.hf_tokens)


def test_hybrid_layer_plan(tiny_engine):
    import json

    manifest = json.loads((tiny_engine("qwen3_next") / "manifest.json").read_text())
    assert [entry["mixer"] for entry in manifest["layer_plan"]] == ["gdn", "gdn", "gdn", "attention"]
    assert manifest["config"]["norm_offset"] == 1.0
    assert manifest["config"]["rotary_dim"] == 8  # head_dim 32 * partial_rotary_factor 0.25


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "tiny-qwen3-next", "tiny-qwen3.5", "tiny-qwen3.5-vl"])
def test_synthetic_checkpoints_match_transformers(preset, tmp_path, prompt_ids):
    """`synthetic:<preset>` built straight from generated tensors vs transformers on the written checkpoint.

    tiny-qwen3.5-vl has the released Qwen3.5 layout (text_config, model.language_model.*); the hybrid
    presets carry MTP weights, which the engine keeps.
    """
    from atlas.build_engine.builder import BuildConfig, build

    result = build(BuildConfig(f"synthetic:{preset}@7", tmp_path / "engine", progress=False))
    config = result.manifest["config"]
    if "qwen3" in preset and preset != "tiny-qwen3":
        assert config["mtp_num_layers"] == 1 and "mtp.fc.weight" in result.manifest["tensors"]
    assert result.unused_tensors == []
    report = compare_with_hf(result.path, f"synthetic:{preset}@7", prompt_ids, steps=16)
    print(report.summary())
    assert report.rel_error < 1e-4
    assert report.greedy_match
