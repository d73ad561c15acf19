"""tools/bench_gdn.py's re-summary: the verify default is re-picked from recorded times, nothing re-timed."""

import json

import pytest

pytest.importorskip("triton")


def test_resummarize_picks_the_launchers_default_way(tmp_path):
    from atlas.plugins_trt.gated_delta_net.triton_verify import deltas_verify_kernel
    from atlas.tools import bench_gdn as bg

    cases = []
    for B, K in ((1, 17), (8, 4)):
        row = {"kind": "verify", "model": "qwen3.5-27b", "B": B, "K": K, "floor_bytes": 4.0e6, "fla_us": 50.0}
        for i, way in enumerate(bg.VERIFY_WAYS):
            row[f"atlas_{way}_us"], row[f"atlas_{way}_timing"] = 10.0 + i, "graph"
        row["atlas_us"], row["atlas_timing"] = 99.0, "graph"  # a stale pick
        cases.append(row)
    path = tmp_path / "gdn.json"
    path.write_text(json.dumps({"copy_bandwidth_Bps": 4.0e12, "cases": cases}))
    assert bg.main(["--resummarize", str(path)]) == 0
    out = json.loads(path.read_text())
    for c in out["cases"]:
        way = f"deltas_{deltas_verify_kernel(c['B'], c['K'], 48)}"
        assert c["atlas_way"] == way and c["atlas_us"] == c[f"atlas_{way}_us"]
        assert c["speedup_vs_fla"] == pytest.approx(50.0 / c["atlas_us"])
        assert c["atlas_fraction_of_floor"] == pytest.approx(1.0 / c["atlas_us"])  # 4 MB at 4 TB/s: 1 us
    assert out["summary"]["min_verify_speedup_vs_fla"] == pytest.approx(min(c["speedup_vs_fla"] for c in out["cases"]))
    assert set(out["summary"]["min_verify_speedup_by_way"]) == set(bg.VERIFY_WAYS)


def test_merge_into_replaces_only_the_groups_timed_again():
    from atlas.tools import bench_gdn as bg

    def case(model, kind, us):
        return {"model": model, "kind": kind, "B": 1, "K": 2, "T": 512, "atlas_us": us, "fla_us": 2.0 * us,
                "speedup_vs_fla": 2.0}
    old = {"device": {"name": "a"}, "copy_bandwidth_Bps": 1.0, "wall_s": 1.0,
           "cases": [case("m", "prefill", 1.0), case("m", "verify", 5.0)], "summary": {}}
    new = {"device": {"name": "b"}, "copy_bandwidth_Bps": 2.0, "wall_s": 2.0, "cases": [case("m", "verify", 3.0)],
           "summary": {}}
    out = bg.merge_into(old, new)
    assert [(c["kind"], c["atlas_us"]) for c in out["cases"]] == [("prefill", 1.0), ("verify", 3.0)]
    assert out["runs"][0]["groups"] == [("m", "prefill")] and out["runs"][1]["groups"] == [("m", "verify")]
    assert out["runs"][1]["copy_bandwidth_Bps"] == 2.0 and out["summary"]["min_verify_speedup_vs_fla"] == 2.0


def test_resummarize_repicks_a_prefill_timed_before_the_sliced_default(tmp_path):
    """A prefill case recorded when the held stage 1 was the default gets the sliced form's time as atlas_us (the
    held time kept under its form's name); a case already timed with the new default is left alone."""
    from atlas.tools import bench_gdn as bg

    old = {"kind": "prefill", "model": "qwen3.5-27b", "T": 4096, "B": 1, "floor_bytes": 4.0e6, "fla_us": 600.0,
           "atlas_us": 630.0, "atlas_timing": "graph", f"atlas_{bg.PREFILL_DEFAULT}_us": 580.0,
           f"atlas_{bg.PREFILL_DEFAULT}_timing": "graph"}
    new = {"kind": "prefill", "model": "qwen3-next-80b", "T": 4096, "B": 1, "floor_bytes": 4.0e6, "fla_us": 500.0,
           "atlas_us": 450.0, "atlas_timing": "graph", "atlas_way": bg.PREFILL_DEFAULT, "speedup_vs_fla": 500.0 / 450.0,
           "atlas_fraction_of_floor": 1.0 / 450.0}
    path = tmp_path / "gdn.json"
    path.write_text(json.dumps({"copy_bandwidth_Bps": 4.0e12, "cases": [old, new]}))
    assert bg.main(["--resummarize", str(path)]) == 0
    a, b = json.loads(path.read_text())["cases"]
    assert a["atlas_us"] == 580.0 and a["atlas_held_wy_us"] == 630.0 and a["atlas_way"] == bg.PREFILL_DEFAULT
    assert a["speedup_vs_fla"] == pytest.approx(600.0 / 580.0)
    assert b["atlas_us"] == 450.0 and "atlas_held_wy_us" not in b
