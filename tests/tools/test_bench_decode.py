"""tools/bench_decode.py's summary: the issue's keys from the cases that ran, speedups over transformers."""

import pytest

from atlas.plugins_trt.pdl_order import WAIT_FIRST
from atlas.tools.bench_decode import case_name, summarize


def _run(case, b1_tps, floor):
    return {"case": case, "preset": case.split(":")[0],
            "cases": [{"batch": 1, "tokens_per_s": b1_tps, "floor_fraction": floor},
                      {"batch": 8, "tokens_per_s": 8 * b1_tps, "floor_fraction": floor / 2}]}


def test_summary_keys_and_min_speedup():
    atlas = [_run("llama-3.1-8b:bfloat16", 120.0, 0.8), _run("llama-3.1-8b:nvfp4", 300.0, 0.6),
             _run("qwen3.5-27b:nvfp4", 90.0, 0.55)]
    hf = {"llama-3.1-8b": {"tokens_per_s": 20.0}, "qwen3.5-27b": {"tokens_per_s": 15.0}}
    s = summarize(atlas, hf)
    assert s["bf16_b1_floor_fraction"] == 0.8
    assert s["nvfp4_b1_floor_fraction"] == 0.6
    assert s["hybrid_nvfp4_b1_floor_fraction"] == 0.55
    assert "hybrid_bf16_b1_floor_fraction" not in s  # its case did not run
    assert s["min_speedup_vs_hf"] == 6.0  # 90 / 15 and 120 / 20 both 6; 300 / 20 = 15
    assert s["speedup_vs_hf"]["llama-3.1-8b:nvfp4"] == 15.0


def test_pdl_variants_are_kept_beside_the_default_and_out_of_the_speedups():
    """An A/B run is recorded under its own name ('+no-pdl', '+pdl-launch-first') and takes no part in the
    speedups; the default (wait-first) order is the plain name."""
    from atlas.plugins_trt.pdl_order import LAUNCH_FIRST
    from atlas.runtime.model_runner import RunnerOptions

    assert RunnerOptions().pdl == WAIT_FIRST  # the default order is the plain name
    assert case_name("llama-3.1-8b:nvfp4", WAIT_FIRST) == "llama-3.1-8b:nvfp4"
    assert case_name("llama-3.1-8b:nvfp4", False) == "llama-3.1-8b:nvfp4+no-pdl"
    assert case_name("llama-3.1-8b:nvfp4", LAUNCH_FIRST) == "llama-3.1-8b:nvfp4+pdl-launch-first"
    assert case_name("llama-3.1-8b:nvfp4", WAIT_FIRST, 256) == "llama-3.1-8b:nvfp4+split-256"
    assert case_name("llama-3.1-8b:nvfp4", LAUNCH_FIRST, 256) == "llama-3.1-8b:nvfp4+pdl-launch-first+split-256"
    assert case_name("llama-3.1-8b:nvfp4", WAIT_FIRST, RunnerOptions().attn_split_tokens) == "llama-3.1-8b:nvfp4"
    default = {**_run("llama-3.1-8b:nvfp4", 300.0, 0.6), "pdl": WAIT_FIRST}
    variant = {**_run(case_name("llama-3.1-8b:nvfp4", LAUNCH_FIRST), 100.0, 0.2), "pdl": LAUNCH_FIRST}
    s = summarize([default, variant], {"llama-3.1-8b": {"tokens_per_s": 20.0}})
    assert s["speedup_vs_hf"] == {"llama-3.1-8b:nvfp4": 15.0} and s["nvfp4_b1_floor_fraction"] == 0.6


def test_no_peer_no_speedup():
    assert "min_speedup_vs_hf" not in summarize([_run("llama-3.1-8b:fp8", 200.0, 0.7)], {})


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3.5-vl"])
def test_the_peer_holds_the_checkpoint_s_tensors(preset):
    """The model the benchmark builds in place (bf16, the text model of a VL preset, tensors copied one at a time)
    has the same config and, rounded to bf16, the same parameters as transformers' own loading of the written
    checkpoint (the engine's parity with that model is tested in tests/build_engine/test_families.py)."""
    import torch

    from atlas.tools.bench_decode import hf_model
    from atlas.tools.compare import load_hf_model

    want = load_hf_model(f"synthetic:{preset}")
    got = hf_model(preset, "cpu")
    assert type(got) is type(want)
    params = dict(got.named_parameters())
    assert set(params) == set(dict(want.named_parameters()))
    for name, p in want.named_parameters():
        assert torch.equal(params[name], p.to(torch.bfloat16)), name


def _result():
    runs = [{**_run("llama-3.1-8b:bfloat16", 120.0, 0.8), "dtype": "bfloat16"},
            {**_run("qwen3.5-27b:nvfp4", 90.0, 0.55), "dtype": "nvfp4"}]
    for r in runs:
        for c in r["cases"]:
            c.update(tpot_s=c["batch"] / c["tokens_per_s"], ttft_s=0.05)
    return {"device": "NVIDIA H200", "prompt_len": 512, "gen_len": 256, "atlas": runs,
            "hf": {"llama-3.1-8b": {"batch": 1, "tokens_per_s": 20.0}}}


