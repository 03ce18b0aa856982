"""flash_attn_with_kvcache on the GPU against an fp32 reference: GQA/MQA packing, split-KV (1, 3, 17-256
and the heuristic's count; merged in a thread block cluster and by the combine kernel), paged caches (page sizes 1 to 256, shuffled tables), appends with and
without rotary, cache_batch_idx, cache_leftpad, causal query lengths 1-16, CUDA graph replays; and
the calls whose packed rows fill 128-row tiles (MQA with 4 query tokens, chunked prefill), which an
sm90 profile serves with its KV-cache kernels (wgmma) and an sm80 one with the decode kernels.
Every output starts as NaN (ops.poison_outputs), so a row the kernels forget cannot pass."""
from __future__ import annotations

import math

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned")]

import flashtune  # noqa: E402
from flashtune.kernels.build import build_specs, load_binding, load_kernel  # noqa: E402
from flashtune.kernels.decode_spec import DecodeSplitPolicy  # noqa: E402
from flashtune.measure.timing import kernel_names  # noqa: E402
from flashtune.runtime.decode import cluster_slots, decode_spec, run_decode  # noqa: E402
from flashtune.runtime.decode_splits import call_ctas, in_cluster, kv_bytes, short_call  # noqa: E402
from flashtune.runtime.selection import active_profile  # noqa: E402

DEV = "cuda"


def rotate_ref(x, cos, sin, interleaved):
    """fp32 rotary of x (b, s, h, d) with cos/sin (b, s, rd/2), written independently of kvcache.py."""
    x = x.float()
    half = cos.shape[-1]
    out = x.clone()
    c, s = cos[:, :, None, :].float(), sin[:, :, None, :].float()
    if interleaved:
        a, b = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        out[..., 0:2 * half:2] = a * c - b * s
        out[..., 1:2 * half:2] = a * s + b * c
    else:
        a, b = x[..., :half], x[..., half:2 * half]
        out[..., :half] = a * c - b * s
        out[..., half:2 * half] = a * s + b * c
    return out


