"""README tables from the committed benchmark result files (no GPU needed).

    python -m atlas.tools.bench.tables gemm [tools/results/gemm.json]
    python -m atlas.tools.bench.tables gdn [tools/results/gdn.json]
    python -m atlas.tools.bench.tables decode [tools/results/decode.json]
    python -m atlas.tools.bench.tables decode-plot [tools/results/decode.json] [tools/results/decode.png]
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


def _default_engines(result: dict) -> list[dict]:
    """The engines as built by default: A/B variants ('<case>+no-pdl', '+pdl-launch-first') are left out."""
    return [r for r in result["atlas"] if "+" not in r["case"]]


def decode_table(result: dict) -> str:
    rows = ["| engine | batch | tok/s | TPOT ms | TTFT ms | floor fraction | transformers tok/s | speedup |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in _default_engines(result):
        hf = result["hf"].get(r["preset"])
        for c in r["cases"]:
            peer = hf if hf is not None and c["batch"] == hf["batch"] else None
            rows.append(f"| {r['case'].replace(':', ' ')} | {c['batch']} | {c['tokens_per_s']:.1f} | "
                        f"{c['tpot_s'] * 1e3:.2f} | {c['ttft_s'] * 1e3:.0f} | {c['floor_fraction']:.1%} | "
                        + (f"{peer['tokens_per_s']:.1f} | {c['tokens_per_s'] / peer['tokens_per_s']:.1f}x |"
                           if peer else "| |"))
    return "\n".join(rows)


def decode_plot(result: dict, path: str) -> None:
    """Batch-1 decode tok/s of each engine beside transformers on the same checkpoint, the floor fraction on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b1 = [(r, next(c for c in r["cases"] if c["batch"] == 1)) for r in _default_engines(result)
          if any(c["batch"] == 1 for c in r["cases"])]
    labels = [r["case"].replace(":", "\n") for r, _ in b1]
    xs = range(len(b1))
    fig, ax = plt.subplots(figsize=(max(1.6 * len(b1) + 2, 6), 4))
    bars = ax.bar([x - 0.2 for x in xs], [c["tokens_per_s"] for _, c in b1], 0.4, label="Atlas")
    hf = [result["hf"].get(r["preset"], {}).get("tokens_per_s", 0) for r, _ in b1]
    ax.bar([x + 0.2 for x in xs], hf, 0.4, label="transformers (bf16)")
    for bar, (_, c) in zip(bars, b1):
        ax.annotate(f"{c['floor_fraction']:.0%} of floor", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("decode tokens/s, batch 1")
    ax.set_title(f"{result['device']}: {result['prompt_len']}-token prompt, {result['gen_len']} generated",
                 fontsize=10)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    kind = argv[0] if argv else "gemm"
    tables = {"gemm": gemm_table, "gdn": gdn_table, "decode": decode_table}
    if kind not in (*tables, "decode-plot"):
        print(f"unknown table {kind!r}: one of {', '.join((*tables, 'decode-plot'))}", file=sys.stderr)
        return 2
    path = argv[1] if len(argv) > 1 else f"tools/results/{kind.removesuffix('-plot')}.json"
    with open(path) as f:
        result = json.load(f)
    if kind == "decode-plot":
        decode_plot(result, argv[2] if len(argv) > 2 else "tools/results/decode.png")
        return 0
    print(tables[kind](result))
    if result.get("summary"):
        print("\nsummary:", json.dumps({k: v for k, v in result["summary"].items() if not isinstance(v, dict)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
