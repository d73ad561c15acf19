"""Experiment helper (GPU box): where RS on the stream-K grid loses its time at M = 256.

8B qkv at M 256 is 96 tiles of 128 x 128 on 132 SMs; spread evenly, the shipped tile's time would be 96 / 132 of
itself (NOTES, 2026-12-06, sixth session). RS on the persistent stream-K grid (gluon_ws.nvfp4_gemm_rs_sk_kernel) was slower than
the plain RS tile there (H100, 43.5 against 35.8 us), and nothing said whether the kernel or its reduction launch
(sk_reduce_kernel) carried the loss. This times, beside the shipped config and cuBLAS BF16 on random bf16 weights,
RS-SK at several program counts: whole (x permutation, kernel, reduction), without the reduction launch (its output
then wrong on the shared tiles, so only the whole forms are checked against the fp32 reference), with FIX or
FIX 2 (no reduction launch: the parts summed inside; VARIANTS). Replays
interleaved (timing.paired_graph_times) over rotated weight copies.

    python -m atlas.tools.dev.nvfp4_rs_sk_parts   # $OUT/nvfp4_rs_sk_parts.json
"""
from __future__ import annotations

import json
from pathlib import Path

SHAPES = ("llama-3.1-8b.qkv", "qwen3.5-27b.down")
PROGRAMS = (96, 132)
VARIANTS = {"": {}, "_fix_pdl": {"FIX": True, "PDL": True}, "_own_pdl": {"FIX": 2, "PDL": True}}
"""The reduction launch (timed also without it), FIX (the program completing a tile's count sums its parts:
gluon_gemm.sk_fixup) and FIX 2 (the tile's owner waits for the others' parts: gluon_gemm.sk_finish_own), both with
programmatic dependent launch after permute_k. (The first runs also had 112 and 124 programs and FIX without PDL:
tools/results/nvfp4_rs_sk_parts_mn_h100.json.)"""


def main(m: int = 256) -> list[dict]:
    import torch

    from atlas.plugins_trt.quant_linear import gluon_gemm as gm
    from atlas.plugins_trt.quant_linear import gluon_ws as W
    from atlas.plugins_trt.quant_linear import triton_gemm as GM
    from atlas.tools.bench.timing import paired_graph_times
    from atlas.tools.bench_gemm import SHAPES as ALL, rel
    from atlas.tools.dev.variants import m256_case, shipped_results, write_rows

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    shipped = {(c["shape"], c["M"]): c["nvfp4"]["config"] for c in json.loads(Path(shipped_results()).read_text())
               ["cases"]}
    base = {k: v for k, v in GM.CONFIGS_nvfp4_ws_rs_sk[0].items() if k != "SK_PER_SM"}
    rows = []
    for name in SHAPES:
        n, k = ALL[name]
        case = m256_case(n, k, m)
        x, out = case["x"], case["out"]
        sk = {f"sk{g}{tag}": {**base, "SK": g, "DP": 0, "TILED": True, "BITS": True, **extra}
              for g in PROGRAMS if g <= sms for tag, extra in VARIANTS.items()}
        parts = {v: torch.empty(gm.sk_partials_shape(c), dtype=torch.float32, device="cuda") for v, c in sk.items()}
        row = {"shape": name, "M": m, "sms": sms, "shipped": shipped[(name, m)], "sk_configs": sk,
               "rel_error": {"shipped": rel(GM.launch_nvfp4_gemm(x, *case["copies"][0], shipped[(name, m)], out=out),
                                            case["ref"]),
                             **{v: rel(W.launch_nvfp4_gemm_rs_sk(x, *case["copies"][0], c, out=out, part=parts[v]),
                                       case["ref"]) for v, c in sk.items()}}}
        lists = {"cublas": [lambda ww=ww: torch.matmul(x, ww.T, out=out) for ww in case["w16"]],
                 "shipped": [lambda qt=qt: GM.launch_nvfp4_gemm(x, *qt, shipped[(name, m)], out=out)
                             for qt in case["copies"]]}
        for v, c in sk.items():
            for reduce in ((True, False) if not c.get("FIX") else (True, )):
                lists[v + ("" if reduce else "_noreduce")] = [
                    lambda qt=qt, c=c, p=parts[v], r=reduce: W.launch_nvfp4_gemm_rs_sk(x, *qt, c, out=out, part=p,
                                                                                      reduce=r)
                    for qt in case["copies"]]
        times = paired_graph_times(list(lists.values()), repeats=30)
        row["us"] = {v: t * 1e6 for v, t in zip(lists, times)}
        row["rel_error_after_timing"] = {  # FIX's counters must be back at zero after every replay
            v: rel(W.launch_nvfp4_gemm_rs_sk(x, *case["copies"][0], c, out=out, part=parts[v]), case["ref"])
            for v, c in sk.items() if c.get("FIX")}
        row["speedup_vs_cublas"] = {v: times[0] / t for v, t in zip(lists, times)}
        rows.append(row)
        print(f"{name:22s} M={m} " + "  ".join(f"{v} {t:6.1f}" for v, t in row["us"].items())
              + "  err " + " ".join(f"{v} {e:.4f}" for v, e in row["rel_error"].items()), flush=True)
    write_rows("nvfp4_rs_sk_parts.json", rows)
    return rows


if __name__ == "__main__":
    main()
