"""A CUDA-target build of a hybrid model compiles its Gated DeltaNet kernels ahead of time (no GPU needed).

The build runs in a subprocess without TRITON_INTERPRET: kernels decorated while the interpreter is on
(tests/plugins_trt/test_gdn_triton.py turns it on when it imports triton first) cannot be compiled, so
the result must not depend on which test module ran first in this process.
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

BUILD = r"""
import sys
from atlas.build_engine.builder import BuildConfig, build
build(BuildConfig("synthetic:tiny-qwen3.5", sys.argv[1], device="cuda", autotune=False, progress=False))
"""


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    out = tmp_path_factory.mktemp("gdn") / "e"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(out.parent / "triton-cache")
    proc = subprocess.run([sys.executable, "-c", BUILD, str(out)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, json.loads((out / "manifest.json").read_text())


def _names(plan: dict) -> set[str]:
    names = set()
    for role, value in plan.items():
        if role in ("dims", "kernels") or not isinstance(value, (str, list, dict)):
            continue
        if isinstance(value, str):
            if role not in ("act_dtype", "state_dtype", "verify_mode"):
                names.add(value)
        else:
            names |= _leaves(value)
    return names


def _leaves(value) -> set[str]:
    """The kernel names in a plan entry: strings nested in dicts and lists."""
    if isinstance(value, str):
        return {value}
    return set().union(*map(_leaves, value.values() if isinstance(value, dict) else value))


def _deltas_kernels() -> tuple[str, ...]:
    """triton_verify.DELTAS_KERNELS, read from the source (importing triton here could pick up the interpreter)."""
    import ast
    import pathlib

    src = pathlib.Path(__file__).resolve().parents[2] / "plugins_trt" / "gated_delta_net" / "triton_verify.py"
    for node in ast.parse(src.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "DELTAS_KERNELS":
            return ast.literal_eval(node.value)
    raise AssertionError("DELTAS_KERNELS not found in triton_verify.py")


def test_gdn_plan_names_compiled_kernels(engine):
    out, m = engine
    plan, table = m["gdn_kernels"], m["kernels"]
    assert table["arch"] == 90 and m["target"]["device"] == "cuda"
    c = m["config"]
    assert plan["dims"] == {"HK": c["linear_num_key_heads"], "HV": c["linear_num_value_heads"],
                            "DK": c["linear_key_head_dim"], "DV": c["linear_value_head_dim"],
                            "KW": c["linear_conv_kernel"], "C": plan["dims"]["C"]}
    for role in ("decode", "verify", "verify_replay", "commit", "commit_replay", "conv_varlen", "conv_update",
                 "conv_update_verify", "conv_commit", "chunk", "chunk_state", "verify_deltas"):
        assert plan[role], role
    assert set(plan["verify"]) == {"2", "3", "4", "8", "17"}
    assert len(set(plan["verify"].values())) == 1  # T is a run-time int: one instance serves every width
    deltas = plan["verify_deltas"]
    assert set(_deltas_kernels()) <= set(deltas)  # every way the run-time policy can pick was compiled
    for way in ("chunk", "prepped_chunk", "prep", "commit"):  # one instance per token tile: 16 (T <= 16), 32 (T 17)
        assert set(deltas[way]) == {"16", "32"} and deltas[way]["16"] != deltas[way]["32"], way
    assert set(deltas["prep_tail"]) == {"17"} and deltas["prep_tail"]["17"] not in deltas["prep"].values()
    assert len(plan["chunk"]) == 3
    names = _names(plan)
    assert names == set(plan["kernels"])
    assert names <= set(table["kernels"]), sorted(names - set(table["kernels"]))
    for name in names:
        entry = table["kernels"][name]
        cubin = out / "kernels" / entry["cubin"]
        assert cubin.is_file() and cubin.stat().st_size > 0, name
        assert f"kernels/{entry['cubin']}" in m["files"]


def test_gdn_table_params_match_kernel_signatures(engine):
    _, m = engine
    from atlas.runtime.kernels import parse_grid_formula

    plan, table = m["gdn_kernels"], m["kernels"]["kernels"]
    # the kernels' parameters, read from the source (importing triton here could pick up the interpreter)
    arg_names = _kernel_args()
    for name, info in plan["kernels"].items():
        entry = table[name]
        args = arg_names[info["kernel"]]
        params = [p for p, _ in entry["params"]]
        assert params == [a for a in args if a not in entry["constexprs"]], name
        assert set(params) | set(entry["constexprs"]) == set(args), name
        assert set(entry["divisible_by_16"]) <= {p for p, ty in entry["params"] if ty.startswith("*")}, name
        for p, ty in entry["params"]:
            assert ty in ("*bf16", "*fp32", "*i32", "i32"), (name, p, ty)
        ints = {p for p, ty in entry["params"] if not ty.startswith("*")}
        assert len(info["grid"]) == 3
        for expr in info["grid"]:
            parse_grid_formula(expr, ints | set(entry["constexprs"]) | {"B", "N", "NT", "max_T"})
        for key, value in info["config"].items():
            got = entry[key] if key in ("num_warps", "num_stages") else entry["constexprs"][key]
            assert got == value, (name, key, got, value)


def _kernel_args() -> dict[str, list[str]]:
    import ast
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2] / "plugins_trt"
    files = [root / "causal_conv1d" / "triton_conv.py"] + sorted((root / "gated_delta_net").glob("triton_*.py"))
    out = {}
    for f in files:
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.endswith("_kernel"):
                out[node.name] = [a.arg for a in node.args.args]
    return out
