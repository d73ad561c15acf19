"""What a pure streaming read of a GEMV's weight bytes can reach on the GPU, launched as the engine launches its GEMVs:
back to back in one CUDA graph over rotated buffers, with programmatic dependent launch, part or all of each
program's bytes loaded before the PDL wait (what the Gluon GEMV's PRE does with its weight blocks).

    python -m atlas.tools.dev.read_ceiling      # GPU box; writes $OUT/read_ceiling.json

It bounds issue 4's bandwidth goal (every quantized GEMV at 0.75 of the copy bandwidth) on the small layers: if no
read of 14 MB (Llama-3.1-8B qkv in NVFP4) reaches 0.75 in such a chain, no GEMV of those bytes can.
Each program reads ITERS blocks of BLOCK int32 words (16-byte loads), PRE of them before the wait, and writes
one word (the xor of what it read, so no load is dead code) after it.
"""

from __future__ import annotations

import json
import os

from atlas.tools.bench.read import ReadBuffers


def main() -> None:
    from atlas.tools.bench.timing import copy_bandwidth

    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    bw = copy_bandwidth()
    sizes = {"8b.qkv.nvfp4": 14_200_832, "8b.qkv.fp8": 25_190_400, "8b.down.nvfp4": 33_046_528,
             "8b.down.fp8": 58_736_640, "27b.gate_up.nvfp4": 100_417_536}
    rows = []
    for name, nbytes in sizes.items():
        for block, warps in ((1024, 4), (2048, 8)):
            for iters in (2, 4, 8, 16):
                bufs = ReadBuffers(nbytes, block * iters)
                for pre in sorted({0, min(2, iters), iters}):
                    for pdl in (False, True) if pre == 0 else (True,):
                        t, ok = bufs.time(block, iters, pre, pdl, warps)
                        rows.append({"case": name, "bytes": bufs.nbytes, "BLOCK": block, "num_warps": warps,
                                     "ITERS": iters, "programs": bufs.programs, "PRE": pre, "PDL": pdl,
                                     "correct": ok, "us": t * 1e6, "bw_fraction": bufs.nbytes / t / bw})
                        print(f"{name:18s} {bufs.nbytes / 1e6:6.1f} MB BLOCK {block} w{warps} ITERS {iters:2d} "
                              f"progs {bufs.programs:5d} PRE {pre:2d} PDL {int(pdl)}  {t * 1e6:7.2f} us  "
                              f"bw {bufs.nbytes / t / bw:.2f} {'ok' if ok else 'WRONG'}", flush=True)
                del bufs
        best = max((r for r in rows if r["case"] == name and r["correct"]), key=lambda r: r["bw_fraction"])
        print(f"BEST {name}: {best['us']:.2f} us, bw {best['bw_fraction']:.2f} "
              f"(BLOCK {best['BLOCK']} ITERS {best['ITERS']} PRE {best['PRE']} PDL {best['PDL']})", flush=True)
    json.dump({"copy_bandwidth": bw, "rows": rows}, open(f"{out_dir}/read_ceiling.json", "w"), indent=1)


if __name__ == "__main__":
    main()
