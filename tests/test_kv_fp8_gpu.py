"""An e4m3 KV cache on the GPU: the decode kernels' FP8 twins against the floor the format sets
(fp8_floor.py: error <= 1.1 x floor + 1e-3, on random-normal and activation-shaped inputs),
against fp32 on the dequantised cache with per-sequence lengths, pages and causal queries,
quantise-on-append byte for byte, and the kernel's name in the profiler. Outputs start as NaN."""
from __future__ import annotations

import math

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned")]

import flashtune  # noqa: E402
from flashtune.kernels.build import build_specs  # noqa: E402
from flashtune.measure import fp8_floor  # noqa: E402
from flashtune.measure.reference import attention_reference, rel_l2  # noqa: E402
from flashtune.measure.timing import kernel_names  # noqa: E402
from flashtune.runtime.decode import cluster_slots, decode_spec  # noqa: E402
from flashtune.runtime.decode_splits import in_cluster  # noqa: E402
from flashtune.runtime.fp8 import quantise_kv  # noqa: E402
from flashtune.runtime.selection import active_profile  # noqa: E402

DEV = "cuda"
BF16 = torch.bfloat16


@pytest.fixture(scope="module", autouse=True)
def built_kernels():
    profile = active_profile(torch.device(DEV))
    specs = {decode_spec(profile, dtype, hdim, causal, seqlen_q, ratio, page, kv_fp8=True)
             for dtype in (torch.bfloat16, torch.float16) for hdim in (64, 128, 256) for causal in (False, True)
             for seqlen_q, ratio in ((1, 4), (1, 32), (4, 4)) for page in (None, 16, 64)}
    _, failures = build_specs(sorted(specs, key=lambda s: s.name), jobs=16)
    assert not failures, failures


def fp8_case(kind, batch, seqlen_q, heads, heads_kv, hdim, capacity, dtype=BF16, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    q, k, v = fp8_floor.inputs(kind, batch, seqlen_q, capacity, heads, heads_kv, hdim, dtype, DEV, g)
    k_descale, v_descale = flashtune.kv_descales(k, v)
    return q, k, v, quantise_kv(k, k_descale), quantise_kv(v, v_descale), k_descale, v_descale


@pytest.mark.parametrize("kind", fp8_floor.INPUT_KINDS)
@pytest.mark.parametrize("hdim", [64, 128, 256])
@pytest.mark.parametrize("heads_kv,splits", [(8, 0), (1, 3), (32, 1)])
def test_fp8_cache_error_is_at_the_formats_floor(kind, hdim, heads_kv, splits):
    q, k, v, k8, v8, k_descale, v_descale = fp8_case(kind, 3, 1, 32, heads_kv, hdim, 1500, seed=hdim + heads_kv)
    out = flashtune.flash_attn_with_kvcache(q, k8, v8, k_descale=k_descale, v_descale=v_descale, num_splits=splits)
    check = fp8_floor.kv_cache_check(out, q, k, v, k8, v8, k_descale, v_descale, causal=False)
    assert check.ok, f"error {check.error:.4f} over the bar {check.bar:.4f} (floor {check.floor:.4f})"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("page_size", [None, 16, 64])
@pytest.mark.parametrize("causal,seqlen_q", [(False, 1), (True, 4)])
def test_fp8_cache_reads_like_fp32_on_its_dequantised_values(dtype, page_size, causal, seqlen_q):
    """Per-sequence lengths (0 and full included), pages in shuffled order, causal query rows:
    the kernel against fp32 attention on exactly the values the cache holds (16-bit rounding of
    the output is all that may differ), LSE included."""
    batch, capacity, hdim = 4, 700, 128
    q, k, v, k8, v8, k_descale, v_descale = fp8_case("normal", batch, seqlen_q, 32, 8, hdim, capacity, dtype)
    seqlens = torch.tensor([0, 1, 333, capacity], dtype=torch.int32, device=DEV)
    table = None
    if page_size:
        pages = math.ceil(capacity / page_size)
        order = torch.randperm(batch * pages, device=DEV, generator=torch.Generator(device=DEV).manual_seed(5))
        table = order.view(batch, pages).to(torch.int32)
        paged = torch.zeros(batch * pages * page_size, 8, hdim, dtype=torch.float8_e4m3fn, device=DEV)
        paged_v = torch.zeros_like(paged)
        rows = (table.long()[:, :, None] * page_size + torch.arange(page_size, device=DEV)).view(batch, -1)[:, :capacity]
        paged.view(torch.uint8)[rows.flatten()] = k8.reshape(-1, 8, hdim).view(torch.uint8)
        paged_v.view(torch.uint8)[rows.flatten()] = v8.reshape(-1, 8, hdim).view(torch.uint8)
        k_cache, v_cache = paged.view(-1, page_size, 8, hdim), paged_v.view(-1, page_size, 8, hdim)
    else:
        k_cache, v_cache = k8, v8
    out, lse = flashtune.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                                 causal=causal, k_descale=k_descale, v_descale=v_descale,
                                                 return_softmax_lse=True)
    assert not torch.isnan(out).any()
    kd, vd = fp8_floor.dequantised(k8, k_descale), fp8_floor.dequantised(v8, v_descale)
    for b in range(batch):
        n = int(seqlens[b])
        ref, ref_lse = attention_reference(q[b:b + 1].float(), kd[b:b + 1, :n], vd[b:b + 1, :n], causal)
        if n == 0:
            assert (out[b] == 0).all() and torch.isinf(lse[b]).all()
            continue
        rounding = rel_l2(ref.to(dtype).float(), ref)
        assert rel_l2(out[b:b + 1], ref) <= 3 * rounding + 1e-6
        finite = torch.isfinite(ref_lse)
        assert (lse[b:b + 1][finite] - ref_lse[finite]).abs().max() < 2e-3


