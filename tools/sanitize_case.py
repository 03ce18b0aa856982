"""Small attention calls for compute-sanitizer (memcheck, racecheck): every kernel path once,
prefill and decode.

Run: compute-sanitizer --tool memcheck python3 tools/sanitize_case.py [PROFILE] [--backward | --fp8all]
(--backward: the backward's calls alone; --fp8all: the all-FP8 kernels' alone, under a profile with fp8.pv)
"""
import sys

import torch

import flashtune
from flashtune.runtime import ops
from flashtune.runtime.fp8 import quantise_kv


def backward_calls():
    """The backward (the profile's kernel): odd lengths, GQA, causal with more queries than keys and
    fewer, several query blocks per key block (the Q/dO ring wraps), varlen with an empty sequence;
    hdim 256 (the mma.sync kernel on every profile) also deterministic."""
    for hdim in (64, 128, 256):
        for causal in (False, True):
            for seqlen_q, seqlen_k in ((77, 130), (300, 200), (520, 260)):
                q = torch.randn(2, seqlen_q, 4, hdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                k = torch.randn(2, seqlen_k, 2, hdim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                v = torch.randn_like(k, requires_grad=True)
                flashtune.flash_attn_func(q, k, v, causal=causal).sum().backward()
    cu_q = torch.tensor([0, 50, 50, 250], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 70, 71, 200], dtype=torch.int32, device="cuda")
    q = torch.randn(250, 4, 128, device="cuda", dtype=torch.float16, requires_grad=True)
    k = torch.randn(200, 4, 128, device="cuda", dtype=torch.float16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    flashtune.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 200, 129, causal=True).sum().backward()
    q = torch.randn(1, 300, 4, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 200, 2, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    flashtune.flash_attn_func(q, k, v, causal=True, deterministic=True).sum().backward()


def fp8all_calls():
    """The all-FP8 kernels and their V^T pass: every head dim and mask, keys that are not a multiple
    of 32 or of a block (zero-padded V^T), more queries than keys, one query, no keys, GQA, a v
    strided out of a packed qkv, and more tiles than SMs."""
    for hdim in (64, 128, 256):
        for causal in (False, True):
            for seqlen_q, seqlen_k in ((77, 130), (300, 17), (1, 1000), (300, 0)):
                q, k, v = (torch.randn(2, s, h, hdim, device="cuda", dtype=torch.bfloat16)
                           for s, h in ((seqlen_q, 4), (seqlen_k, 2), (seqlen_k, 2)))
                flashtune.flash_attn_func(q, k, v, causal=causal, qk_fp8=True, pv_fp8=True, return_lse=True)
        qkv = torch.randn(4, 400, 3, 8, hdim, device="cuda").to(torch.float8_e4m3fn)  # e4m3, read in place
        flashtune.flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])
    q = torch.randn(4, 1000, 40, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(4, 1000, 8, 128, device="cuda", dtype=torch.bfloat16)
    flashtune.flash_attn_func(q, k, torch.randn_like(k), causal=True, qk_fp8=True, pv_fp8=True)


ops.use_profile(sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else "h200-sm80")
torch.manual_seed(0)
for flag, calls in (("--backward", backward_calls), ("--fp8all", fp8all_calls)):
    if flag in sys.argv:
        calls()
        torch.cuda.synchronize()
        print(f"sanitize_case: done ({flag[2:]})")
        sys.exit(0)
for hdim in (64, 128, 256):
    for causal in (False, True):
        q = torch.randn(1, 77, 4, hdim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, 130, 2, hdim, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        flashtune.flash_attn_func(q, k, v, causal=causal, return_lse=True)
# More tiles than SMs: the persistent grid's loop, its tile counter and the K/V rings across tiles.
for hdim in (64, 128, 256):
    for causal in (False, True):
        q = torch.randn(4, 400, 40, hdim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(4, 400, 8, hdim, device="cuda", dtype=torch.bfloat16)
        flashtune.flash_attn_func(q, k, torch.randn_like(k), causal=causal)
cu = torch.tensor([0, 3, 3, 70], dtype=torch.int32, device="cuda")
q = torch.randn(70, 4, 64, device="cuda", dtype=torch.float16)
flashtune.flash_attn_varlen_func(q, q[:, :2], q[:, 2:], cu, cu, 67, 67, causal=True)
# Causal with more queries than keys (bottom-right): most tiles see no key (n_blocks 0, O = 0), in
# the loop among tiles that do, the path where a deferred epilogue (hdim 64, hdim 128 128x128) is
# first written out.
for hdim in (64, 128, 256):
    q = torch.randn(2, 1000, 40, hdim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 300, 8, hdim, device="cuda", dtype=torch.bfloat16)
    flashtune.flash_attn_func(q, k, torch.randn_like(k), causal=True, return_lse=True)
# Non-causal calls with a partial last wave of tiles on the persistent grid: 1500 keys (8 or more
# blocks, a masked tail block), heads for a last wave of about a third, and a half, of the SMs.
sms = torch.cuda.get_device_properties(0).multi_processor_count
for hdim, block_m in ((64, 192), (128, 128), (256, 128)):
    for share in (1.33, 1.5):
        heads = round(share * sms / -(-1500 // block_m))
        q, k, v = (torch.randn(1, 1500, heads, hdim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flashtune.flash_attn_func(q, k, v, return_lse=True)
# Scores that grow along the keys, with a jump that overflows exps against the old maxima: rows'
# maxima move (the rescale, and spec_max's second S of a block), in some warps of a warpgroup only.
for hdim in (64, 128, 256):
    for causal in (False, True):
        q = torch.randn(1, 700, 4, hdim, device="cuda", dtype=torch.bfloat16)
        growth = torch.linspace(0.25, 6.0, 700, device="cuda")
        growth[500:] *= 30
        k = (torch.randn(1, 700, 4, hdim, device="cuda") * growth[None, :, None, None]).bfloat16()
        flashtune.flash_attn_func(q, k, torch.randn_like(k), causal=causal, return_lse=True)
# Decode (csrc/decode/): split-KV (3 splits: merged in a thread block cluster on sm_90 and newer,
# elsewhere by the combine kernel; the heuristic's count), GQA packing of 16 and 32 rows, causal query
# lengths, an append, ragged cache_seqlens (0, partial tiles, full), contiguous, paged (bulk pages
# of 16, gathered pages of 1) and varlen with seqused_k.
for hdim in (64, 128, 256):
    for seqlen_q, causal, heads_kv in ((1, False, 2), (4, True, 1), (9, True, 2)):
        batch, capacity = 3, 400
        q = torch.randn(batch, seqlen_q, 16, hdim, device="cuda", dtype=torch.bfloat16)
        k_cache, v_cache = (torch.randn(batch, capacity, heads_kv, hdim, device="cuda", dtype=torch.bfloat16)
                            for _ in range(2))
        seqlens = torch.tensor([0, 133, capacity - 2], dtype=torch.int32, device="cuda")
        new = torch.randn(batch, 2, heads_kv, hdim, device="cuda", dtype=torch.bfloat16)
        for splits in (1, 3, 0):
            flashtune.flash_attn_with_kvcache(q, k_cache, v_cache, new, new, cache_seqlens=seqlens, causal=causal,
                                              num_splits=splits, return_softmax_lse=True)
        for page in (16, 1):
            pages = batch * capacity // page
            kp, vp = (torch.randn(pages, page, heads_kv, hdim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            table = torch.randperm(pages, device="cuda").to(torch.int32).view(batch, -1)
            flashtune.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=table, causal=causal)
        cu_q = torch.arange(0, (batch + 1) * seqlen_q, seqlen_q, dtype=torch.int32, device="cuda")
        kp, vp = (torch.randn(batch * capacity // 16, 16, heads_kv, hdim, device="cuda", dtype=torch.bfloat16)
                  for _ in range(2))
        table = torch.randperm(batch * capacity // 16, device="cuda").to(torch.int32).view(batch, -1)
        flashtune.flash_attn_varlen_func(q.flatten(0, 1), kp, vp, cu_q, None, seqlen_q, capacity, causal=causal,
                                         seqused_k=seqlens + 2, block_table=table)
# An e4m3 cache (fragments converted in registers): 16-row tiles at every head dim, one and four
# causal query tokens, 1 and 3 splits and the heuristic's, contiguous and pages of 16.
for hdim in (64, 128, 256):
    for seqlen_q, causal in ((1, False), (4, True)):
        batch, capacity, heads_kv = 3, 400, 4
        q = torch.randn(batch, seqlen_q, 16, hdim, device="cuda", dtype=torch.bfloat16)
        k16, v16 = (torch.randn(batch, capacity, heads_kv, hdim, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        k_descale, v_descale = flashtune.kv_descales(k16, v16)
        k8, v8 = quantise_kv(k16, k_descale), quantise_kv(v16, v_descale)
        seqlens = torch.tensor([0, 133, capacity], dtype=torch.int32, device="cuda")
        for splits in (1, 3, 0):
            flashtune.flash_attn_with_kvcache(q, k8, v8, cache_seqlens=seqlens, causal=causal, num_splits=splits,
                                              k_descale=k_descale, v_descale=v_descale)
        table = torch.randperm(batch * capacity // 16, device="cuda").to(torch.int32).view(batch, -1)
        flashtune.flash_attn_with_kvcache(q, k8.view(-1, 16, heads_kv, hdim), v8.view(-1, 16, heads_kv, hdim),
                                          cache_seqlens=seqlens, block_table=table, causal=causal,
                                          k_descale=k_descale, v_descale=v_descale)
# Head dims between the built ones and a V head dim unlike Q/K's (an sm90 profile's narrow kernels: TMA
# boxes partly and wholly past a tensor's head dim, O stored up to its own): fixed length (TMA stores
# where the tile has them) and varlen (direct stores), causal and not.
for dqk, dv in ((96, 96), (136, 136), (192, 128), (64, 128)):
    for causal in (False, True):
        q = torch.randn(2, 333, 8, dqk, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(2, 500, 2, dqk, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(2, 500, 2, dv, device="cuda", dtype=torch.bfloat16)
        flashtune.flash_attn_func(q, k, v, causal=causal, return_lse=True)
        cu_q = torch.tensor([0, 100, 333], dtype=torch.int32, device="cuda")
        cu_k = torch.tensor([0, 150, 500], dtype=torch.int32, device="cuda")
        flashtune.flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, 233, 350, causal=causal)
backward_calls()
torch.cuda.synchronize()
print("sanitize_case: done")
