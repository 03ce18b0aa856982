"""`flash_attn_with_kvcache`, with FlashAttention's signature and semantics, on the decode kernels.

New keys and values (k, v) are written into the cache in place at cache_seqlens (through
block_table when the cache is paged), rotated first when rotary_cos/rotary_sin are given, as is
q; then q attends to each sequence's cache. These steps are torch operations on the device, so the
call needs no host synchronisation and can be captured in a CUDA graph. The index tensors a caller
passes (cache_seqlens, block_table, cache_batch_idx, cache_leftpad) are checked against the cache
(room for the new keys, page and row indices in range) by one read on the host, a device sync,
unless the stream is capturing a graph or FLASHTUNE_TRUST_CU_SEQLENS=1 (as flash_attn, which never
checks: a wrong value then reads or writes the wrong rows); tensors found valid are not read again
until PyTorch writes to them (checks.read_values: one sync for a forward's layers, not one each).

An e4m3 cache (torch.float8_e4m3fn k_cache and v_cache, profiles with `fp8: {kv: e4m3}`) is read
by the decode kernels' FP8 twins with k_descale / v_descale per (sequence, KV head), FlashAttention-3's
and vLLM's convention (dequantised value = byte x descale; None: 1); new 16-bit k/v are quantised
with those descales as they are appended.
"""
from __future__ import annotations

import torch

from flashtune.kernels.tiles import MAX_HEAD_DIM, MIN_HEAD_DIM, computed_head_dim
from flashtune.runtime import checks, ops
from flashtune.runtime.checks import DTYPE_NAMES, FP8, fail, scale_for
from flashtune.runtime.decode import decode_spec, run_decode
from flashtune.runtime.fp8 import quantise_kv
from flashtune.runtime.selection import active_profile

MAX_PAGE_SIZE = 512


def _int32_vector(t, name: str, batch: int) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.shape != (batch,):
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        fail(f"{name} must be an int32 tensor of shape (batch,) = ({batch},), got {got}")


