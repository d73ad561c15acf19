"""Experiment helper (CPU): is there an NVFP4 word order that decodes each bf16 pair with one shift and one mask?

A decoded pair (layout.NVFP4_BITS, gluon_gemv._bits_pair_asm) needs its two values' bits at the bf16 positions
S = {6, 7, 8, 15, 22, 23, 24, 31} (mantissa bit, the exponent's two low bits, sign; in both halves). One shift and one
mask a pair would need shifted copies of S (shifts, rotations, or funnel shifts over two or four words) that cover the
words' bits exactly once. This searches every such cover and prints how many exist: none, for one, two or four words,
so some pairs must take two shifts and a merge (BITS: 11-12 integer operations a word of 8 values, where a cover
would allow 7).

    python -m atlas.tools.dev.nvfp4_bits_partition
"""
from __future__ import annotations

S = (6, 7, 8, 15, 22, 23, 24, 31)


def covers(words: int, rotate: bool, bits: tuple[int, ...] = S) -> list[tuple[int, ...]]:
    """Every choice of 4 x `words` shifts d (bit i of a pair = bit i + d of the words' concatenation; rotate: taken
    modulo the width, as a rotation of one word) whose shifted copies of `bits` (8 positions, S) cover the
    32 x `words` bits exactly once.
    Without rotate a copy must lie inside the words (S spans 26 bits, so any copy lies in two adjacent words: one
    shift or one funnel shift)."""
    width = 32 * words
    found = []

    def extend(used: frozenset, shifts: tuple):
        if len(shifts) == 4 * words:
            found.append(shifts)
            return
        low = min(set(range(width)) - used)  # the lowest uncovered bit: some copy must take it
        for s in bits:
            d = low - s
            pos = {(p + d) % width if rotate else p + d for p in bits}
            if (not rotate and (min(pos) < 0 or max(pos) >= width)) or pos & used:
                continue
            extend(used | pos, shifts + (d,))

    extend(frozenset(), ())
    return found


def main() -> None:
    print("one word, rotations:", len(covers(1, True)), "covers")
    for words in (1, 2, 4):
        print(f"{words} word(s), shifts and funnel shifts:", len(covers(words, False)), "covers")


if __name__ == "__main__":
    main()
