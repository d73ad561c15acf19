"""Experiment helper (GPU box): what the wgmma GEMM's x permutation costs. permute_k (triton_gemm.permute_k_kernel,
what engines launch), words (triton_gemm.permute_k_words_kernel: the same order as a transpose of 32-bit words, 16-byte
loads and stores; the candidate), gather_k (torch.index_select, the launchers' way before it) and permute_k_view (one
strided copy), against a plain copy of x (the floor for any permutation launched on its own) and
the bytes moved; M 64 / 256 / 2048 at the benchmark's K values, each CHAIN launches in one CUDA graph (one launch
a graph measured the replay's own ~18 us on an H100, tools/results/permute_k_h100.json).

    python -m atlas.tools.dev.permute_k      # $OUT/permute_k.json
"""
from __future__ import annotations

import json
import os


CHAIN = 50


def main() -> None:
    import torch

    from atlas.plugins_trt.quant_linear.gluon_gemm import gather_k, permute_k, permute_k_view
    from atlas.tools.bench.timing import copy_bandwidth, device_info, graph_time

    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    bw = copy_bandwidth()
    res = {**device_info(), "copy_bandwidth": bw, "rows": []}
    for k in (4096, 5120, 14336, 17408):
        for m in (64, 256, 2048):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            o = torch.empty_like(x)
            row = {"M": m, "K": k, "bytes": 2 * x.numel() * 2}
            for bk in (64, 128):
                assert torch.equal(permute_k_view(x, bk, o), gather_k(x, bk))
                assert torch.equal(permute_k(x, bk, words=False), gather_k(x, bk))
                row[f"kernel_bk{bk}_us"] = graph_time([lambda: permute_k(x, bk, o, words=False)] * CHAIN,
                                                      repeats=20) * 1e6
                o.fill_(float("nan"))
                assert torch.equal(permute_k(x, bk, o, words=True), gather_k(x, bk))
                row[f"words_bk{bk}_us"] = graph_time([lambda: permute_k(x, bk, o, words=True)] * CHAIN,
                                                     repeats=20) * 1e6
                row[f"gather_bk{bk}_us"] = graph_time([lambda: gather_k(x, bk, o)] * CHAIN, repeats=20) * 1e6
                row[f"view_bk{bk}_us"] = graph_time([lambda: permute_k_view(x, bk, o)] * CHAIN, repeats=20) * 1e6
            row["copy_us"] = graph_time([lambda: o.copy_(x)] * CHAIN, repeats=20) * 1e6
            res["rows"].append(row)
            print(f"M={m:5d} K={k:6d} " + "  ".join(f"{n} {v:7.2f}" for n, v in row.items() if n.endswith("_us")),
                  flush=True)
    json.dump(res, open(f"{out_dir}/permute_k.json", "w"), indent=1)


if __name__ == "__main__":
    main()
