"""Experiment helper, not used by Atlas: compile the GDN decode, verify and prefill stage-1 kernels for sm_90 (no GPU
needed) and print each configuration's registers and stack (spills) a thread, as cuobjdump reports them.

    python -m atlas.tools.dev.gdn_registers > tools/results/gdn_registers.txt

Run without TRITON_INTERPRET. Shapes: Qwen3.5-27B (HK 16, HV 48, D 128), bf16 activations, fp32 state.
"""

from __future__ import annotations


def usage(sig) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from atlas.tools.dev.step_spills import resource_usage

    c = triton.compile(ASTSource(fn=sig.fn, signature=sig.signature, constexprs=sig.constexprs, attrs=sig.attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": sig.num_warps,
                                                                  "num_stages": sig.num_stages})
    u = resource_usage(c.asm["cubin"])
    return f"REG:{u.get('reg')} STACK:{u.get('stack')}"


def main() -> None:
    from atlas.plugins_trt.gated_delta_net import triton_recurrent as rec
    from atlas.plugins_trt.gated_delta_net import triton_verify_chunk as vc
    from atlas.plugins_trt.gated_delta_net import triton_verify_prep as vp

    HK, HV, D = 16, 48, 128
    rows = []
    # decode with the gated norm fused: one tile a head (BV = DV, 8 warps: the engine's until 2026-12-07) against
    # the tiles SPLIT_NORM keeps (the engine's since)
    rows.append(("recurrent decode fused norm BV 128 / 8 warps",
                 rec.signature_gdn_recurrent("decode", HK, HV, D, D, 4, BV=D, num_warps=8)))
    for bv in (32, 64):
        rows.append((f"recurrent decode split norm BV {bv} / 4 warps",
                     rec.signature_gdn_recurrent("decode", HK, HV, D, D, 4, BV=bv, num_warps=4, split_norm=True)))
    for mode in ("verify_replay", "verify_deltas"):  # the fused token-by-token kernel, without the norm
        sig = rec.signature_gdn_recurrent(mode, HK, HV, D, D, 4, BV=16, num_warps=1)
        rows.append((f"recurrent {mode} BV 16 / 1 warp", sig._replace(constexprs={**sig.constexprs,
                                                                                   "FUSE_NORM": False})))
    for bv, w in ((16, 1), (16, 2), (32, 4)):
        rows.append((f"prepped recurrence BV {bv} / {w} warps",
                     vp.signature_gdn_recurrent_prepped(HK, HV, D, D, BV=bv, num_warps=w, fuse_norm=False)))
    for T in (4, 17):
        rows.append((f"prep T {T}", vp.signature_gdn_verify_prep(HK, HV, D, D, T)))
    for T, prepped, tail, inv in ((4, False, False, False), (17, False, False, False), (8, True, False, False),
                                  (17, True, False, False), (17, True, True, False), (17, True, True, True)):
        for prec in ("tf32", "ieee") if not prepped else ("tf32",):
            name = (f"chunk T {T}{' prepped' if prepped else ''}{' tail' if tail else ''}"
                    f"{' inverse' if inv else ''} {prec} BV 64 / 4 warps")
            rows.append((name, vc.signature_gdn_verify_chunk(HK, HV, D, D, T, BV=64, num_warps=4, fuse_norm=False,
                                                             dot_prec=prec, prepped=prepped, tail=tail,
                                                             solve_inverse=inv)))
    from atlas.plugins_trt.gated_delta_net import triton_chunk as tc
    for w in (2, 4, 8):  # prefill stage 1: fused, fused reloading its key tiles, the split form's first launch
        for what, kw in (("fused", {}), ("fused reload_k", {"reload_k": True}), ("split X", {"store_x": True})):
            rows.append((f"prefill stage 1 {what} / {w} warps", tc.signature_chunk_wy(HK, HV, D, D, num_warps=w, **kw)))
    for w in (4, 8):
        rows.append((f"prefill stage 1 split wu / {w} warps", tc.signature_chunk_wu(HK, HV, D, D, num_warps=w)))
    for bk, w, inv in ((32, 1, False), (32, 2, False), (32, 4, False), (16, 2, False), (64, 2, False),
                       (32, 2, True), (32, 4, True)):  # the sliced stage 1 (the default: BK 32, 2 warps)
        rows.append((f"prefill stage 1 sliced BK {bk}{' inverse' if inv else ''} / {w} warps",
                     tc.signature_chunk_wy_sliced(HK, HV, D, D, BK=bk, num_warps=w, inverse=inv)))
    for bv, w, ns in ((32, 4, 2), (32, 4, 3), (64, 4, 2), (64, 8, 2), (32, 8, 2)):  # stage 2: default, halves
        for halves in (False, True):
            rows.append((f"prefill stage 2{' halves' if halves else ''} BV {bv} / {w} warps / {ns} stages",
                         tc.signature_chunk_state(HK, HV, D, D, BV=bv, num_warps=w, num_stages=ns, halves=halves)))
    for name, sig in rows:
        print(f"{name:55s} {usage(sig)}", flush=True)


if __name__ == "__main__":
    main()
