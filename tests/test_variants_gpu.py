"""The decode kernels' variants on the GPU against the fp32 reference: sliding windows (keys
outside skipped, not only masked), softcap, attention sinks and ALiBi (per sequence and head),
alone and together, with GQA,
causal query rows, split-KV (the sink joins once, in the combine), paged caches and the LSE.
Outputs start as NaN."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned")]

import flashtune  # noqa: E402
from flashtune.measure.reference import attention_reference, rel_l2  # noqa: E402
from flashtune.measure.timing import kernel_names  # noqa: E402

DEV = "cuda"


def randn(*shape, seed, dtype=torch.bfloat16):
    return torch.randn(*shape, device=DEV, dtype=dtype, generator=torch.Generator(device=DEV).manual_seed(seed))


CASES = [  # (window, softcap, sinks, alibi)
    ((127, 0), 0.0, False, False), ((1000, -1), 0.0, False, False), ((-1, -1), 30.0, False, False),
    ((-1, -1), 0.0, True, False), ((127, 0), 50.0, True, False), ((4096, 0), 0.0, True, False),
    ((-1, -1), 0.0, False, True), ((255, 0), 30.0, True, True),
]


@pytest.mark.parametrize("window,softcap,with_sinks,with_alibi", CASES)
@pytest.mark.parametrize("seqlen_q,causal", [(1, False), (4, True)])
@pytest.mark.parametrize("splits", [1, 3, 0])
@pytest.mark.parametrize("page_size", [None, 16])
def test_decode_variants_match_the_reference(window, softcap, with_sinks, with_alibi, seqlen_q, causal, splits,
                                             page_size):
    batch, capacity, hdim = 3, 2048, 128
    q = randn(batch, seqlen_q, 32, hdim, seed=1)
    k, v = randn(batch, capacity, 8, hdim, seed=2), randn(batch, capacity, 8, hdim, seed=3)
    sinks = (2 * randn(32, seed=4, dtype=torch.float32)) if with_sinks else None
    alibi = torch.rand(3, 32, device=DEV, generator=torch.Generator(device=DEV).manual_seed(14)) / 8 if with_alibi else None
    seqlens = torch.tensor([0, 200, 2048], dtype=torch.int32, device=DEV)
    table, k_cache, v_cache = None, k, v
    if page_size:
        pages = capacity // page_size
        table = torch.randperm(batch * pages, device=DEV, generator=torch.Generator(device=DEV).manual_seed(5))
        table = table.to(torch.int32).view(batch, pages)
        k_cache = torch.empty(batch * pages, page_size, 8, hdim, device=DEV, dtype=k.dtype)
        v_cache = torch.empty_like(k_cache)
        k_cache[table.flatten().long()] = k.reshape(-1, page_size, 8, hdim)
        v_cache[table.flatten().long()] = v.reshape(-1, page_size, 8, hdim)
    out, lse = flashtune.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                                 causal=causal, window_size=window, softcap=softcap, sinks=sinks,
                                                 alibi_slopes=alibi, num_splits=splits, return_softmax_lse=True)
    assert not torch.isnan(out).any()
    for b, n in enumerate(seqlens.tolist()):
        ref, ref_lse = attention_reference(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], causal, None, window,
                                           softcap, sinks, alibi[b] if alibi is not None else None)
        assert rel_l2(out[b:b + 1], ref) <= 3 * rel_l2(ref.to(q.dtype).float(), ref) + 1e-6
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isinf(lse[b:b + 1]), ~finite)
        assert (lse[b:b + 1][finite] - ref_lse[finite]).abs().max() < 2e-3 if finite.any() else True


def test_a_window_reads_only_its_keys():
    """Keys before the window's blocks are never loaded: they are NaN here, and the output is still
    the reference's (a loaded NaN value row gives NaN, masked or not: 0 x NaN)."""
    q = randn(2, 1, 32, 128, seed=6)
    k, v = randn(2, 8192, 8, 128, seed=7), randn(2, 8192, 8, 128, seed=8)
    poisoned_k, poisoned_v = k.clone(), v.clone()
    poisoned_k[:, :8191 - 255 - 64] = float("nan")  # a block of up to 64 keys may hold the window's first key
    poisoned_v[:, :8191 - 255 - 64] = float("nan")
    for splits in (1, 3):
        out = flashtune.flash_attn_with_kvcache(q, poisoned_k, poisoned_v, window_size=(255, 0), num_splits=splits)
        ref, _ = attention_reference(q, k, v, False, None, (255, 0))
        assert rel_l2(out, ref) <= 3 * rel_l2(ref.to(q.dtype).float(), ref) + 1e-6, splits
    names = kernel_names(lambda: flashtune.flash_attn_with_kvcache(q, k, k, window_size=(255, 0)))
    assert any("_swa_" in n for n in names), names


def test_a_sink_of_minus_infinity_joins_nothing():
    """sinks = -inf: the plain softmax, and a row without keys keeps LSE +inf (not NaN)."""
    q = randn(2, 1, 32, 128, seed=11)
    k, v = randn(2, 300, 8, 128, seed=12), randn(2, 300, 8, 128, seed=13)
    seqlens = torch.tensor([0, 300], dtype=torch.int32, device=DEV)
    sinks = torch.full((32,), float("-inf"), device=DEV)
    for splits in (1, 3):
        out, lse = flashtune.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, sinks=sinks, num_splits=splits,
                                                     return_softmax_lse=True)
        plain, plain_lse = flashtune.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, num_splits=splits,
                                                             return_softmax_lse=True)
        assert torch.isinf(lse[0]).all() and (lse[0] > 0).all()
        torch.testing.assert_close(out, plain, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(lse[1], plain_lse[1], atol=1e-4, rtol=1e-4)
