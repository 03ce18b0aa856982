"""Attention variants on the CPU: the fp32 reference's sliding window, softcap and sinks against a
plain per-row loop, the arguments' checks, and the decode kernels' names for them."""
from __future__ import annotations

import math

import pytest
import torch

import flashtune
from flashtune.kernels.decode_spec import DecodeSpec, DecodeTile
from flashtune.kernels.variants import Variants
from flashtune.measure.reference import attention_reference

BF16 = torch.bfloat16


def loop_reference(q, k, v, causal, window, softcap, sinks, alibi=None):
    """One query row at a time, written from the definitions (flash_attn's, vLLM's)."""
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    out = torch.zeros(b, sq, hq, d)
    lse = torch.full((b, hq, sq), float("inf"))
    for bi in range(b):
        for h in range(hq):
            for i in range(sq):
                own = i + sk - sq
                logits, values = [], []
                for j in range(sk):
                    if (causal and j > own) or (window[0] >= 0 and j < own - window[0]) or \
                            (window[1] >= 0 and j > own + window[1]):
                        continue
                    s = float(q[bi, i, h] @ k[bi, j, h // (hq // hkv)]) / math.sqrt(d)
                    s = softcap * math.tanh(s / softcap) if softcap else s
                    if alibi is not None:
                        s -= float(alibi[h]) * abs(own - j)
                    logits.append(s)
                    values.append(v[bi, j, h // (hq // hkv)])
                if sinks is not None:
                    logits.append(float(sinks[h]))
                    values.append(torch.zeros(d))
                if not logits:
                    continue
                weights = torch.softmax(torch.tensor(logits), dim=0)
                out[bi, i, h] = sum(w * x for w, x in zip(weights, values))
                lse[bi, h, i] = torch.logsumexp(torch.tensor(logits), dim=0)
    return out, lse


@pytest.mark.parametrize("causal,window,softcap,with_sinks", [
    (False, (3, 1), 0.0, False), (True, (4, -1), 0.0, False), (True, (-1, -1), 5.0, False),
    (True, (-1, -1), 0.0, True), (True, (2, 0), 3.0, True), (False, (0, 0), 0.0, True),
])
@pytest.mark.parametrize("with_alibi", [False, True], ids=["", "alibi"])
def test_the_reference_follows_the_definitions(causal, window, softcap, with_sinks, with_alibi):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, n, h, 16, generator=g) for n, h in ((5, 4), (9, 2), (9, 2)))
    sinks = torch.randn(4, generator=g) if with_sinks else None
    alibi = torch.rand(4, generator=g) if with_alibi else None
    out, lse = attention_reference(q, k, v, causal, None, window, softcap, sinks, alibi)
    want, want_lse = loop_reference(q, k, v, causal, window, softcap, sinks, alibi)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-5)


def call_kv(**overrides):
    args = dict(q=torch.zeros(2, 1, 32, 128, dtype=BF16), k_cache=torch.zeros(2, 64, 8, 128, dtype=BF16),
                v_cache=torch.zeros(2, 64, 8, 128, dtype=BF16))
    args.update(overrides)
    flashtune.flash_attn_with_kvcache(**args)


@pytest.mark.parametrize("overrides,message", [
    (dict(window_size=(-2, 0)), "each side is a number of keys >= 0, or -1"),
    (dict(window_size=(4,)), "a pair of ints"),
    (dict(softcap=-1.0), "softcap must be a finite number >= 0"),
    (dict(sinks=torch.zeros(8)), r"sinks must be a float tensor of shape \(heads_q,\) = \(32,\)"),
    (dict(alibi_slopes=torch.ones(32, dtype=torch.float64)), "alibi_slopes must be a float32 tensor"),
    (dict(alibi_slopes=torch.ones(3, 32)), r"\(32,\) or \(2, 32\)"),
    (dict(window_size=(128, 0), softcap=30.0, sinks=torch.zeros(32), alibi_slopes=torch.ones(2, 32)), "on cpu"),
])
def test_variant_arguments_are_checked(overrides, message):
    with pytest.raises(flashtune.FlashtuneInputError, match=message):
        call_kv(**overrides)


def test_every_kernel_family_has_the_variants():
    from flashtune.kernels.profiles import find_profile
    from flashtune.runtime.selection import kernel_for, select_spec

    every = Variants(True, True, True, True)
    spec = select_spec(find_profile("rtx4090"), BF16, 128, True, 4096, 4096, variants=every)
    assert spec.name.endswith("_c_softcap_swa_sinks_alibi_sm89")
    assert "flashtune::Variants<true, true, true, true>" in spec.source()
    sm90 = select_spec(find_profile("h200"), BF16, 128, True, 4096, 4096, variants=Variants(window=True))
    assert sm90.name.endswith("_c_swa_sm90a")
    assert "KernelSchedule, flashtune::Variants<false, true, false, false>>" in sm90.source()
    plain = select_spec(find_profile("h200"), BF16, 128, True, 4096, 4096)
    assert "KernelSchedule>;" in plain.source()  # the plain kernel's source as before
    # queries of at most 16 rows: the decode kernels, which have the variants under an sm90 profile too
    decode = kernel_for(find_profile("h200"), BF16, 128, True, 4, 4096, 4, variants=Variants(False, True, True, True))
    assert decode.name.endswith("_c_swa_sinks_alibi_sm90a")
    q = torch.zeros(1, 300, 8, 64, dtype=BF16)
    with pytest.raises(flashtune.FlashtuneInputError, match="on cpu"):  # accepted: only the device is left
        flashtune.flash_attn_func(q, q, q, causal=True, window_size=(128, 0), softcap=30.0, sinks=torch.zeros(8))


def test_variant_kernels_are_named_and_built_with_them():
    tile = DecodeTile(16, 32, 4, 3)
    plain = DecodeSpec("sm_90a", "bfloat16", 128, tile, True)
    every = DecodeSpec("sm_90a", "bfloat16", 128, tile, True, variants=Variants(True, True, True, True))
    assert every.name == plain.name.replace("_c_sm90a", "_c_softcap_swa_sinks_alibi_sm90a")
    assert "Variants<true, true, true, true>" in every.source()
    assert "combine_body<__nv_bfloat16, 128, true, kPdl>" in every.source()
    assert "Variants<false, false, false, false>" in plain.source() and every.source_hash() != plain.source_hash()


def test_a_huge_window_side_is_clamped_not_wrapped():
    from flashtune.runtime.checks import MAX_WINDOW, check_variants

    checked = check_variants((2**40, 2**31 - 1), 0.0, None, 8)
    assert checked.window == (MAX_WINDOW, MAX_WINDOW) and checked.variants == Variants(window=True)
    assert check_variants((-1, -1), 0.0, None, 8).variants == Variants()
