"""Next-token selection on the GPU: greedy argmax, and temperature / top-k / top-p sampling, per row of logits.

Argmax (launch_argmax): two stages so that one row of a 152k vocabulary spreads over many programs when the batch
is small: stage 1, grid (B, NB), takes the max of each BLOCK of a row and its lowest index; stage 2, grid (B,),
takes the max over a row's NB partials, the lowest block among equal maxima. Result: torch.argmax's index, the
lowest among ties, for NaN-free logits.

Sampling (launch_sample) draws from exactly the distribution of reference.sampling_probs, with per-row parameters
in device tensors (nothing read on the host: safe inside CUDA graph capture). Row b, V logits l:

  temperature[b] <= 0: greedy, the argmax of l (lowest index among ties).
  otherwise, with s = l / T (T = temperature[b]):
    1. top-k (0 < top_k[b] < V): keep s_i >= the k-th largest value (ties with it kept, like the reference);
    2. top-p (top_p[b] < 1): of those, with p = softmax over the kept set, keep the smallest set of largest
       values whose mass reaches top_p[b] (a token stays when the mass strictly above it is < top_p);
       top_p <= 0 keeps the largest value only;
    3. draw from the kept set by the Gumbel-max trick: token = argmax over kept i of  s_i + G_i,
       G_i = -log(-log(u_i)), i.e. -log of an Exp(1) variable: the exponential race p_i / E_i. Since the G_i are
       i.i.d. Gumbel(0, 1), P(token = i) = p_i renormalised over the kept set, the reference's distribution.
  u_i = (philox(key = seeds[b]; counter = (i, offsets[b] low 32 bits, high 32 bits, 0)) >> 8 + 0.5) · 2^-24,
  in (0, 1) strictly (24 random bits). One (seed, offset) gives one reproducible draw whatever the batch
  composition; advance offsets[b] every step (e.g. the request's token count) and give rows distinct seeds (or
  offsets), or they draw the same noise.

The kept set is found without sorting. Both cut-offs are values of the row, each found by bisection between
two row values over their order-preserving int32 keys (_order_key), one pass over the row per step: the pass at
the middle key counts (top-k) or sums exp(s - s_max) (top-p) over the values >= it and also returns the nearest
row values on either side, so the bracket snaps to values that occur in the row. At most 32 passes per cut-off,
fewer where the top of the row is sparse in key space (it usually is). Per sampled row: 1 pass for max / min,
the top-k bisection, 1 pass for the top-k mass and the top-p bisection (each only where active), 1 draw pass;
greedy rows stop after the first. One program streams its row each pass (from L2 while the batch's rows fit in
it). The cost grows with the pass count times V / BLOCK; it has not been timed on a GPU yet (this was written
on a CPU-only machine), so a large-batch, large-vocabulary profile is owed before this is the default sampler.
Logits must be NaN-free (a NaN is never kept, nor is it ranked like torch ranks it).

Kernels take pointers, ints and constexprs only (compiled ahead of time); `launch_*` launch them through
atlas.plugins_trt.launch (JIT, or the engine's cubins with `aot=`) and run on meta tensors when the build records
them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atlas.plugins_trt.launch import JIT_DEFAULT_STAGES, launch
from atlas.plugins_trt.pdl import pdl_enter

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _order_key(x):
    """int32 key of fp32 x (NaN excluded) that orders and equates like the floats: key(a) < key(b) iff a < b,
    and -0.0, +0.0 share key 0, so a float compare and a key compare always agree."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, (bits ^ 0x7FFFFFFF) + 1, bits)


@triton.jit
def _key_value(key):
    """The fp32 whose _order_key is `key` (key 0 is +0.0)."""
    return tl.where(key < 0, (key - 1) ^ 0x7FFFFFFF, key).to(tl.float32, bitcast=True)


# ---------------------------------------------------------------------------------------------- argmax


