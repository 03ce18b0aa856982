"""poly_exp2 (csrc/common/convert.cuh), the softmax's 2^x on the FMA and integer pipes: its
float32 steps replayed here with the coefficients read from the source, against exp2."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).parents[1] / "csrc" / "common" / "convert.cuh"


def _coefficients() -> tuple[np.float32, np.float32, np.float32]:
    text = SOURCE.read_text()
    found = {name: np.float32(value.rstrip("f"))
             for name, value in re.findall(r"(kExp2C[123]) = ([0-9.eE+-]+f)", text)}
    assert set(found) == {"kExp2C1", "kExp2C2", "kExp2C3"}, found
    return found["kExp2C1"], found["kExp2C2"], found["kExp2C3"]


def _fma(a, b, c):  # one rounding, as fmaf: the float32 product is exact in float64
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(np.float32)


def poly_exp2(x: np.ndarray) -> np.ndarray:
    c1, c2, c3 = _coefficients()
    shift = np.float32(12582912.0)
    x = np.maximum(x.astype(np.float32), np.float32(-127.0))
    shifted = x + shift
    f = x - (shifted - shift)
    p = _fma(_fma(_fma(c3, f, c2), f, c1), f, np.float32(1.0))
    bits = (p.view(np.uint32).astype(np.uint64) + (shifted.view(np.uint32).astype(np.uint64) << 23)) % 2**32
    return bits.astype(np.uint32).view(np.float32)


def test_relative_error_is_below_half_an_ulp_of_bf16_and_fp16():
    x = np.linspace(-126.0, 0.0, 1_000_001, dtype=np.float32)
    rel = np.abs(poly_exp2(x).astype(np.float64) / np.exp2(x.astype(np.float64)) - 1)
    assert rel.max() < 1.5e-4  # fp16's half ulp is 4.9e-4, bf16's 2.0e-3


def test_a_masked_score_gives_exactly_zero_and_the_row_maximum_exactly_one():
    out = poly_exp2(np.array([-np.inf, -1e30, -127.0, 0.0], dtype=np.float32))
    assert out.tolist() == [0.0, 0.0, 0.0, 1.0]


def test_below_the_normal_range_it_stays_a_tiny_non_negative_number():
    out = poly_exp2(np.linspace(-127.0, -125.0, 2001, dtype=np.float32))
    assert (out >= 0).all() and out.max() < 2.0 ** -124
