"""The Gluon NVFP4 GEMV (plugins_trt/quant_linear/gluon_gemv.py) cannot run in Triton's interpreter. What can be checked
on the CPU: its PTX pair decode, emulated instruction by instruction with the module's prmt selectors, is exact for
every nibble; and its k permutation (the reshape / permute chains of the weight pairs and of x in the kernel) keeps
the dot product: logical k -> physical k' = (BK/4)·i + 4r + 2·s1 + s0 for both operands."""

import numpy as np
import pytest

pytest.importorskip("triton.experimental.gluon")

E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])


def _prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32 (default mode): output byte i = byte (sel nibble i & 7) of b:a, or its sign replicated (bit 3)."""
    src = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        c = (sel >> (4 * i)) & 0xF
        v = src[c & 7]
        out |= ((0xFF if v & 0x80 else 0) if c & 8 else v) << (8 * i)
    return out


def _bf16(h: int) -> float:
    return float(np.array([h << 16], dtype=np.uint32).view(np.float32)[0])


def test_pair_decode_is_exact_for_every_nibble():
    from atlas.plugins_trt.quant_linear.gluon_gemv import _SEL, _pair_asm

    rng = np.random.default_rng(0)
    for i, sel in enumerate(_SEL):
        assert f"prmt.b32 p, q, $1, {sel};" in _pair_asm(i)  # the emulation below follows the asm's ops
    for w in [int(v) for v in rng.integers(0, 2 ** 32, 3000)] + [0, 0xFFFFFFFF, 0x88888888, 0x77777777]:
        for i, sel in enumerate(_SEL):
            p = _prmt((w << 4) & 0xFFFFFFFF, w, int(sel, 16))  # shl.b32 q, w, 4; prmt.b32 p, q, w, sel
            p = ((p - (1 << 32) if p & 0x80000000 else p) >> 6) & 0xFFFFFFFF  # shr.s32 p, p, 6
            p &= 0x81C081C0  # and.b32
            lo, hi = _bf16(p & 0xFFFF) * 2.0 ** 126, _bf16(p >> 16) * 2.0 ** 126
            assert lo == E2M1[(w >> (8 * i)) & 0xF] and hi == E2M1[(w >> (8 * i + 4)) & 0xF], (hex(w), i)


@pytest.mark.parametrize("BK", [64, 128, 256])
def test_k_permutation_keeps_the_dot(BK):
    rng = np.random.default_rng(BK)
    BN, MP, RP = 16, 8, BK // 32
    W, X = rng.standard_normal((BN, BK)), rng.standard_normal((MP, BK))  # one block, physical order
    words = W.reshape(BN, BK // 8, 8)  # word j holds k' = 8j + t
    p = [words[:, :, 2 * a:2 * a + 2] for a in range(4)]  # pair a: nibbles 2a, 2a + 1 (the 2 halves of an int32)
    join = lambda u, v: np.stack([u, v], axis=-1)  # noqa: E731 — gl.join: a new last axis of size 2
    # p[a] carries the two halves as its last axis; the kernel's pairs are int32, so join before that axis
    t = np.moveaxis(join(join(np.moveaxis(p[0], -1, 0), np.moveaxis(p[2], -1, 0)),
                         join(np.moveaxis(p[1], -1, 0), np.moveaxis(p[3], -1, 0))), 0, -1)
    assert t.shape == (BN, BK // 8, 2, 2, 2)
    A = t.reshape(BN, 2, 2, RP, 2, 2, 2).transpose(0, 3, 4, 5, 1, 2, 6).reshape(BN, BK)  # as in the kernel
    B = X.reshape(MP, 2, 2, RP, 2, 2, 2).transpose(3, 4, 5, 1, 2, 6, 0).reshape(BK, MP)
    np.testing.assert_allclose(A @ B, W @ X.T, rtol=1e-12, atol=1e-12)
    k = np.arange(BK)
    s0, i0, i1, s1, r0, rhi = k & 1, (k >> 1) & 1, (k >> 2) & 1, (k >> 3) & 1, (k >> 4) & 1, k >> 5
    phys = (BK // 4) * (2 * i1 + i0) + 4 * (2 * rhi + r0) + 2 * s1 + s0
    assert np.array_equal(A, W[:, phys]) and np.array_equal(B, X[:, phys].T)


def test_tiled_weights_follow_the_kernels_addressing():
    """TILED: the engine's tiled order (layout.tile_nvfp4) holds word c of row r in block kb at the address the Gluon
    GEMV computes: ((r // 128) * (K / 128) + c // 16) * 2048 + (r % 128) * 16 + c % 16 + kb * (BK / 128) * 2048 words
    (scales: 8 a tile row, 1024 a tile), for both block widths the kernel reads tiled."""
    import torch

    from atlas.plugins_trt.quant_linear.layout import tile_nvfp4

    N, K = 256, 1024
    g = torch.Generator().manual_seed(5)
    w = torch.randint(0, 256, (N, K // 2), generator=g, dtype=torch.uint8)
    ws = torch.randint(0, 127, (N, K // 16), generator=g, dtype=torch.uint8).view(torch.float8_e4m3fn)
    wt, st = tile_nvfp4(w, ws)
    assert wt.shape == w.shape and st.shape == ws.shape and st.dtype == ws.dtype
    words, twords = w.view(torch.int32).numpy(), wt.view(torch.int32).reshape(-1).numpy()
    sbytes, tsbytes = ws.view(torch.uint8).numpy(), st.view(torch.uint8).reshape(-1).numpy()
    r = np.arange(N)[:, None]
    for BK in (128, 256):
        KW = BK // 8
        c, cs = np.arange(KW)[None, :], np.arange(KW // 2)[None, :]
        for kb in range(K // BK):
            addr = (r // 128) * (K // 128) * 2048 + (r % 128) * 16 + (c // 16) * 2048 + c % 16 + kb * (BK // 128) * 2048
            assert np.array_equal(twords[addr], words[:, kb * KW:(kb + 1) * KW])
            sadr = (r // 128) * (K // 128) * 1024 + (r % 128) * 8 + (cs // 8) * 1024 + cs % 8 + kb * (BK // 128) * 1024
            assert np.array_equal(tsbytes[sadr], sbytes[:, kb * KW // 2:(kb + 1) * KW // 2])


def test_bits_order_decodes_every_nibble():
    """layout.bits_nvfp4 moves each word's bits to layout.NVFP4_BITS order; the BITS decode (gluon_gemv._bits_pair_asm,
    emulated op by op: shifts, masks, or) gives every pair the values the ModelOpt-order decode gives."""
    import re

    import torch

    from atlas.plugins_trt.quant_linear.gluon_gemv import _bits_pair_asm
    from atlas.plugins_trt.quant_linear.layout import NVFP4_BITS, bits_nvfp4

    rng = np.random.default_rng(1)
    words = [int(v) for v in rng.integers(0, 2 ** 32, 3000)] + [0, 0xFFFFFFFF, 0x88888888, 0x77777777, 0x12345678]
    raw = torch.from_numpy(np.array(words, dtype=np.uint32).view(np.uint8).reshape(-1, 4).copy())
    permuted = bits_nvfp4(raw)
    assert permuted.shape == raw.shape and permuted.dtype == torch.uint8
    new = permuted.numpy().view(np.uint32).reshape(-1)

    def shift(v: int, k: int) -> int:
        return (v << k) & 0xFFFFFFFF if k >= 0 else v >> -k

    for i, (a, b) in enumerate(NVFP4_BITS):
        asm = _bits_pair_asm(i)
        assert ("0x81C081C0" in asm) == (a == b)  # the emulation below follows the asm's form
        for r, k in (("t", a), ("u", b)) if a != b else (("t", a),):
            if k:
                assert re.search(rf"sh[lr]\.[bu]32 {r}, \$1, {abs(k)};", asm), (asm, r, k)
    for w, q in zip(words, new):
        q = int(q)
        for i, (a, b) in enumerate(NVFP4_BITS):
            p = shift(q, a) & 0x81C081C0 if a == b else (shift(q, a) & 0x80008000) | (shift(q, b) & 0x01C001C0)
            lo, hi = _bf16(p & 0xFFFF) * 2.0 ** 126, _bf16(p >> 16) * 2.0 ** 126
            assert lo == E2M1[(w >> (8 * i)) & 0xF] and hi == E2M1[(w >> (8 * i + 4)) & 0xF], (hex(w), i)
