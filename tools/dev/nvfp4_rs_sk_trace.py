"""Experiment helper (GPU box): a time line of RS on the stream-K grid (gluon_ws.nvfp4_gemm_rs_sk_kernel, TRACE).

tools/results/nvfp4_rs_sk_parts_h100.json: on 8B qkv at M 256, 132 programs (11.6 block pairs each) take as long as
96 (16 pairs each, one whole tile), while on 27B down the time falls with the program count. So something costs
several microseconds a work item. TRACE has every program stamp %clock64 at each item's start, after its last wgmma,
after its store and after FIX (and %globaltimer at its start and end); this prints, per config, the medians over
programs of each phase and of the gaps, beside each item's block pairs (gluon_gemm.sk_items, the host's model of the
walk).

    python -m atlas.tools.dev.nvfp4_rs_sk_trace   # $OUT/nvfp4_rs_sk_trace.json
"""
from __future__ import annotations

import statistics

SHAPE = "llama-3.1-8b.qkv"


def main(m: int = 256) -> list[dict]:
    import torch

    from atlas.plugins_trt.quant_linear import gluon_gemm as gm
    from atlas.plugins_trt.quant_linear import gluon_ws as W
    from atlas.plugins_trt.quant_linear import triton_gemm as GM
    from atlas.tools.bench_gemm import SHAPES as ALL, rel
    from atlas.tools.dev.variants import m256_case, write_rows

    n, k = ALL[SHAPE]
    case = m256_case(n, k, m)
    x, out = case["x"], case["out"]
    base = {kk: v for kk, v in GM.CONFIGS_nvfp4_ws_rs_sk[0].items() if kk != "SK_PER_SM"}
    row_len = W.TRACE_ROW.value
    rows = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for g in (96, min(132, sms)):
        for fix in (0, 1, 2):
            if g < sms and fix == 2:  # FIX 2 at the full grid only (one program an SM)
                continue
            cfg = {**base, "SK": g, "DP": 0, "TILED": True, "BITS": True, "TRACE": True, **({"FIX": fix} if fix else {})}
            nparts = g * 2 * cfg["BLOCK_M"] * cfg["BLOCK_N"]
            part = torch.zeros(nparts + g * row_len * 2, dtype=torch.float32, device="cuda")
            for _ in range(5):  # warm, then the last launch's stamps
                W.launch_nvfp4_gemm_rs_sk(x, *case["copies"][0], cfg, out=out, part=part, reduce=not fix)
            torch.cuda.synchronize()
            err = rel(out, case["ref"])
            tr = part[nparts:].view(torch.int64).view(g, row_len).cpu().tolist()
            items = gm.sk_items(g, 0, -(-n // cfg["BLOCK_N"]) * -(-m // cfg["BLOCK_M"]), k // (2 * cfg["BLOCK_K"]))
            t0 = min(r[0] for r in tr)
            progs = []
            for pid, r in enumerate(tr):
                ns = r[1] - r[0]
                ghz = (r[row_len - 1] - r[row_len - 2]) / ns if ns > 0 else float("nan")
                its = []
                prev = r[row_len - 2]
                for j, (u, p0, p1) in enumerate(items[pid][:W.TRACE_ITEMS.value]):
                    s = r[2 + 4 * j: 6 + 4 * j]
                    its.append({"tile": u, "pairs": p1 - p0, "gap_us": (s[0] - prev) / ghz / 1e3,
                                "compute_us": (s[1] - s[0]) / ghz / 1e3, "store_us": (s[2] - s[1]) / ghz / 1e3,
                                "fix_us": (s[3] - s[2]) / ghz / 1e3})
                    prev = s[3]
                progs.append({"pid": pid, "start_us": (r[0] - t0) / 1e3, "end_us": (r[1] - t0) / 1e3, "ghz": ghz,
                              "tail_us": (r[row_len - 1] - prev) / ghz / 1e3, "items": its})
            name = f"sk{g}" + ("_noreduce", "_fix", "_own")[fix]
            med = {key: statistics.median(it[key] for p in progs for it in p["items"])
                   for key in ("gap_us", "compute_us", "store_us", "fix_us")}
            per_pair = statistics.median(it["compute_us"] / it["pairs"] for p in progs for it in p["items"])
            first = statistics.median(p["items"][0]["gap_us"] for p in progs if p["items"])
            row = {"config": name, "rel_error": err if fix else None, "programs": progs, "median": med,
                   "compute_us_a_pair": per_pair, "first_gap_us": first,
                   "span_us": max(p["end_us"] for p in progs), "last_start_us": max(p["start_us"] for p in progs)}
            rows.append(row)
            print(f"{SHAPE} M={m} {name:14s} span {row['span_us']:6.1f} us, last start {row['last_start_us']:5.1f}, "
                  f"first gap {first:5.2f}, a pair {per_pair:5.2f} us, medians "
                  + ", ".join(f"{kk} {v:5.2f}" for kk, v in med.items())
                  + (f", err {err:.4f}" if fix else ""), flush=True)
            for p in progs[:: max(1, g // 6)]:
                print("   pid", p["pid"], f"start {p['start_us']:5.1f} end {p['end_us']:5.1f} tail {p['tail_us']:5.2f}",
                      " | ".join(f"t{it['tile']} {it['pairs']}p gap {it['gap_us']:.2f} c {it['compute_us']:.2f} "
                                 f"s {it['store_us']:.2f} f {it['fix_us']:.2f}" for it in p["items"]), flush=True)
    write_rows("nvfp4_rs_sk_trace.json", rows)
    return rows


if __name__ == "__main__":
    main()
