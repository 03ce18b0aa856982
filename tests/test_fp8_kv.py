"""The e4m3 KV cache on the CPU: descales, quantise-on-append, the accuracy floor it is judged by,
and its decode kernels' specs (names, shared memory, the archs that have them)."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

import flashtune
from flashtune.kernels.arch import get_arch
from flashtune.kernels.decode_spec import (DecodeSpec, DecodeTile, decode_smem_bytes, decode_tile_problems,
                                           e4m3_cache_tile)
from flashtune.kernels.profiles import ProfileError, find_profile
from flashtune.measure import fp8_floor
from flashtune.measure.reference import attention_reference
from flashtune.runtime.fp8 import FP8_MAX, quantise_kv

E4M3 = torch.float8_e4m3fn


def test_descales_map_each_sequence_and_kv_head_absmax_to_448():
    k = torch.randn(3, 50, 2, 64)
    k[1, 7, 0, 5] = -20.0
    k[2] = 0  # an all-zero sequence gets descale 1, not 0
    v = torch.randn(3, 50, 2, 64)
    k_descale, v_descale = flashtune.kv_descales(k, v)
    assert k_descale.shape == v_descale.shape == (3, 2) and k_descale.dtype == torch.float32
    assert k_descale[1, 0] == pytest.approx(20.0 / FP8_MAX) and (k_descale[2] == 1).all()
    k8 = quantise_kv(k, k_descale)
    assert k8.dtype == E4M3 and k8.float().abs().max() == FP8_MAX  # the absmax lands on 448 exactly
    empty_k, _ = flashtune.kv_descales(torch.zeros(2, 0, 4, 64), torch.zeros(2, 0, 4, 64))
    assert (empty_k == 1).all()


def test_quantise_on_append_saturates_instead_of_making_nan():
    x = torch.tensor([1000.0, -1000.0, 1.0]).view(1, 1, 1, 3)
    got = quantise_kv(x, torch.ones(1, 1)).float().flatten().tolist()
    assert got == [FP8_MAX, -FP8_MAX, 1.0]


@pytest.mark.parametrize("kind", fp8_floor.INPUT_KINDS)
def test_the_floor_passes_an_exact_reader_and_fails_a_wrong_one(kind):
    g = torch.Generator().manual_seed(0)
    q, k, v = fp8_floor.inputs(kind, 2, 1, 300, 8, 2, 64, torch.bfloat16, "cpu", g)
    k_descale, v_descale = flashtune.kv_descales(k, v)
    k8, v8 = quantise_kv(k, k_descale), quantise_kv(v, v_descale)
    exact, _ = attention_reference(q.float(), fp8_floor.dequantised(k8, k_descale),
                                   fp8_floor.dequantised(v8, v_descale), False)
    check = fp8_floor.kv_cache_check(exact, q, k, v, k8, v8, k_descale, v_descale, causal=False)
    assert 0.001 < check.floor < 0.2 and check.error == pytest.approx(check.floor) and check.ok
    no_v_descale, _ = attention_reference(q.float(), fp8_floor.dequantised(k8, k_descale), v8.float(), False)
    assert not fp8_floor.kv_cache_check(no_v_descale, q, k, v, k8, v8, k_descale, v_descale, False).ok


def test_the_p_rounded_reference_is_attention_with_p_in_e4m3():
    """The all-FP8 kernels' bar on their own inputs: exact where every P is representable (equal
    scores: P = 1), a few percent off elsewhere (3 mantissa bits), GQA and bottom-right causal as
    attention_reference has them."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, s, h, 64, generator=g) for s, h in ((5, 4), (9, 2), (9, 2)))
    for causal in (False, True):
        ref, _ = attention_reference(q, k, v, causal, 0.125)
        error = fp8_floor.rel_l2(fp8_floor.p_rounded_attention(q, k, v, causal, 0.125), ref)
        assert 1e-3 < error < 5e-2
        flat = fp8_floor.p_rounded_attention(torch.zeros_like(q), k, v, causal, 0.125)
        torch.testing.assert_close(flat, attention_reference(torch.zeros_like(q), k, v, causal, 0.125)[0])


