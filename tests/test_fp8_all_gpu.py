"""All-FP8 prefill on the GPU (sm90 profiles with `fp8: {qk: e4m3, pv: e4m3}`): Q K^T and P V both on
FP8 tensor cores, e4m3 q, k and v with descales or 16-bit ones quantised by the op (qk_fp8=True,
pv_fp8=True), against fp32 references on fresh random inputs, outputs poisoned before each launch.
Runs with $FLASHTUNE_PROFILE or the GPU's matched profile; skipped where it builds no all-FP8 kernels."""
from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.gpu
from flashtune.commands.verify import all_fp8_reference, dequantised_qkv  # noqa: E402

FP8 = torch.float8_e4m3fn


@pytest.fixture(autouse=True, scope="module")
def fp8_profile():
    import flashtune.runtime.ops as ops

    profile = ops.use_profile(os.environ.get("FLASHTUNE_PROFILE")) or ops.active_profile()
    if not profile.fp8_pv:
        pytest.skip(f"profile {profile.name} builds no all-FP8 kernels (fp8.pv)")
    ops.poison_outputs = True
    yield profile
    ops.poison_outputs = False
    ops.use_profile(None)


def _inputs(b, sq, sk, hq, hkv, d):
    return (torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16),
            torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16),
            torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16))


