"""Experiment helper (CPU): the sm_90 instruction mix of kernels the notes reason about, compiled here (no GPU):
static SASS counts by opcode class, registers, spills and shared memory, per kernel.

    python -m atlas.tools.dev.sass_mix > tools/results/sass_mix.txt

Kernels: the NVFP4 GEMV configs gemm_h100.json shipped for 8B qkv at M 16 / 8 / 1 (split GEMV, UNROLL 2 / PRE 4;
WK; the first two again with XCLAMP), and permute_k_kernel beside permute_k_words_kernel (BK 128, K 4096).
"""
from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile

_BASE = {"num_stages": 1, "GLUON": True, "PIPE": 1, "TILED": True, "BITS": True}
GEMVS = {
    "8B qkv M 16 (split, UNROLL 2)": {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_K": 8, "num_warps": 4,
                                      "UNROLL": 2, **_BASE},
    "8B qkv M 8 (split, PRE 4)": {"BLOCK_M": 8, "BLOCK_N": 128, "BLOCK_K": 128, "SPLIT_K": 8, "num_warps": 4,
                                  "PRE": 4, **_BASE},
    "8B qkv M 1 (WK 4, PRE 4)": {"BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 256, "SPLIT_K": 1, "num_warps": 4,
                                 "WK": 4, "PRE": 4, **_BASE},
}
GEMVS.update({f"{name[:-1]}, XCLAMP)": {**cfg, "XCLAMP": True} for name, cfg in list(GEMVS.items())[:2]})


def opcode_mix(cubin: bytes) -> tuple[collections.Counter, str, int]:
    """(opcode counts without modifiers, cuobjdump's resource line, HMUL2 count) of a cubin."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
        res = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    ops = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if m:
            ops.append(m.group(1))
    usage = " ".join(w for line in res.splitlines() if "REG:" in line for w in line.split()
                     if w.startswith(("REG:", "STACK:", "SHARED:", "LOCAL:")))
    return collections.Counter(ops), usage, sum(1 for o in ops if o.startswith("HMUL2"))


def main() -> None:
    from atlas.plugins_trt.quant_linear import triton_gemm as GM
    from atlas.plugins_trt.quant_linear import triton_gemv as GV

    for name, cfg in GEMVS.items():
        c = GV.compile_aot(GV.signature_nvfp4_gemv(cfg, 6144, 4096, pdl=True))
        mix, usage, hmul2 = opcode_mix(c.asm["cubin"])
        words = hmul2 // 4  # 4 bf16x2 scale multiplies a word of 8 weights: the static words of decode code
        total = sum(mix.values())
        print(f"{name}: {usage}, {total} instructions, {words} static words -> {total / words:.1f} a word")
        print("   " + ", ".join(f"{op} {n / words:.2f}" for op, n in mix.most_common(14)))
    for name, sig in (("permute_k_kernel", GM.signature_permute_k(128, 4096, words=False)),
                      ("permute_k_words_kernel", GM.signature_permute_k(128, 4096))):
        c = GV.compile_aot(sig)
        mix, usage, _ = opcode_mix(c.asm["cubin"])
        mem = {op: n for op, n in mix.items() if op.startswith(("LDG", "STG", "LDS", "STS", "LDSM"))}
        print(f"{name} (BK 128): {usage}, dynamic shared {c.metadata.shared} B, memory instructions {mem}")


if __name__ == "__main__":
    main()