@triton.jit
def argmax_partial_kernel(
    logits, stride_l,               # [B, V] (unit column stride)
    part_val, part_idx,             # fp32, int32 [B, NB]: max and its lowest column per block
    V, NB,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,      # programmatic dependent launch (plugins_trt/pdl.py)
):
    """Grid (B, NB): block j of row b covers columns j·BLOCK .. j·BLOCK + BLOCK - 1."""
    pdl_enter(PDL)
    b = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    cols = j * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(logits + b * stride_l + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
    # padding lanes sit past the row's columns: they never win a tie against a real -inf
    tl.store(part_val + b * NB + j, tl.max(x, axis=0))
    tl.store(part_idx + b * NB + j, j * BLOCK + tl.argmax(x, axis=0, tie_break_left=True))


@triton.jit
def argmax_combine_kernel(
    part_val, part_idx,             # fp32, int32 [B, NB]
    out,                            # int32 / int64 [B]
    NB,
    NB_P2: tl.constexpr,            # power of two >= NB
    PDL: tl.constexpr = False,      # programmatic dependent launch (plugins_trt/pdl.py)
):
    """Grid (B,): the first block holding the row's max holds its lowest index."""
    pdl_enter(PDL)
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, NB_P2)
    v = tl.load(part_val + b * NB + j, mask=j < NB, other=float("-inf"))
    best = tl.argmax(v, axis=0, tie_break_left=True)
    tl.store(out + b, tl.load(part_idx + b * NB + best).to(out.dtype.element_ty))


# ---------------------------------------------------------------------------------------------- sampling


@triton.jit
def _row_max(row, V, BLOCK: tl.constexpr):
    """(max, its lowest column, min) of one row's V logits as fp32."""
    best = float("-inf")
    best_i = 0
    low = float("inf")
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        m = cols < V
        x = tl.load(row + cols, mask=m, other=float("-inf")).to(tl.float32)
        bm = tl.max(x, axis=0)
        best_i = tl.where(bm > best, start + tl.argmax(x, axis=0, tie_break_left=True), best_i)  # earlier wins ties
        best = tl.maximum(best, bm)
        low = tl.minimum(low, tl.min(tl.where(m, x, float("inf")), axis=0))
    return best, best_i, low


@triton.jit
def _pass_at(row, V, mid, row_max, c, MASS: tl.constexpr, BLOCK: tl.constexpr):
    """One pass over the row at value `mid`: (total, smallest value >= mid, largest value < mid), where total is
    the number (MASS False) or the mass sum of exp2((l - row_max)·c) (MASS True) of the values >= mid."""
    total = 0.0
    above = float("inf")
    below = float("-inf")
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        m = cols < V
        x = tl.load(row + cols, mask=m, other=float("-inf")).to(tl.float32)
        ge = m & (x >= mid)
        if MASS:
            total += tl.sum(tl.where(ge, tl.exp2((x - row_max) * c), 0.0), axis=0)
        else:
            total += tl.sum(ge.to(tl.float32), axis=0)
        above = tl.minimum(above, tl.min(tl.where(ge, x, float("inf")), axis=0))
        below = tl.maximum(below, tl.max(tl.where(m & (x < mid), x, float("-inf")), axis=0))
    return total, above, below


@triton.jit
def _cutoff(row, V, lo, hi, target, row_max, c, MASS: tl.constexpr, BLOCK: tl.constexpr):
    """The largest row value t with total(values >= t) >= target (> 0), given row values lo <= t <= hi.

    Bisection over the values' int32 keys (_order_key): a pass at the middle key either reaches the target
    (t >= mid: lo <- the smallest row value >= mid) or not (t < mid: hi <- the largest row value < mid). The
    bracket shrinks strictly and its ends stay row values, so the loop ends (<= 32 passes) at lo = hi = t.
    Counts and sums compare floats; keys only pick the middle, and the two orders agree.
    """
    lo_key = _order_key(lo)
    hi_key = _order_key(hi)
    while lo_key < hi_key:
        mid = ((lo_key.to(tl.int64) + hi_key.to(tl.int64) + 1) >> 1).to(tl.int32)
        total, above, below = _pass_at(row, V, _key_value(mid), row_max, c, MASS, BLOCK)
        ok = (total >= target) & (total > 0)
        lo = tl.where(ok, above, lo)
        hi = tl.where(ok, hi, below)
        lo_key = _order_key(lo)
        hi_key = _order_key(hi)
    return lo


