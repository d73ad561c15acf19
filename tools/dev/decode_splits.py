"""The decode attention's split count: the paged decode over num_splits context splits, combined in the same launch
as the runner launches it (COMBINE), timed at each num_splits beside the count the runner picks (model_runner.RunnerOptions.num_splits:
default_num_splits from the engine's max_seq_len), on the real models' attention shapes.

    python -m atlas.tools.dev.decode_splits     # GPU box; writes $OUT/decode_splits.json

Why: the H100 decode benchmark left ~24 us a layer outside the GEMVs for the 8B nvfp4 engine (runtime/NOTES.md),
and at batch 1 with bench_decode's max_seq_len (832) the runner gives the decode 4 splits: 32 programs for 8B on 132
SMs. Each case: B sequences of context ctx in a bf16 paged cache (blocks of 16, shuffled), rotated over enough
caches that each replay reads from device memory, launched with programmatic dependent launch as the step launches
them, each count's output checked against one split's first.
"""

from __future__ import annotations

import json
import os

import torch

MODELS = {"llama-3.1-8b": (32, 8, 128, False), "qwen3.5-27b": (24, 4, 256, True)}  # Hq, Hkv, D, output gate
SPLITS = (1, 2, 4, 6, 8, 12, 16, 24, 32)


def paged_cache(batch: int, ctx: int, hkv: int, d: int, block: int, g: torch.Generator):
    """(k_cache, v_cache, block_tables, context_lens) of `batch` sequences of ctx tokens, blocks in random order."""
    per = -(-ctx // block)
    ids = torch.randperm(batch * per, generator=g).int().view(batch, per).cuda()
    k = torch.randn(batch * per, block, hkv, d, generator=g).to(device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch * per, block, hkv, d, generator=g).to(device="cuda", dtype=torch.bfloat16)
    return k, v, ids, torch.full((batch,), ctx, dtype=torch.int32, device="cuda")


def main() -> None:
    from atlas.plugins_trt.attention.triton_decode import decode_workspace, default_num_splits, launch_paged_decode
    from atlas.tools.bench.timing import copies_for, copy_bandwidth, graph_time

    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    bw = copy_bandwidth()
    one = torch.ones(1, dtype=torch.float32, device="cuda")
    rows = []
    for model, (hq, hkv, d, gated) in MODELS.items():
        for ctx in (640, 4096):
            for batch in (1, 8, 32):
                g = torch.Generator().manual_seed(ctx * 131 + batch)
                nbytes = batch * ctx * hkv * d * 2 * 2
                caches = [paged_cache(batch, ctx, hkv, d, 16, g) for _ in range(copies_for(nbytes, most=16))]
                q = torch.randn(batch, hq, d, generator=g).to(device="cuda", dtype=torch.bfloat16)
                gate = torch.randn(batch, hq, d, generator=g).to(device="cuda", dtype=torch.bfloat16) if gated else None
                out = torch.empty(batch, hq, d, dtype=torch.bfloat16, device="cuda")
                runner_splits = default_num_splits(batch, hkv, ctx + 192)  # bench_decode: prompt + gen + 64
                counts = sorted(set(SPLITS) | {runner_splits})
                ws = decode_workspace(batch, hq, d, max(counts), "cuda")
                counters = torch.zeros(batch * hkv, dtype=torch.int32, device="cuda")  # one launch (COMBINE)

                def run(splits, cache):
                    k, v, bt, cl = cache
                    return launch_paged_decode(q, k, v, one, one, bt, cl, d ** -0.5, gate=gate, num_splits=splits,
                                               out=out, workspace=ws, pdl=True, counters=counters)

                want = run(1, caches[0]).float().clone()
                for splits in counts:
                    got = run(splits, caches[0]).float()
                    err = float((got - want).norm() / want.norm())
                    us = graph_time([lambda c=c, s=splits: run(s, c) for c in caches], repeats=20) * 1e6
                    rows.append({"model": model, "ctx": ctx, "batch": batch, "num_splits": splits,
                                 "runner_splits": runner_splits, "rel_error_vs_one_split": err, "us": us,
                                 "kv_bytes": nbytes, "bw_fraction": nbytes / (us * 1e-6) / bw})
                    print(f"{model:13s} ctx {ctx:5d} B {batch:2d} splits {splits:2d}{' (runner)' if splits == runner_splits else '':9s}"
                          f" {us:7.2f} us  {rows[-1]['bw_fraction']:.2f} of copy bw  err {err:.1e}", flush=True)
                del caches
                torch.cuda.empty_cache()
    result = {"device": torch.cuda.get_device_name(), "copy_bandwidth_bytes_per_s": bw, "rows": rows}
    with open(os.path.join(out_dir, "decode_splits.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
