"""Experiment helper (GPU box): XCLAMP (gluon_gemv: the x rows past M clamped to row M - 1 instead of masked, so the
x loads lose their row mask and the zeroing of their registers: 27.0 -> 26.2 instructions a word of 8 weights in the
8B qkv M 16 loop, tests/tools/test_nvfp4_xclamp.py) beside the config gemm.json shipped, where that is a Gluon split
GEMV of PIPE 1, at M 4, 8 and 16 (the mask also runs where no row is past M: M is a run-time argument), in the
benchmark's PDL chain over rotated BITS weight copies, every output checked.

    python -m atlas.tools.dev.nvfp4_xclamp      # $OUT/nvfp4_xclamp.json
"""
from __future__ import annotations


def configs(shipped: dict, m: int = 0, n: int = 0, k: int = 0) -> list[tuple[str, dict]]:
    """(label, config): the shipped config, and its XCLAMP form where it has one (the shape does not matter)."""
    out = [("shipped", shipped)]
    if shipped.get("GLUON") and shipped.get("PIPE", 1) == 1 and not (shipped.get("XSMEM") or shipped.get("STAGE")
                                                                     or shipped.get("WK")):
        out.append(("xclamp", {**shipped, "XCLAMP": True}))
    return out


def main() -> None:
    from atlas.tools.dev.variants import nvfp4_gemv_sweep

    nvfp4_gemv_sweep("nvfp4_xclamp.json", (4, 8, 16), configs)


if __name__ == "__main__":
    main()