@triton.jit
def _uniform(seed, offset, cols):
    """u in (0, 1) for columns `cols`: Philox-4x32-10, key `seed`, counter (col, offset lo, offset hi, 0);
    24 random bits, centred in their bin, so u is never 0 or 1 and log(-log(u)) stays finite."""
    c0 = cols.to(tl.uint32)
    zero = c0 * 0
    c1 = zero + (offset & 0xFFFFFFFF).to(tl.uint32)
    c2 = zero + ((offset >> 32) & 0xFFFFFFFF).to(tl.uint32)
    r, _, _, _ = tl.philox(seed, c0, c1, c2, zero)
    return ((r >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)


@triton.jit
def sample_kernel(
    logits, stride_l,               # [B, V] bf16 / fp16 / fp32 (unit column stride)
    temperature,                    # fp32 [B]; <= 0: greedy
    top_k,                          # int32 [B]; <= 0 or >= V: off
    top_p,                          # fp32 [B]; >= 1: off
    seeds, offsets,                 # int64 [B] each: Philox key and step counter of each row
    out,                            # int32 / int64 [B]
    V,
    BLOCK: tl.constexpr,
):
    """Grid (B,): one program per row (module docstring: the exact semantics)."""
    b = tl.program_id(0).to(tl.int64)
    row = logits + b * stride_l
    row_max, argmax, row_min = _row_max(row, V, BLOCK)
    temp = tl.load(temperature + b)
    if temp <= 0.0:
        tl.store(out + b, argmax.to(out.dtype.element_ty))
    else:
        inv_t = 1.0 / temp
        c = inv_t * LOG2E  # exp(s - s_max) = exp2((l - l_max) · c)
        # the cut-offs are values of the raw logits: l -> l / T keeps the order for T > 0
        cut = row_min  # keep everything
        k = tl.load(top_k + b)
        if (k > 0) & (k < V):
            cut = _cutoff(row, V, cut, row_max, k.to(tl.float32), row_max, c, False, BLOCK)
        p = tl.load(top_p + b)
        if p < 1.0:
            kept_mass, _, _ = _pass_at(row, V, cut, row_max, c, True, BLOCK)
            cut = _cutoff(row, V, cut, row_max, p * kept_mass, row_max, c, True, BLOCK)
        seed = tl.load(seeds + b)
        offset = tl.load(offsets + b)
        best = float("-inf")
        best_i = 0
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            m = cols < V
            x = tl.load(row + cols, mask=m, other=float("-inf")).to(tl.float32)
            gumbel = -tl.log(-tl.log(_uniform(seed, offset, cols)))
            score = tl.where(m & (x >= cut), (x - row_max) * inv_t + gumbel, float("-inf"))
            bm = tl.max(score, axis=0)
            best_i = tl.where(bm > best, start + tl.argmax(score, axis=0, tie_break_left=True), best_i)
            best = tl.maximum(best, bm)
        tl.store(out + b, best_i.to(out.dtype.element_ty))


# ---------------------------------------------------------------------------------------------- launchers


def _check_logits(logits: torch.Tensor):
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits: expected [B, V] with unit column stride, got {tuple(logits.shape)} "
                         f"strides {logits.stride()}")


def _out(out: torch.Tensor | None, B: int, device) -> torch.Tensor:
    out = torch.empty(B, dtype=torch.int64, device=device) if out is None else out
    # the kernels store row b at out + b: a strided view would be written in the wrong places
    if out.shape != (B,) or out.dtype not in (torch.int32, torch.int64) or (B > 1 and out.stride(0) != 1):
        raise ValueError(f"out: expected contiguous int32 / int64 [{B}], got {out.dtype} {tuple(out.shape)} "
                         f"strides {out.stride()}")
    return out