def test_keys_with_offset_channels_raise_the_floor():
    """What K smoothing is for: outlier channels set the scale, and the small channels fall into
    e4m3's subnormals (a float format: the rest keeps its 3-bit relative precision)."""
    floors = {}
    for kind in fp8_floor.INPUT_KINDS:
        g = torch.Generator().manual_seed(1)
        q, k, v = fp8_floor.inputs(kind, 2, 1, 500, 8, 2, 128, torch.float32, "cpu", g)
        k_descale, v_descale = flashtune.kv_descales(k, v)
        k8, v8 = quantise_kv(k, k_descale), quantise_kv(v, v_descale)
        exact, _ = attention_reference(q, fp8_floor.dequantised(k8, k_descale), fp8_floor.dequantised(v8, v_descale))
        floors[kind] = fp8_floor.kv_cache_check(exact, q, k, v, k8, v8, k_descale, v_descale, False).floor
    assert floors["activations"] > 1.2 * floors["normal"], floors  # 5.5% against 3.9% (seed 1)


def test_fp8_cache_decode_kernels_are_named_sized_and_refused_where_no_hardware_converts():
    tile = DecodeTile(16, 32, 4, 3)
    plain = DecodeSpec("sm_90a", "bfloat16", 128, tile, False)
    fp8 = DecodeSpec("sm_90a", "bfloat16", 128, tile, False, kv_fp8=True)
    assert fp8.name == plain.name.replace("_sm90a", "_e4m3kv_sm90a") and fp8.combine_name.endswith("_e4m3kv_sm90a_combine")
    assert re.search(r"false, true,\s+flashtune::Variants", fp8.source()) and fp8.source_hash() != plain.source_hash()
    # the ring at one byte an element (the fragments are converted in registers: no 16-bit copy)
    assert fp8.smem_bytes == decode_smem_bytes(128, tile) - 4 * 3 * 2 * 32 * 128
    assert fp8.ring_bytes * 2 == plain.ring_bytes
    assert any("FP8 conversions in hardware" in p for p in decode_tile_problems(128, tile, get_arch("sm_80"), True))
    assert not decode_tile_problems(128, DecodeTile(16, 16, 4, 2), get_arch("sm_89"), True)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_89", "sm_120"])
def test_the_rtx_cards_e4m3_cache_kernels_compile_with_hardware_fp8_conversions(arch):
    """CI's compile-check of the RTX 4090's and 5090's e4m3-cache decode (the h200-sm80 profile run-tests
    that code on the H200, where ptxas emulates FP8 conversions): it builds without spills, and its SASS
    unpacks e4m3 pairs in hardware (F2FP ... E4M3.UNPACK_B) into the 16-bit mma.sync (HMMA)."""
    import subprocess

    from flashtune.kernels.build import build_spec
    from flashtune.kernels.toolchain import detect_toolchain
    from flashtune.runtime.decode import decode_spec

    profile = dataclasses.replace(find_profile("h200"), arch=get_arch(arch), family="sm80")
    spec = decode_spec(profile, torch.bfloat16, 128, False, 1, 8, None, kv_fp8=True)
    assert spec.name.endswith(f"_e4m3kv_{arch.replace('_', '')}")
    result = build_spec(spec)
    assert result.registers and not result.spill_stores, (result.registers, result.spill_stores)
    cuobjdump = detect_toolchain().cuobjdump_path
    if cuobjdump is None:
        pytest.skip("cuobjdump not installed (pip install '.[test]' brings it)")
    sass = subprocess.run([cuobjdump, "-sass", str(result.library)], capture_output=True, text=True, check=True).stdout
    assert re.search(r"F2FP\.\w+\.E4M3\.UNPACK_B", sass) and "HMMA.16816.F32" in sass


