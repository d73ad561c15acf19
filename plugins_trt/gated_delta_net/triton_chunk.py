"""Chunked Gated DeltaNet prefill for variable-length batches (chunk size 64): stage 2 and the launcher.

Three launches (after the conv):
1. `triton_chunk_wy.py` (every chunk in parallel): gating, the chunk-local cumulative log2 decay G,
   the inverse norms of q and k, and the WY factors w, u of each chunk;
2. here (sequential over a sequence's chunks, one program per (Dv tile, value head, sequence)): from the
   slot state, for each chunk

       H_c = S                                      the state entering the chunk, stored    [DK, BV]
       Δ   = u - w · S                              the token updates, stored               [BT, BV]
       S  <- 2^(G_L) · S + (k̂ ⊙ 2^(G_L - G))ᵀ · Δ    (G_L: G at the chunk's last token)

   then the final state back to the slot, and optionally S every `snapshot_every` tokens (a multiple
   of 64) into a snapshot buffer. Two products per chunk on the sequential path;
3. `triton_chunk_out.py` (every chunk in parallel): o from H_c, Δ and the raw q, k.

Cost (bf16, per token): stage 1 reads k, v and writes w, u; stage 2 reads w, u, k and writes Δ and,
per chunk, H (HV·DK·DV·2 bytes: 1.5 MB for HV 48, D 128); stage 3 reads q, k, Δ, H and writes o.
About 6 GB for 32768 tokens of Qwen3.5-27B (HK 16, HV 48, D 128), plus the sequential walk of T/64
chunks, two [64 × 128]-sized products each, with HV·DV/BV programs side by side.
Measured there on the H200 (one sequence of 32768): conv 0.83 ms, stage 1 2.3 ms (2 warps; 4.1 ms at
8), stage 2 1.26 ms (2.5 us a chunk), stage 3 1.05 ms; flash-linear-attention's whole prefill 4.3 ms.
Stage 1 is the one to speed up (it recomputes K̂K̂ᵀ for each of a key head's HV/HK value heads, and
spills at 2 warps). A first version fused stage 3 into stage 2 (no H in memory): with five products
per chunk on the sequential path it ran 0.58-0.7x flash-linear-attention at 4k-32k tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atlas.plugins_trt.gated_delta_net.triton_chunk_out import chunk_out_kernel
from atlas.plugins_trt.gated_delta_net.triton_chunk_state_halves import chunk_state_halves_kernel
from atlas.plugins_trt.gated_delta_net.triton_chunk_wy import chunk_wu_kernel, chunk_wy_kernel
from atlas.plugins_trt.gated_delta_net.triton_chunk_wy_sliced import chunk_wy_sliced_kernel
from atlas.plugins_trt.launch import JIT_DEFAULT_STAGES, launch

CHUNK = 64


@triton.jit
def chunk_state_kernel(
    k, stride_k,          # [total_T, HK*DK] keys after the conv (raw); row stride in elements
    w, u, G, RK,          # stage 1: [total_T, HV, DK], [total_T, HV, DV], fp32 [total_T, HV], [total_T, HK]
    cu_seqlens,           # int32 [N+1]
    slots,                # int32 [N] (distinct); negative = skipped
    chunk_first,          # int32 [N]: index of each sequence's first chunk in H
    state,                # [num_slots, HV, DK, DV]: read at the start, overwritten with the final state
    H,                    # [NT, HV, DK, DV] out: the state entering each chunk (dtype of H)
    dv,                   # [total_T, HV, DV] out: the token updates Δ
    snaps,                # [num_snaps, HV, DK, DV] (SNAPSHOT): state after every snap_every tokens
    snap_first,           # int32 [N]: index in snaps of each sequence's first snapshot
    snap_every,           # tokens between snapshots, a multiple of BT
    HK: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BT: tl.constexpr, BV: tl.constexpr, SNAPSHOT: tl.constexpr,
    DOT_PREC: tl.constexpr,  # "tf32" (bf16 operands ignore it) or "ieee" for fp32 activations
    ACC_DOT: tl.constexpr = False,  # fla's form: keys loaded as [DK, BT], the update accumulated into S by the dot
):
    iv, h, n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slots + n).to(tl.int64)
    if slot < 0:
        return
    bos = tl.load(cu_seqlens + n).to(tl.int64)
    T = tl.load(cu_seqlens + n + 1) - bos
    c0 = tl.load(chunk_first + n).to(tl.int64)
    kh = h // (HV // HK)
    ot = tl.arange(0, BT)
    ck = tl.arange(0, DK)
    cv = iv * BV + tl.arange(0, BV)
    tile = ck[:, None] * DV + cv[None, :]  # int32 offsets of this program's [DK, BV] tile in a head's state
    S = tl.load(state + (slot * HV + h) * (DK * DV) + tile).to(tl.float32)  # S: [DK, BV]
    dt = k.dtype.element_ty
    k_rows = ot[:, None] * stride_k + ck[None, :]  # int32 offsets from a chunk's first row
    w_rows = ot[:, None] * (HV * DK) + ck[None, :]
    u_rows = ot[:, None] * (HV * DV) + cv[None, :]
    for c in range(tl.cdiv(T, BT)):
        t0 = c * BT
        r0 = bos + t0  # int64 first row of the chunk; per-element offsets stay int32
        valid = t0 + ot < T
        vm = valid[:, None]
        kr = tl.load(k + r0 * stride_k + kh * DK + k_rows, mask=vm, other=0.0).to(dt)  # kr: [BT, DK]
        wc = tl.load(w + (r0 * HV + h) * DK + w_rows, mask=vm, other=0.0).to(dt)
        uc = tl.load(u + (r0 * HV + h) * DV + u_rows, mask=vm, other=0.0).to(tl.float32)
        rk = tl.load(RK + (r0 + ot) * HK + kh, mask=valid, other=0.0)
        g = tl.load(G + (r0 + ot) * HV + h, mask=valid, other=0.0)
        g_last = tl.load(G + (bos + tl.minimum(t0 + BT, T) - 1) * HV + h)
        Sd = S.to(dt)
        tl.store(H + ((c0 + c) * HV + h) * (DK * DV) + tile, S.to(H.dtype.element_ty))
        delta = uc - tl.dot(wc, Sd, input_precision=DOT_PREC)  # delta: [BT, BV]
        tl.store(dv + (r0 * HV + h) * DV + u_rows, delta.to(dv.dtype.element_ty), mask=vm)
        decay = tl.where(valid, tl.exp2(g_last - g), 0.0) * rk
        if ACC_DOT:  # the default (launch_chunk_gdn state_acc_dot)
            kt = tl.load(k + r0 * stride_k + kh * DK + ck[:, None] + ot[None, :] * stride_k, mask=valid[None, :],
                         other=0.0).to(dt)  # [DK, BT]
            S = tl.dot(kt, (delta * decay[:, None]).to(dt), S * tl.exp2(g_last), input_precision=DOT_PREC)
        else:
            S = S * tl.exp2(g_last) + tl.dot(tl.trans(kr), (delta * decay[:, None]).to(dt),
                                             input_precision=DOT_PREC)
        if SNAPSHOT:
            end = t0 + BT
            if (end % snap_every == 0) & (end <= T):
                idx = (tl.load(snap_first + n) + end // snap_every - 1).to(tl.int64)
                tl.store(snaps + (idx * HV + h) * (DK * DV) + tile, S.to(snaps.dtype.element_ty))
    tl.debug_barrier()  # every thread has read its part of the initial state before it is overwritten
    tl.store(state + (slot * HV + h) * (DK * DV) + tile, S.to(state.dtype.element_ty))


# ---------------------------------------------------------------------------------------------- launcher


def prepare_chunks(cu_seqlens: list[int], BT: int = CHUNK) -> torch.Tensor:
    """int32 [NT, 2]: (sequence, chunk index) of every chunk, for stage 1's grid. Host-side metadata."""
    out = [(n, c) for n in range(len(cu_seqlens) - 1)
           for c in range(triton.cdiv(cu_seqlens[n + 1] - cu_seqlens[n], BT))]
    return torch.tensor(out, dtype=torch.int32).view(-1, 2)