def _check_cache(q, k_cache, v_cache, block_table, cache_batch_idx, cache_leftpad) -> int | None:
    """The shapes of q and the caches; returns the page size of a paged cache (else None)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            fail(f"{name} must be a 4-d tensor, got "
                 + (f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__))
        if t.dtype not in DTYPE_NAMES and not (name != "q" and t.dtype == FP8):
            fail(f"{name} has dtype {t.dtype}; allowed: torch.float16, torch.bfloat16"
                 + (", or torch.float8_e4m3fn for an FP8 cache" if name != "q" else ""))
        checks.check_strides(name, t)
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in (q.dtype, FP8):
        fail(f"k_cache and v_cache must both be in q's dtype or both in torch.float8_e4m3fn, got q "
             f"{q.dtype}, k_cache {k_cache.dtype}, v_cache {v_cache.dtype}")
    if k_cache.shape[:-1] == v_cache.shape[:-1] and k_cache.shape[-1] != v_cache.shape[-1]:
        fail(f"a V head dim ({v_cache.shape[-1]}) unlike K's ({k_cache.shape[-1]}) is served by flash_attn_func and "
             "flash_attn_varlen_func (zero-padded to one head dim), not with a KV cache")
    if k_cache.shape != v_cache.shape:
        fail(f"k_cache and v_cache must have the same shape, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    hdim = q.shape[-1]
    if computed_head_dim(hdim) is None or k_cache.shape[-1] != hdim:
        fail(f"head dim {hdim} (k_cache: {k_cache.shape[-1]}) is not served; the decode kernels take "
             f"multiples of 8 from {MIN_HEAD_DIM} to {MAX_HEAD_DIM}, the same for q and the cache")
    heads_q, heads_kv = q.shape[2], k_cache.shape[2]
    if heads_kv == 0 or heads_q % heads_kv:
        fail(f"q's {heads_q} heads must be a multiple of the cache's {heads_kv} KV heads")
    if block_table is None:
        return None
    page_size = _check_pages(block_table, k_cache, q.shape[0])
    if cache_batch_idx is not None:
        fail("cache_batch_idx cannot be combined with block_table (the block table already maps each "
             "sequence to its pages); pass None")
    if cache_leftpad is not None:
        fail("cache_leftpad cannot be combined with block_table (as in flash_attn); pass None")
    return page_size


def _check_pages(block_table, k_cache, batch: int) -> int:
    """A block table for `batch` sequences over a paged cache; returns the page size."""
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2 \
            or block_table.shape[0] != batch or block_table.stride(-1) != 1:
        got = (f"{block_table.dtype} {tuple(block_table.shape)}" if isinstance(block_table, torch.Tensor)
               else type(block_table).__name__)
        fail(f"block_table must be a contiguous int32 tensor (batch, max_pages_per_sequence) with batch = "
             f"{batch}, got {got}")
    page_size = k_cache.shape[1]
    if page_size != 1 and (page_size % 16 or page_size > MAX_PAGE_SIZE):
        fail(f"page size {page_size} (k_cache.shape[1]) is not served; allowed: 1 and multiples of 16 up to "
             f"{MAX_PAGE_SIZE}")
    return page_size


def _check_descales(q, k_cache, k_descale, v_descale, batch: int) -> tuple:
    """An e4m3 cache's (k_descale, v_descale) as the kernels take them: contiguous float32 (batch,
    heads_kv) (from anything that broadcasts to it; None: 1); (None, None) for a 16-bit cache."""
    heads_kv = k_cache.shape[2]
    if k_cache.dtype != FP8:
        if k_descale is not None or v_descale is not None:
            fail(f"k_descale / v_descale apply to an e4m3 cache; k_cache is {k_cache.dtype}: pass None")
        return None, None
    out = []
    for name, t in (("k_descale", k_descale), ("v_descale", v_descale)):
        if t is None:
            t = torch.ones(batch, heads_kv, dtype=torch.float32, device=q.device)
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() > 2:
            fail(f"{name} must be a float tensor of shape (batch, heads_kv) = ({batch}, {heads_kv}), got "
                 + (f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__))
        try:
            t = t.float().expand(batch, heads_kv).contiguous()
        except RuntimeError:
            fail(f"{name} of shape {tuple(t.shape)} does not broadcast to (batch, heads_kv) = ({batch}, {heads_kv})")
        out.append(t)
    return tuple(out)


def _check_fp8_profile(profile, q, kv_fp8: bool) -> None:
    """An e4m3 cache runs where the GPU converts e4m3 in hardware (a profile's `fp8: {kv: e4m3}`
    only builds its kernels ahead; elsewhere they are built on first use)."""
    if kv_fp8 and not profile.arch.fp8:
        fail(f"an e4m3 KV cache needs FP8 conversions in hardware, which {profile.arch.name} (profile "
             f"{profile.name}) lacks: sm_89 (RTX 4090, L40S), sm_90 (H100/H200) and sm_120 (RTX 5090) have "
             f"them; use a {DTYPE_NAMES[q.dtype]} cache here")


def _check_new(q, k_cache, k, v) -> int:
    """The new keys and values to append; returns their count per sequence (0 without them)."""
    if (k is None) != (v is None):
        fail("k and v (the new keys and values to append) go together; pass both or neither")
    if k is None:
        return 0
    shape = (q.shape[0], k.shape[1] if isinstance(k, torch.Tensor) and k.dim() == 4 else -1,
             k_cache.shape[2], q.shape[3])
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != q.dtype:
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            fail(f"{name} (new) must be (batch, seqlen_new, heads_kv, head_dim) = {shape} in {q.dtype}, got {got}")
    return k.shape[1]


def _check_rotary(rotary_cos, rotary_sin, hdim: int, appending: bool) -> int:
    if (rotary_cos is None) != (rotary_sin is None):
        fail("rotary_cos and rotary_sin go together; pass both or neither")
    if rotary_cos is None:
        return 0
    if not appending:
        fail("rotary_cos/rotary_sin rotate q and the new k (as in flash_attn, only when appending); pass k and v, "
             "or rotate q yourself")
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape != rotary_cos.shape or \
                not t.is_floating_point():
            fail(f"{name} must be a float tensor (seqlen_ro, rotary_dim / 2), the same shape for both")
    rotary_dim = 2 * rotary_cos.shape[1]
    if rotary_dim == 0 or rotary_dim > hdim:
        fail(f"rotary_dim {rotary_dim} (2 x rotary_cos.shape[1]) must be in 2..head_dim ({hdim})")
    return rotary_dim


def _rotate(x, cos, sin, interleaved: bool):
    """x (..., head_dim) rotated on its first 2 * cos.shape[-1] dims; cos/sin broadcast over heads."""
    half = cos.shape[-1]
    rot = x[..., :2 * half].float()
    cos, sin = cos.float().unsqueeze(-2), sin.float().unsqueeze(-2)  # (..., 1, half): over heads
    if interleaved:  # pairs (0, 1), (2, 3), ...
        a, b = rot[..., 0::2], rot[..., 1::2]
        turned = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    else:  # halves (GPT-NeoX)
        a, b = rot[..., :half], rot[..., half:]
        turned = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return torch.cat((turned.to(x.dtype), x[..., 2 * half:]), dim=-1)


def _check_values(cache_seqlens, cache_leftpad, cache_batch_idx, block_table, seqlen_new: int, capacity: int,
                  batch_cache: int, num_pages: int, page_size: int | None, seqlen_ro: int, more=None) -> None:
    """The index values, read on the host once (skipped while capturing a graph, or trusted), with
    the call's `more` {error: flag} checks; without those, not again for the same tensors at the
    same versions and sizes (checks.read_values: the other layers of a forward)."""
    if not checks.device_values_checked():
        return
    tensors = (cache_seqlens, cache_leftpad, cache_batch_idx, block_table)
    asked = (seqlen_new, capacity, batch_cache, num_pages, page_size, seqlen_ro)
    if not more and checks.read_values.get(tensors, asked):
        return
    lens = cache_seqlens.long()
    end = lens + seqlen_new
    pad = cache_leftpad.long() if cache_leftpad is not None else torch.zeros_like(lens)
    found = {
        "cache_seqlens must be >= 0 (and >= cache_leftpad)": (lens < pad) | (pad < 0),
        f"cache_seqlens + the {seqlen_new} new keys exceed the cache's capacity of {capacity}": end > capacity,
    }
    if cache_batch_idx is not None:
        found[f"cache_batch_idx must index the cache's {batch_cache} rows"] = \
            (cache_batch_idx < 0) | (cache_batch_idx >= batch_cache)
    if block_table is not None:
        pages_used = (end + page_size - 1) // page_size
        used = torch.arange(block_table.shape[1], device=block_table.device) < pages_used[:, None]
        found[f"block_table's pages in use must index the cache's {num_pages} pages"] = \
            (used & ((block_table < 0) | (block_table >= num_pages))).any(dim=1)
    if seqlen_ro:
        found[f"rotary_cos has {seqlen_ro} positions; the new keys reach position cache_seqlens + seqlen_new"] = \
            end > seqlen_ro
    checks.read_flags(found | (more or {}))
    checks.read_values.put(tensors, asked)


def _append(k_cache, v_cache, k, v, positions, rows, block_table, page_size) -> None:
    """Write the new keys and values at their positions (batch, seqlen_new), in place."""
    if k_cache.dtype == FP8:  # e4m3 written as its bytes: uint8 indexing is in every torch build
        k_cache, v_cache, k, v = (t.view(torch.uint8) for t in (k_cache, v_cache, k, v))
    if block_table is None:
        k_cache[rows[:, None], positions] = k
        v_cache[rows[:, None], positions] = v
    else:
        pages = block_table.long().gather(1, positions // page_size)
        k_cache[pages, positions % page_size] = k
        v_cache[pages, positions % page_size] = v


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False,
                            *, q_descale=None, k_descale=None, v_descale=None, sinks=None, page_table=None,
                            cu_seqlens_q=None, max_seqlen_q=None, cu_seqlens_k_new=None, qv=None, rotary_seqlens=None,
                            attention_chunk=0, scheduler_metadata=None, pack_gqa=None, sm_margin=0):
    """Attention of q against a KV cache, appending new keys/values first, as flash_attn's.

    q: (batch, seqlen_q, heads, head_dim). k_cache, v_cache: (batch_cache, capacity, heads_kv,
    head_dim), or paged (num_pages, page_size, heads_kv, head_dim) with block_table (batch,
    max_pages) int32; page sizes 1 and multiples of 16 up to 512. cache_seqlens: int or (batch,)
    int32, the keys each sequence has (None: the whole capacity). k, v: (batch, seqlen_new,
    heads_kv, head_dim), written at cache_seqlens (rotated by rotary_cos/rotary_sin at those
    positions when given, as is q: at cache_seqlens + i when causal, else at cache_seqlens).
    cache_batch_idx: the cache row of each sequence; cache_leftpad: its first valid key.
    causal: bottom-right aligned. num_splits: CTAs per sequence's keys (0: chosen from the SM count,
    the tiles and the cache length). An e4m3 cache (torch.float8_e4m3fn k_cache, v_cache) takes
    k_descale, v_descale of shape (batch, heads_kv) (None: 1) and quantises new k/v with them;
    q stays 16-bit (q_descale must be None). Variants: window_size=(left, right) keys around each
    query's own position (bottom-right aligned, -1 unbounded; blocks outside are skipped),
    softcap > 0 (scores = softcap x tanh(scores / softcap)), sinks (heads,) float: one logit per
    query head that joins every row's softmax (gpt-oss), O is not pulled toward it; alibi_slopes
    (heads,) or (batch, heads) float32 (flash_attn's).
    FlashAttention-3's keywords, as SGLang calls it: page_table (block_table's name there);
    cu_seqlens_q with max_seqlen_q for queries of several lengths, q (total_q, heads, head_dim), on a
    paged cache with k=None (cu_seqlens_k_new, which only new keys use, is then not read, as in
    FlashAttention-3); qv, rotary_seqlens, attention_chunk, scheduler_metadata, pack_gqa=False and
    sm_margin are refused unless neutral.
    Returns out, or (out, softmax_lse (batch, heads, seqlen_q); (heads, total_q) with cu_seqlens_q).
    """
    checks.check_unsupported(0.0)
    _refuse_fa3_only(qv, rotary_seqlens, attention_chunk, pack_gqa, sm_margin)
    checks.check_engine_args(scheduler_metadata)
    checks.check_num_splits(num_splits)
    if page_table is not None:
        if block_table is not None:
            fail("page_table and block_table are the same argument (FlashAttention-3's and 2's names): pass one")
        block_table = page_table
    if checks.needs_grad(q, k_cache, v_cache, k, v):
        fail("flash_attn_with_kvcache is forward-only (inference); run it under torch.no_grad(), or detach the "
             "inputs (flash_attn_func and flash_attn_varlen_func have a backward)")
    if q_descale is not None:
        fail("q_descale: q stays 16-bit in decode (an FP8 cache dequantises K and V, not q); pass None")
    if cu_seqlens_q is not None:
        return _varlen_queries(q, k_cache, v_cache, k, v, rotary_cos, cache_seqlens, cache_batch_idx, cache_leftpad,
                               block_table, cu_seqlens_q, max_seqlen_q, softmax_scale, causal, window_size, softcap,
                               alibi_slopes, num_splits, return_softmax_lse, k_descale, v_descale, sinks)
    if max_seqlen_q is not None:
        fail("max_seqlen_q goes with cu_seqlens_q (queries of several lengths); q (batch, seqlen_q, heads, "
             "head_dim) gives its own")
    heads_q, batch = (q.shape[2], q.shape[0]) if isinstance(q, torch.Tensor) and q.dim() == 4 else (0, None)
    var = checks.check_variants(window_size, softcap, sinks, heads_q, alibi_slopes, batch)
    page_size = _check_cache(q, k_cache, v_cache, block_table, cache_batch_idx, cache_leftpad)
    seqlen_new = _check_new(q, k_cache, k, v)
    rotary_dim = _check_rotary(rotary_cos, rotary_sin, q.shape[-1], seqlen_new > 0)
    batch, seqlen_q, heads_q, hdim = q.shape
    capacity = k_cache.shape[1] if page_size is None else block_table.shape[1] * page_size
    caller_seqlens = isinstance(cache_seqlens, torch.Tensor)  # values only known on the device
    if cache_seqlens is None:
        cache_seqlens = capacity - seqlen_new
    keys_known = None  # every sequence's key count, when the host knows it
    if isinstance(cache_seqlens, int):
        if not 0 <= cache_seqlens <= capacity - seqlen_new:
            fail(f"cache_seqlens {cache_seqlens} + {seqlen_new} new keys must be within the capacity {capacity}")
        keys_known = cache_seqlens + seqlen_new
        indexed = block_table is not None or cache_leftpad is not None or cache_batch_idx is not None
        if seqlen_new or (indexed and checks.device_values_checked()):
            cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
        else:  # nothing below reads per-sequence lengths: no fill kernel on the call's path
            cache_seqlens = None
    if cache_seqlens is not None:
        _int32_vector(cache_seqlens, "cache_seqlens", batch)
    for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if t is not None:
            _int32_vector(t, name, batch)
    scale = scale_for(softmax_scale, hdim)
    k_descale, v_descale = _check_descales(q, k_cache, k_descale, v_descale, batch)
    checks.check_devices(q, k_cache, v_cache, k_new=k, v_new=v, cache_seqlens=cache_seqlens, block_table=block_table,
                         cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, rotary_cos=rotary_cos,
                         rotary_sin=rotary_sin, k_descale=k_descale, v_descale=v_descale, sinks=var.sinks,
                         alibi_slopes=var.alibi)
    profile = active_profile(q.device)
    _check_fp8_profile(profile, q, k_descale is not None)
    if cache_seqlens is not None and (caller_seqlens or cache_leftpad is not None or cache_batch_idx is not None
                                      or block_table is not None):
        _check_values(cache_seqlens, cache_leftpad, cache_batch_idx, block_table, seqlen_new, capacity,
                      k_cache.shape[0], k_cache.shape[0], page_size, rotary_cos.shape[0] if rotary_dim else 0)

    seqused = cache_seqlens
    if seqlen_new:
        positions = cache_seqlens.long()[:, None] + torch.arange(seqlen_new, device=q.device)
        if rotary_dim:
            k = _rotate(k, rotary_cos[positions], rotary_sin[positions], rotary_interleaved)
            q_positions = (cache_seqlens.long()[:, None] + torch.arange(seqlen_q, device=q.device) if causal
                           else cache_seqlens.long()[:, None].expand(batch, seqlen_q))
            q = _rotate(q, rotary_cos[q_positions], rotary_sin[q_positions], rotary_interleaved)
        rows = cache_batch_idx.long() if cache_batch_idx is not None else torch.arange(batch, device=q.device)
        if k_descale is not None:  # an e4m3 cache: quantised with the sequences' descales
            k, v = quantise_kv(k, k_descale), quantise_kv(v, v_descale)
        _append(k_cache, v_cache, k, v, positions, rows, block_table, page_size)
        seqused = cache_seqlens + seqlen_new

    keys = capacity if keys_known is None else keys_known
    spec = decode_spec(profile, q.dtype, hdim, bool(causal), seqlen_q, heads_q // k_cache.shape[2], page_size,
                       kv_fp8=k_descale is not None, variants=var.variants,
                       key_rows=batch * k_cache.shape[2] * keys, device_index=q.device.index)
    # Keys the host knows for every sequence need no per-sequence array (nor the kernel's read of it).
    out, lse = run_decode(spec, q, k_cache, v_cache, seqused_k=seqused if keys_known is None else None,
                          cache_batch_idx=cache_batch_idx, leftpad_k=cache_leftpad, block_table=block_table,
                          max_seqlen_q=seqlen_q, seqlen_k=keys,
                          softmax_scale=scale, num_splits=num_splits,
                          with_lse=return_softmax_lse, poison=ops.poison_outputs,
                          policy=profile.decode_split, k_descale=k_descale, v_descale=v_descale,
                          variant_args=var)
    return (out, lse) if return_softmax_lse else out


def _refuse_fa3_only(qv, rotary_seqlens, attention_chunk, pack_gqa, sm_margin) -> None:
    """FlashAttention-3's flash_attn_with_kvcache keywords flashtune does not serve, each refused by
    name unless it has its neutral value."""
    if qv is not None:
        fail("qv (FlashAttention-3's extra query part for MLA) is not served; pass None")
    if rotary_seqlens is not None:
        fail("rotary_seqlens is not served: rotary positions are cache_seqlens (pass rotary_cos/rotary_sin with k, v)")
    if attention_chunk:
        fail(f"attention_chunk={attention_chunk} (chunked local attention) is not served; pass 0 (a sliding window: "
             "window_size)")
    if pack_gqa is False:
        fail("pack_gqa=False: flashtune's decode kernels always pack a KV head's query heads into one tile; pass "
             "None or True")
    if sm_margin:
        fail(f"sm_margin={sm_margin} (SMs left free for other kernels) is not served; pass 0")


def _varlen_queries(q, k_cache, v_cache, k, v, rotary_cos, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                    cu_seqlens_q, max_seqlen_q, softmax_scale, causal, window_size, softcap, alibi_slopes, num_splits,
                    return_softmax_lse, k_descale, v_descale, sinks):
    """flash_attn_with_kvcache with cu_seqlens_q, as SGLang calls it: packed queries over a paged
    cache whose keys the caller has written (cache_seqlens of them each); served by paged_varlen."""
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        fail("with cu_seqlens_q, q is (total_q, heads, head_dim), got "
             + (f"shape {tuple(q.shape)}" if isinstance(q, torch.Tensor) else type(q).__name__))
    if k is not None or v is not None:
        fail("appending new keys (k, v) for queries of several lengths (cu_seqlens_q) is not served: write them "
             "into the cache first, as SGLang does, and pass k=None, v=None")
    if rotary_cos is not None:
        fail("rotary_cos/rotary_sin rotate appended keys, which cu_seqlens_q calls do not take: rotate q first")
    if cache_batch_idx is not None or cache_leftpad is not None:
        fail("cache_batch_idx and cache_leftpad are not served with cu_seqlens_q: index the pages by block_table")
    if block_table is None:
        fail("queries of several lengths (cu_seqlens_q) are served with a paged cache: pass page_table (or "
             "block_table)")
    if max_seqlen_q is None:
        fail("cu_seqlens_q needs max_seqlen_q, the longest query sequence it delimits")
    if not isinstance(cu_seqlens_q, torch.Tensor) or cu_seqlens_q.dim() != 1 or cu_seqlens_q.numel() < 2:
        fail("cu_seqlens_q must be an int32 tensor of batch+1 offsets")
    batch = cu_seqlens_q.numel() - 1
    if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2:
        fail("page_table / block_table must be an int32 tensor (batch, max_pages)")
    if cache_seqlens is None or isinstance(cache_seqlens, int):
        capacity = block_table.shape[1] * k_cache.shape[1] if isinstance(k_cache, torch.Tensor) else 0
        keys = capacity if cache_seqlens is None else cache_seqlens
        if not 0 <= keys <= capacity:
            fail(f"cache_seqlens {keys} must be within the capacity {capacity}")
        cache_seqlens = torch.full((batch,), keys, dtype=torch.int32, device=q.device)
    out, lse = paged_varlen(q, k_cache, v_cache, cu_seqlens_q, None, max_seqlen_q, None, cache_seqlens, block_table,
                            scale_for(softmax_scale, q.shape[-1]), causal, None, return_softmax_lse, k_descale,
                            v_descale, window_size, softcap, sinks, alibi_slopes, num_splits)
    return (out, lse) if return_softmax_lse else out


def _padded_cache_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: torch.Tensor | None,
                         end: torch.Tensor | None, scale: float, causal: bool, window_left: int = -1, window_right: int = -1,
                         softcap: float = 0.0, sinks: torch.Tensor | None = None,
                         alibi_slopes: torch.Tensor | None = None) -> torch.Tensor:
    var = checks.check_variants((window_left, window_right), softcap, sinks, q.shape[2], alibi_slopes, q.shape[0])
    profile = active_profile(q.device)
    spec = decode_spec(profile, q.dtype, q.shape[-1], bool(causal), q.shape[1], q.shape[2] // k.shape[2], None,
                       variants=var.variants, key_rows=q.shape[0] * k.shape[2] * k.shape[1],
                       device_index=q.device.index)
    out, _ = run_decode(spec, q, k, v, seqused_k=end, leftpad_k=first, max_seqlen_q=q.shape[1], seqlen_k=k.shape[1],
                        softmax_scale=scale, num_splits=0, with_lse=False, poison=ops.poison_outputs,
                        policy=profile.decode_split, variant_args=var)
    return out


# A custom op, so that torch.compile (transformers compiles a static cache's decode step) traces the
# call as one node, not into the kernel's selection, build and loading (host work a graph cannot hold).
_padded_cache_decode_op = torch.library.custom_op("flashtune::padded_cache_decode",
                                                  mutates_args=())(_padded_cache_decode)


@_padded_cache_decode_op.register_fake
def _(q, k, v, first, end, scale, causal, window_left=-1, window_right=-1, softcap=0.0, sinks=None,
      alibi_slopes=None):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def padded_cache_decode(q, k, v, first, end, scale: float, causal: bool, window_size=(-1, -1), softcap=0.0,
                        sinks=None, alibi_slopes=None):
    """Few queries (b, sq, heads, d) over a cache (b, S, heads_kv, d) whose row b holds its keys at
    first[b]..end[b]-1 (int32 on the device: left padding, a static cache's unwritten tail; None:
    0 and S, every key), read in place (any strides of multiples of 8 elements), the queries the
    last sq of them: transformers' generation (flashtune/hf.py), whose tensors and mask give these
    values, so they are not checked again (no sync, and a CUDA graph can capture the call)."""
    args = (q, k, v, first, end, float(scale), bool(causal), *window_size, float(softcap), sinks, alibi_slopes)
    plain = type(q) is torch.Tensor and not torch.compiler.is_compiling()  # eager: no dispatch wrapper
    return (_padded_cache_decode if plain else _padded_cache_decode_op)(*args)


def paged_varlen(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int | None,
                 seqused_k, block_table, scale: float, causal: bool, out, with_lse: bool, k_descale=None,
                 v_descale=None, window_size=(-1, -1), softcap=0.0, sinks=None, alibi_slopes=None, num_splits=0,
                 more_checks=None):
    """flash_attn_varlen_func's paged form, as vLLM calls it: packed queries (total_q, heads,
    head_dim) delimited by cu_seqlens_q, each sequence's keys in pages of k_cache / v_cache
    (num_pages, page_size, heads_kv, head_dim) through block_table, seqused_k keys each (or the
    lengths cu_seqlens_k delimits); `out` written in place when given; an e4m3 cache with k_descale /
    v_descale (num_seqs, heads_kv), vLLM's; num_splits checked by the caller, whose `more_checks`
    {error: flag} join the index values' one host read. Returns (out, lse or None)."""
    if block_table is None:
        fail("seqused_k is served with a paged cache (block_table); pass block_table, or cu_seqlens_k alone "
             "for packed keys")
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        fail("q must be (total_q, heads, head_dim) with a paged cache, got "
             + (f"shape {tuple(q.shape)}" if isinstance(q, torch.Tensor) else type(q).__name__))
    for name, t in (("k", k_cache), ("v", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            fail(f"with block_table, {name} is a paged cache (num_pages, page_size, heads_kv, head_dim), got "
                 + (f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__))
    _check_cache(q[None], k_cache, v_cache, None, None, None)  # dtypes, head dims, heads, strides
    var = checks.check_variants(window_size, softcap, sinks, q.shape[1], alibi_slopes,
                                cu_seqlens_q.numel() - 1 if isinstance(cu_seqlens_q, torch.Tensor) else None)
    checks.check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[0], max_seqlen_q, covers_all=True)
    batch = cu_seqlens_q.numel() - 1
    page_size = _check_pages(block_table, k_cache, batch)
    capacity = block_table.shape[1] * page_size
    if seqused_k is None:
        if cu_seqlens_k is None:
            fail("a paged cache needs each sequence's key count: seqused_k, or cu_seqlens_k")
        if max_seqlen_k is None:
            fail("cu_seqlens_k needs max_seqlen_k, the longest key sequence it delimits")
        checks.check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", batch * capacity, max_seqlen_k, covers_all=False)
        if cu_seqlens_k.numel() != batch + 1:
            fail(f"cu_seqlens_k must have batch+1 = {batch + 1} entries like cu_seqlens_q, got {cu_seqlens_k.numel()}")
        seqused_k = (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
    else:
        _int32_vector(seqused_k, "seqused_k", batch)
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.shape != q.shape or out.dtype != q.dtype:
            fail(f"out must be a tensor like q: {tuple(q.shape)} {q.dtype}")
        checks.check_strides("out", out)
    k_descale, v_descale = _check_descales(q, k_cache, k_descale, v_descale, batch)
    checks.check_devices(q, k_cache, v_cache, cu_seqlens_q=cu_seqlens_q, seqused_k=seqused_k,
                         block_table=block_table, out=out, k_descale=k_descale, v_descale=v_descale, sinks=var.sinks,
                         alibi_slopes=var.alibi)
    _check_values(seqused_k, None, None, block_table, 0, capacity, k_cache.shape[0], k_cache.shape[0], page_size, 0,
                  more_checks)
    profile = active_profile(q.device)
    _check_fp8_profile(profile, q, k_descale is not None)
    spec = decode_spec(profile, q.dtype, q.shape[-1], bool(causal), int(max_seqlen_q), q.shape[1] // k_cache.shape[2],
                       page_size, kv_fp8=k_descale is not None, variants=var.variants, varlen_q=True,
                       key_rows=batch * k_cache.shape[2] * capacity, device_index=q.device.index)
    return run_decode(spec, q, k_cache, v_cache, cu_seqlens_q=cu_seqlens_q, seqused_k=seqused_k,
                      block_table=block_table, max_seqlen_q=int(max_seqlen_q), seqlen_k=capacity, softmax_scale=scale,
                      num_splits=num_splits, with_lse=with_lse, out=out, poison=ops.poison_outputs and out is None,
                      policy=profile.decode_split, k_descale=k_descale, v_descale=v_descale, variant_args=var)
