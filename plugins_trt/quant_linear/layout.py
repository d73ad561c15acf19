"""The tiled NVFP4 weight order of GPU engines: 128-row x 128-column tiles, each tile's bytes contiguous.

Engines store NVFP4 weights in ModelOpt's row-major order (u8 [N, K/2] packed E2M1, e4m3 [N, K/16] block scales);
on the GPU a weight with N % 128 == 0 and K % 128 == 0 is re-ordered at load into tiles (`tile_nvfp4`), and every
kernel the build compiled for it reads that order (the kernels' TILED constexpr). Same shapes and dtypes, only the
order of the bytes changes:

    words  [N, K/2]  ->  [N/128, K/128, 128, 64]   tile (n // 128, j // 64), row n % 128, byte j % 64
    scales [N, K/16] ->  [N/128, K/128, 128, 8]    tile (n // 128, s // 8),  row n % 128, scale s % 8

Why: a GEMV program reads a [BLOCK_N, BLOCK_K] block of the weights a step. Row-major, that is BLOCK_N runs of
BLOCK_K / 2 bytes a K/2 apart; tiled, a 128 x 128 block is one run of 8 KB (and a 64 x 256 block two runs of
4 KB). Measured on the H200 with the Gluon GEMV (tools/results/nvfp4_gluon_pre.json, block-contiguous weights):
Qwen3.5-27B gate_up 61.1 -> 51.2 us at M 16, 49.6 -> 43.3 at M 8; Llama-3.1-8B qkv 12.0 -> 8.6 at M 8.

Offsets, for a kernel that reads element (n, j): `row_part(n) + col_part(j)`, with (in units of the pointer's
element, `ROW` = elements a tile row, `TILE` = elements a tile)

    row_part(n) = (n // 128) * (K / 128) * TILE + (n % 128) * ROW
    col_part(j) = (j // ROW) * TILE + j % ROW

bytes: ROW 64, TILE 8192 (words) and ROW 8, TILE 1024 (scales); int32 words: ROW 16, TILE 2048. A block of BLOCK_K
columns (BLOCK_K a multiple of 128) starts BLOCK_K / 128 tiles after the one before.
"""

from __future__ import annotations

import torch

TILE_N = 128
"""Rows of a tile."""
TILE_K = 128
"""Weight columns (K) of a tile: 64 bytes of packed E2M1 and 8 block scales a row."""


def can_tile(n: int, k: int) -> bool:
    """Whether an NVFP4 weight [N, K] can take the tiled order (whole tiles only)."""
    return n % TILE_N == 0 and k % TILE_K == 0


def _tile(t: torch.Tensor, cols: int) -> torch.Tensor:
    """[N, C] -> the same shape, bytes in [N/128, C/cols, 128, cols] order."""
    n, c = t.shape
    return t.reshape(n // TILE_N, TILE_N, c // cols, cols).transpose(1, 2).contiguous().reshape(n, c)


def tile_nvfp4(weight: torch.Tensor, weight_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-major NVFP4 (u8 [N, K/2], e4m3 [N, K/16]) -> the tiled order, same shapes and dtypes (new tensors)."""
    n, half = weight.shape
    if not can_tile(n, 2 * half) or tuple(weight_scale.shape) != (n, 2 * half // 16):
        raise ValueError(f"tile_nvfp4: weight [{n}, {half}] / scales {tuple(weight_scale.shape)} do not make whole "
                         f"{TILE_N} x {TILE_K} tiles (N % {TILE_N} and K % {TILE_K} must be 0)")
    scale = _tile(weight_scale.view(torch.uint8), TILE_K // 16).view(weight_scale.dtype)
    return _tile(weight, TILE_K // 2), scale


NVFP4_BITS = ((1, 6), (3, 3), (0, 0), (2, -3))
"""The bit order inside each int32 word of packed E2M1 for the Gluon kernels' BITS form, pair by pair (pair i: the
values of byte i, low nibble then high nibble, as in ModelOpt's order): (a, b) puts the pair's two sign bits at bits
31 - a and 15 - a and its magnitude bits (e1 e0 m) at 24 - b .. 22 - b and 8 - b .. 6 - b, so that one left shift by
a (by b) brings them where a bf16 holds them (sign 15, exponent and mantissa bits 8..6: E2M1 * 2^-126). The four
(a, b) cover the 32 bits once, with 7 integer-pipe operations a word to decode (a search over every shift pair found
none with fewer; gluon_gemv._bits_pair_asm)."""


def _bit_moves() -> dict[int, int]:
    """ModelOpt bit position -> NVFP4_BITS position, for the 32 bits of a word."""
    moves = {}
    for p, (a, b) in enumerate(NVFP4_BITS):
        for half, base in ((0, 8 * p), (16, 8 * p + 4)):  # low nibble -> low bf16, high nibble -> high bf16
            moves[base + 3] = 15 + half - a           # sign
            for j in range(3):                         # m, e0, e1 -> 6, 7, 8 (less b)
                moves[base + j] = 6 + j + half - b
    return moves


def bits_nvfp4(weight: torch.Tensor) -> torch.Tensor:
    """u8 [N, K/2] packed E2M1 (either element order of the rows: the bits move inside each 4-byte word) -> the same
    shape with every int32 word's bits in NVFP4_BITS order (a new tensor)."""
    moves = _bit_moves()
    if sorted(moves.values()) != list(range(32)):
        raise AssertionError("NVFP4_BITS does not cover the 32 bits of a word once")
    if weight.dtype != torch.uint8 or weight.shape[-1] % 4:
        raise ValueError(f"bits_nvfp4: u8 [N, K/2] with K % 8 == 0 expected, got {weight.dtype} {list(weight.shape)}")
    by_shift: dict[int, int] = {}
    for old, new in moves.items():
        by_shift[new - old] = by_shift.get(new - old, 0) | (1 << old)
    w = weight.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    out = torch.zeros_like(w)
    for shift, mask in by_shift.items():
        t = w & mask
        out |= (t << shift) if shift >= 0 else (t >> -shift)
    out = torch.where(out >= 2 ** 31, out - 2 ** 32, out).to(torch.int32)
    return out.view(torch.uint8).reshape(weight.shape)


def gpu_order(weight: torch.Tensor, weight_scale: torch.Tensor, bits: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A row-major NVFP4 weight in the order a GPU plan reads: tiled (tile_nvfp4), and with bits its words'
    bits in NVFP4_BITS order (bits_nvfp4)."""
    w, ws = tile_nvfp4(weight, weight_scale)
    return (bits_nvfp4(w) if bits else w), ws


def pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """t [N, ...] -> [rows, ...] (rows >= N), the added rows zero: for NVFP4 zero codes and zero scales, so the
    padded outputs are 0 (a new tensor; CudaLinear pads a weight whose plan runs it at whole tiles)."""
    out = torch.zeros((rows, *t.shape[1:]), dtype=t.dtype, device=t.device)
    out[: t.shape[0]] = t
    return out
