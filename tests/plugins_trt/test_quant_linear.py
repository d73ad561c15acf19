"""The quant_linear reference: E2M1 codes, nibble order, dequantization of each format, and the linear itself.

The expectations are computed independently of the reference: E2M1 values from their bit fields, scales
applied element by element.
"""

import pytest
import torch

from atlas.build_engine.quantize import QTensor
from atlas.plugins_trt.quant_linear.reference import (
    E2M1_VALUES, dequantize, e2m1_decode, e2m1_encode, pack_e2m1, quant_linear, unpack_e2m1)


def rel(a, b):
    return float((a - b).norm() / b.norm())


def e2m1_from_bits(code: int) -> float:
    """Sign bit 3, exponent bits 2-1 (bias 1), mantissa bit 0; exponent 0 is subnormal (0 or 0.5)."""
    sign = -1.0 if code & 8 else 1.0
    e, m = (code >> 1) & 3, code & 1
    return sign * (m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1))


def random_e4m3(shape, g, positive=False):
    """Random finite float8_e4m3fn values (every bit pattern but NaN 0x7F / 0xFF)."""
    bits = torch.randint(0, 0x7F, shape, generator=g, dtype=torch.uint8)
    if not positive:
        bits |= torch.randint(0, 2, shape, generator=g, dtype=torch.uint8) << 7
    else:
        bits = bits.clamp(min=1)
    return bits.view(torch.float8_e4m3fn)


def test_e2m1_table_matches_bit_fields():
    assert [float(v) for v in E2M1_VALUES] == [e2m1_from_bits(c) for c in range(16)]
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(e2m1_decode(codes), E2M1_VALUES)
    assert torch.equal(e2m1_encode(e2m1_decode(codes)), codes)  # including -0 (code 8)


def test_e2m1_encode_rounds_to_nearest_even_and_saturates():
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    # ties go to the even code (mantissa 0): 0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0
    expected = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0])
    assert torch.equal(e2m1_decode(e2m1_encode(mids)), expected)
    assert torch.equal(e2m1_decode(e2m1_encode(-mids)), -expected)
    # just off each midpoint: plain nearest
    up, down = torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1)
    assert torch.equal(e2m1_decode(e2m1_encode(up)), torch.tensor([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]))
    assert torch.equal(e2m1_decode(e2m1_encode(down)), torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]))
    big = torch.tensor([6.0, 6.5, 7.9, 1e30, float("inf")])
    assert torch.equal(e2m1_decode(e2m1_encode(big)), torch.full((5,), 6.0))
    assert torch.equal(e2m1_decode(e2m1_encode(-big)), torch.full((5,), -6.0))


def test_e2m1_encode_is_nearest_on_random_values():
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(4096, generator=g) * 2 - 1) * 7
    got = e2m1_decode(e2m1_encode(x))
    dist = (x[:, None] - E2M1_VALUES[None, :8].copysign(x[:, None])).abs()  # same-sign candidates
    assert torch.equal((got - x).abs(), dist.min(dim=1).values)


def test_nibble_order_is_modelopt():
    """Element 2i sits in the low nibble, 2i+1 in the high nibble (ModelOpt / vLLM break_fp4_bytes)."""
    codes = torch.tensor([[0x1, 0x2, 0xF, 0x8, 0x7, 0x0]], dtype=torch.uint8)
    assert pack_e2m1(codes).tolist() == [[0x21, 0x8F, 0x07]]
    g = torch.Generator().manual_seed(2)
    rnd = torch.randint(0, 16, (8, 64), generator=g, dtype=torch.uint8)
    assert torch.equal(unpack_e2m1(pack_e2m1(rnd)), rnd)


def random_nvfp4(n, k, g):
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scale = random_e4m3((n, k // 16), g, positive=True)
    scale_2 = torch.rand(n, generator=g) * 1e-2 + 1e-3
    return QTensor("nvfp4", pack_e2m1(codes), scale, scale_2), codes


def test_dequantize_nvfp4_elementwise():
    g = torch.Generator().manual_seed(3)
    qt, codes = random_nvfp4(6, 48, g)
    got = dequantize("nvfp4", qt.weight, qt.weight_scale, qt.weight_scale_2)
    for n in range(6):
        for k in range(48):
            want = e2m1_from_bits(int(codes[n, k])) * float(qt.weight_scale[n, k // 16]) * float(qt.weight_scale_2[n])
            assert float(got[n, k]) == pytest.approx(want, rel=1e-7, abs=0)


def test_dequantize_fp8_formats_elementwise():
    g = torch.Generator().manual_seed(4)
    n, k = 200, 300  # partial edge blocks in both dims
    w = random_e4m3((n, k), g)
    scale = torch.rand(n, generator=g) + 0.1
    block = torch.rand(2, 3, generator=g) + 0.1
    fp8 = dequantize("fp8", w, scale)
    fp8_block = dequantize("fp8_block", w, block)
    for i, j in [(0, 0), (127, 127), (128, 0), (5, 128), (199, 299), (150, 260)]:
        assert float(fp8[i, j]) == pytest.approx(float(w[i, j]) * float(scale[i]), rel=1e-7)
        assert float(fp8_block[i, j]) == pytest.approx(float(w[i, j]) * float(block[i // 128, j // 128]), rel=1e-7)


@pytest.mark.parametrize("fmt", ["float32", "bfloat16", "fp8", "fp8_block", "nvfp4"])
@pytest.mark.parametrize("M", [1, 5], ids=lambda m: f"M{m}")
def test_quant_linear_is_x_at_dequantized_weight(fmt, M):
    g = torch.Generator().manual_seed(5)
    n, k = 160, 256
    if fmt == "nvfp4":
        qt, _ = random_nvfp4(n, k, g)
    elif fmt == "fp8":
        qt = QTensor("fp8", random_e4m3((n, k), g), torch.rand(n, generator=g) * 1e-3)
    elif fmt == "fp8_block":
        qt = QTensor("fp8_block", random_e4m3((n, k), g), torch.rand(2, 2, generator=g) * 1e-3)
    else:
        qt = QTensor(fmt, torch.randn(n, k, generator=g).to(getattr(torch, fmt)))
    x = torch.randn(M, k, generator=g)
    bias = torch.randn(n, generator=g)
    w = qt.dequantize().double()
    want = x.double() @ w.T + bias.double()
    got = quant_linear(x, qt, bias)
    err = rel(got.double(), want)
    print(f"{fmt} M={M}: quant_linear vs fp64 x @ dequant.T rel error {err:.2e}")
    assert got.dtype == x.dtype and got.shape == (M, n)
    assert err < 1e-6
    xb = x.bfloat16()
    assert torch.equal(quant_linear(xb, qt).float(), (xb.float() @ qt.dequantize().T).bfloat16().float())