def test_appending_quantises_with_the_sequences_descales():
    batch, capacity, hdim = 3, 256, 128
    q, k, v, k8, v8, k_descale, v_descale = fp8_case("activations", batch, 2, 32, 8, hdim, capacity)
    new_k = torch.randn(batch, 2, 8, hdim, dtype=BF16, device=DEV)
    new_v = torch.randn(batch, 2, 8, hdim, dtype=BF16, device=DEV)
    seqlens = torch.tensor([0, 100, 254], dtype=torch.int32, device=DEV)
    k_cache, v_cache = k8.clone(), v8.clone()
    out = flashtune.flash_attn_with_kvcache(q, k_cache, v_cache, k=new_k, v=new_v, cache_seqlens=seqlens, causal=True,
                                            k_descale=k_descale, v_descale=v_descale)
    want_k, want_v = quantise_kv(new_k, k_descale), quantise_kv(new_v, v_descale)
    for b, n in enumerate(seqlens.tolist()):
        assert torch.equal(k_cache[b, n:n + 2].view(torch.uint8), want_k[b].view(torch.uint8))
        assert torch.equal(v_cache[b, n:n + 2].view(torch.uint8), want_v[b].view(torch.uint8))
        kd = fp8_floor.dequantised(k_cache[b:b + 1, :n + 2], k_descale[b:b + 1])
        vd = fp8_floor.dequantised(v_cache[b:b + 1, :n + 2], v_descale[b:b + 1])
        ref, _ = attention_reference(q[b:b + 1].float(), kd, vd, True)
        assert rel_l2(out[b:b + 1], ref) <= 3 * rel_l2(ref.to(BF16).float(), ref) + 1e-6


def test_the_fp8_twin_is_the_kernel_that_runs():
    q, k, v, k8, v8, k_descale, v_descale = fp8_case("normal", 2, 1, 32, 8, 128, 4096)
    names = kernel_names(lambda: flashtune.flash_attn_with_kvcache(q, k8, v8, k_descale=k_descale,
                                                                   v_descale=v_descale, num_splits=4))
    profile = active_profile(torch.device(DEV))
    expected = decode_spec(profile, BF16, 128, False, 1, 4, None, kv_fp8=True)
    merged = in_cluster(4, 2 * 8, cluster_slots(expected, 0), profile.decode_split)
    assert expected.name in names and (expected.combine_name in names) != merged, names


@pytest.mark.parametrize("splits", [1, 3])
def test_fp8_cache_with_softcap_caps_the_true_scores(splits):
    """The cap is on the dequantised scores (raw x descale x scale): with descales far from 1 a
    kernel that capped the raw ones would squash every score (a review found it before a GPU did)."""
    q, k, v, k8, v8, k_descale, v_descale = fp8_case("normal", 2, 1, 32, 8, 128, 1000)
    out = flashtune.flash_attn_with_kvcache(q, k8, v8, k_descale=k_descale, v_descale=v_descale, softcap=5.0,
                                            num_splits=splits)
    assert (k_descale - 1).abs().min() > 0.5  # far from 1: absmax / 448 of normal data
    kd, vd = fp8_floor.dequantised(k8, k_descale), fp8_floor.dequantised(v8, v_descale)
    ref, _ = attention_reference(q.float(), kd, vd, False, None, (-1, -1), 5.0)
    assert rel_l2(out, ref) <= 3 * rel_l2(ref.to(BF16).float(), ref) + 1e-6