@pytest.mark.parametrize("hdim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlens", [(512, 512), (17, 1000), (1000, 17), (1, 4097), (4097, 4097)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_all_fp8_matches_the_references(fp8_profile, hdim, causal, seqlens):
    import flashtune
    from flashtune.measure.reference import attention_reference, rel_l2
    from flashtune.runtime.fp8 import quantised_inputs

    if hdim not in fp8_profile.head_dims:
        pytest.skip(f"hdim {hdim} not in profile {fp8_profile.name}")
    q, k, v = _inputs(2, *seqlens, 8, 2, hdim)
    out, lse = flashtune.flash_attn_func(q, k, v, causal=causal, qk_fp8=True, pv_fp8=True, return_lse=True)
    torch.cuda.synchronize()
    assert out.dtype == v.dtype and not torch.isnan(out).any()
    # pv_fp8=True quantises exactly as quantise_qk and quantise_v do (the references below rely on it)
    (q8, k8, v8), descales = quantised_inputs(q, k, v, qk=True, pv=True)
    again = flashtune.flash_attn_func(q8, k8, v8, causal=causal, **descales)
    assert again.dtype == torch.bfloat16 and torch.equal(out, again)
    # The kernel's error on its own inputs is P's rounding to e4m3 (3 mantissa bits), which the
    # 16-bit reference does not have: held to that rounding's own error, plus the 16-bit kernels' bar.
    scale = hdim ** -0.5
    ref, ref_lse, bar = all_fp8_reference(q, k, v, causal, scale)
    assert rel_l2(out, ref) <= bar, (rel_l2(out, ref), bar)
    no_key = torch.isinf(ref_lse)
    assert not torch.isnan(lse).any() and torch.equal(torch.isinf(lse), no_key)
    assert bool((lse[no_key] == float("inf")).all())
    torch.testing.assert_close(lse[~no_key], ref_lse[~no_key], atol=5e-3, rtol=1e-3)  # the sums are fp32 P's
    # End to end, against the 16-bit inputs: within 2x of the FP8 Q/K kernel's error (issue 36's bar)
    ref16, _ = attention_reference(q, k, v, causal, scale)
    qk_only = flashtune.flash_attn_func(q, k, v, causal=causal, qk_fp8=True)
    assert rel_l2(out, ref16) <= 2 * rel_l2(qk_only, ref16), (rel_l2(out, ref16), rel_l2(qk_only, ref16))


def test_e4m3_v_with_descales_scales_and_variants(fp8_profile):
    """Given descales far from 1 (v's too), an explicit scale, a window and a softcap: the kernel
    computes softmax(cap(q8 k8^T x descales x scale)) (v8 x v_descale), up to P's rounding."""
    import flashtune
    from flashtune.measure.fp8_floor import dequantised
    from flashtune.measure.reference import attention_reference, rel_l2

    hdim = 128 if 128 in fp8_profile.head_dims else fp8_profile.head_dims[0]
    b, hkv, sk = 3, 2, 700
    q8 = (torch.randn(b, 300, 4, hdim, device="cuda") * 40).to(FP8)
    k8 = (torch.randn(b, sk, hkv, hdim, device="cuda") * 40).to(FP8)
    v8 = (torch.randn(b, sk, hkv, hdim, device="cuda") * 40).to(FP8)
    q_descale, k_descale, v_descale = (torch.rand(b, hkv, device="cuda") * 0.02 + 0.005 for _ in range(3))
    scale, window, cap = 0.3, (200, 0), 4.0
    out = flashtune.flash_attn_func(q8, k8, v8, softmax_scale=scale, causal=True, window_size=window, softcap=cap,
                                    q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    q = dequantised(q8, q_descale.repeat_interleave(2, dim=1))
    ref, _ = attention_reference(q, dequantised(k8, k_descale), dequantised(v8, v_descale), True, scale, window, cap)
    assert out.dtype == torch.bfloat16 and not torch.isnan(out).any()
    # P's rounding is up to 2^-4 of each P: a few percent of O (measured against the 16-bit reference)
    assert rel_l2(out, ref) < 6e-2, rel_l2(out, ref)


def test_all_fp8_kernel_is_the_one_that_runs(fp8_profile):
    import flashtune
    from flashtune.measure.timing import kernel_names
    from flashtune.runtime import ops

    q, k, v = _inputs(1, 256, 256, 4, 4, fp8_profile.head_dims[0])
    spec = ops.select_spec(fp8_profile, torch.bfloat16, q.shape[-1], False, 256, 256, fp8=True, fp8_pv=True)
    names = kernel_names(lambda: flashtune.flash_attn_func(q, k, v, qk_fp8=True, pv_fp8=True))
    assert spec.name in names and "fp8all" in spec.name
    assert not any(n.startswith("flashtune_fwd") and n != spec.name for n in names)


@pytest.mark.parametrize("kind", ["normal", "activations"])
def test_all_fp8_error_beside_its_floor_and_the_qk_kernels(fp8_profile, kind):
    """Issue 36's report for the all-FP8 path, on random-normal and activation-shaped inputs: its
    error against the 16-bit inputs' reference beside its input floor (fp32 attention on the
    dequantised q, k and v, which P's rounding adds to) and within 2x of the FP8 Q/K kernel's."""
    import flashtune
    from flashtune.measure import fp8_floor
    from flashtune.measure.reference import attention_reference, rel_l2

    hdim = 128 if 128 in fp8_profile.head_dims else fp8_profile.head_dims[0]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = fp8_floor.inputs(kind, 2, 1024, 1024, 8, 2, hdim, torch.bfloat16, "cuda", g)
    ref, _ = attention_reference(q, k, v, True)
    floor = rel_l2(attention_reference(*dequantised_qkv(q, k, v), True)[0], ref)
    all_fp8 = rel_l2(flashtune.flash_attn_func(q, k, v, causal=True, qk_fp8=True, pv_fp8=True), ref)
    qk_only = rel_l2(flashtune.flash_attn_func(q, k, v, causal=True, qk_fp8=True), ref)
    print(f"{kind}: all-FP8 {all_fp8:.4f}, its input floor {floor:.4f}, FP8 Q/K {qk_only:.4f}")
    assert all_fp8 <= 2 * qk_only and all_fp8 >= floor * 0.9, (all_fp8, floor, qk_only)


def test_all_fp8_without_keys_gives_zeros_and_an_infinite_lse(fp8_profile):
    """seqlen_k = 0 (the 16-bit kernels' case too): no V^T to lay out, O = 0, LSE = +inf."""
    import flashtune

    hdim = fp8_profile.head_dims[0]
    q, k, v = _inputs(2, 300, 0, 8, 2, hdim)
    out, lse = flashtune.flash_attn_func(q, k, v, qk_fp8=True, pv_fp8=True, return_lse=True)
    torch.cuda.synchronize()
    assert torch.equal(out, torch.zeros_like(out)) and bool((lse == float("inf")).all())