def test_profiles_build_fp8_cache_kernels_only_when_asked(tmp_path):
    from flashtune.kernels.decode_spec import decode_row_groups, decode_specs_for_profile

    h200, rtx5090 = find_profile("h200"), find_profile("rtx5090")
    assert h200.fp8_kv and not rtx5090.fp8_kv
    specs = decode_specs_for_profile(h200)
    # each e4m3 kernel beside its 16-bit twin, with twice its stages (the same ring bytes) ...
    fp8 = {s for s in specs if s.kv_fp8}
    row_groups = {s for s in specs if decode_row_groups(s.hdim, s.tile.rows) > 1}  # 32 rows at 192 and 256
    assert {(s.hdim, s.tile.rows) for s in row_groups} == {(192, 32), (256, 32)}
    twins = {s for s in specs if not s.kv_fp8 and s not in row_groups
             and dataclasses.replace(s, tile=e4m3_cache_tile(s.tile), kv_fp8=True) in fp8}
    only_16bit = [s for s in specs if not s.kv_fp8 and s not in twins]
    assert len(twins) == len(fp8) > 20 and all(s.ring_bytes == 2 * dataclasses.replace(s, kv_fp8=True).ring_bytes
                                               for s in twins)
    assert only_16bit and all(s in row_groups for s in only_16bit)  # ... but row groups'
    assert not any(s.kv_fp8 for s in decode_specs_for_profile(rtx5090))
    bad = tmp_path / "bad.yaml"
    bad.write_text(find_profile("h200").path.read_text().replace("  kv: e4m3", "  kv: e5m2"))
    with pytest.raises(ProfileError, match="fp8.kv.*e5m2"):
        from flashtune.kernels.profiles import load_profile
        load_profile(bad)


def test_k_smoothing_is_exact_for_the_output_and_the_lse_is_put_back():
    """K's mean over the tokens subtracted before quantisation shifts each row's scores by a
    constant: the softmax (so O) is unchanged, the LSE moves by scale * q.mean, which
    lse_unsmoothed adds back."""
    from flashtune.runtime.fp8 import fp8_operands, lse_unsmoothed

    g = torch.Generator().manual_seed(0)
    q, k, v = fp8_floor.inputs("activations", 2, 50, 70, 8, 2, 64, torch.float32, "cpu", g)
    q8, k8, q_descale, k_descale, k_mean = fp8_operands(q, k, None, None, True, k_smoothing=True)
    assert k_mean.shape == (2, 2, 64) and torch.allclose(k_mean, k.mean(dim=1))
    assert k8.dtype == E4M3 and fp8_operands(q, k, None, None, True)[4] is None  # off unless asked
    smoothed = k - k_mean[:, None]
    out, lse = attention_reference(q, smoothed, v, True)
    ref_out, ref_lse = attention_reference(q, k, v, True)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse_unsmoothed(lse, q, k_mean, 1 / 8), ref_lse, atol=1e-4, rtol=1e-5)


def test_k_smoothing_is_a_profile_option(tmp_path):
    from flashtune.kernels.profiles import load_profile

    base = find_profile("h200").path.read_text()
    assert not find_profile("h200").k_smoothing
    on = tmp_path / "smooth.yaml"
    on.write_text(base.replace("  kv: e4m3", "  kv: e4m3\n  k_smoothing: true"))
    assert load_profile(on).k_smoothing
    bad = tmp_path / "bad.yaml"
    bad.write_text(base.replace("  kv: e4m3", "  kv: e4m3\n  k_smoothing: maybe"))
    with pytest.raises(ProfileError, match="k_smoothing"):
        load_profile(bad)


def test_an_e4m3_cache_keeps_the_16bit_tiles_bytes_in_flight():
    """Twice the stages, 8 at most, on an allowed count: the ring's bytes are the 16-bit tile's."""
    assert [e4m3_cache_tile(DecodeTile(16, 32, 4, s)).stages for s in (2, 3, 4, 6, 8)] == [4, 6, 8, 8, 8]
    tile = DecodeTile(16, 32, 4, 3)
    assert DecodeSpec("sm_90a", "bfloat16", 128, e4m3_cache_tile(tile), False, kv_fp8=True).ring_bytes == \
        DecodeSpec("sm_90a", "bfloat16", 128, tile, False).ring_bytes
    h200 = find_profile("h200")
    from flashtune.kernels.decode_spec import decode_spec_for
    for hdim, rows in ((64, 16), (128, 16), (128, 32), (256, 16)):
        sixteen = decode_spec_for(h200, "bfloat16", hdim, rows, False, "contiguous")
        e4m3 = decode_spec_for(h200, "bfloat16", hdim, rows, False, "contiguous", kv_fp8=True)
        assert e4m3.tile == e4m3_cache_tile(sixteen.tile) and e4m3.ring_bytes * 2 >= sixteen.ring_bytes
