"""QTensor: one canonical linear weight in an engine storage format, and the row operations fusions need.

Engine tensors for a linear with prefix P and logical weight W [N, K] (N = output features):
  float32 / bfloat16  P.weight [N, K] in that dtype
  fp8        P.weight e4m3 [N, K]; P.weight_scale f32 [N]                W ≈ weight · weight_scale[:, None]
  fp8_block  P.weight e4m3 [N, K]; P.weight_scale f32 [⌈N/128⌉, ⌈K/128⌉]
             W[n,k] ≈ weight[n,k] · weight_scale[n//128, k//128]
  nvfp4      P.weight u8 [N, K/2] (E2M1 pairs, even element in the low nibble); P.weight_scale e4m3 [N, K/16];
             P.weight_scale_2 f32 [N]; optional P.input_scale f32 []
             W[n,k] = E2M1(code[n,k]) · weight_scale[n, k//16] · weight_scale_2[n]
The format is fixed: the ONNX exporter and the runtime read exactly these names, dtypes and shapes.

weight_scale_2 is per output row although ModelOpt stores one scalar per tensor: a fused [q|k|v] then keeps
each part's own global scale exactly. Row operations (map_rows, concat_rows, combine_rows) work by tracking
row indices, so every per-row tensor moves with its rows; fp8_block scales can only move in whole 128-row blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from atlas.plugins_trt.quant_linear import reference
from atlas.plugins_trt.quant_linear.reference import FP8_BLOCK, NVFP4_BLOCK

FORMATS = ("float32", "bfloat16", "fp8", "fp8_block", "nvfp4")
FLOAT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
FP8 = torch.float8_e4m3fn


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _desc(t: torch.Tensor | None) -> str:
    return "None" if t is None else f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


@dataclass
class QTensor:
    """One linear weight [N, K] in an engine format (validated on construction)."""

    fmt: str
    """One of FORMATS."""
    weight: torch.Tensor
    """[N, K] float32 / bfloat16 / e4m3, or uint8 [N, K/2] packed E2M1 for nvfp4."""
    weight_scale: torch.Tensor | None = None
    """fp8: f32 [N]; fp8_block: f32 [⌈N/128⌉, ⌈K/128⌉]; nvfp4: e4m3 [N, K/16]; None for float formats."""
    weight_scale_2: torch.Tensor | None = None
    """nvfp4 only: f32 [N], the global scale of each row (one value per original tensor)."""
    input_scale: torch.Tensor | None = None
    """nvfp4 only, optional: f32 [] activation scale kept from ModelOpt checkpoints (unused by W4A16)."""

    def __post_init__(self):
        if self.fmt not in FORMATS:
            raise ValueError(f"unknown weight format '{self.fmt}'; expected one of {', '.join(FORMATS)}.")
        expected = self._expected()
        got = {"weight": self.weight, "weight_scale": self.weight_scale,
               "weight_scale_2": self.weight_scale_2, "input_scale": self.input_scale}
        for field, want in expected.items():
            t = got[field]
            if want is None:
                ok = t is None
            else:
                ok = t is not None and t.dtype == want[0] and tuple(t.shape) == want[1]
            if not ok and not (field == "input_scale" and t is None):
                wanted = "None" if want is None else f"{str(want[0]).removeprefix('torch.')}{list(want[1])}"
                raise ValueError(
                    f"{self.fmt} QTensor: {field} is {_desc(t)}, expected {wanted} "
                    f"(weight {_desc(self.weight)}); the tensors do not form a {self.fmt} weight."
                )

    def _expected(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]] | None]:
        """field -> (dtype, shape) the format requires, or None where the field must be None."""
        if self.weight.dim() != 2:
            raise ValueError(f"{self.fmt} QTensor: weight must be 2-D [N, K], got {_desc(self.weight)}.")
        n, k = self.shape
        none = {"weight_scale": None, "weight_scale_2": None, "input_scale": None}
        if self.fmt in FLOAT_DTYPES:
            return {"weight": (FLOAT_DTYPES[self.fmt], (n, k)), **none}
        if self.fmt == "fp8":
            return {**none, "weight": (FP8, (n, k)), "weight_scale": (torch.float32, (n,))}
        if self.fmt == "fp8_block":
            return {**none, "weight": (FP8, (n, k)),
                    "weight_scale": (torch.float32, (_cdiv(n, FP8_BLOCK), _cdiv(k, FP8_BLOCK)))}
        if k % NVFP4_BLOCK:
            raise ValueError(
                f"nvfp4 QTensor: K = {k} (weight {_desc(self.weight)}) is not a multiple of {NVFP4_BLOCK}.")
        return {"weight": (torch.uint8, (n, k // 2)), "weight_scale": (FP8, (n, k // NVFP4_BLOCK)),
                "weight_scale_2": (torch.float32, (n,)), "input_scale": (torch.float32, ())}

    def __repr__(self) -> str:
        return f"QTensor(fmt='{self.fmt}', shape={self.shape}, nbytes={self.nbytes})"

    @property
    def shape(self) -> tuple[int, int]:
        """The logical [N, K] of W (nvfp4 stores K/2 bytes a row)."""
        n, k = self.weight.shape
        return (n, k * 2) if self.fmt == "nvfp4" else (n, k)

    @property
    def nbytes(self) -> int:
        """Bytes of every stored tensor (what a GEMV reads, plus the tiny input_scale)."""
        return sum(t.numel() * t.element_size() for t in self._tensors().values())

    def _tensors(self) -> dict[str, torch.Tensor]:
        out = {"weight": self.weight, "weight_scale": self.weight_scale,
               "weight_scale_2": self.weight_scale_2, "input_scale": self.input_scale}
        return {k: v for k, v in out.items() if v is not None}

    def dequantize(self) -> torch.Tensor:
        """fp32 [N, K], through the plugins_trt reference."""
        return reference.dequantize(self.fmt, self.weight, self.weight_scale, self.weight_scale_2)

    def to_tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        """The engine tensors: {prefix.weight, prefix.weight_scale, ...} (only those the format has)."""
        return {f"{prefix}.{name}": t.contiguous() for name, t in self._tensors().items()}

    @classmethod
    def from_tensors(cls, weights: dict[str, torch.Tensor], prefix: str) -> QTensor:
        """Inverse of to_tensors; the format follows from the dtypes (and, for e4m3, the scale's rank)."""
        key = f"{prefix}.weight"
        if key not in weights:
            raise KeyError(f"'{key}' is not among the weights; no linear weight with prefix '{prefix}'.")
        w = weights[key]
        ws, ws2, s_in = (weights.get(f"{prefix}.{n}") for n in ("weight_scale", "weight_scale_2", "input_scale"))
        if w.dtype == torch.float32:
            fmt = "float32"
        elif w.dtype == torch.bfloat16:
            fmt = "bfloat16"
        elif w.dtype == torch.uint8:
            fmt = "nvfp4"
        elif w.dtype == FP8 and ws is not None:
            fmt = "fp8" if ws.dim() == 1 else "fp8_block"
        else:
            raise ValueError(f"'{key}' is {_desc(w)} with weight_scale {_desc(ws)}: not a known engine weight format.")
        return cls(fmt, w, ws, ws2, s_in)

    # ---- row operations ----------------------------------------------------------------------

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> QTensor:
        """Apply a row map fn ([N, X] -> [N', X], e.g. a family's split or reorder of heads) to every tensor.

        fn must only select, reorder or repeat rows and use -1 (or w.shape[-1]) for the trailing dim:
        it is applied to the row indices, and each per-row tensor is gathered by the result.
        """
        return _gather_rows([self], _row_sources(lambda idx: fn(idx[0]), [self.shape[0]]))


def concat_rows(parts: list[QTensor]) -> QTensor:
    """[parts[0]; parts[1]; ...] along N. Same format and K; fp8_block parts (but the last) need N % 128 == 0."""
    if len(parts) == 1:
        return parts[0]
    return _gather_rows(parts, torch.arange(sum(p.shape[0] for p in parts)))


def combine_rows(parts: list[QTensor], combine: Callable[[list[torch.Tensor]], torch.Tensor]) -> QTensor:
    """A family's list combine (WeightSource.combine, e.g. cat[split_gate(q), k, v]) applied to quantized parts.

    combine must be a pure row map of its inputs (concatenation, splits, head reorders).
    """
    return _gather_rows(parts, _row_sources(combine, [p.shape[0] for p in parts]))


def _row_sources(fn: Callable[[list[torch.Tensor]], torch.Tensor], rows: list[int]) -> torch.Tensor:
    """Global source row (into the concatenated parts) of every output row: fn applied to row indices."""
    total = sum(rows)
    offsets = [sum(rows[:i]) for i in range(len(rows))]
    idx = [torch.arange(o, o + n).view(n, 1) for o, n in zip(offsets, rows)]
    try:
        out = fn(idx)
    except Exception as e:  # noqa: BLE001 - any failure means fn is not a pure row map
        raise ValueError(
            f"the row map could not run on row indices ({type(e).__name__}: {e}); a quantized weight only "
            f"supports maps that select or reorder rows, with -1 for the trailing dim."
        ) from None
    if (not isinstance(out, torch.Tensor) or out.dtype != torch.int64 or out.dim() != 2 or out.shape[1] != 1
            or (out.numel() and (out.min() < 0 or out.max() >= total))):
        raise ValueError(
            f"the row map returned {_desc(out) if isinstance(out, torch.Tensor) else type(out).__name__} on "
            f"int64 row indices [{total}, 1]; it must only select or reorder rows (no arithmetic, no new rows)."
        )
    return out[:, 0]


def _gather_rows(parts: list[QTensor], src: torch.Tensor) -> QTensor:
    """Rows src (global indices into the concatenation of parts) of every tensor, as one QTensor."""
    fmt, k = parts[0].fmt, parts[0].shape[1]
    for p in parts:
        if p.fmt != fmt or p.shape[1] != k:
            raise ValueError(
                f"cannot join rows of {parts[0]!r} and {p!r}: parts need one format and one K. Quantize "
                f"every part of a fused weight to the same format."
            )
    cat = (lambda ts: ts[0] if len(ts) == 1 else torch.cat(ts, 0))
    weight = cat([p.weight for p in parts])[src].contiguous()
    input_scale = None
    present = [p.input_scale for p in parts if p.input_scale is not None]
    if present:
        # A fused GEMM quantizes its input once: the largest part scale covers all (TensorRT-LLM does the same).
        input_scale = torch.stack(present).amax()
    if fmt in FLOAT_DTYPES:
        return QTensor(fmt, weight)
    if fmt in ("fp8", "nvfp4"):
        ws = cat([p.weight_scale for p in parts])[src].contiguous()
        ws2 = cat([p.weight_scale_2 for p in parts])[src].contiguous() if fmt == "nvfp4" else None
        return QTensor(fmt, weight, ws, ws2, input_scale if fmt == "nvfp4" else None)
    # fp8_block: global scale-block id of every global row; each 128-row output block must come from one.
    block_of_row, block_offset = [], 0
    for p in parts:
        n = p.shape[0]
        block_of_row.append(torch.arange(n) // FP8_BLOCK + block_offset)
        block_offset += p.weight_scale.shape[0]
    blocks = torch.cat(block_of_row)[src]  # [N']
    first = blocks[::FP8_BLOCK]  # the block each output block takes its scales from
    bad = (blocks != first.repeat_interleave(FP8_BLOCK)[: len(blocks)]).nonzero()
    if len(bad):
        j = int(bad[0]) // FP8_BLOCK
        seen = sorted(set(blocks[j * FP8_BLOCK:(j + 1) * FP8_BLOCK].tolist()))
        sizes = [p.shape[0] for p in parts]
        raise ValueError(
            f"fp8_block weight (parts with N = {sizes}): output rows {j * FP8_BLOCK}..{j * FP8_BLOCK + 127} would "
            f"take rows from {len(seen)} different 128-row scale blocks {seen[:4]}. fp8_block scales cover "
            f"128x128 tiles, so rows may only move in whole 128-row blocks (fused parts and head slices must be "
            f"multiples of 128 rows). Dequantize and requantize this weight, or use fmt 'fp8'."
        )
    ws = cat([p.weight_scale for p in parts])[first].contiguous()
    return QTensor(fmt, weight, ws)