def launch_argmax(logits: torch.Tensor, out: torch.Tensor | None = None, BLOCK: int = 4096,
                  partials: tuple[torch.Tensor, torch.Tensor] | None = None, num_warps: int = 8,
                  aot=None, pdl: bool = False) -> torch.Tensor:
    """Greedy ids: torch.argmax(logits, -1) (lowest index among ties) for NaN-free logits.

    logits: [B, V] bf16 / fp16 / fp32 (rows may be strided, unit column stride);
    out: int32 / int64 [B], default a new int64 tensor;
    partials: (fp32 [B, NB], int32 [B, NB]) with NB = cdiv(V, BLOCK), the stage-1 results, default new tensors
      (pass static ones to keep allocation out of a captured graph).
    aot: None (JIT), the engine's AotKernels, or the build's KernelRecorder (atlas.plugins_trt.launch).
    pdl: launch with programmatic dependent launch (plugins_trt/pdl.py).
    Returns out.
    """
    _check_logits(logits)
    B, V = logits.shape
    out = _out(out, B, logits.device)
    BLOCK = min(BLOCK, triton.next_power_of_2(V))
    NB = triton.cdiv(V, BLOCK)
    if partials is None:
        partials = (torch.empty(B, NB, dtype=torch.float32, device=logits.device),
                    torch.empty(B, NB, dtype=torch.int32, device=logits.device))
    part_val, part_idx = partials
    if part_val.shape != (B, NB) or part_idx.shape != (B, NB) or part_val.dtype != torch.float32 \
            or part_idx.dtype != torch.int32 or not (part_val.is_contiguous() and part_idx.is_contiguous()):
        raise ValueError(f"partials: expected contiguous fp32 and int32 [{B}, {NB}]")
    if B == 0:
        return out
    # logits may be a view with strided rows, out a slice of a larger buffer
    launch(argmax_partial_kernel, (B, NB), (logits, logits.stride(0), part_val, part_idx, V, NB),
           dict(BLOCK=BLOCK, PDL=pdl),
           num_warps, JIT_DEFAULT_STAGES, aot=aot, unaligned=("logits",))
    launch(argmax_combine_kernel, (B,), (part_val, part_idx, out, NB),
           dict(NB_P2=triton.next_power_of_2(NB), PDL=pdl),
           1, JIT_DEFAULT_STAGES, aot=aot, unaligned=("out",))
    return out


def launch_sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  seeds: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor | None = None, BLOCK: int = 1024,
                  num_warps: int = 4, aot=None) -> torch.Tensor:
    """One token per row: greedy where temperature <= 0, else temperature / top-k / top-p sampling.

    logits: [B, V] bf16 / fp16 / fp32 (rows may be strided, unit column stride);
    temperature: fp32 [B]; top_k: int32 [B] (<= 0 or >= V: off); top_p: fp32 [B] (>= 1: off);
    seeds, offsets: int64 [B] (Philox key and counter of each row's draw);
    out: int32 / int64 [B], default a new int64 tensor.
    aot: None (JIT), the engine's AotKernels, or the build's KernelRecorder (atlas.plugins_trt.launch).
    Returns out. The module docstring gives the exact semantics: in distribution, reference.sampling_probs.
    """
    _check_logits(logits)
    B, V = logits.shape
    out = _out(out, B, logits.device)
    for name, t, dtype in (("temperature", temperature, torch.float32), ("top_k", top_k, torch.int32),
                           ("top_p", top_p, torch.float32), ("seeds", seeds, torch.int64),
                           ("offsets", offsets, torch.int64)):
        if t.shape != (B,) or t.dtype != dtype or (B > 1 and t.stride(0) != 1):  # read at t + b
            raise ValueError(f"{name}: expected contiguous {dtype} [{B}], got {t.dtype} {tuple(t.shape)} "
                             f"strides {t.stride()}")
    if B == 0:
        return out
    # logits may be a view with strided rows, out a slice of a larger buffer
    launch(sample_kernel, (B,), (logits, logits.stride(0), temperature, top_k, top_p, seeds, offsets, out, V),
           dict(BLOCK=min(BLOCK, triton.next_power_of_2(V))), num_warps, JIT_DEFAULT_STAGES, aot=aot,
           unaligned=("logits", "out"))
    return out
