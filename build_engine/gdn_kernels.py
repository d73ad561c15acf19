"""Kernels for the engine's Gated DeltaNet layers: one instance per role, compiled at build for the config's dims.

All GDN layers of a model share one shape (HK, HV, DK, DV, conv width KW, conv channels C), so a hybrid
engine needs one instance per role whatever its number of layers. Every instance uses its launcher's
default configuration (plugins_trt/gated_delta_net/triton_*.py, causal_conv1d/triton_conv.py), bf16
activations / conv weight / conv window, fp32 recurrent state (and fp32 per-token verify states), fp32
A_log, dt_bias and norm weight, no conv bias. Token counts, strides, C and the verify width T stay
run-time ints, so one verify instance serves every width.

Grids depend on the batch, which no kernel takes as an argument, so the table has no grid formula for
these; the plan gives each kernel's grid as formulas over its constexprs / int params and the batch
sizes B (sequences of a decode / verify / commit = slots.numel()), N (packed prefill sequences),
NT (their 64-token chunks) and max_T (longest prefill sequence); the runtime evaluates them (with
atlas.runtime.kernels.parse_grid_formula and those extra names) and passes the grid to KernelTable.launch.

The plan the runtime reads (manifest["gdn_kernels"]):
    {"dims": {"HK", "HV", "DK", "DV", "KW", "C"}, "act_dtype": "bf16", "state_dtype": "fp32",
     "norm_eps": float, "chunk_size": 64, "verify_mode": "states",
     "decode": name,                         # fused conv + gating + delta rule + gated norm, T = 1, in place
     "verify": {"2": name, ..., "17": name}, # same instance (T is an int arg): keeps steps + raw inputs
     "verify_replay": name,                  # rollback mode "replay": keeps the raw inputs only
     "commit": name,                         # mode "states": steps[b, n-1] -> slot, window slid by n
     "commit_replay": name,                  # either mode: re-run the accepted tokens in place (lens = accepted)
     "verify_deltas": {                      # rollback mode "deltas"; triton_verify.deltas_verify_kernel(B, T, HV)
         "recurrent": name,                  #   picks the way: one fused token-by-token launch,
         "prep": {"16": name, "32": name},   #   or the prep launch (per token tile TP = token_tile(T)) then
         "prepped": name,                    #   the token-by-token recurrence
         "prepped_chunk": {"16": n, "32": n},#   or the chunk form on the prep's outputs,
         "chunk": {"16": n, "32": n},        #   or the chunk form alone
         "prepped_chunk_inverse": {"16": n}, #   (either, solving by products where verify_solve_inverse says:
         "chunk_inverse": {"16": n},         #    T 9..16);
         "prepped_chunk_tail": {"17": n},    #   (prepped chunk, T 17: 16 tokens in the tile solved by products,
                                             #    the last one step from three small dots)
         "prep_tail": {"17": n},             #   (its prep: a 16-row tile and the last token as a 1-row tile)
         "commit": {"16": n, "32": n}},      #   then the rank-n commit
     "conv_varlen": name,                    # prefill conv + SiLU, windows updated
     "conv_update": name, "conv_update_verify": name, "conv_commit": name,   # the unfused conv path
     "chunk": [wy, state, out],              # chunked prefill stages in launch order (state at the largest BV)
     "chunk_state": {"64": name},             # stage 2 per BV (pick_bv(DV): one)
     "kernels": {name: {"kernel": triton function, "config": {tile constexprs, num_warps, num_stages},
                        "grid": [3 formulas]}}}
"""

from __future__ import annotations

from atlas.build_engine.kernels import compile_kernels
from atlas.runtime.kernels import parse_grid_formula
from atlas.runtime.config import GDN, ModelConfig

VERIFY_WIDTHS = (2, 3, 4, 8, 17)
BATCH_NAMES = ("B", "N", "NT", "max_T")
BUILD_BATCH = {"B": 1, "N": 1, "NT": 1, "max_T": 64}  # the shape recorded as each table entry's `grid`
TILE_KEYS = ("BV", "BT", "BC")


def has_gdn(config: ModelConfig) -> bool:
    return GDN in config.layer_types