def attention_ref(q, keys, values, causal, scale):
    """q (sq, h, d) fp32 against keys/values (sk, hkv, d): out (sq, h, d), lse (h, sq); rows that see
    no key: out 0, lse +inf."""
    sq, h, _ = q.shape
    sk, hkv, _ = keys.shape
    kk = keys.repeat_interleave(h // hkv, dim=1)
    vv = values.repeat_interleave(h // hkv, dim=1)
    s = torch.einsum("qhd,khd->hqk", q, kk) * scale
    if causal:
        i = torch.arange(sq, device=q.device)[:, None]
        j = torch.arange(sk, device=q.device)[None, :]
        s = s.masked_fill(j > i + sk - sq, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("hqk,khd->qhd", p, vv)
    return out, torch.where(torch.isfinite(lse), lse, torch.full_like(lse, float("inf")))


def make_case(batch, seqlen_q, heads, heads_kv, hdim, dtype, capacity, page_size=None, seqlens=None, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = torch.randn(batch, seqlen_q, heads, hdim, device=DEV, dtype=dtype, generator=g)
    if seqlens is None:
        seqlens = torch.randint(0, capacity + 1, (batch,), device=DEV, generator=g)
    seqlens = torch.as_tensor(seqlens, device=DEV).to(torch.int32)
    if page_size is None:
        k_cache = torch.randn(batch, capacity, heads_kv, hdim, device=DEV, dtype=dtype, generator=g)
        v_cache = torch.randn(batch, capacity, heads_kv, hdim, device=DEV, dtype=dtype, generator=g)
        return q, k_cache, v_cache, seqlens, None
    pages_per_seq = math.ceil(capacity / page_size)
    num_pages = batch * pages_per_seq + 3  # spare pages nobody uses
    k_cache = torch.randn(num_pages, page_size, heads_kv, hdim, device=DEV, dtype=dtype, generator=g)
    v_cache = torch.randn(num_pages, page_size, heads_kv, hdim, device=DEV, dtype=dtype, generator=g)
    table = torch.randperm(num_pages, device=DEV, generator=g)[:batch * pages_per_seq]
    return q, k_cache, v_cache, seqlens, table.view(batch, pages_per_seq).to(torch.int32)


def sequence_kv(cache, b, length, block_table, batch_idx=None, leftpad=0):
    """Rows [leftpad, length) of sequence b's keys (or values), fp32."""
    if block_table is None:
        row = b if batch_idx is None else int(batch_idx[b])
        return cache[row, leftpad:length].float()
    page_size = cache.shape[1]
    idx = torch.arange(length, device=cache.device)
    pages = block_table[b].long()[idx // page_size]
    return cache[pages, idx % page_size].float()


def check(out, lse, q, k_cache, v_cache, seqlens, block_table, causal, batch_idx=None, leftpad=None):
    scale = 1.0 / math.sqrt(q.shape[-1])
    assert not torch.isnan(out).any(), "an output row was never written"
    refs, lses = [], []
    for b in range(q.shape[0]):
        pad = 0 if leftpad is None else int(leftpad[b])
        n = int(seqlens[b])
        keys = sequence_kv(k_cache, b, n, block_table, batch_idx, pad)
        values = sequence_kv(v_cache, b, n, block_table, batch_idx, pad)
        o, l = attention_ref(q[b].float(), keys, values, causal, scale)
        refs.append(o)
        lses.append(l)
    ref = torch.stack(refs)
    rounding = ((ref.to(q.dtype).float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    err = ((out.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err <= 3 * rounding + 1e-6, f"relative L2 error {err:.2e}, rounding {rounding:.2e}"
    if lse is not None:
        ref_lse = torch.stack(lses)
        inf = torch.isinf(ref_lse)
        assert torch.equal(torch.isinf(lse), inf), "LSE +inf exactly where a row sees no key"
        assert (lse[~inf] - ref_lse[~inf]).abs().max().item() < 2e-3 if (~inf).any() else True


def kv_call(q, k_cache, v_cache, seqlens, table, causal, splits, lse=True, **kw):
    return flashtune.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                             causal=causal, num_splits=splits, return_softmax_lse=lse, **kw)


# Every decode kernel the cases below launch, compiled in parallel up front (one wait, not 30).
@pytest.fixture(scope="module", autouse=True)
def built_kernels():
    profile = active_profile(torch.device(DEV))
    specs = set()
    for dtype in (torch.bfloat16, torch.float16):
        for hdim in (64, 128, 256):
            for causal in (False, True):
                for seqlen_q, ratio in ((1, 4), (1, 32), (4, 4), (16, 4), (4, 32), (300, 4)):
                    for page in (None, 1, 16, 64, 256):
                        specs.add(decode_spec(profile, dtype, hdim, causal, seqlen_q, ratio, page))
    wanted = [s for s in specs if s.dtype == "bfloat16" or s.paging == "contiguous"]
    _, failures = build_specs(wanted, jobs=16)
    assert not failures, failures


@pytest.mark.parametrize("hdim", [64, 128, 256])
@pytest.mark.parametrize("heads_kv", [8, 32, 1])
@pytest.mark.parametrize("splits", [1, 3, 0])
def test_decode_one_query_gqa_mqa_and_splits(hdim, heads_kv, splits):
    q, kc, vc, seqlens, _ = make_case(5, 1, 32, heads_kv, hdim, torch.bfloat16, 1000,
                                      seqlens=[0, 1, 1000, 517, 64])
    out, lse = kv_call(q, kc, vc, seqlens, None, False, splits)
    check(out, lse, q, kc, vc, seqlens, None, False)


@pytest.mark.parametrize("hdim", [64, 128, 256])
@pytest.mark.parametrize("splits", [17, 40, 100, 256])
def test_many_splits_share_each_row_among_a_group_of_combine_warps(hdim, splits):
    """Above 16 splits 2, 4 or 8 combine warps share a (row, head); 5 query heads make the last
    CTA's groups partly idle. Splits past the keys (256 x 16 > 3000) must weigh nothing."""
    q, kc, vc, seqlens, _ = make_case(3, 1, 5, 1, hdim, torch.bfloat16, 3000, seqlens=[3000, 0, 1777])
    out, lse = kv_call(q, kc, vc, seqlens, None, False, splits)
    check(out, lse, q, kc, vc, seqlens, None, False)
    again = kv_call(q, kc, vc, seqlens, None, False, splits)
    assert torch.equal(out, again[0]) and torch.equal(lse, again[1])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("hdim", [64, 128, 256])
def test_decode_dtypes_long_cache(dtype, hdim):
    q, kc, vc, seqlens, _ = make_case(2, 1, 32, 8, hdim, dtype, 9000, seqlens=[9000, 4099])
    out, lse = kv_call(q, kc, vc, seqlens, None, False, 0)
    check(out, lse, q, kc, vc, seqlens, None, False)


@pytest.mark.parametrize("seqlen_q", [1, 2, 4, 7, 16])
@pytest.mark.parametrize("splits", [1, 3])
def test_causal_query_lengths(seqlen_q, splits):
    q, kc, vc, seqlens, _ = make_case(4, seqlen_q, 32, 8, 128, torch.bfloat16, 700, seqlens=[0, 3, 700, 300])
    out, lse = kv_call(q, kc, vc, seqlens, None, True, splits)
    check(out, lse, q, kc, vc, seqlens, None, True)


@pytest.mark.parametrize("page_size", [1, 16, 64, 256])
@pytest.mark.parametrize("causal,seqlen_q", [(False, 1), (True, 4)])
@pytest.mark.parametrize("splits", [1, 3, 0])
def test_paged_cache(page_size, causal, seqlen_q, splits):
    q, kc, vc, seqlens, table = make_case(3, seqlen_q, 32, 8, 128, torch.bfloat16, 1300, page_size,
                                          seqlens=[1300, 5, 777])
    out, lse = kv_call(q, kc, vc, seqlens, table, causal, splits)
    check(out, lse, q, kc, vc, seqlens, table, causal)


@pytest.mark.parametrize("page_size", [32, 48, 128, 512])
@pytest.mark.parametrize("hdim", [64, 128])
def test_the_other_page_sizes(page_size, hdim):
    """Pages of a multiple of 16 beside the grid's: 32 (whole tiles of 32 keys, row gathers under
    64-key tiles), 48 (not a multiple of either: gathered), 128 and 512 (whole tiles, 512 the largest)."""
    q, kc, vc, seqlens, table = make_case(3, 1, 32, 8, hdim, torch.bfloat16, 1300, page_size, seqlens=[1300, 5, 777],
                                          seed=page_size)
    out, lse = kv_call(q, kc, vc, seqlens, table, False, 0)
    check(out, lse, q, kc, vc, seqlens, table, False)


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_a_paged_fp16_cache(page_size):
    q, kc, vc, seqlens, table = make_case(2, 4, 32, 8, 128, torch.float16, 900, page_size, seqlens=[900, 130],
                                          seed=page_size + 1)
    out, lse = kv_call(q, kc, vc, seqlens, table, True, 3)
    check(out, lse, q, kc, vc, seqlens, table, True)


@pytest.mark.parametrize("hdim", [64, 256])
def test_paged_other_head_dims(hdim):
    q, kc, vc, seqlens, table = make_case(2, 1, 16, 2, hdim, torch.bfloat16, 600, 16, seqlens=[600, 33])
    out, lse = kv_call(q, kc, vc, seqlens, table, False, 0)
    check(out, lse, q, kc, vc, seqlens, table, False)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("rotary", [None, "interleaved", "halves"])
@pytest.mark.parametrize("causal", [False, True])
def test_append_with_and_without_rotary(paged, rotary, causal):
    seqlen_q = 4 if causal else 1
    q, kc, vc, seqlens, table = make_case(3, seqlen_q, 16, 4, 128, torch.bfloat16, 512, 16 if paged else None,
                                          seqlens=[0, 100, 508])
    g = torch.Generator(device=DEV).manual_seed(1)
    k_new = torch.randn(3, seqlen_q, 4, 128, device=DEV, dtype=torch.bfloat16, generator=g)
    v_new = torch.randn(3, seqlen_q, 4, 128, device=DEV, dtype=torch.bfloat16, generator=g)
    kw = {}
    q_ref, k_ref = q.float(), k_new.float()
    if rotary:
        angles = torch.rand(600, 32, device=DEV, generator=g) * 6.28
        cos, sin = angles.cos(), angles.sin()
        kw = dict(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=rotary == "interleaved")
        pos = seqlens.long()[:, None] + torch.arange(seqlen_q, device=DEV)
        qpos = pos if causal else seqlens.long()[:, None].expand(3, seqlen_q)
        k_ref = rotate_ref(k_new, cos[pos], sin[pos], rotary == "interleaved")
        q_ref = rotate_ref(q, cos[qpos], sin[qpos], rotary == "interleaved")
    expected_k, expected_v = kc.clone(), vc.clone()
    for b in range(3):
        for i in range(seqlen_q):
            p = int(seqlens[b]) + i
            if table is None:
                expected_k[b, p], expected_v[b, p] = k_ref[b, i].to(kc.dtype), v_new[b, i]
            else:
                page = int(table[b, p // 16])
                expected_k[page, p % 16], expected_v[page, p % 16] = k_ref[b, i].to(kc.dtype), v_new[b, i]
    out, lse = kv_call(q, kc, vc, seqlens, table, causal, 0, k=k_new, v=v_new, **kw)
    assert (kc.float() - expected_k.float()).abs().max().item() <= 0.02, "appended keys"
    assert torch.equal(vc, expected_v), "appended values"
    check(out, lse, q_ref.to(q.dtype), kc, vc, seqlens + seqlen_q, table, causal)


def test_cache_batch_idx_and_leftpad():
    q, kc, vc, _, _ = make_case(3, 1, 32, 8, 128, torch.bfloat16, 800)
    kc5 = torch.randn(5, 800, 8, 128, device=DEV, dtype=torch.bfloat16)
    vc5 = torch.randn(5, 800, 8, 128, device=DEV, dtype=torch.bfloat16)
    batch_idx = torch.tensor([4, 0, 2], device=DEV, dtype=torch.int32)
    seqlens = torch.tensor([800, 10, 500], device=DEV, dtype=torch.int32)
    out, lse = kv_call(q, kc5, vc5, seqlens, None, False, 3, cache_batch_idx=batch_idx)
    check(out, lse, q, kc5, vc5, seqlens, None, False, batch_idx=batch_idx)
    leftpad = torch.tensor([100, 0, 500], device=DEV, dtype=torch.int32)
    out, lse = kv_call(q, kc, vc, seqlens, None, False, 0, cache_leftpad=leftpad)
    check(out, lse, q, kc, vc, seqlens, None, False, leftpad=leftpad)


def assert_repeatable_and_split_invariant(q, kc, vc, seqlens, table, causal, many_splits):
    """Two identical calls give identical bits; one split and many agree within rounding."""
    first = kv_call(q, kc, vc, seqlens, table, causal, 0)
    second = kv_call(q, kc, vc, seqlens, table, causal, 0)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    one = kv_call(q, kc, vc, seqlens, table, causal, 1)
    many = kv_call(q, kc, vc, seqlens, table, causal, many_splits)
    assert (one[0].float() - many[0].float()).abs().max().item() < 2e-2
    assert (one[1] - many[1]).abs().max().item() < 1e-4


def captured_call(q, kc, vc, seqlens, table, causal, splits):
    """A kv_call captured in a CUDA graph (its kernel built and loaded by a first call outside the
    capture): (graph, out, lse), the outputs the replays write."""
    kv_call(q, kc, vc, seqlens, table, causal, splits)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            out, lse = kv_call(q, kc, vc, seqlens, table, causal, splits)
    torch.cuda.current_stream().wait_stream(stream)
    return graph, out, lse


def test_two_identical_calls_are_bit_identical_and_splits_agree():
    q, kc, vc, seqlens, table = make_case(2, 1, 32, 8, 128, torch.bfloat16, 20000, 64, seqlens=[20000, 12345])
    assert_repeatable_and_split_invariant(q, kc, vc, seqlens, table, False, 37)


def test_cuda_graph_replay_follows_new_seqlens_and_block_table():
    q, kc, vc, seqlens, table = make_case(2, 1, 32, 8, 128, torch.bfloat16, 2048, 64, seqlens=[2048, 100])
    graph, out, lse = captured_call(q, kc, vc, seqlens, table, False, 4)
    for new_lens, flip in (([1000, 2048], False), ([1, 1500], True)):
        seqlens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        if flip:
            table.copy_(table.flip(1))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(out, lse, q, kc, vc, seqlens, table, False)


def test_run_decode_honours_an_explicit_split_count_on_the_heuristics_kernel():
    profile = active_profile(torch.device(DEV))
    q, kc, vc, seqlens, _ = make_case(1, 1, 32, 8, 128, torch.bfloat16, 4096, seqlens=[4096])
    spec = decode_spec(profile, torch.bfloat16, 128, False, 1, 4, None)
    for splits in (1, 2, 5, 64):
        out, lse = run_decode(spec, q, kc, vc, seqused_k=seqlens, max_seqlen_q=1, seqlen_k=4096,
                              softmax_scale=128 ** -0.5, num_splits=splits, with_lse=True, poison=True)
        check(out, lse, q, kc, vc, seqlens, None, False)


@pytest.mark.parametrize("hdim", [64, 128, 256])
@pytest.mark.parametrize("seqlen_q, heads_kv", [(1, 1), (1, 8), (16, 8)])
@pytest.mark.parametrize("splits", [2, 3, 8])
def test_splits_merged_in_a_cluster_and_by_the_combine_kernel_agree(hdim, seqlen_q, heads_kv, splits):
    """Where the arch has clusters up to 8 splits merge in one (csrc/decode/cluster_merge.cuh), else
    in the combine kernel: both against fp32 and each other, with sequences of no key and of fewer
    key blocks than splits, and 16 causal positions x 4 heads (two row blocks, two clusters a KV head)."""
    profile = active_profile(torch.device(DEV))
    causal = seqlen_q > 1
    q, kc, vc, seqlens, _ = make_case(4, seqlen_q, 32, heads_kv, hdim, torch.bfloat16, 1000,
                                      seqlens=[0, 1000, 37, 517])
    spec = decode_spec(profile, torch.bfloat16, hdim, causal, seqlen_q, 32 // heads_kv, None)
    results = {}
    for policy in (DecodeSplitPolicy(), DecodeSplitPolicy(cluster_splits=0)):
        def call():
            return run_decode(spec, q, kc, vc, seqused_k=seqlens, max_seqlen_q=seqlen_q, seqlen_k=1000,
                              softmax_scale=hdim ** -0.5, num_splits=splits, with_lse=True, poison=True,
                              policy=policy)
        out, lse = call()
        check(out, lse, q, kc, vc, seqlens, None, causal)
        ctas = call_ctas(spec, 4, heads_kv, seqlen_q, 32 // heads_kv)
        merged_in_cluster = in_cluster(splits, ctas, cluster_slots(spec, 0), policy)
        names = kernel_names(call)
        assert spec.name in names and (spec.combine_name in names) != merged_in_cluster, names
        results[merged_in_cluster] = (out.float(), lse)
    assert (cluster_slots(spec, 0) != ()) == spec.arch_facts.clusters
    if spec.arch_facts.clusters and heads_kv == 1:  # 4 CTAs x 8 at most: the default merges in clusters
        assert len(results) == 2
    if len(results) == 2:
        (a, lse_a), (b, lse_b) = results[True], results[False]
        assert (a - b).abs().max().item() < 2e-2 and torch.equal(torch.isinf(lse_a), torch.isinf(lse_b))
        finite = torch.isfinite(lse_a)
        assert (lse_a[finite] - lse_b[finite]).abs().max().item() < 1e-4


def test_cluster_slots_are_whole_clusters_on_at_most_the_sms_a_kernel_fills_alone():
    profile = active_profile(torch.device(DEV))
    spec = decode_spec(profile, torch.bfloat16, 128, False, 1, 32, None)  # MQA: 32 packed rows
    slots = cluster_slots(spec, 0)
    if not spec.cluster_merge:
        assert slots == ()
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    per_sm = max(1, (227 * 1024) // (spec.smem_bytes + 1024))  # CTAs an SM holds by shared memory
    assert len(slots) == 9 and slots[:2] == (0, 0)
    for s in range(2, 9):
        assert slots[s] % s == 0 and sms // 2 <= slots[s] <= sms * per_sm, slots


@pytest.mark.parametrize("page", [None, 1, 16, 64])
@pytest.mark.parametrize("seqlen_q, heads_kv", [(1, 1), (2, 2), (16, 8)])
@pytest.mark.parametrize("splits", [1, 3, 0])
def test_hdim_256_row_groups_share_each_ring(page, seqlen_q, heads_kv, splits):
    """At hdim 256, 32 packed rows (MQA's one token; causal, 2 tokens x 16 heads, and 16 x 4: two row
    blocks) are two row groups of 16 whose warps share each key group's ring: against fp32 on
    contiguous caches, pages of whole key blocks and gathered rows, with sequences of no key, of
    one, of fewer key blocks than the CTA has key groups and whole ones."""
    profile = active_profile(torch.device(DEV))
    causal = seqlen_q > 1
    q, kc, vc, seqlens, table = make_case(4, seqlen_q, 32, heads_kv, 256, torch.bfloat16, 700, page,
                                          seqlens=[0, 1, 45, 700], seed=seqlen_q)
    spec = decode_spec(profile, torch.bfloat16, 256, causal, seqlen_q, 32 // heads_kv, page)
    assert spec.tile.rows == 32 and spec.key_groups == spec.tile.warps // 2, spec.name
    out, lse = run_decode(spec, q, kc, vc, seqused_k=seqlens, block_table=table, max_seqlen_q=seqlen_q, seqlen_k=700,
                          softmax_scale=256 ** -0.5, num_splits=splits, with_lse=True, poison=True)
    check(out, lse, q, kc, vc, seqlens, table, causal)


@pytest.mark.parametrize("hdim", [64, 128, 256])
def test_a_short_mqa_call_takes_two_16_row_blocks_and_a_long_one_a_32_row_block(hdim):
    """MQA with one token: 32 packed rows a KV head. Over 1k keys (0.25-1 MB, short on any GPU) two
    16-row blocks; over 128k (34-134 MB, over 6 us at an H100's or H200's memory peak) one of 32 (at
    hdim 256 two row groups). Each through flash_attn_with_kvcache against fp32, its kernel named in
    the profiler."""
    profile = active_profile(torch.device(DEV))
    for keys, rows in ((1024, 16), (131072, 32)):
        q, kc, vc, seqlens, _ = make_case(1, 1, 32, 1, hdim, torch.bfloat16, keys, seqlens=[keys])
        spec = decode_spec(profile, q.dtype, hdim, False, 1, 32, None, key_rows=keys, device_index=q.device.index)
        if rows == 32 and short_call(profile.decode_split, kv_bytes(1, 1, keys, hdim), q.device.index):
            rows = 16  # a GPU whose memory reads them in under short_call_us
        assert spec.tile.rows == rows, spec.name
        out, lse = kv_call(q, kc, vc, seqlens, None, False, 0)
        check(out, lse, q, kc, vc, seqlens, None, False)
        assert spec.name in kernel_names(lambda: kv_call(q, kc, vc, seqlens, None, False, 0))


def test_a_cluster_of_more_than_8_splits_is_refused_by_the_launcher():
    profile = active_profile(torch.device(DEV))
    q, kc, vc, seqlens, _ = make_case(1, 1, 32, 8, 128, torch.bfloat16, 4096, seqlens=[4096])
    spec = decode_spec(profile, torch.bfloat16, 128, False, 1, 4, None)
    load_binding()
    out = torch.empty_like(q)
    with pytest.raises(RuntimeError, match="decode launch failed: invalid argument"):
        torch.ops.flashtune_C.decode(load_kernel(spec).launcher, q, kc, vc, out, None, None, seqlens, None, None,
                                     None, 1, 4096, 128 ** -0.5, 9, None, None, cluster_merge=True)


def test_index_values_out_of_range_are_clear_errors():
    q, kc, vc, seqlens, table = make_case(2, 1, 32, 8, 128, torch.bfloat16, 128, 16, seqlens=[128, 5])
    k_new = torch.randn(2, 1, 8, 128, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(flashtune.FlashtuneInputError, match="exceed the cache's capacity of 128"):
        kv_call(q, kc, vc, seqlens, table, False, 0, k=k_new, v=k_new)
    bad = table.clone()
    bad[1, 0] = 10_000
    with pytest.raises(flashtune.FlashtuneInputError, match="block_table's pages in use"):
        kv_call(q, kc, vc, seqlens, bad, False, 0)


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("lengths_from", ["seqused_k", "cu_seqlens_k"])
def test_vllms_paged_varlen_call(page_size, lengths_from):
    """flash_attn_varlen_func(q packed, k=key_cache, v=value_cache, out=, cu_seqlens_q, max_seqlen_q, seqused_k,
    max_seqlen_k, causal=True, block_table): prefill chunks and decode tokens in one call."""
    lens_q, lens_k = [1, 4, 0, 9], [300, 17, 5, 640]
    q_all, kc, vc, seqlens, table = make_case(4, 9, 32, 8, 128, torch.bfloat16, 640, page_size, seqlens=lens_k)
    q = torch.cat([q_all[b, :n] for b, n in enumerate(lens_q)])
    cu_q = torch.tensor([0, 1, 5, 5, 14], device=DEV, dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    kw = dict(seqused_k=seqlens) if lengths_from == "seqused_k" else {}
    cu_k = torch.tensor([0, 300, 317, 322, 962], device=DEV, dtype=torch.int32) if not kw else None
    got, lse = flashtune.flash_attn_varlen_func(q, kc, vc, cu_q, cu_k, 9, 640, causal=True, block_table=table, out=out,
                                                return_lse=True, **kw)
    assert got.data_ptr() == out.data_ptr()
    check_packed(out, lse, q, cu_q, lens_q, lens_k, kc, vc, table, causal=True)


def check_packed(out, lse, q, cu_q, lens_q, lens_k, kc, vc, table, causal):
    """Packed queries' out (total_q, heads, hdim) and lse (heads, total_q), sequence by sequence,
    against the fp32 reference over each sequence's pages."""
    assert not torch.isnan(out).any(), "an output row was never written"
    for b, (start, n) in enumerate(zip(cu_q.tolist(), lens_q)):
        if n == 0:
            continue
        ref, ref_lse = attention_ref(q[start:start + n].float(), sequence_kv(kc, b, lens_k[b], table),
                                     sequence_kv(vc, b, lens_k[b], table), causal, q.shape[-1] ** -0.5)
        err = ((out[start:start + n].float() - ref).norm() / ref.norm()).item()
        rounding = ((ref.to(q.dtype).float() - ref).norm() / ref.norm()).item()
        assert err <= 3 * rounding, (b, err, rounding)
        if lse is not None:
            assert (lse[:, start:start + n] - ref_lse).abs().max().item() < 2e-3


@pytest.mark.parametrize("splits", [1, 3, 0])
def test_vllms_call_with_its_own_keywords(splits):
    """vLLM's call as vLLM writes it: keywords only, no cu_seqlens_k, num_splits, fa_version, window_size
    None, scheduler_metadata None, descales of 1 beside a 16-bit cache; pages of 16."""
    lens_q, lens_k = [1, 4, 0, 9], [300, 17, 5, 640]
    q_all, kc, vc, seqlens, table = make_case(4, 9, 32, 8, 128, torch.bfloat16, 640, 16, seqlens=lens_k, seed=splits)
    q = torch.cat([q_all[b, :n] for b, n in enumerate(lens_q)])
    cu_q = torch.tensor([0, 1, 5, 5, 14], device=DEV, dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    ones = torch.ones(1, device=DEV).expand(4, 8)  # vLLM's descales for a 16-bit cache
    flashtune.flash_attn_varlen_func(q=q, k=kc, v=vc, out=out, cu_seqlens_q=cu_q, max_seqlen_q=9, seqused_k=seqlens,
                                     max_seqlen_k=640, softmax_scale=128 ** -0.5, causal=True, alibi_slopes=None,
                                     window_size=None, block_table=table, softcap=0.0, scheduler_metadata=None,
                                     fa_version=2, q_descale=ones, k_descale=ones, v_descale=ones, num_splits=splits)
    check_packed(out, None, q, cu_q, lens_q, lens_k, kc, vc, table, causal=True)


def test_descales_other_than_1_beside_a_16_bit_cache_are_refused():
    """vLLM's descales with a 16-bit paged cache are read with the index values: 1 is taken (above),
    anything else refused."""
    q_all, kc, vc, seqlens, table = make_case(2, 1, 32, 8, 128, torch.bfloat16, 64, 16, seqlens=[64, 5])
    cu_q = torch.tensor([0, 1, 2], device=DEV, dtype=torch.int32)
    with pytest.raises(flashtune.FlashtuneInputError, match="v_descale scales FP8 operands"):
        flashtune.flash_attn_varlen_func(q=q_all[:, 0], k=kc, v=vc, cu_seqlens_q=cu_q, max_seqlen_q=1,
                                         seqused_k=seqlens, max_seqlen_k=64, block_table=table,
                                         v_descale=torch.full((2, 8), 0.5, device=DEV))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
def test_sglangs_call(causal, page_size):
    """SGLang's call: flash_attn_with_kvcache(q packed, k_cache, v_cache, page_table, cache_seqlens,
    cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q, softmax_scale, causal, return_softmax_lse) over a
    cache it has written (pages of 1 by default): decode tokens and a 4-token chunk."""
    lens_q, lens_k = [1, 4, 1], [300, 17, 640]
    q_all, kc, vc, seqlens, table = make_case(3, 4, 32, 8, 128, torch.bfloat16, 640, page_size, seqlens=lens_k,
                                              seed=page_size)
    q = torch.cat([q_all[b, :n] for b, n in enumerate(lens_q)])
    cu_q = torch.tensor([0, 1, 5, 6], device=DEV, dtype=torch.int32)
    cu_k = torch.tensor([0, 300, 317, 957], device=DEV, dtype=torch.int32)
    out, lse = flashtune.flash_attn_with_kvcache(q=q, k_cache=kc, v_cache=vc, page_table=table, cache_seqlens=seqlens,
                                                 cu_seqlens_q=cu_q, cu_seqlens_k_new=cu_k, max_seqlen_q=4,
                                                 softmax_scale=128 ** -0.5, causal=causal, return_softmax_lse=True)
    assert lse.shape == (32, 6)
    check_packed(out, lse, q, cu_q, lens_q, lens_k, kc, vc, table, causal)


# ---- Calls whose packed rows fill 128-row tiles: the KV-cache kernels (wgmma) on an sm90 profile.

def expect_kernel(q, k_cache, causal, page_size=None):
    """The kernel such a call launches: the KV-cache kernel where the profile has wgmma."""
    profile = active_profile(torch.device(DEV))
    spec = decode_spec(profile, q.dtype, q.shape[-1], causal, q.shape[1], q.shape[2] // k_cache.shape[2], page_size)
    assert ("_wgmma" in spec.name) == profile.arch.wgmma, spec.name
    return spec


@pytest.mark.parametrize("hdim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("splits", [1, 3, 0])
def test_mqa_four_query_tokens_fill_a_tile(hdim, causal, splits):
    """32 query heads over one KV head, 4 tokens (speculative decoding): 128 packed rows."""
    q, kc, vc, seqlens, _ = make_case(3, 4, 32, 1, hdim, torch.bfloat16, 1500, seqlens=[0, 1500, 777])
    expect_kernel(q, kc, causal)
    out, lse = kv_call(q, kc, vc, seqlens, None, causal, splits)
    check(out, lse, q, kc, vc, seqlens, None, causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_chunked_prefill_against_a_cache(causal, dtype):
    """300 query tokens of 32 heads over 8 KV heads (10 tiles of 128 packed rows) against caches
    shorter than, as long as and longer than the chunk."""
    q, kc, vc, seqlens, _ = make_case(4, 300, 32, 8, 128, dtype, 2000, seqlens=[300, 2000, 1000, 17])
    expect_kernel(q, kc, causal)
    out, lse = kv_call(q, kc, vc, seqlens, None, causal, 0)
    check(out, lse, q, kc, vc, seqlens, None, causal)


@pytest.mark.parametrize("page_size", [256, 16])
@pytest.mark.parametrize("splits", [1, 3, 0])
def test_mqa_four_tokens_on_pages(page_size, splits):
    """Pages of whole key blocks (256) are the KV-cache kernel's; pages of 16 stay the decode
    kernels' (a block would span pages)."""
    q, kc, vc, seqlens, table = make_case(3, 4, 32, 1, 128, torch.bfloat16, 1300, page_size, seqlens=[1300, 5, 777])
    spec = expect_kernel(q, kc, True, page_size) if page_size == 256 else None
    if spec is None:
        assert "_wgmma" not in decode_spec(active_profile(torch.device(DEV)), q.dtype, 128, True, 4, 32, 16).name
    out, lse = kv_call(q, kc, vc, seqlens, table, True, splits)
    check(out, lse, q, kc, vc, seqlens, table, True)


def test_mqa_four_tokens_cache_batch_idx_and_leftpad():
    q, _, _, _, _ = make_case(3, 4, 32, 1, 128, torch.bfloat16, 900)
    kc5 = torch.randn(5, 900, 1, 128, device=DEV, dtype=torch.bfloat16)
    vc5 = torch.randn(5, 900, 1, 128, device=DEV, dtype=torch.bfloat16)
    expect_kernel(q, kc5, True)
    batch_idx = torch.tensor([4, 0, 2], device=DEV, dtype=torch.int32)
    seqlens = torch.tensor([900, 10, 500], device=DEV, dtype=torch.int32)
    out, lse = kv_call(q, kc5, vc5, seqlens, None, True, 3, cache_batch_idx=batch_idx)
    check(out, lse, q, kc5, vc5, seqlens, None, True, batch_idx=batch_idx)
    leftpad = torch.tensor([100, 0, 497], device=DEV, dtype=torch.int32)
    out, lse = kv_call(q, kc5[:3], vc5[:3], seqlens, None, True, 0, cache_leftpad=leftpad)
    check(out, lse, q, kc5[:3], vc5[:3], seqlens, None, True, leftpad=leftpad)


@pytest.mark.parametrize("page_size", [None, 256])
@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_cache_rows_past_the_end_never_reach_the_output(page_size, poison):
    """Cache rows past cache_seqlens are never written in an engine's cache and may hold anything;
    the last key block loads them with the rest, so they must weigh exactly nothing (0 x NaN is NaN)."""
    q, kc, vc, seqlens, table = make_case(3, 4, 32, 1, 128, torch.bfloat16, 1024, page_size, seqlens=[1000, 1, 555])
    expect_kernel(q, kc, False, page_size)
    for b in range(3):
        n = int(seqlens[b])
        idx = torch.arange(n, 1024, device=DEV)
        if table is None:
            kc[b, n:], vc[b, n:] = poison, poison
        else:
            pages = table[b].long()[idx // page_size]
            kc[pages, idx % page_size], vc[pages, idx % page_size] = poison, poison
    out, lse = kv_call(q, kc, vc, seqlens, table, False, 0)
    check(out, lse, q, kc, vc, seqlens, table, False)


def test_mqa_four_tokens_bit_identical_calls_splits_agree_and_graph_replay():
    q, kc, vc, seqlens, _ = make_case(2, 4, 32, 1, 128, torch.bfloat16, 8192, seqlens=[8192, 3000])
    expect_kernel(q, kc, True)
    assert_repeatable_and_split_invariant(q, kc, vc, seqlens, None, True, 29)
    graph, out, lse = captured_call(q, kc, vc, seqlens, None, True, 6)
    for new_lens in ([100, 8192], [7000, 4]):
        seqlens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(out, lse, q, kc, vc, seqlens, None, True)
