"""The prefill kernels with the variants, on the GPU against the fp32 reference: sliding windows
(blocks outside skipped), softcap, sinks and ALiBi, alone and together, causal and not, GQA, seqlen_q
!= seqlen_k, varlen, with the LSE; under the profile the run selects (h200: the sm90 family;
FLASHTUNE_PROFILE=h200-sm80: the RTX cards' code path). Outputs start as NaN."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned", "run_profile")]

import flashtune  # noqa: E402
from flashtune.measure.reference import attention_reference, rel_l2  # noqa: E402

DEV = "cuda"
CASES = [  # (window, softcap, sinks, alibi)
    ((255, 0), 0.0, False, False), ((100, 37), 0.0, False, False), ((-1, -1), 30.0, False, False),
    ((-1, -1), 0.0, True, False), ((255, 0), 50.0, True, False), ((-1, -1), 0.0, False, True),
    ((255, 0), 30.0, True, True),
]


def randn(*shape, seed, dtype=torch.bfloat16):
    return torch.randn(*shape, device=DEV, dtype=dtype, generator=torch.Generator(device=DEV).manual_seed(seed))


@pytest.mark.parametrize("window,softcap,with_sinks,with_alibi", CASES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hdim,seqlen_q,seqlen_k", [(64, 700, 700), (128, 333, 1000), (256, 1000, 517)])
def test_prefill_variants_match_the_reference(window, softcap, with_sinks, with_alibi, causal, hdim, seqlen_q,
                                              seqlen_k):
    if causal and window[1] > 0:
        window = (window[0], 0)  # causal already bounds the right side
    q = randn(2, seqlen_q, 8, hdim, seed=1)
    k, v = randn(2, seqlen_k, 2, hdim, seed=2), randn(2, seqlen_k, 2, hdim, seed=3)
    sinks = 2 * randn(8, seed=4, dtype=torch.float32) if with_sinks else None
    alibi = torch.rand(8, device=DEV, generator=torch.Generator(device=DEV).manual_seed(15)) / 8 if with_alibi else None
    out, lse = flashtune.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap, sinks=sinks,
                                         alibi_slopes=alibi, return_lse=True)
    ref, ref_lse = attention_reference(q, k, v, causal, None, window, softcap, sinks, alibi)
    assert not torch.isnan(out).any()
    assert rel_l2(out, ref) <= 3 * rel_l2(ref.to(q.dtype).float(), ref) + 1e-6
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isinf(lse), ~finite)
    assert (lse[finite] - ref_lse[finite]).abs().max() < 2e-3


def test_varlen_with_a_window_sinks_and_alibi_per_sequence():
    lens_q, lens_k = [7, 0, 300, 513], [9, 4, 300, 900]
    cu_q = torch.tensor([0, 7, 7, 307, 820], dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0, 9, 13, 313, 1213], dtype=torch.int32, device=DEV)
    q, k, v = randn(820, 8, 128, seed=5), randn(1213, 2, 128, seed=6), randn(1213, 2, 128, seed=7)
    sinks = randn(8, seed=8, dtype=torch.float32)
    slopes = torch.rand(4, 8, device=DEV, generator=torch.Generator(device=DEV).manual_seed(9)) / 16  # (batch, heads)
    out = flashtune.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                           window_size=(64, 0), sinks=sinks, alibi_slopes=slopes)
    for i in range(4):
        a, b, c, d = cu_q[i].item(), cu_q[i + 1].item(), cu_k[i].item(), cu_k[i + 1].item()
        if b == a:
            continue
        ref, _ = attention_reference(q[a:b][None], k[c:d][None], v[c:d][None], True, None, (64, 0), 0.0, sinks,
                                     slopes[i])
        assert rel_l2(out[a:b][None], ref) <= 3 * rel_l2(ref.to(q.dtype).float(), ref) + 1e-6


def test_a_window_skips_the_blocks_outside_it():
    """The last 128 queries of 8k keys with a 512-key window: keys before the window's blocks are NaN,
    never loaded (a loaded NaN value row gives NaN, masked or not), so the output is the reference's."""
    q = randn(1, 128, 8, 128, seed=9)
    k, v = randn(1, 8192, 8, 128, seed=10), randn(1, 8192, 8, 128, seed=11)
    first_seen = 8192 - 128 - 511  # the first row's window starts there
    poisoned_k, poisoned_v = k.clone(), v.clone()
    poisoned_k[:, :first_seen - 256] = float("nan")  # blocks of up to 256 keys may start before it
    poisoned_v[:, :first_seen - 256] = float("nan")
    out = flashtune.flash_attn_func(q, poisoned_k, poisoned_v, causal=True, window_size=(511, 0))
    ref, _ = attention_reference(q, k, v, True, None, (511, 0))
    assert rel_l2(out, ref) <= 3 * rel_l2(ref.to(q.dtype).float(), ref) + 1e-6