def _eval_grid(formulas: list[str], names: dict) -> tuple[int, ...]:
    out = []
    for expr in formulas:
        code = parse_grid_formula(expr, set(names))
        out.append(max(1, int(eval(code, {"cdiv": lambda a, b: -(-a // b)}, dict(names)))))  # noqa: S307
    return tuple(out)


def gdn_kernel_specs(config: ModelConfig) -> tuple[list, dict]:
    """(KernelSpecs, plan) for every kernel the config's GDN layers launch at run time."""
    from atlas.plugins_trt.causal_conv1d import triton_conv as conv
    from atlas.plugins_trt.gated_delta_net import triton_chunk as chunk
    from atlas.plugins_trt.gated_delta_net import triton_recurrent as rec
    from atlas.plugins_trt.gated_delta_net import triton_verify as ver
    from atlas.plugins_trt.gated_delta_net import triton_verify_chunk as vc
    from atlas.plugins_trt.gated_delta_net import triton_verify_prep as vp

    HK, HV = config.linear_num_key_heads, config.linear_num_value_heads
    DK, DV, KW, C = config.linear_key_head_dim, config.linear_value_head_dim, config.linear_conv_kernel, \
        config.gdn_conv_size
    eps = float(config.rms_norm_eps)
    tag = f"HK{HK}.HV{HV}.DK{DK}.DV{DV}"
    specs, info = [], {}

    def add(role: str, sig, grid: list[str]) -> str:
        cfg = {k: v for k, v in sig.constexprs.items() if k in TILE_KEYS or k in ("SNAPSHOT", "DOT_PREC", "TP")}
        cfg.update(num_warps=sig.num_warps, num_stages=sig.num_stages)
        name = f"gdn_{role}.{tag}." + "_".join(str(v) for v in cfg.values())
        ints = {p for p, ty in sig.params if not ty.startswith("*")}
        values = {**{k: v for k, v in sig.constexprs.items() if isinstance(v, int)}, **BUILD_BATCH, "C": C}
        for expr in grid:  # fails the build on a formula the runtime could not evaluate
            parse_grid_formula(expr, ints | set(sig.constexprs) | set(BATCH_NAMES))
        specs.append(sig.kernel_spec(name, _eval_grid(grid, values)))
        info[name] = {"kernel": sig.fn.__name__, "role": role, "config": cfg, "grid": list(grid)}
        return name

    plan = {"dims": {"HK": HK, "HV": HV, "DK": DK, "DV": DV, "KW": KW, "C": C}, "act_dtype": "bf16",
            "state_dtype": "fp32", "norm_eps": eps, "chunk_size": chunk.CHUNK, "verify_mode": "states"}
    rgrid = ["DV // BV", "HV", "B"]
    # decode: Dv tiles of a batch-1 step with the fused norm across them (SPLIT_NORM); verify: the fused norm fixes
    # the tile (BV = DV, 8 warps) whatever B and T
    bv, warps = rec.recurrent_config(1, 1, HV, DV, fuse_norm=True)
    plan["decode"] = add("decode", rec.signature_gdn_recurrent("decode", HK, HV, DK, DV, KW, BV=bv, num_warps=warps,
                                                               norm_eps=eps, split_norm=bv < DV), rgrid)
    bv, warps = rec.recurrent_config(2, 1, HV, DV, fuse_norm=True)
    verify = add("verify", rec.signature_gdn_recurrent("verify", HK, HV, DK, DV, KW, BV=bv, num_warps=warps,
                                                       norm_eps=eps), rgrid)
    plan["verify"] = {str(t): verify for t in VERIFY_WIDTHS}
    plan["verify_replay"] = add("verify_replay", rec.signature_gdn_recurrent(
        "verify_replay", HK, HV, DK, DV, KW, BV=bv, num_warps=warps, norm_eps=eps), rgrid)
    plan["commit"] = add("commit", ver.signature_gdn_commit(HK, HV, DK, DV, KW, BV=min(DV, 64)), rgrid)
    bv, warps = rec.recurrent_config(2, 1, HV, DV, fuse_norm=False)
    plan["commit_replay"] = add("commit_replay", rec.signature_gdn_recurrent(
        "commit_replay", HK, HV, DK, DV, KW, BV=bv, num_warps=warps, norm_eps=eps), rgrid)
    # rollback mode "deltas": every way triton_verify.deltas_verify_kernel can pick (per batch and width, at run
    # time), instances per token tile where the tile is a constexpr, and the commit
    tiles = sorted({vc.token_tile(t) for t in VERIFY_WIDTHS})
    deltas = {"chunk": {}, "prepped_chunk": {}, "chunk_inverse": {}, "prepped_chunk_inverse": {}, "prep": {},
              "commit": {}}
    for tp in tiles:
        bv, warps = vc.verify_chunk_config(DV, fuse_norm=True)
        for way in ("chunk", "prepped_chunk"):
            deltas[way][str(tp)] = add(f"verify_deltas_{way}", vc.signature_gdn_verify_chunk(
                HK, HV, DK, DV, tp, BV=bv, num_warps=warps, norm_eps=eps, prepped=way == "prepped_chunk"), rgrid)
            if tp == 16:  # T 9..16 solve by products (triton_verify.verify_solve_inverse)
                deltas[f"{way}_inverse"]["16"] = add(f"verify_deltas_{way}_inverse", vc.signature_gdn_verify_chunk(
                    HK, HV, DK, DV, tp, BV=bv, num_warps=warps, norm_eps=eps, prepped=way == "prepped_chunk",
                    solve_inverse=True), rgrid)
        deltas["prep"][str(tp)] = add("verify_deltas_prep", vp.signature_gdn_verify_prep(HK, HV, DK, DV, tp),
                                      ["HK + HV", "B", "1"])
        deltas["commit"][str(tp)] = add("commit_deltas", vc.signature_gdn_commit_deltas(
            HK, HV, DK, DV, KW, tp, BV=vc.commit_deltas_bv(DV)), rgrid)
    bv, warps = vc.verify_chunk_config(DV, fuse_norm=True)  # T 17: 16 tokens in the tile + one step
    deltas["prepped_chunk_tail"] = {"17": add("verify_deltas_prepped_chunk_tail", vc.signature_gdn_verify_chunk(
        HK, HV, DK, DV, 17, BV=bv, num_warps=warps, norm_eps=eps, prepped=True, tail=True, solve_inverse=True,
        tail_dots=True), rgrid)}
    deltas["prep_tail"] = {"17": add("verify_deltas_prep_tail", vp.signature_gdn_verify_prep(  # its 1-row tail
        HK, HV, DK, DV, 17, tail=True), ["HK + HV", "B", "1"])}
    bv, warps = rec.recurrent_config(2, 1, HV, DV, fuse_norm=True)
    deltas["recurrent"] = add("verify_deltas_recurrent", rec.signature_gdn_recurrent(
        "verify_deltas", HK, HV, DK, DV, KW, BV=bv, num_warps=warps, norm_eps=eps), rgrid)
    bv, warps = vp.prepped_config(DV, fuse_norm=True)
    deltas["prepped"] = add("verify_deltas_prepped", vp.signature_gdn_recurrent_prepped(
        HK, HV, DK, DV, BV=bv, num_warps=warps, norm_eps=eps), rgrid)
    plan["verify_deltas"] = deltas
    # the conv on its own: prefill (before the chunked stages), and the unfused decode / verify / commit path
    plan["conv_varlen"] = add("conv_varlen", conv.signature_conv_varlen(KW),
                              ["cdiv(C, BC)", "cdiv(max_T, BT)", "N"])
    plan["conv_update"] = add("conv_update", conv.signature_conv_update(KW, in_place=True), ["B", "cdiv(C, BC)", "1"])
    plan["conv_update_verify"] = add("conv_update_verify", conv.signature_conv_update(KW, in_place=False),
                                     ["B", "cdiv(C, BC)", "1"])
    plan["conv_commit"] = add("conv_commit", conv.signature_conv_commit(KW), ["B", "cdiv(C, BC)", "1"])
    # chunked prefill
    wy = add("chunk_wy_sliced", chunk.signature_chunk_wy_sliced(HK, HV, DK, DV, BK=chunk.WY_SLICE, num_warps=2),
             ["NT", "HV", "1"])
    bv = chunk.pick_bv(DV)
    states = {str(bv): add("chunk_state", chunk.signature_chunk_state(HK, HV, DK, DV, BV=bv), ["DV // BV", "HV", "N"])}
    out = add("chunk_out", chunk.signature_chunk_out(HK, HV, DK, DV, BV=min(64, DV)), ["NT", "HV", "DV // BV"])
    plan["chunk"] = [wy, next(iter(states.values())), out]
    plan["chunk_state"] = states
    plan["kernels"] = info
    return specs, plan


def gdn_kernel_list(config: ModelConfig, arch: int = 90) -> tuple[list, dict]:
    """Compile (without writing) every GDN kernel: (compiled kernels, plan); ([], {}) without GDN layers."""
    if not has_gdn(config):
        return [], {}
    specs, plan = gdn_kernel_specs(config)
    return compile_kernels(specs, arch), plan


def compile_gdn_kernels(config: ModelConfig, kernels_dir=None, arch: int = 90) -> tuple[list, dict]:
    """The GDN kernels' (table entries, plan): compiled kernels to pass to `write_kernels` together with the
    engine's other kernels (one table), and the plan for manifest["gdn_kernels"]. kernels_dir is where they
    will be written (by the caller's write_kernels); nothing is written here."""
    del kernels_dir
    return gdn_kernel_list(config, arch)


__all__ = ["compile_gdn_kernels", "gdn_kernel_list", "gdn_kernel_specs", "has_gdn", "VERIFY_WIDTHS"]