def test_fp8_cache_with_alibi_per_sequence_and_head():
    """ALiBi's bias in raw-score units divides by the descaled scale; slopes of (batch, heads)."""
    q, k, v, k8, v8, k_descale, v_descale = fp8_case("normal", 2, 4, 32, 8, 128, 900)
    slopes = torch.rand(2, 32, device=DEV, generator=torch.Generator(device=DEV).manual_seed(3)) / 16
    out = flashtune.flash_attn_with_kvcache(q, k8, v8, k_descale=k_descale, v_descale=v_descale, causal=True,
                                            alibi_slopes=slopes)
    kd, vd = fp8_floor.dequantised(k8, k_descale), fp8_floor.dequantised(v8, v_descale)
    for b in range(2):
        ref, _ = attention_reference(q[b:b + 1].float(), kd[b:b + 1], vd[b:b + 1], True, None, (-1, -1), 0.0, None,
                                     slopes[b])
        assert rel_l2(out[b:b + 1], ref) <= 3 * rel_l2(ref.to(BF16).float(), ref) + 1e-6


@pytest.mark.parametrize("splits", [1, 3])
def test_fp8_cache_with_a_window_and_sinks(splits):
    """A window's edges fall inside key blocks, so every S column's key (S's columns are keys t, t+4,
    t+8, t+12 of each 16 with an e4m3 cache) is masked by its own position; sinks join the sum."""
    q, k, v, k8, v8, k_descale, v_descale = fp8_case("normal", 2, 4, 32, 8, 128, 901)
    sinks = torch.randn(32, device=DEV, generator=torch.Generator(device=DEV).manual_seed(4))
    out = flashtune.flash_attn_with_kvcache(q, k8, v8, k_descale=k_descale, v_descale=v_descale, causal=True,
                                            window_size=(37, 0), sinks=sinks, num_splits=splits)
    kd, vd = fp8_floor.dequantised(k8, k_descale), fp8_floor.dequantised(v8, v_descale)
    ref, _ = attention_reference(q.float(), kd, vd, True, None, (37, 0), 0.0, sinks)
    assert rel_l2(out, ref) <= 3 * rel_l2(ref.to(BF16).float(), ref) + 1e-6


@pytest.mark.parametrize("q_scale", [3e5, 1e-6])
def test_fp8_cache_takes_q_of_any_16bit_magnitude(q_scale):
    """q is stored as f16 times a power of two chosen from its tile's largest |q|: bf16 queries past
    f16's range (65504) or far below its normal range read as exactly as ordinary ones."""
    q, k, v, k8, v8, k_descale, v_descale = fp8_case("normal", 2, 1, 32, 8, 128, 600)
    q = (q.float() * q_scale).to(BF16)
    scale = 0.5 / (q_scale * math.sqrt(128))  # scores of ordinary size
    out = flashtune.flash_attn_with_kvcache(q, k8, v8, k_descale=k_descale, v_descale=v_descale,
                                            softmax_scale=scale)
    kd, vd = fp8_floor.dequantised(k8, k_descale), fp8_floor.dequantised(v8, v_descale)
    ref, _ = attention_reference(q.float(), kd, vd, False, scale)
    assert rel_l2(out, ref) <= 3 * rel_l2(ref.to(BF16).float(), ref) + 1e-6


@pytest.mark.parametrize("hdim", [80, 96, 192])
def test_fp8_cache_at_head_dims_between_the_built_ones(hdim):
    """Computed at the next built head dim: Q, K and V zero past hdim (Q's permuted columns too)."""
    q, k, v, k8, v8, k_descale, v_descale = fp8_case("normal", 2, 1, 16, 4, hdim, 777)
    out = flashtune.flash_attn_with_kvcache(q, k8, v8, k_descale=k_descale, v_descale=v_descale)
    kd, vd = fp8_floor.dequantised(k8, k_descale), fp8_floor.dequantised(v8, v_descale)
    ref, _ = attention_reference(q.float(), kd, vd, False)
    assert rel_l2(out, ref) <= 3 * rel_l2(ref.to(BF16).float(), ref) + 1e-6

