"""Paged KV cache: the tensors of every attention layer and the layout every kernel that touches them shares.

Layout (the contract between the block manager, the KV write of the RoPE kernel and the attention kernels):

  k_cache, v_cache of one layer: [num_blocks, block_size, num_kv_heads, head_dim], contiguous.
    A token's slot is `block * block_size + offset`; its K row is k_cache.view(-1, Hkv, D)[slot].
    dtype: bfloat16 / float16 / float32 (stored as is), or torch.float8_e4m3fn with one fp32 scale per tensor
    (k_scale, v_scale: 1-element fp32 tensors): stored = e4m3(clamp(x / scale, -448, 448)), read = stored · scale.
  block_tables: int32 [B, max_blocks_per_seq]; row b lists sequence b's blocks in order; entries past the blocks
    the sequence holds are never read.
  slot_mapping: int32 [T] for the T tokens of a step: where each token's K / V row is written; negative = padding,
    not written.
  context_lens: int32 [B]: tokens in sequence b's cache after this step's write (cached prefix + new tokens);
    0 marks a padding sequence: its queries get zeros and its block-table row is not read.
  cu_q: int32 [B + 1]: query tokens of sequence b are rows cu_q[b] .. cu_q[b+1]-1 of the packed q; query i of b
    sits at absolute position context_lens[b] - q_len_b + i and sees the keys at positions 0 .. that position.
    cu_q[-1] may be less than the rows of a static q buffer: rows past it are not written.
  Element offsets (slot · Hkv · D) pass 2^31 in large pools: kernels compute them in int64.

Block 0 .. num_blocks-1 belong to the pool; the block manager (runtime/block_manager.py) hands them out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_MAX = 448.0
"""Largest finite float8_e4m3fn."""

KV_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
             "fp8": torch.float8_e4m3fn}


@dataclass
class LayerKV:
    """One attention layer's cache."""

    k: torch.Tensor
    """[num_blocks, block_size, num_kv_heads, head_dim]."""
    v: torch.Tensor
    """[num_blocks, block_size, num_kv_heads, head_dim]."""
    k_scale: torch.Tensor
    """fp32 [1]: the dequantization scale of k (1 for unquantized caches)."""
    v_scale: torch.Tensor
    """fp32 [1]."""


@dataclass
class KVCache:
    """The block pool of every attention layer (same num_blocks and block_size for all of them)."""

    layers: list[LayerKV]
    block_size: int

    @property
    def num_blocks(self) -> int:
        return self.layers[0].k.shape[0] if self.layers else 0

    @classmethod
    def allocate(cls, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu",
                 scales: list[tuple[float, float]] | None = None) -> "KVCache":
        """Zeroed caches; `scales` (one (k_scale, v_scale) per layer) is required for float8_e4m3fn."""
        if block_size < 1 or block_size & (block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {block_size}")
        if dtype == torch.float8_e4m3fn and scales is None:
            raise ValueError("an FP8 KV cache needs one (k_scale, v_scale) per layer (from calibration or 1.0)")
        scales = scales or [(1.0, 1.0)] * num_layers
        if len(scales) != num_layers:
            raise ValueError(f"{len(scales)} scale pairs for {num_layers} layers")
        shape = (num_blocks, block_size, num_kv_heads, head_dim)

        def scalar(s: float) -> torch.Tensor:
            return torch.tensor([s], dtype=torch.float32, device=device)

        return cls([LayerKV(torch.zeros(shape, dtype=dtype, device=device),
                            torch.zeros(shape, dtype=dtype, device=device), scalar(ks), scalar(vs))
                    for ks, vs in scales], block_size)

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """K and V bytes one token takes across all layers (what sizes the pool from free memory)."""
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def quantize_kv(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor) -> torch.Tensor:
    """The value a cache of `dtype` stores for x (reference of the kernels' KV write)."""
    if dtype == torch.float8_e4m3fn:
        return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(dtype)
    return x.to(dtype)


def dequantize_kv(stored: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 values of cache rows."""
    out = stored.float()
    return out * scale if stored.dtype == torch.float8_e4m3fn else out


def write_kv(layer: LayerKV, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Reference KV write: k, v [T, Hkv, D] into their slots (negative slots skipped)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    layer.k.view(-1, *layer.k.shape[2:])[slots] = quantize_kv(k[keep], layer.k.dtype, layer.k_scale)
    layer.v.view(-1, *layer.v.shape[2:])[slots] = quantize_kv(v[keep], layer.v.dtype, layer.v_scale)


def gather_kv(layer: LayerKV, block_table: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 K and V [length, Hkv, D] of one sequence, in position order (reference read)."""
    bs = layer.k.shape[1]
    blocks = block_table[:(length + bs - 1) // bs].long()
    k = layer.k[blocks].reshape(-1, *layer.k.shape[2:])[:length]
    v = layer.v[blocks].reshape(-1, *layer.v.shape[2:])[:length]
    return dequantize_kv(k, layer.k_scale), dequantize_kv(v, layer.v_scale)