def pick_bv(DV: int) -> int:
    """Dv tile of stage 2: 64 (H200, Qwen3.5-27B, one sequence of 32768 tokens, `python -m atlas.tools.bench_gdn
    --stages 32768` → tools/results/gdn_stages_32768.json: the accumulating form at BV 64 / 4 warps / 3 stages
    842 us, at BV 32 1296 us, though BV 64 gives only 96 programs to 132 SMs: the pipelined loads matter more)."""
    return min(64, DV)


def chunk_plan(cu_seqlens_host: list[int], device, BT: int = CHUNK) -> dict:
    """Host-side metadata of one packed batch: `chunks` int32 [NT, 2] (sequence, chunk), sequence-major,
    and `chunk_first` int32 [N] (each sequence's first chunk). Build it outside graph capture."""
    counts = [triton.cdiv(cu_seqlens_host[i + 1] - cu_seqlens_host[i], BT) for i in range(len(cu_seqlens_host) - 1)]
    first = [sum(counts[:i]) for i in range(len(counts))]
    return {"chunks": prepare_chunks(cu_seqlens_host, BT).to(device),
            "chunk_first": torch.tensor(first, dtype=torch.int32, device=device)}


def padded_chunk_plan(num_seqs: int, max_len: int, device, BT: int = CHUNK) -> dict:
    """A chunk plan from host sizes only, for a batch whose lengths stay on the device (the GPU step): every
    sequence gets M = cdiv(max_len, BT) chunk rows, sequence n's chunk c at row n·M + c (`chunks` int32
    [num_seqs·M, 2], `chunk_first` int32 [num_seqs] = n·M). Rows past a sequence's end are empty chunks: every
    stage masks its rows by the tokens left (none), so they write nothing; stage 2 walks only the real ones.
    max_len: the longest sequence or any bound on it. Costs (M - own chunks) idle programs a sequence."""
    M = triton.cdiv(max_len, BT)
    i = torch.arange(num_seqs * M, dtype=torch.int32, device=device)
    return {"chunks": torch.stack((i // M, i % M), dim=1),
            "chunk_first": torch.arange(num_seqs, dtype=torch.int32, device=device) * M}


WY_SLICE = 32
"""Column slice of the default stage 1 (chunk_wy_sliced_kernel), at 2 warps: the setting of the end-to-end prefill
times in tools/results/gdn.json. Per launch 1 warp is faster (1432 us against 1612, 27B, T 32768,
tools/results/gdn_stages_32768.json); bench_gdn times it end to end as the form "wy_w1"."""
STATE_STAGES = 3
"""num_stages of stage 2 (the software pipeline of its key / w / u loads). Same file, BV 64: the plain form 1330 us
at 2 stages, 966 at 3, 888 at 4; the accumulating form (the default) 842 at 3."""


def launch_chunk_gdn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                     A_log: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor, slots: torch.Tensor,
                     cu_seqlens: torch.Tensor, cu_seqlens_host: list[int] | None = None,
                     snapshot_every: int = 0, snapshots: torch.Tensor | None = None,
                     out: torch.Tensor | None = None, work: dict | None = None, BV: int | None = None,
                     BV_out: int = 64, num_warps: tuple[int, int, int] = (2, 4, 4), num_stages: int = STATE_STAGES,
                     split_wy: bool = False, wu_warps: int = 4, reload_k: bool = False, wy_slice: int = WY_SLICE,
                     wy_warps: int | None = None, wy_inverse: bool = False, state_acc_dot: bool = True,
                     state_halves: bool = False, out_heads: bool = False, out_head_stages: int = 2, aot=None):
    """Chunked prefill of N packed sequences from their slot states; final states written back.

    q, k: [total_T, HK*DK]; v: [total_T, HV*DV] (views into the conv output are fine: any row stride);
    a, b: [total_T, HV] raw gate inputs (one row stride); A_log, dt_bias [HV]; state
    [num_slots, HV, DK, DV]; slots int32 [N] (distinct); cu_seqlens int32 [N+1] and its host copy.
    snapshot_every > 0 (a multiple of 64): also returns the states after every snapshot_every tokens of
    each sequence, [sum_n floor(T_n / snapshot_every), HV, DK, DV], sequence by sequence.
    work: preallocated buffers for graph capture ("chunks", "chunk_first" from `chunk_plan` or `padded_chunk_plan`;
    "w", "u", "G", "RQ", "RK", "H", "dv"; whatever is missing is allocated and added to it). num_warps: of the
    three stages. Stage 1 is chunk_wy_sliced_kernel (keys and values wy_slice = 32 columns at a time, at wy_warps
    or num_warps[0] = 2 warps): the fastest stage-1 form in all six prefill cases of the H200 benchmark
    (tools/results/gdn.json). wy_slice = 0, split_wy or reload_k: the kernel holding whole key tiles instead.
    Stage 2 (num_stages, BV = pick_bv): state_acc_dot, flash-linear-attention's form (keys loaded transposed, the
    state update accumulated by the dot: 842 us against 966 for the other form at the same tile, 27B T 32768);
    state_halves: stage 2 as triton_chunk_state_halves (fla's layout of the work, DK 128; 880 us). wy_inverse: the
    sliced stage 1 inverts its diagonal 16 x 16 blocks by products (inv_unit_lower) instead of forward substitution
    (1596 us at 2 warps, 2622 at 1). split_wy: stage 1 as two launches (chunk_wy_kernel writes X = (I + A)^{-1}
    into work["X"] [total_T, HV, 64], chunk_wu_kernel at wu_warps makes w and u from it); same values as the fused
    stage 1. reload_k: the fused stage 1 loads its key tiles again for w instead of holding them. out_heads: stage 3
    with one program per key head, q kᵀ computed once for its value heads (a loop pipelined out_head_stages deep;
    untimed).
    aot: None (JIT), the engine's AotKernels, or the build's KernelRecorder (atlas.plugins_trt.launch).
    Host reads: cu_seqlens_host (or cu_seqlens.tolist(), a device sync) is needed only to make the chunk plan and the
    snapshot offsets; with work["chunks"] and work["chunk_first"] given (padded_chunk_plan) and no snapshots, nothing
    is read from the device (the GPU step).
    Returns (o [total_T, HV, DV] in q's dtype, snapshots or None).
    """
    total_T = q.shape[0]
    _, HV, DK, DV = state.shape
    HK = q.shape[1] // DK
    N = slots.numel()
    work = {} if work is None else work
    cu = None  # the lengths on the host: read only where the plan or the snapshots need them
    if "chunks" not in work or snapshot_every:
        cu = cu_seqlens_host if cu_seqlens_host is not None else [int(t) for t in cu_seqlens.tolist()]
    if snapshot_every and snapshot_every % CHUNK:
        raise ValueError(f"snapshot_every={snapshot_every} must be a multiple of the chunk size {CHUNK}")
    if a.stride(0) != b.stride(0):
        raise ValueError(f"a and b need one row stride, got {a.stride(0)} and {b.stride(0)}")
    dev, dt = q.device, q.dtype
    if "chunks" not in work:
        work.update(chunk_plan(cu, dev))
    NT = work["chunks"].shape[0]
    shapes = {"w": ((total_T, HV, DK), dt), "u": ((total_T, HV, DV), dt), "G": ((total_T, HV), torch.float32),
              "RQ": ((total_T, HK), torch.float32), "RK": ((total_T, HK), torch.float32),
              "H": ((NT, HV, DK, DV), dt), "dv": ((total_T, HV, DV), dt)}
    if split_wy:
        shapes["X"] = ((total_T, HV, CHUNK), dt)
    for name, (shape, dtype) in shapes.items():
        if name not in work:
            work[name] = torch.empty(shape, dtype=dtype, device=dev)
    o = torch.empty((total_T, HV, DV), dtype=dt, device=dev) if out is None else out
    snap_first = slots
    if snapshot_every:
        counts = [(cu[i + 1] - cu[i]) // snapshot_every for i in range(N)]
        snap_first = torch.tensor([sum(counts[:i]) for i in range(N)], dtype=torch.int32, device=dev)
        if snapshots is None:
            snapshots = torch.empty((sum(counts), HV, DK, DV), dtype=state.dtype, device=dev)
    if NT == 0:
        return o, snapshots
    # fp32 activations (tests) get fp32 products; bf16 ones run bf16 tensor-core products either way
    prec = "ieee" if dt == torch.float32 else "tf32"
    W = work
    # k, v, a and b are column views (of the conv output, of the in_proj output) at any offset; q is column 0 of the
    # conv output and every other buffer its own allocation (as the signature_chunk_* functions below compile them)
    views = ("k", "v", "a", "b")
    if wy_slice and not (split_wy or reload_k):
        launch(chunk_wy_sliced_kernel, (NT, HV),
               (q, q.stride(0), k, k.stride(0), v, v.stride(0), a, b, a.stride(0), A_log, dt_bias, cu_seqlens,
                W["chunks"], W["w"], W["u"], W["G"], W["RQ"], W["RK"]),
               dict(HK=HK, HV=HV, DK=DK, DV=DV, BT=CHUNK, BC=CHUNK // 4, BK=min(wy_slice, DK, DV), DOT_PREC=prec,
                    INV=wy_inverse),
               wy_warps or num_warps[0], JIT_DEFAULT_STAGES, aot=aot, unaligned=views)
    else:
        launch(chunk_wy_kernel, (NT, HV),
               (q, q.stride(0), k, k.stride(0), v, v.stride(0), a, b, a.stride(0), A_log, dt_bias, cu_seqlens,
                W["chunks"], W["w"], W["u"], W["G"], W["RQ"], W["RK"], W["X"] if split_wy else W["w"]),
               dict(HK=HK, HV=HV, DK=DK, DV=DV, BT=CHUNK, BC=CHUNK // 4, DOT_PREC=prec, STORE_X=split_wy,
                    RELOAD_K=reload_k),
               num_warps[0], JIT_DEFAULT_STAGES, aot=aot, unaligned=views)
    if split_wy:
        launch(chunk_wu_kernel, (NT, HV),
               (k, k.stride(0), v, v.stride(0), a, b, a.stride(0), A_log, dt_bias, cu_seqlens, W["chunks"], W["X"],
                W["G"], W["RK"], W["w"], W["u"]),
               dict(HK=HK, HV=HV, DK=DK, DV=DV, BT=CHUNK, DOT_PREC=prec),
               wu_warps, JIT_DEFAULT_STAGES, aot=aot, unaligned=views)
    BV = BV or pick_bv(DV)
    state_fn = chunk_state_halves_kernel if state_halves else chunk_state_kernel
    extra = {} if state_halves else {"ACC_DOT": state_acc_dot}
    launch(state_fn, (DV // BV, HV, N),
           (k, k.stride(0), W["w"], W["u"], W["G"], W["RK"], cu_seqlens, slots, W["chunk_first"], state, W["H"],
            W["dv"], snapshots if snapshot_every else state, snap_first, max(snapshot_every, 1)),
           dict(HK=HK, HV=HV, DK=DK, DV=DV, BT=CHUNK, BV=BV, SNAPSHOT=bool(snapshot_every), DOT_PREC=prec, **extra),
           num_warps[1], num_stages, aot=aot, unaligned=("k",))
    BVo = min(BV_out, DV)
    launch(chunk_out_kernel, (NT, HK if out_heads else HV, DV // BVo),
           (q, q.stride(0), k, k.stride(0), W["G"], W["RQ"], W["RK"], cu_seqlens, W["chunks"], W["H"], W["dv"], o,
            o.stride(0)),
           dict(HK=HK, HV=HV, DK=DK, DV=DV, BT=CHUNK, BV=BVo, DOT_PREC=prec, HEADS=out_heads,
                HEAD_STAGES=out_head_stages),
           num_warps[2], JIT_DEFAULT_STAGES, aot=aot, unaligned=("k",))
    return o, snapshots


# ---------------------------------------------------------------------------------------------- AOT signatures
# q is column 0 of the conv output (aligned); k, v, a, b are column views (not assumed aligned). Grids:
# chunk_wy (NT, HV); chunk_state (DV // BV, HV, N); chunk_out (NT, HV, DV // BV). DOT_PREC "tf32" (bf16 operands).


def signature_chunk_wy(HK: int, HV: int, DK: int, DV: int, *, num_warps: int = 2, num_stages: int = 3,
                       act: str = "*bf16", dot_prec: str = "tf32", store_x: bool = False, reload_k: bool = False):
    from atlas.plugins_trt.gated_delta_net.triton_common import aot_signature_of

    P, F, I, i32 = act, "*fp32", "*i32", "i32"
    types = dict(q=P, stride_q=i32, k=P, stride_k=i32, v=P, stride_v=i32, a=P, b=P, stride_ab=i32, A_log=F,
                 dt_bias=F, cu_seqlens=I, chunks=I, w=P, u=P, G=F, RQ=F, RK=F, X=P)
    const = dict(HK=HK, HV=HV, DK=DK, DV=DV, BT=CHUNK, BC=CHUNK // 4, DOT_PREC=dot_prec, STORE_X=store_x,
                 RELOAD_K=reload_k)
    return aot_signature_of(chunk_wy_kernel, types, const, num_warps, num_stages, unaligned=("k", "v", "a", "b"))


def signature_chunk_wy_sliced(HK: int, HV: int, DK: int, DV: int, *, BK: int = 32, num_warps: int = 4,
                              num_stages: int = 2, act: str = "*bf16", dot_prec: str = "tf32", inverse: bool = False):
    """chunk_wy_sliced_kernel: stage 1 taking keys and values BK columns at a time."""
    from atlas.plugins_trt.gated_delta_net.triton_common import aot_signature_of

    P, F, I, i32 = act, "*fp32", "*i32", "i32"
    types = dict(q=P, stride_q=i32, k=P, stride_k=i32, v=P, stride_v=i32, a=P, b=P, stride_ab=i32, A_log=F,
                 dt_bias=F, cu_seqlens=I, chunks=I, w=P, u=P, G=F, RQ=F, RK=F)
    const = dict(HK=HK, HV=HV, DK=DK, DV=DV, BT=CHUNK, BC=CHUNK // 4, BK=min(BK, DK, DV), DOT_PREC=dot_prec,
                 INV=inverse)
    return aot_signature_of(chunk_wy_sliced_kernel, types, const, num_warps, num_stages,
                            unaligned=("k", "v", "a", "b"))


def signature_chunk_wu(HK: int, HV: int, DK: int, DV: int, *, num_warps: int = 4, num_stages: int = 2,
                       act: str = "*bf16", dot_prec: str = "tf32"):
    """chunk_wu_kernel, the second launch of the split stage 1 (after signature_chunk_wy(..., store_x=True))."""
    from atlas.plugins_trt.gated_delta_net.triton_common import aot_signature_of

    P, F, I, i32 = act, "*fp32", "*i32", "i32"
    types = dict(k=P, stride_k=i32, v=P, stride_v=i32, a=P, b=P, stride_ab=i32, A_log=F, dt_bias=F, cu_seqlens=I,
                 chunks=I, X=P, G=F, RK=F, w=P, u=P)
    const = dict(HK=HK, HV=HV, DK=DK, DV=DV, BT=CHUNK, DOT_PREC=dot_prec)
    return aot_signature_of(chunk_wu_kernel, types, const, num_warps, num_stages, unaligned=("k", "v", "a", "b"))


def signature_chunk_state(HK: int, HV: int, DK: int, DV: int, *, BV: int, snapshot: bool = False,
                          num_warps: int = 4, num_stages: int = STATE_STAGES, act: str = "*bf16",
                          state: str = "*fp32", dot_prec: str = "tf32", halves: bool = False, acc_dot: bool = True):
    from atlas.plugins_trt.gated_delta_net.triton_common import aot_signature_of

    P, F, I, i32 = act, "*fp32", "*i32", "i32"
    types = dict(k=P, stride_k=i32, w=P, u=P, G=F, RK=F, cu_seqlens=I, slots=I, chunk_first=I, state=state,
                 H=P, dv=P, snaps=state, snap_first=I, snap_every=i32)
    const = dict(HK=HK, HV=HV, DK=DK, DV=DV, BT=CHUNK, BV=BV, SNAPSHOT=snapshot, DOT_PREC=dot_prec)
    if halves:  # triton_chunk_state_halves (fla's layout of the work)
        return aot_signature_of(chunk_state_halves_kernel, types, const, num_warps, num_stages, unaligned=("k",))
    return aot_signature_of(chunk_state_kernel, types, {**const, "ACC_DOT": acc_dot}, num_warps, num_stages,
                            unaligned=("k",))


def signature_chunk_out(HK: int, HV: int, DK: int, DV: int, *, BV: int, num_warps: int = 4, num_stages: int = 3,
                        act: str = "*bf16", dot_prec: str = "tf32", heads: bool = False, head_stages: int = 2):
    from atlas.plugins_trt.gated_delta_net.triton_common import aot_signature_of

    P, F, I, i32 = act, "*fp32", "*i32", "i32"
    types = dict(q=P, stride_q=i32, k=P, stride_k=i32, G=F, RQ=F, RK=F, cu_seqlens=I, chunks=I, H=P, dv=P, o=P,
                 stride_o=i32)
    const = dict(HK=HK, HV=HV, DK=DK, DV=DV, BT=CHUNK, BV=BV, DOT_PREC=dot_prec, HEADS=heads, HEAD_STAGES=head_stages)
    return aot_signature_of(chunk_out_kernel, types, const, num_warps, num_stages, unaligned=("k",))
