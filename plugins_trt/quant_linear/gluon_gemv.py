"""NVFP4 GEMV for M = 1..16 in Gluon: mma.sync m16n8k16 with the weights decoded straight into the A-operand registers
(swap-AB: acc[BLOCK_N, MP] += W[BLOCK_N, BLOCK_K] @ x^T[BLOCK_K, MP], MP = 8 or 16 rows of x, zero-padded).

A drop-in for `triton_gemv.nvfp4_gemv_kernel` (same parameters, grid and outputs: the build times it as one more way,
configs with "GLUON": True), written in Gluon because the Triton GEMVs lose either the instruction count (CUDA
cores: ~4.6 instructions a weight element, issue-bound at 0.47-0.58 of the copy bandwidth on the H200) or the
layout (tensor cores: the decoded tile goes through shared memory, or the loads lose their width). Here every
layout is written out (`gl.DistributedLinearLayout`) and every layout change is `convert_layout(...,
assert_trivial=True)`, so the compiler refuses any data movement between threads:

  * k is permuted inside each BLOCK_K block, the same way for the weights and for x (a dot product does not
    care): the thread owning quarter i of a block holds, for mma k-tile r, logical k = 16r + 2i + {0, 1, 8, 9},
    stored at physical k' = (BLOCK_K/4)·i + 4r + {0, 1, 2, 3}. Each thread then reads BLOCK_K/32 contiguous int32
    words a row and BLOCK_K/4 contiguous x values (16-byte loads), and word j = (BLOCK_K/32)·i + r // 2 holds
    exactly its elements.
  * one PTX op per bf16x2 pair (the shl shared by a word's 4 pairs, prmt, shr, and, a bf16x2 multiply by the
    block scale: 17 instructions a word), returning int32 so that the reorder into the A operand's register
    order renames 32-bit values; a final mov reinterprets them as bf16 pairs.
  * sm_90 SASS (compiled on the CPU, `python -m atlas.tools.dev.nvfp4_gluon_gemv --sass`): 2.66-3.6 instructions a
    weight element in the loop, no shared memory, no spills; the latency-hiding forms (PIPE 2: registers two deep,
    3.06-3.41 now that only raw 32-bit words cross the loop; PIPE 3 / 4: cp.async stages through shared memory,
    2.9-3.4) are candidates beside it.

Gluon kernels cannot run in Triton's interpreter; the GPU check is `python -m atlas.tools.dev.nvfp4_gluon_gemv`
and the GPU tests of test_quant_linear_triton.py.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from atlas.plugins_trt.quant_linear.triton_gemv import _PAIR_SEL

S_UP = gl.constexpr(2.0 ** 118)  # decoded value = E2M1 * scale * 2^-8 (as in triton_gemv.nvfp4_tile_bf16)
_SEL = _PAIR_SEL  # prmt selectors: byte i of q = w << 4 and of w, with the sign replicated


@gluon.jit
def _gdc_wait():
    """griddepcontrol.wait (as triton.language.extra.cuda.gdc_wait)."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _gdc_launch_dependents():
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


def _pair_asm(i: int) -> str:
    """int32 word w, bf16 scale S -> the bf16x2 of nibbles 2i, 2i + 1 (E2M1 * S * 2^-126) as int32."""
    return ("{ .reg .b32 q, p, s2; shl.b32 q, $1, 4; mov.b32 s2, {$2, $2}; prmt.b32 p, q, $1, " + _SEL[i] + "; "
            "shr.s32 p, p, 6; and.b32 p, p, 0x81C081C0; mul.rn.bf16x2 $0, p, s2; }")


P0, P1, P2, P3 = (gl.constexpr(_pair_asm(i)) for i in range(4))


def _bits_pair_asm(i: int) -> str:
    """The same bf16x2 as _pair_asm(i) from a word in layout.NVFP4_BITS order (layout.bits_nvfp4): the pair's signs
    sit `a` bits below bits 31 / 15 and its magnitudes `b` bits below 24..22 / 8..6 (b < 0: above), so a pair is one
    or two shifts (left shifts run on the FMA pipe as IMAD) and one or two masks: 7 integer-pipe (ALU) operations a
    word instead of 13 (prmt, arithmetic shift and mask a pair)."""
    from atlas.plugins_trt.quant_linear.layout import NVFP4_BITS
    a, b = NVFP4_BITS[i]
    shift = lambda r, k: f"shl.b32 {r}, $1, {k};" if k > 0 else f"shr.u32 {r}, $1, {-k};" if k < 0 \
        else f"mov.b32 {r}, $1;"  # noqa: E731
    body = (shift("t", a) + " and.b32 p, t, 0x81C081C0;") if a == b else (
        shift("t", a) + " " + shift("u", b) + " and.b32 t, t, 0x80008000; and.b32 u, u, 0x01C001C0; or.b32 p, t, u;")
    return "{ .reg .b32 t, u, p, s2; " + body + " mov.b32 s2, {$2, $2}; mul.rn.bf16x2 $0, p, s2; }"


Q0, Q1, Q2, Q3 = (gl.constexpr(_bits_pair_asm(i)) for i in range(4))
UNPACK = gl.constexpr("mov.b32 $0, $1;")