def test_readme_table_puts_the_peer_beside_batch_1():
    from atlas.tools.bench.tables import decode_table

    rows = decode_table(_result()).splitlines()
    assert rows[2].startswith("| llama-3.1-8b bfloat16 | 1 | 120.0 | 8.33 | 50 | 80.0% | 20.0 | 6.0x |")
    assert rows[3].endswith("| | |")  # batch 8: no peer
    assert rows[4].startswith("| qwen3.5-27b nvfp4 | 1 | 90.0 |") and rows[4].endswith("| | |")  # no 27B peer ran


def test_readme_table_leaves_the_ab_variants_out():
    """The table (and plot) show the engines as built by default; '+pdl-launch-first' / '+no-pdl' runs stay in the
    results file only."""
    from atlas.tools.bench.tables import decode_table

    result = _result()
    variant = {**result["atlas"][0], "case": "llama-3.1-8b:bfloat16+pdl-launch-first"}
    result["atlas"].append(variant)
    rows = decode_table(result).splitlines()
    assert len(rows) == 2 + 4 and not any("launch-first" in r for r in rows)


def test_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    from atlas.tools.bench.tables import decode_plot

    decode_plot(_result(), str(tmp_path / "decode.png"))
    assert (tmp_path / "decode.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_no_pdl_case_is_not_in_the_summary():
    atlas = [_run("llama-3.1-8b:nvfp4", 300.0, 0.6), {**_run("llama-3.1-8b:nvfp4", 100.0, 0.2),
                                                      "case": "llama-3.1-8b:nvfp4+no-pdl", "pdl": False}]
    s = summarize(atlas, {"llama-3.1-8b": {"tokens_per_s": 20.0}})
    assert s["nvfp4_b1_floor_fraction"] == 0.6 and s["min_speedup_vs_hf"] == 15.0


def test_reloads_run_on_the_same_engine_and_are_kept_under_the_case(tmp_path, monkeypatch):
    """--carveout-ab / --defer-ab: after a case's default run (written first, so a later timeout keeps it) its engine
    is loaded again inside each runtime knob (each other shared-memory preference, then the norms deferred),
    recorded under the case's 'carveout_ab' / 'defer_ab'; then it is deleted. The GPU parts stand in (atlas_case,
    reload_case, which reads the knobs inside the switch it is given); the plumbing is what is checked."""
    import json

    from click.testing import CliRunner

    from atlas.runtime import cuda_ops, kernels
    from atlas.tools import bench_decode
    from atlas.tools.bench import timing

    seen = []

    def fake_case(name, work, *args, keep_engine=False, **kwargs):
        seen.append(("case", name, keep_engine))
        bench_decode.engine_dir(work, name).mkdir(parents=True)
        return _run(name, 100.0, 0.5)

    def fake_reload(path, switch, *args):
        with switch:
            knobs = (kernels.SHARED_PREFERENCE, cuda_ops.DEFER_NORM)
        seen.append(("reload", path.name, *knobs, path.is_dir()))
        assert json.loads(out.read_text())["atlas"][0]["case"] == "llama-3.1-8b:nvfp4"  # the default, written
        return {"cases": [{"batch": 1, "tokens_per_s": 120.0 if knobs[1] else {"none": 90.0, "all": 110.0}[knobs[0]]}]}

    out = tmp_path / "decode.json"
    monkeypatch.setattr(bench_decode, "atlas_case", fake_case)
    monkeypatch.setattr(bench_decode, "reload_case", fake_reload)
    monkeypatch.setattr(timing, "device_info", lambda: {"device": "stand-in"})
    result = CliRunner().invoke(bench_decode.main, ["--out", str(out), "--cases", "llama-3.1-8b:nvfp4", "--part",
                                                    "atlas", "--work", str(tmp_path / "work"), "--carveout-ab",
                                                    "none,all", "--defer-ab"])
    assert result.exit_code == 0, result.output
    assert seen == [("case", "llama-3.1-8b:nvfp4", True), ("reload", "llama-3.1-8b-nvfp4", "none", False, True),
                    ("reload", "llama-3.1-8b-nvfp4", "all", False, True),
                    ("reload", "llama-3.1-8b-nvfp4", "large", True, True)]
    assert kernels.SHARED_PREFERENCE == "large" and not cuda_ops.DEFER_NORM  # the defaults back
    entry = json.loads(out.read_text())["atlas"][0]
    assert {m: ab["cases"][0]["tokens_per_s"] for m, ab in entry["carveout_ab"].items()} == {"none": 90.0, "all": 110.0}
    assert entry["defer_ab"]["on"]["cases"][0]["tokens_per_s"] == 120.0
    assert not bench_decode.engine_dir(tmp_path / "work", "llama-3.1-8b:nvfp4").exists()
    bad = CliRunner().invoke(bench_decode.main, ["--out", str(out), "--carveout-ab", "most"])
    assert bad.exit_code != 0 and "none, all or large" in bad.output
