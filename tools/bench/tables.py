"""README tables from the committed benchmark result files (no GPU needed).

    python -m atlas.tools.bench.tables gemm [tools/results/gemm.json]
    python -m atlas.tools.bench.tables gdn [tools/results/gdn.json]
"""

from __future__ import annotations

import json
import sys

def _cell(r: dict) -> str:
    way = ", dequant + cuBLAS" if "dequant" in r["kernel"] else ", cuBLASLt" if r["config"].get("CUBLAS") else ""
    return f"{r['seconds'] * 1e6:.1f} (x{r['speedup_vs_cublas']:.2f}, {r['bw_fraction']:.2f}{way})"


def gemm_table(result: dict, ms=(1, 16, 256, 2048)) -> str:
    rows = ["| shape | M | cuBLAS BF16 us | NVFP4 us | FP8 us |", "|---|---|---|---|---|"]
    for c in result["cases"]:
        if c["M"] in ms:
            rows.append(f"| {c['shape']} ({c['N']} x {c['K']}) | {c['M']} | {c['cublas_bf16']['seconds'] * 1e6:.1f} | "
                        f"{_cell(c['nvfp4'])} | {_cell(c['fp8'])} |")
    return "\n".join(rows)


def gdn_table(result: dict) -> str:
    rows = ["| model | kind | case | Atlas µs | fla µs | speedup | way |", "| --- | --- | --- | --- | --- | --- | --- |"]
    order = {"prefill": 0, "decode": 1, "verify": 2}
    models = list(dict.fromkeys(c["model"] for c in result["cases"]))
    cases = sorted((c for c in result["cases"] if "error" not in c),
                   key=lambda c: (order[c["kind"]] == 2, models.index(c["model"]), order[c["kind"]]))
    for c in cases:
        case = {"prefill": f"T={c.get('T')}", "decode": f"B={c.get('B')}",
                "verify": f"B={c.get('B')} K={c.get('K')}"}[c["kind"]]
        way = c.get("atlas_way", "").removeprefix("deltas_")
        rows.append(f"| {c['model']} | {c['kind']} | {case} | {c['atlas_us']:.1f} | {c['fla_us']:.1f} | "
                    f"{c['speedup_vs_fla']:.2f}x | {way} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    kind = argv[0] if argv else "gemm"
    path = argv[1] if len(argv) > 1 else f"tools/results/{kind}.json"
    with open(path) as f:
        result = json.load(f)
    print({"gemm": gemm_table, "gdn": gdn_table}[kind](result))
    if result.get("summary"):
        print("\nsummary:", json.dumps({k: v for k, v in result["summary"].items() if not isinstance(v, dict)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