@gluon.constexpr_function
def words_layout(BN, KW, NW, HALF):
    """int32 words [BN, KW] (row n, word j; HALF: one entry a word pair, [BN, KW / 2], for the block scales):
    registers walk the thread's contiguous words, then row n + 8 and the row repeats; lanes 0-1 pick the quarter
    of the block, lanes 2-4 and the warps the rows (those of the mma A operand)."""
    BN, KW, NW, HALF = (getattr(v, "value", v) for v in (BN, KW, NW, HALF))
    RP = KW // 4 // (2 if HALF else 1)
    reg = [[0, 1 << b] for b in range(RP.bit_length() - 1)] + [[8, 0]] + [
        [16 * NW << b, 0] for b in range((BN // (16 * NW)).bit_length() - 1)]
    return gl.DistributedLinearLayout(reg_bases=reg, lane_bases=[[0, RP], [0, 2 * RP], [1, 0], [2, 0], [4, 0]],
                                      warp_bases=[[16 << b, 0] for b in range(NW.bit_length() - 1)], block_bases=[],
                                      shape=[BN, KW // (2 if HALF else 1)])


@gluon.constexpr_function
def pairs_layout(BN, BK, NW):
    """The A operand's layout without its k + 1 basis: int32 [BN, BK/2], each the bf16x2 of (k, k + 1)."""
    BN, BK, NW = (getattr(v, "value", v) for v in (BN, BK, NW))
    reg = [[8, 0]] + [[0, 4 << b] for b in range((BK // 8).bit_length() - 1)] + [
        [16 * NW << b, 0] for b in range((BN // (16 * NW)).bit_length() - 1)]
    return gl.DistributedLinearLayout(reg_bases=reg, lane_bases=[[0, 1], [0, 2], [1, 0], [2, 0], [4, 0]],
                                      warp_bases=[[16 << b, 0] for b in range(NW.bit_length() - 1)], block_bases=[],
                                      shape=[BN, BK // 2])


@gluon.constexpr_function
def x_layout(BK, MP, NW):
    """x [MP, BK] in physical order: lane l holds row l // 4 (and + 8 for MP 16) and the contiguous quarter l % 4
    of the block; the warps replicate it."""
    BK, MP, NW = (getattr(v, "value", v) for v in (BK, MP, NW))
    q = BK // 4
    reg = [[0, 1 << b] for b in range(q.bit_length() - 1)] + ([[8, 0]] if MP == 16 else [])
    return gl.DistributedLinearLayout(reg_bases=reg, lane_bases=[[0, q], [0, 2 * q], [1, 0], [2, 0], [4, 0]],
                                      warp_bases=[[0, 0]] * (NW.bit_length() - 1), block_bases=[], shape=[MP, BK])


@gluon.constexpr_function
def x_pairs_layout(BK, MP, NW):
    """x as int32 bf16 pairs [MP, BK/2], physical order: x_layout without its k + 1 basis (the pair's two halves)."""
    BK, MP, NW = (getattr(v, "value", v) for v in (BK, MP, NW))
    q = BK // 8
    reg = [[0, 1 << b] for b in range(q.bit_length() - 1)] + ([[8, 0]] if MP == 16 else [])
    return gl.DistributedLinearLayout(reg_bases=reg, lane_bases=[[0, q], [0, 2 * q], [1, 0], [2, 0], [4, 0]],
                                      warp_bases=[[0, 0]] * (NW.bit_length() - 1), block_bases=[], shape=[MP, BK // 2])


@gluon.constexpr_function
def mma_layouts(BN, BK, MP, NW):
    """The swap-AB mma.sync kernels' layouts: (accumulator, A operand, B operand, words, scales, pairs, x)."""
    BN, BK, MP, NW = (getattr(v, "value", v) for v in (BN, BK, MP, NW))
    mma = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1], instr_shape=[16, 8])
    layouts = (mma, gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2),
               gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2), words_layout(BN, BK // 8, NW, False),
               words_layout(BN, BK // 8, NW, True), pairs_layout(BN, BK, NW), x_layout(BK, MP, NW))
    return gl.tuple([gl.constexpr(v) for v in layouts])  # a tuple of constexprs, unpacked in the kernels


@gluon.constexpr_function
def copy_layouts(BK, NW):
    """cp.async copy layouts of one block: (words: 4 int32 = 16 bytes a thread, scales: 4 bytes, x: 8 bf16)."""
    BK, NW = (getattr(v, "value", v) for v in (BK, NW))
    KW = BK // 8
    layouts = (gl.BlockedLayout([1, 4], [32 // (KW // 4), KW // 4], [NW, 1], [1, 0]),
               gl.BlockedLayout([1, 4], [32 // (KW // 8), KW // 8], [NW, 1], [1, 0]),
               gl.BlockedLayout([1, 8], [32 // (BK // 8), BK // 8], [NW, 1], [1, 0]))
    return gl.tuple([gl.constexpr(v) for v in layouts])


@gluon.jit
def _x_unpack(xw, BK: gl.constexpr, MP: gl.constexpr, xL: gl.constexpr):
    """int32 bf16 pairs [MP, BK/2] -> bf16 [MP, BK] in x_layout (a register rename: low half = even k)."""
    u = gl.inline_asm_elementwise(UNPACK, "=r,r,r", [gl.join(xw, xw)], dtype=gl.bfloat16, is_pure=True, pack=2)
    return gl.convert_layout(gl.reshape(u, [MP, BK]), xL, assert_trivial=True)


@gluon.jit
def _pair(wd, sc, ASM: gl.constexpr):
    return gl.inline_asm_elementwise(ASM, "=r,r,h", [wd, sc], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _scales(sr, BN: gl.constexpr, KW: gl.constexpr, wL: gl.constexpr):
    """e4m3 block scales [BN, KW/2] -> bf16 scale * 2^118, one a word [BN, KW] (exact: 4 significant bits)."""
    sc = (sr.to(gl.float32) * S_UP).to(gl.bfloat16)
    return gl.convert_layout(gl.reshape(gl.join(sc, sc), [BN, KW]), wL, assert_trivial=True)


@gluon.jit
def _x_operand(xv, BK: gl.constexpr, MP: gl.constexpr, RP: gl.constexpr, bL: gl.constexpr):
    """x [MP, BK] in physical order (i1, i0, rhi, r0, s1, s0) -> the B operand [BK, MP] in logical k order."""
    xv = gl.permute(gl.reshape(xv, [MP, 2, 2, RP, 2, 2, 2]), [3, 4, 5, 1, 2, 6, 0])  # rhi, r0, s1, i1, i0, s0, m
    return gl.convert_layout(gl.reshape(xv, [BK, MP]), bL, assert_trivial=True)


@gluon.jit
def _block(acc, wd, sc, b, BN: gl.constexpr, BK: gl.constexpr, RP: gl.constexpr, pL: gl.constexpr,
           aL: gl.constexpr, BITS: gl.constexpr = False):
    """acc += W_block @ x_block^T from one block's words wd [BN, KW], scales sc (_scales) and B operand b."""
    return mma_v2(_a_operand(wd, sc, BN, BK, RP, pL, aL, BITS), b, acc)


@gluon.jit
def _a_operand(wd, sc, BN: gl.constexpr, BK: gl.constexpr, RP: gl.constexpr, pL: gl.constexpr, aL: gl.constexpr,
               BITS: gl.constexpr = False):
    """One block's decoded weights [BN, BK] (bf16, logical k order) in the A-operand layout aL (BITS: words in
    layout.NVFP4_BITS order)."""
    if BITS:
        p0 = _pair(wd, sc, Q0)
        p1 = _pair(wd, sc, Q1)
        p2 = _pair(wd, sc, Q2)
        p3 = _pair(wd, sc, Q3)
    else:
        p0 = _pair(wd, sc, P0)
        p1 = _pair(wd, sc, P1)
        p2 = _pair(wd, sc, P2)
        p3 = _pair(wd, sc, P3)
    t = gl.join(gl.join(p0, p2), gl.join(p1, p3))   # int32 [BN, KW, c, b] = pair 2c + b (join stacks on the last axis)
    t = gl.reshape(t, [BN, 2, 2, RP, 2, 2])         # n, i1, i0, rhi, r0, s1 (k = s0 + 2i0 + 4i1 + 8s1 + 16r0 + 32rhi)
    t = gl.permute(t, [0, 3, 4, 5, 1, 2])            # n, rhi, r0, s1, i1, i0
    t = gl.convert_layout(gl.reshape(t, [BN, BK // 2]), pL, assert_trivial=True)  # 32-bit values renamed
    u = gl.inline_asm_elementwise(UNPACK, "=r,r,r", [gl.join(t, t)], dtype=gl.bfloat16, is_pure=True, pack=2)
    return gl.convert_layout(gl.reshape(u, [BN, BK]), aL, assert_trivial=True)


@gluon.jit
def _row_ptrs(w_ptr, ws_ptr, rows, srows, cols, scols, K, stride_wn, stride_sn, BK: gl.constexpr,
              TILED: gl.constexpr):
    """Pointers to block 0 of the given rows: int32 words [R, KW] and scale bytes [R, KW / 2] (tiled: layout.py's
    row_part + col_part; a block of BK <= 128 lies in one tile row, so its columns stay plain)."""
    if TILED:
        wp = w_ptr.to(gl.pointer_type(gl.int32)) + ((rows // 128) * (K // 128) * 2048 + (rows % 128) * 16)[:, None]
        sp = ws_ptr + ((srows // 128) * (K // 128) * 1024 + (srows % 128) * 8)[:, None]
        if BK > 128:
            wp = wp + ((cols // 16) * 2048 + cols % 16)[None, :]
            sp = sp + ((scols // 8) * 1024 + scols % 8)[None, :]
        else:
            wp = wp + cols[None, :]
            sp = sp + scols[None, :]
    else:
        wp = (w_ptr + rows[:, None] * stride_wn).to(gl.pointer_type(gl.int32)) + cols[None, :]
        sp = ws_ptr + srows[:, None] * stride_sn + scols[None, :]
    return wp, sp


@gluon.jit
def _store_out(acc, cn, cm, pk, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr, stride_rm, stride_om,
               HAS_BIAS: gl.constexpr, HAS_RESIDUAL: gl.constexpr):
    """Epilogue of the NVFP4 Gluon kernels (swap-AB: acc [BN, MP] holds output columns cn of rows cm): times
    2^8 weight_scale_2 (the decode's 2^-8 undone), (+ bias) (+ residual), stored to out_ptr's split pk slice
    (out_ptr + pk M stride_om: the fp32 partials of split-K, or the output itself at pk 0)."""
    y = acc * (gl.load(ws2_ptr + gl.minimum(cn, N - 1)) * 256.0)[:, None]
    mask = (cm < M)[None, :] & (cn < N)[:, None]
    if HAS_BIAS:
        y += gl.load(bias_ptr + cn, mask=cn < N, other=0.0).to(gl.float32)[:, None]
    if HAS_RESIDUAL:
        y += gl.load(res_ptr + cm[None, :] * stride_rm + cn[:, None], mask=mask, other=0.0).to(gl.float32)
    gl.store(out_ptr + pk * M * stride_om + cm[None, :] * stride_om + cn[:, None], y.to(out_ptr.dtype.element_ty),
             mask=mask)


@gluon.jit
def _pre_block(acc, wd, sr, x_rows, kb, b_hi, nb, xmask, BN: gl.constexpr, BK: gl.constexpr, RP: gl.constexpr,
               KW: gl.constexpr, MP: gl.constexpr, wL: gl.constexpr, pL: gl.constexpr, aL: gl.constexpr,
               bL: gl.constexpr, BITS: gl.constexpr = False):
    """One preloaded block (PRE): its x (zero when kb is past the split, so the clamped weights add nothing)."""
    x = gl.load(x_rows + gl.minimum(kb, nb - 1) * BK, mask=xmask & (kb < b_hi), other=0.0)
    return _block(acc, wd, _scales(sr, BN, KW, wL), _x_operand(x, BK, MP, RP, bL), BN, BK, RP, pL, aL, BITS)


@gluon.jit
def _pipelined(acc, w_ptr, ws_ptr, x_ptr, pid, b_lo, b_hi, nb, M, N, stride_wn, stride_sn, stride_xm,
               BN: gl.constexpr, BK: gl.constexpr, MP: gl.constexpr, RP: gl.constexpr, KW: gl.constexpr,
               NW: gl.constexpr, S: gl.constexpr, wL: gl.constexpr, sL: gl.constexpr, pL: gl.constexpr,
               xL: gl.constexpr, aL: gl.constexpr, bL: gl.constexpr, PDL: gl.constexpr):
    """The K loop with words, scales and x copied into S shared-memory slots by cp.async (16-byte words and x,
    4-byte scale groups) S - 1 blocks ahead, read back in the compute layouts after a CTA barrier (the copy and
    read layouts differ for the scales and x). Order a block: wait for its group, barrier (everyone is past the
    previous block's reads), issue block + S - 1 into the slot freed by the previous block, read, compute."""
    shl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])  # [S, rows, cols]: S slots of row-major tiles
    w_s = gl.allocate_shared_memory(gl.int32, [S, BN, KW], shl)
    s_s = gl.allocate_shared_memory(gl.int8, [S, BN, KW // 2], shl)
    x_s = gl.allocate_shared_memory(gl.bfloat16, [S, MP, BK], shl)
    wcL, scL, xcL = copy_layouts(BK, NW)
    wr = gl.minimum(pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, wcL)), N - 1)
    wp = (w_ptr + wr[:, None] * stride_wn).to(gl.pointer_type(gl.int32)) \
        + gl.arange(0, KW, layout=gl.SliceLayout(0, wcL))[None, :]
    sr = gl.minimum(pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, scL)), N - 1)
    sp = (ws_ptr + sr[:, None] * stride_sn).to(gl.pointer_type(gl.int8)) \
        + gl.arange(0, KW // 2, layout=gl.SliceLayout(0, scL))[None, :]
    xr = gl.arange(0, MP, layout=gl.SliceLayout(1, xcL))
    xp = x_ptr + xr[:, None] * stride_xm + gl.arange(0, BK, layout=gl.SliceLayout(0, xcL))[None, :]
    xmask = (xr < M)[:, None]
    for i in gl.static_range(S - 1):  # prologue: weights of blocks b_lo .. b_lo + S - 2 (clamped; an unused one is
        kb = gl.minimum(b_lo + i, nb - 1)  # harmless), issued before the PDL wait: they are nobody's output
        async_copy.async_copy_global_to_shared(w_s.index(i), wp + kb * KW)
        async_copy.async_copy_global_to_shared(s_s.index(i), sp + kb * (BK // 16))
    if PDL:
        _gdc_wait()
    for i in gl.static_range(S - 1):  # their x; group i ends with block i's x (group 0 also holds every prologue
        kb = gl.minimum(b_lo + i, nb - 1)  # weight copy: waiting for it waits a little more than needed, once)
        async_copy.async_copy_global_to_shared(x_s.index(i), xp + kb * BK, mask=xmask)
        async_copy.commit_group()
    for kb in range(b_lo, b_hi):
        it = kb - b_lo
        async_copy.wait_group(S - 2)  # block kb's group (this thread's copies) has landed
        gl.thread_barrier()            # everyone's copies are visible, everyone is past block kb - 1's reads
        nxt = gl.minimum(kb + S - 1, nb - 1)
        slot = (it + S - 1) % S
        async_copy.async_copy_global_to_shared(w_s.index(slot), wp + nxt * KW)
        async_copy.async_copy_global_to_shared(s_s.index(slot), sp + nxt * (BK // 16))
        async_copy.async_copy_global_to_shared(x_s.index(slot), xp + nxt * BK, mask=xmask)
        async_copy.commit_group()
        cur = it % S
        wd = w_s.index(cur).load(wL)
        sc = _scales(s_s.index(cur).load(sL).to(gl.float8e4nv, bitcast=True), BN, KW, wL)
        b = _x_operand(x_s.index(cur).load(xL), BK, MP, RP, bL)
        acc = _block(acc, wd, sc, b, BN, BK, RP, pL, aL)
    async_copy.wait_group(0)
    return acc


@gluon.jit
def _staged(acc, w_ptr, ws_ptr, x_rows, pid, b_lo, b_hi, nb, N, K, stride_wn, stride_sn, wstep, sstep, xmask,
            BN: gl.constexpr, BK: gl.constexpr, MP: gl.constexpr, RP: gl.constexpr, KW: gl.constexpr,
            NW: gl.constexpr, S: gl.constexpr, TILED: gl.constexpr, wL: gl.constexpr, sL: gl.constexpr,
            pL: gl.constexpr, aL: gl.constexpr, bL: gl.constexpr, PDL: gl.constexpr, BITS: gl.constexpr):
    """STAGE: the split's first S blocks of words and scales copied into shared memory by cp.async (16-byte words,
    4-byte scale groups, one commit group a block) before the PDL wait, then read back block by block in the
    compute layouts. The bytes in flight live in shared memory instead of registers (PRE holds them in registers:
    128-192 of them in sm_90 compiles, three programs filling an SM's register file), so a program needs few registers
    and, in a PDL chain, the next kernel's programs fit beside this kernel's and stream their weights while this one
    decodes. x (the previous kernel's output) is loaded after the wait, one block ahead. Blocks past the split are
    clamped copies that meet x = 0."""
    shl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    w_s = gl.allocate_shared_memory(gl.int32, [S, BN, KW], shl)
    s_s = gl.allocate_shared_memory(gl.int8, [S, BN, KW // 2], shl)
    wcL, scL, _ = copy_layouts(BK, NW)
    rows = gl.minimum(pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, wcL)), N - 1)
    srows = gl.minimum(pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, scL)), N - 1)
    wp, sp = _row_ptrs(w_ptr, ws_ptr, rows, srows, gl.arange(0, KW, layout=gl.SliceLayout(0, wcL)),
                       gl.arange(0, KW // 2, layout=gl.SliceLayout(0, scL)), K, stride_wn, stride_sn, BK, TILED)
    sp = sp.to(gl.pointer_type(gl.int8))
    for i in gl.static_range(S):
        kb = gl.minimum(b_lo + i, nb - 1)
        async_copy.async_copy_global_to_shared(w_s.index(i), wp + kb * wstep)
        async_copy.async_copy_global_to_shared(s_s.index(i), sp + kb * sstep)
        async_copy.commit_group()
    if PDL:
        _gdc_wait()
    x = gl.load(x_rows + gl.minimum(b_lo, nb - 1) * BK, mask=xmask & (b_lo < b_hi), other=0.0)
    for i in gl.static_range(S):
        kb = b_lo + i
        if i + 1 < S:  # the next block's x, one block ahead
            x_n = gl.load(x_rows + gl.minimum(kb + 1, nb - 1) * BK, mask=xmask & (kb + 1 < b_hi), other=0.0)
        async_copy.wait_group(S - 1 - i)  # block i's group (this thread's copies) has landed
        gl.thread_barrier()                # and everyone else's
        wd = w_s.index(i).load(wL)
        sc = _scales(s_s.index(i).load(sL).to(gl.float8e4nv, bitcast=True), BN, KW, wL)
        acc = _block(acc, wd, sc, _x_operand(x, BK, MP, RP, bL), BN, BK, RP, pL, aL, BITS)
        if i + 1 < S:
            x = x_n
    return acc


@gluon.jit
def _x_shared(acc, w_rows, s_rows, wstep, sstep, x_ptr, b_lo, b_hi, nb, M, stride_xm, BN: gl.constexpr,
              BK: gl.constexpr, MP: gl.constexpr, RP: gl.constexpr, KW: gl.constexpr, NW: gl.constexpr,
              S: gl.constexpr, wL: gl.constexpr, sL: gl.constexpr, pL: gl.constexpr, xL: gl.constexpr,
              aL: gl.constexpr, bL: gl.constexpr):
    """The K loop with the weights loaded straight into registers (as the plain form) and x through S shared-memory
    slots (cp.async, S - 1 blocks ahead), so that x crosses L2 once a program instead of once a warp: x_layout
    replicates the x tile in every warp, which at M 8 costs two bytes of x from L2 for each byte of weights (8B
    qkv, BLOCK_K 256, 4 warps: 16 KB of x against 8 KB of words a block)."""
    shl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    x_s = gl.allocate_shared_memory(gl.bfloat16, [S, MP, BK], shl)
    xcL: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BK // 8), BK // 8], [NW, 1], [1, 0])  # 16-byte copies
    xr = gl.arange(0, MP, layout=gl.SliceLayout(1, xcL))
    xp = x_ptr + xr[:, None] * stride_xm + gl.arange(0, BK, layout=gl.SliceLayout(0, xcL))[None, :]
    xmask = (xr < M)[:, None]
    for i in gl.static_range(S - 1):  # prologue: x of blocks b_lo .. b_lo + S - 2 (clamped)
        async_copy.async_copy_global_to_shared(x_s.index(i), xp + gl.minimum(b_lo + i, nb - 1) * BK, mask=xmask)
        async_copy.commit_group()
    for kb in range(b_lo, b_hi):
        it = kb - b_lo
        wd = gl.load(w_rows + kb * wstep)  # the long loads first
        sr = gl.load(s_rows + kb * sstep)
        async_copy.wait_group(S - 2)  # block kb's x (this thread's copies) has landed
        gl.thread_barrier()            # everyone's copies are in, everyone is past block kb - 1's reads
        async_copy.async_copy_global_to_shared(x_s.index((it + S - 1) % S),
                                               xp + gl.minimum(kb + S - 1, nb - 1) * BK, mask=xmask)
        async_copy.commit_group()
        b = _x_operand(x_s.index(it % S).load(xL), BK, MP, RP, bL)
        acc = _block(acc, wd, _scales(sr, BN, KW, wL), b, BN, BK, RP, pL, aL)
    async_copy.wait_group(0)
    return acc


@gluon.jit
def nvfp4_gemv_mma_kernel(x_ptr, w_ptr, ws_ptr, ws2_ptr, bias_ptr, res_ptr, out_ptr,
                          M, N, K, stride_xm, stride_wn, stride_sn, stride_rm, stride_om,
                          BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, SPLIT_K: gl.constexpr,
                          HAS_BIAS: gl.constexpr, HAS_RESIDUAL: gl.constexpr, PIPE: gl.constexpr = 1,
                          PDL: gl.constexpr = False, TILED: gl.constexpr = False,
                          XSMEM: gl.constexpr = 0, UNROLL: gl.constexpr = 1, PRE: gl.constexpr = 0,
                          BITS: gl.constexpr = False, STAGE: gl.constexpr = 0, WAIT_LATE: gl.constexpr = False,
                          XCLAMP: gl.constexpr = False):
    """Drop-in for triton_gemv.nvfp4_gemv_kernel (same parameters, grid (cdiv(N, BLOCK_N), SPLIT_K, 1), same
    outputs); K % BLOCK_K == 0, BLOCK_K in 64 / 128 / 256, BLOCK_N a multiple of 16 x num_warps. PIPE 2: the next
    block's loads are issued before this block's math (registers two deep); PIPE >= 3: cp.async through PIPE
    shared-memory slots (BLOCK_K >= 128). PDL: programmatic dependent launch (triton_gemv's docstring); PIPE 2 loads
    its first weight block before the wait, PIPE >= 3 its first PIPE - 1 weight blocks. TILED (PIPE 1 / 2, BK 128 /
    256): the weights in the engine's tiled order (`layout.tile_nvfp4`: 128 x 128 tiles, N % 128 == K % 128 == 0),
    a block's bytes in one or two runs. XSMEM (with PIPE 1): x through that many shared-memory slots, read once a
    program (`_x_shared`). UNROLL 2 (PIPE 1, no XSMEM): the K loop two blocks a step, both blocks' loads first.
    PRE 2 / 4 (PIPE 1, no XSMEM or UNROLL): that many blocks' weights loaded before the PDL wait (all of a short
    split), so that they stream during the kernel before. STAGE S (PIPE 1, no XSMEM, UNROLL or PRE): the first S
    blocks' weights copied into shared memory before the PDL wait (`_staged`), the rest in the plain loop. WAIT_LATE
    (PIPE 1, no XSMEM or STAGE): a timing probe, the PDL wait moved to the store (x read early; wrong where x is the
    previous kernel's output), never a build candidate. XCLAMP (PIPE 1, no XSMEM or STAGE): the x rows past M read
    as copies of row M - 1 (their outputs are never stored) instead of masked to zero, so the x loads carry no row
    mask and no zeroing of their registers (CS2R, 1.3 of the ~27 instructions a word of 8 weights at M 16:
    tools/results/sass_mix.txt)."""
    NW: gl.constexpr = gl.num_warps()
    MP: gl.constexpr = 8 if BLOCK_M <= 8 else 16
    BK: gl.constexpr = BLOCK_K
    BN: gl.constexpr = BLOCK_N
    KW: gl.constexpr = BK // 8
    RP: gl.constexpr = BK // 32
    mma, aL, bL, wL, sL, pL, xL = mma_layouts(BN, BK, MP, NW)
    pid, pk = gl.program_id(0), gl.program_id(1)
    nb = K // BK
    per = (nb + SPLIT_K - 1) // SPLIT_K
    b_lo = pk * per
    b_hi = gl.minimum(b_lo + per, nb)
    rows = gl.minimum(pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, wL)), N - 1)  # programs past N clamped
    srows = gl.minimum(pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, sL)), N - 1)
    w_rows, s_rows = _row_ptrs(w_ptr, ws_ptr, rows, srows, gl.arange(0, KW, layout=gl.SliceLayout(0, wL)),
                               gl.arange(0, KW // 2, layout=gl.SliceLayout(0, sL)), K, stride_wn, stride_sn, BK, TILED)
    if TILED:  # the engine's tiled order (layout.py): a block starts BK / 128 tiles after the one before
        gl.static_assert(PIPE <= 2)
        gl.static_assert(BK % 128 == 0)
        wstep = (BK // 128) * 2048
        sstep = (BK // 128) * 1024
    else:
        wstep = KW
        sstep = BK // 16
    xm = gl.arange(0, MP, layout=gl.SliceLayout(1, xL))
    if XCLAMP:
        gl.static_assert(PIPE == 1 and XSMEM == 0 and STAGE == 0)
        x_rows = x_ptr + gl.minimum(xm, M - 1)[:, None] * stride_xm \
            + gl.arange(0, BK, layout=gl.SliceLayout(0, xL))[None, :]
        xmask = gl.full([MP, 1], 1, gl.int1, layout=xL)  # a constant: the loads lose their row mask
    else:
        x_rows = x_ptr + xm[:, None] * stride_xm + gl.arange(0, BK, layout=gl.SliceLayout(0, xL))[None, :]
        xmask = (xm < M)[:, None]
    acc = gl.zeros([BN, MP], gl.float32, layout=mma)
    gl.static_assert(STAGE == 0 or (PIPE == 1 and XSMEM == 0))  # _staged holds the PDL wait of the plain loop only
    gl.static_assert(not WAIT_LATE or (PIPE == 1 and XSMEM == 0 and STAGE == 0))
    if PDL:
        _gdc_launch_dependents()
        if PIPE == 1 and PRE == 0 and STAGE == 0 and not WAIT_LATE:
            _gdc_wait()
    if XSMEM > 0:
        gl.static_assert(PIPE == 1)
        gl.static_assert(not BITS)
        acc = _x_shared(acc, w_rows, s_rows, wstep, sstep, x_ptr, b_lo, b_hi, nb, M, stride_xm, BN, BK, MP, RP, KW,
                        NW, XSMEM, wL, sL, pL, xL, aL, bL)
    elif PIPE > 2:  # cp.async through shared memory, PIPE stages deep (one CTA barrier a block)
        gl.static_assert(not BITS)
        acc = _pipelined(acc, w_ptr, ws_ptr, x_ptr, pid, b_lo, b_hi, nb, M, N, stride_wn, stride_sn, stride_xm,
                         BN, BK, MP, RP, KW, NW, PIPE, wL, sL, pL, xL, aL, bL, PDL)
    elif PIPE > 1:  # registers two deep: block kb + 1's loads are issued before block kb's math; what crosses
        # the loop is the loads' raw 32-bit words (x as bf16 pairs), so nothing gets repacked on the way
        xpL: gl.constexpr = x_pairs_layout(BK, MP, NW)
        xpm = gl.arange(0, MP, layout=gl.SliceLayout(1, xpL))
        xp_rows = (x_ptr + xpm[:, None] * stride_xm).to(gl.pointer_type(gl.int32)) \
            + gl.arange(0, BK // 2, layout=gl.SliceLayout(0, xpL))[None, :]
        xpmask = (xpm < M)[:, None]
        kb0 = gl.minimum(b_lo, nb - 1)  # an empty split loads block nb - 1 and never uses it
        wd = gl.load(w_rows + kb0 * wstep)
        sr = gl.load(s_rows + kb0 * sstep)
        if PDL:  # the weights are nobody's output: only x waits for the previous grid
            _gdc_wait()
        xw = gl.load(xp_rows + kb0 * (BK // 2), mask=xpmask, other=0)
        for kb in range(b_lo, b_hi):
            nxt = gl.minimum(kb + 1, b_hi - 1)
            wd_n = gl.load(w_rows + nxt * wstep)
            sr_n = gl.load(s_rows + nxt * sstep)
            xw_n = gl.load(xp_rows + nxt * (BK // 2), mask=xpmask, other=0)
            b = _x_operand(_x_unpack(xw, BK, MP, xL), BK, MP, RP, bL)
            acc = _block(acc, wd, _scales(sr, BN, KW, wL), b, BN, BK, RP, pL, aL, BITS)
            wd, sr, xw = wd_n, sr_n, xw_n
    else:
        b_mid = b_lo
        if STAGE > 0:
            gl.static_assert(PRE == 0)
            gl.static_assert(UNROLL == 1)
            acc = _staged(acc, w_ptr, ws_ptr, x_rows, pid, b_lo, b_hi, nb, N, K, stride_wn, stride_sn, wstep, sstep,
                          xmask, BN, BK, MP, RP, KW, NW, STAGE, TILED, wL, sL, pL, aL, bL, PDL, BITS)
            b_mid = gl.minimum(b_lo + STAGE, b_hi)
        if PRE > 0:  # the first PRE blocks' weights loaded before the PDL wait (the whole split at PRE >= its block
            # count): in a chain of launches they stream while the previous kernel runs; blocks past the split
            # load a clamped block and meet x = 0
            gl.static_assert(PRE == 2 or PRE == 4)
            gl.static_assert(UNROLL == 1)
            w0 = gl.load(w_rows + gl.minimum(b_lo, nb - 1) * wstep)
            s0 = gl.load(s_rows + gl.minimum(b_lo, nb - 1) * sstep)
            w1 = gl.load(w_rows + gl.minimum(b_lo + 1, nb - 1) * wstep)
            s1 = gl.load(s_rows + gl.minimum(b_lo + 1, nb - 1) * sstep)
            if PRE == 4:
                w2 = gl.load(w_rows + gl.minimum(b_lo + 2, nb - 1) * wstep)
                s2 = gl.load(s_rows + gl.minimum(b_lo + 2, nb - 1) * sstep)
                w3 = gl.load(w_rows + gl.minimum(b_lo + 3, nb - 1) * wstep)
                s3 = gl.load(s_rows + gl.minimum(b_lo + 3, nb - 1) * sstep)
            if PDL and not WAIT_LATE:
                _gdc_wait()
            acc = _pre_block(acc, w0, s0, x_rows, b_lo, b_hi, nb, xmask, BN, BK, RP, KW, MP, wL, pL, aL, bL, BITS)
            acc = _pre_block(acc, w1, s1, x_rows, b_lo + 1, b_hi, nb, xmask, BN, BK, RP, KW, MP, wL, pL, aL, bL, BITS)
            if PRE == 4:
                acc = _pre_block(acc, w2, s2, x_rows, b_lo + 2, b_hi, nb, xmask, BN, BK, RP, KW, MP, wL, pL, aL, bL,
                                 BITS)
                acc = _pre_block(acc, w3, s3, x_rows, b_lo + 3, b_hi, nb, xmask, BN, BK, RP, KW, MP, wL, pL, aL, bL,
                                 BITS)
            b_mid = gl.minimum(b_lo + PRE, b_hi)
        if UNROLL > 1:  # two blocks' loads issued before either block's math: twice the bytes in flight a warp,
            # nothing carried across the loop (PIPE 2's repacking); an odd block count ends in the plain loop
            gl.static_assert(UNROLL == 2)
            b_mid = b_lo + (b_hi - b_lo) // 2 * 2
            for kb in range(b_lo, b_mid, 2):
                w0 = gl.load(w_rows + kb * wstep)
                s0 = gl.load(s_rows + kb * sstep)
                x0 = gl.load(x_rows + kb * BK, mask=xmask, other=0.0)
                w1 = gl.load(w_rows + (kb + 1) * wstep)
                s1 = gl.load(s_rows + (kb + 1) * sstep)
                x1 = gl.load(x_rows + (kb + 1) * BK, mask=xmask, other=0.0)
                acc = _block(acc, w0, _scales(s0, BN, KW, wL), _x_operand(x0, BK, MP, RP, bL), BN, BK, RP, pL, aL,
                             BITS)
                acc = _block(acc, w1, _scales(s1, BN, KW, wL), _x_operand(x1, BK, MP, RP, bL), BN, BK, RP, pL, aL,
                             BITS)
        for kb in range(b_mid, b_hi):
            sc = _scales(gl.load(s_rows + kb * sstep), BN, KW, wL)
            b = _x_operand(gl.load(x_rows + kb * BK, mask=xmask, other=0.0), BK, MP, RP, bL)
            acc = _block(acc, gl.load(w_rows + kb * wstep), sc, b, BN, BK, RP, pL, aL, BITS)
    if PDL and WAIT_LATE:  # a timing probe only (tools/dev/nvfp4_waitlate.py): x read before the previous grid is
        _gdc_wait()         # done, right only where x is nobody's output (a benchmark chain over one x)
    _store_out(acc, pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, mma)),
               gl.arange(0, MP, layout=gl.SliceLayout(0, mma)), pk, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr,
               stride_rm, stride_om, HAS_BIAS, HAS_RESIDUAL)


# ---- WK: the K range split over the warps of a program (one launch, no split-K reduction) ------------------------

@gluon.jit
def _warp_k_group(NW: gl.constexpr, WK: gl.constexpr):
    """The K group of this thread's warp, (tid.x / 32) // (NW / WK), as a scalar: a value the compiler cannot see
    differ between warps. It feeds only the addresses and masks of the loads (which every thread issues for its own
    registers) so that each warp reads its own group's blocks, x included, whose layout replicates the x tile over
    the warps as the mma's B operand does. A scalar keeps the loads 16 bytes wide (a per-element value would not)."""
    w = gl.inline_asm_elementwise("{ .reg .u32 t; mov.u32 t, %tid.x; shr.u32 $0, t, 5; }", "=r", [], dtype=gl.int32,
                                  is_pure=True, pack=1)
    return w // (NW // WK)


@gluon.jit
def _wk_block(acc, wd, sr, x_rows, kx, b_hi, nb, xmask, BV: gl.constexpr, BK: gl.constexpr, RP: gl.constexpr,
              KW: gl.constexpr, MP: gl.constexpr, wL: gl.constexpr, pL: gl.constexpr, aL: gl.constexpr,
              bL: gl.constexpr, BITS: gl.constexpr):
    """One block a group: words wd and scale bytes sr of the group's block kx, x of it (zero past the split, where
    the clamped weights then add nothing)."""
    return _wk_block_x(acc, wd, sr, _wk_x(x_rows, kx, b_hi, nb, xmask, BK), BV, BK, RP, KW, MP, wL, pL, aL, bL, BITS)


@gluon.jit
def _wk_x(x_rows, kx, b_hi, nb, xmask, BK: gl.constexpr):
    """x of the group's block kx (zero past the split)."""
    return gl.load(x_rows + gl.minimum(kx, nb - 1) * BK, mask=xmask & (kx < b_hi), other=0.0)


@gluon.jit
def _wk_block_x(acc, wd, sr, x, BV: gl.constexpr, BK: gl.constexpr, RP: gl.constexpr, KW: gl.constexpr,
                MP: gl.constexpr, wL: gl.constexpr, pL: gl.constexpr, aL: gl.constexpr, bL: gl.constexpr,
                BITS: gl.constexpr):
    """_wk_block with the block's x already loaded."""
    return _block(acc, wd, _scales(sr, BV, KW, wL), _x_operand(x, BK, MP, RP, bL), BV, BK, RP, pL, aL, BITS)


@gluon.jit
def _wk_sum(acc, BN: gl.constexpr, MP: gl.constexpr, WK: gl.constexpr, oL: gl.constexpr):
    """acc [WK BN, MP] of the WK groups (row v: output row v % BN, group v // BN) -> their sum [BN, MP] in oL, through
    shared memory, in group order (deterministic)."""
    red = gl.allocate_shared_memory(gl.float32, [WK * BN, MP], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
    red.store(acc)
    gl.thread_barrier()
    y = red.slice(0, BN).load(oL)
    for g in gl.static_range(1, WK):
        y += red.slice(g * BN, BN).load(oL)
    return y


@gluon.jit
def _wk_silu_store(acc, pid, M, N, ws2_ptr, out_ptr, stride_om, BN: gl.constexpr, MP: gl.constexpr,
                   WK: gl.constexpr, NW: gl.constexpr):
    """SILU's epilogue: acc [WK BN, MP] of the WK groups, virtual rows v % BN < BN / 2 the gate rows pid BN / 2 + j of
    a [gate | up] projection, the others the matching up rows N / 2 + pid BN / 2 + j (nvfp4_gemv_wk_kernel's row
    map). Each half summed over the groups in group order and scaled as _store_out does, rounded to the output type,
    then silu(gate) rounded and times up (activation/triton_silu.silu_mul_kernel's steps, tl.sigmoid's formula):
    the bits of the plain kernel's [M, N] output then silu_mul, stored to out [M, N / 2]."""
    HB: gl.constexpr = BN // 2
    oL: gl.constexpr = gl.BlockedLayout([1, 1], [32 // MP, MP], [NW, 1], [1, 0])
    red = gl.allocate_shared_memory(gl.float32, [WK * BN, MP], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0]))
    red.store(acc)
    gl.thread_barrier()
    g = red.slice(0, HB).load(oL)
    u = red.slice(HB, HB).load(oL)
    for k in gl.static_range(1, WK):
        g += red.slice(k * BN, HB).load(oL)
        u += red.slice(k * BN + HB, HB).load(oL)
    half = N // 2
    cn = pid * HB + gl.arange(0, HB, layout=gl.SliceLayout(1, oL))
    cm = gl.arange(0, MP, layout=gl.SliceLayout(0, oL))
    dt: gl.constexpr = out_ptr.dtype.element_ty
    g = (g * (gl.load(ws2_ptr + cn) * 256.0)[:, None]).to(dt).to(gl.float32)
    u = (u * (gl.load(ws2_ptr + half + cn) * 256.0)[:, None]).to(dt).to(gl.float32)
    act = (g * (1 / (1 + gl.exp(-g)))).to(dt).to(gl.float32)
    mask = (cm < M)[None, :] & (cn < half)[:, None]
    gl.store(out_ptr + cm[None, :] * stride_om + cn[:, None], (act * u).to(dt), mask=mask)


@gluon.jit
def _wk_acc(x_ptr, w_ptr, ws_ptr, M, N, K, stride_xm, stride_wn, stride_sn, BLOCK_M: gl.constexpr,
            BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, SPLIT_K: gl.constexpr, PDL: gl.constexpr,
            TILED: gl.constexpr, PRE: gl.constexpr, BITS: gl.constexpr, WK: gl.constexpr, SILU: gl.constexpr,
            LA: gl.constexpr = 0):
    """The WK kernels' main loop: the program's accumulator [WK BLOCK_N, MP] (nvfp4_gemv_wk_kernel says how the
    rows and the K range are dealt), its groups' sums still apart. LA 1: the loop loads step t + 1's block before it
    computes step t's (one more block in registers, two in flight a warp; a clamped, unused load past the end);
    LA 2: and its x (x's L2 round trip leaves the loop's chain too). The same operations in the same order: the bits
    of LA 0."""
    NW: gl.constexpr = gl.num_warps()
    gl.static_assert(BLOCK_N * WK == 16 * NW)
    gl.static_assert(PRE == 0 or PRE == 2 or PRE == 4)
    MP: gl.constexpr = 8 if BLOCK_M <= 8 else 16
    BK: gl.constexpr = BLOCK_K
    BN: gl.constexpr = BLOCK_N
    BV: gl.constexpr = BLOCK_N * WK
    KW: gl.constexpr = BK // 8
    RP: gl.constexpr = BK // 32
    mma, aL, bL, wL, sL, pL, xL = mma_layouts(BV, BK, MP, NW)
    pid, pk = gl.program_id(0), gl.program_id(1)
    nb = K // BK
    per = (nb + SPLIT_K - 1) // SPLIT_K
    b_lo = pk * per
    b_hi = gl.minimum(b_lo + per, nb)
    vw = gl.arange(0, BV, layout=gl.SliceLayout(1, wL))
    vs = gl.arange(0, BV, layout=gl.SliceLayout(1, sL))
    if SILU:  # virtual row v: gate row pid BN / 2 + j (j = v % BN below BN / 2), else the up row N / 2 past it
        rw = (vw % BN) // (BN // 2) * (N // 2) + pid * (BN // 2) + vw % (BN // 2)
        rs = (vs % BN) // (BN // 2) * (N // 2) + pid * (BN // 2) + vs % (BN // 2)
    else:
        rw = pid * BN + vw % BN
        rs = pid * BN + vs % BN
    w_rows, s_rows = _row_ptrs(w_ptr, ws_ptr, gl.minimum(rw, N - 1), gl.minimum(rs, N - 1),
                               gl.arange(0, KW, layout=gl.SliceLayout(0, wL)),
                               gl.arange(0, KW // 2, layout=gl.SliceLayout(0, sL)), K, stride_wn, stride_sn, BK, TILED)
    g0 = b_lo + _warp_k_group(NW, WK)  # the warp's group's first block (the group of its rows vw // BN)
    if TILED:
        gl.static_assert(BK % 128 == 0)
        wstep = (BK // 128) * 2048
        sstep = (BK // 128) * 1024
    else:
        wstep = KW
        sstep = BK // 16
    xc = gl.arange(0, BK, layout=gl.SliceLayout(0, xL))
    xm = gl.arange(0, MP, layout=gl.SliceLayout(1, xL))
    x_rows = x_ptr + xm[:, None] * stride_xm + xc[None, :]
    xmask = (xm < M)[:, None]
    acc = gl.zeros([BV, MP], gl.float32, layout=mma)
    nt = (b_hi - b_lo + WK - 1) // WK  # steps: every group takes one block a step
    if PDL:
        _gdc_launch_dependents()
        if PRE == 0:
            _gdc_wait()
    if PRE > 0:  # the first PRE steps' weights before the PDL wait (clamped past the split, where x is zero)
        w0 = gl.load(w_rows + gl.minimum(g0, nb - 1) * wstep)
        s0 = gl.load(s_rows + gl.minimum(g0, nb - 1) * sstep)
        w1 = gl.load(w_rows + gl.minimum(g0 + WK, nb - 1) * wstep)
        s1 = gl.load(s_rows + gl.minimum(g0 + WK, nb - 1) * sstep)
        if PRE == 4:
            w2 = gl.load(w_rows + gl.minimum(g0 + 2 * WK, nb - 1) * wstep)
            s2 = gl.load(s_rows + gl.minimum(g0 + 2 * WK, nb - 1) * sstep)
            w3 = gl.load(w_rows + gl.minimum(g0 + 3 * WK, nb - 1) * wstep)
            s3 = gl.load(s_rows + gl.minimum(g0 + 3 * WK, nb - 1) * sstep)
        if PDL:
            _gdc_wait()
        acc = _wk_block(acc, w0, s0, x_rows, g0, b_hi, nb, xmask, BV, BK, RP, KW, MP, wL, pL, aL, bL, BITS)
        acc = _wk_block(acc, w1, s1, x_rows, g0 + WK, b_hi, nb, xmask, BV, BK, RP, KW, MP, wL, pL, aL, bL, BITS)
        if PRE == 4:
            acc = _wk_block(acc, w2, s2, x_rows, g0 + 2 * WK, b_hi, nb, xmask, BV, BK, RP, KW, MP, wL, pL, aL, bL,
                            BITS)
            acc = _wk_block(acc, w3, s3, x_rows, g0 + 3 * WK, b_hi, nb, xmask, BV, BK, RP, KW, MP, wL, pL, aL, bL,
                            BITS)
    if LA == 0:
        for t in range(PRE, nt):
            wd = gl.load(w_rows + gl.minimum(g0 + t * WK, nb - 1) * wstep)
            sr = gl.load(s_rows + gl.minimum(g0 + t * WK, nb - 1) * sstep)
            acc = _wk_block(acc, wd, sr, x_rows, g0 + t * WK, b_hi, nb, xmask, BV, BK, RP, KW, MP, wL, pL, aL, bL,
                            BITS)
    else:  # LA 1: the weights a block ahead; LA 2: and x (its L2 round trip off the loop's chain too)
        gl.static_assert(LA == 1 or LA == 2)
        wd = gl.load(w_rows + gl.minimum(g0 + PRE * WK, nb - 1) * wstep)
        sr = gl.load(s_rows + gl.minimum(g0 + PRE * WK, nb - 1) * sstep)
        if LA == 2:
            xd = _wk_x(x_rows, g0 + PRE * WK, b_hi, nb, xmask, BK)
        for t in range(PRE, nt):
            wn = gl.load(w_rows + gl.minimum(g0 + (t + 1) * WK, nb - 1) * wstep)
            sn = gl.load(s_rows + gl.minimum(g0 + (t + 1) * WK, nb - 1) * sstep)
            if LA == 2:
                xn = _wk_x(x_rows, g0 + (t + 1) * WK, b_hi, nb, xmask, BK)
                acc = _wk_block_x(acc, wd, sr, xd, BV, BK, RP, KW, MP, wL, pL, aL, bL, BITS)
                xd = xn
            else:
                acc = _wk_block(acc, wd, sr, x_rows, g0 + t * WK, b_hi, nb, xmask, BV, BK, RP, KW, MP, wL, pL, aL,
                                bL, BITS)
            wd = wn
            sr = sn
    return acc


@gluon.jit
def nvfp4_gemv_wk_kernel(x_ptr, w_ptr, ws_ptr, ws2_ptr, bias_ptr, res_ptr, out_ptr,
                         M, N, K, stride_xm, stride_wn, stride_sn, stride_rm, stride_om,
                         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, SPLIT_K: gl.constexpr,
                         HAS_BIAS: gl.constexpr, HAS_RESIDUAL: gl.constexpr, PIPE: gl.constexpr = 1,
                         PDL: gl.constexpr = False, TILED: gl.constexpr = False, PRE: gl.constexpr = 0,
                         BITS: gl.constexpr = False, WK: gl.constexpr = 2, SILU: gl.constexpr = False,
                         LA: gl.constexpr = 0):
    """nvfp4_gemv_mma_kernel (same parameters, grid and outputs) with the program's K range dealt over WK groups of
    its warps instead of its rows: group g takes blocks b_lo + g, b_lo + g + WK, ... of the rows pid BLOCK_N ..
    + BLOCK_N, and the groups' accumulators are summed through shared memory at the end. So a layer needs no
    split-K reduction launch for enough programs (8B qkv: 384 programs of 16 rows at SPLIT_K 1, where the plain form
    needs SPLIT_K 4-8 and a second launch: 0.7-1.6 us of its 7.5-9.3 on the H200, NOTES.md). The mma sees WK BLOCK_N
    virtual rows (BLOCK_N WK == 16 num_warps: one 16-row slab a warp), group g's warps holding the rows' words of
    its blocks; x, the B operand, differs between the groups (_warp_k_group). PRE 2 / 4: the first PRE blocks of
    every group loaded before the PDL wait. SILU: W is a [gate | up] projection [N, K] and out [M, N / 2] (row stride
    stride_om) gets silu(gate) * up, the bits of the plain launch then activation's silu_mul with one launch and one
    [M, N] round trip fewer: program pid reads gate rows pid BLOCK_N / 2 .. + BLOCK_N / 2 and the up rows N / 2 past
    them (_wk_silu_store; no bias or residual)."""
    NW: gl.constexpr = gl.num_warps()
    gl.static_assert(PIPE == 1)
    gl.static_assert(not SILU or (not (HAS_BIAS or HAS_RESIDUAL) and SPLIT_K == 1))
    MP: gl.constexpr = 8 if BLOCK_M <= 8 else 16
    BN: gl.constexpr = BLOCK_N
    acc = _wk_acc(x_ptr, w_ptr, ws_ptr, M, N, K, stride_xm, stride_wn, stride_sn, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K,
                  PDL, TILED, PRE, BITS, WK, SILU, LA)
    pid, pk = gl.program_id(0), gl.program_id(1)
    if SILU:
        _wk_silu_store(acc, pid, M, N, ws2_ptr, out_ptr, stride_om, BN, MP, WK, NW)
    else:
        oL: gl.constexpr = gl.BlockedLayout([1, 1], [32 // MP, MP], [NW, 1], [1, 0])
        y = _wk_sum(acc, BN, MP, WK, oL)
        _store_out(y, pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, oL)),
                   gl.arange(0, MP, layout=gl.SliceLayout(0, oL)), pk, M, N, ws2_ptr, bias_ptr, res_ptr, out_ptr,
                   stride_rm, stride_om, HAS_BIAS, HAS_RESIDUAL)


@gluon.jit
def _fence():
    """fence.acq_rel.gpu: this thread's earlier writes are visible GPU-wide before its later ones (and reads)."""
    gl.inline_asm_elementwise("fence.acq_rel.gpu; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def nvfp4_gemv_wk_norm_kernel(x_ptr, w_ptr, ws_ptr, ws2_ptr, res_ptr, nw_ptr, cnt_ptr, out_ptr,
                              M, N, K, stride_xm, stride_wn, stride_sn, stride_rm, stride_om, eps,
                              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                              PDL: gl.constexpr = False, TILED: gl.constexpr = False, PRE: gl.constexpr = 0,
                              BITS: gl.constexpr = False, WK: gl.constexpr = 2, OFFSET: gl.constexpr = 0,
                              NP: gl.constexpr = 0, LA: gl.constexpr = 0):
    """The WK GEMV of a projection into the residual stream with the decoder's add + RMSNorm after it, in one launch
    (what splitk_reduce_norm_kernel does for the split GEMVs; a WK GEMV has no reduction launch to put it in). Each
    program rounds its columns of y = x @ W.T to bf16 as nvfp4_gemv_wk_kernel stores them, adds the residual's and
    stores the sum, rounded, back into the residual stream (rms_norm_kernel's add_residual: the same bits); then it
    counts itself in (cnt_ptr, after a fence); the last program normalizes every row of the new residual stream,
    out[m, :] = h[m, :] rstd (OFFSET + w), and sets the counter back to 0. Its sum of squares runs in another order
    than rms_norm_kernel's one-program tl.sum, so out may differ from the two launches' in the last bit where rstd
    does; the residual stream does not.

    res_ptr *bf16 [M, N] (row stride stride_rm), read and written in place; nw_ptr *bf16 [N] the norm's weight;
    cnt_ptr *i32 [1], zero before the launch and after it; out_ptr *bf16 [M, N] (row stride stride_om); eps fp32.
    One split (SPLIT_K 1), grid (N / BLOCK_N, 1, 1), N % BLOCK_N == 0; NP: the next power of two >= N (the last
    program holds a whole row in registers)."""
    NW: gl.constexpr = gl.num_warps()
    MP: gl.constexpr = 8 if BLOCK_M <= 8 else 16
    BN: gl.constexpr = BLOCK_N
    acc = _wk_acc(x_ptr, w_ptr, ws_ptr, M, N, K, stride_xm, stride_wn, stride_sn, BLOCK_M, BLOCK_N, BLOCK_K, 1,
                  PDL, TILED, PRE, BITS, WK, False, LA)
    pid = gl.program_id(0)
    oL: gl.constexpr = gl.BlockedLayout([1, 1], [32 // MP, MP], [NW, 1], [1, 0])
    y = _wk_sum(acc, BN, MP, WK, oL)
    cn = pid * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, oL))
    cm = gl.arange(0, MP, layout=gl.SliceLayout(0, oL))
    mask = (cm < M)[None, :] & (cn < N)[:, None]
    dt: gl.constexpr = out_ptr.dtype.element_ty
    y = (y * (gl.load(ws2_ptr + cn) * 256.0)[:, None]).to(dt).to(gl.float32)  # the plain kernel's stored output
    res = res_ptr + cm[None, :] * stride_rm + cn[:, None]
    h = (y + gl.load(res, mask=mask, other=0.0).to(gl.float32)).to(res_ptr.dtype.element_ty)
    gl.store(res, h, mask=mask)
    _fence()
    gl.thread_barrier()
    if gl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu") == gl.num_programs(0) - 1:  # every column is in
        _fence()
        # a whole row at once (NP columns, up to 16 bytes a thread a repeat): every load of a row in flight together,
        # one L2 round trip a row instead of one a chunk of a loop
        VEC: gl.constexpr = max(1, min(8, NP // (32 * NW)))
        rL: gl.constexpr = gl.BlockedLayout([VEC], [32], [NW], [0])
        cols = gl.arange(0, NP, layout=rL)
        cmask = cols < N
        w = gl.load(nw_ptr + cols, mask=cmask, other=0.0).to(gl.float32)
        for m in range(M):
            v = gl.load(res_ptr + m * stride_rm + cols, mask=cmask, other=0.0, cache_modifier=".cg").to(gl.float32)
            rstd = gl.rsqrt(gl.sum(v * v, axis=0) / N + eps)
            gl.store(out_ptr + m * stride_om + cols, (v * rstd * (OFFSET + w)).to(dt), mask=cmask)
        gl.store(cnt_ptr, 0)
