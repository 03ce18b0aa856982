"""Where the host time of one decode call goes (issue 34: at batch 1 a model's decode loop waits on
it): flashtune's flash_attn_with_kvcache and the path transformers' generate takes
(kvcache.padded_cache_decode), beside SDPA, each called back to back with the GPU kept busy by a
spin kernel so that no call waits on the device; then cProfile's top functions by own time for
flashtune's calls.

Usage: PYTHONPATH=. python3 lab/host_profile.py [PROFILE [CALL]]   (default h200; prints a table, then
cProfile of CALL, one of the table's names; default transformers' static-cache path)
"""
import cProfile
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from flashtune.runtime import kvcache, ops

CALLS = 2000


def host_us(run, calls: int = CALLS) -> float:
    """Median host microseconds per call over rounds of 100, the GPU busy behind a long spin."""
    for _ in range(20):
        run()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(calls // 100):
        torch.cuda._sleep(50_000_000)  # ~25 ms of GPU work queued ahead: launches never wait
        start = time.perf_counter()
        for _ in range(100):
            run()
        rounds.append((time.perf_counter() - start) / 100 * 1e6)
        torch.cuda.synchronize()
    return statistics.median(rounds)


def main() -> None:
    ops.use_profile(sys.argv[1] if len(sys.argv) > 1 else "h200")
    dev = "cuda"
    q = torch.randn(1, 1, 32, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, 4096, 8, 128, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    seqlens = torch.full((1,), 4000, dtype=torch.int32, device=dev)
    first = torch.zeros(1, dtype=torch.int32, device=dev)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    # transformers' generate with its dynamic cache: (batch, heads, keys, d) tensors whose keys grow by
    # one a step, through the registered attention function (bench --model's attention host us
    # column: 168-182 us a call on an H100, 2026-12-07, where these rows' fixed shapes took 29-48)
    from flashtune import hf
    module = torch.nn.Module()
    module.is_causal = True
    kbuf = torch.randn(1, 8, 4096 + CALLS + 600, 128, device=dev, dtype=torch.bfloat16)
    vbuf = torch.randn_like(kbuf)
    grown = [4096]
    static_mask = torch.arange(4096, device=dev)[None] < 4000

    def growing():
        grown[0] += 1
        return hf.attention_forward(module, qt, kbuf[:, :, :grown[0]], vbuf[:, :, :grown[0]], None)
    calls = {
        "flash_attn_with_kvcache (int cache_seqlens)":
            lambda: kvcache.flash_attn_with_kvcache(q, k, v, cache_seqlens=4000),
        "flash_attn_with_kvcache (tensor cache_seqlens)":
            lambda: kvcache.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens),
        "padded_cache_decode (transformers' path)":
            lambda: kvcache.padded_cache_decode(q, k, v, first, seqlens, 128 ** -0.5, False),
        "hf.attention_forward (4k keys, generate's layout)":
            lambda: hf.attention_forward(module, qt, kbuf[:, :, :4096], vbuf[:, :, :4096], None),
        "hf.attention_forward (keys growing one a call)": growing,
        # a static cache's decode step: the whole buffer and the forward's one 2-D mask, which every
        # layer gets (its one-run check read on the host once per mask since checks.read_values)
        "hf.attention_forward (static cache, 2-D mask)":
            lambda: hf.attention_forward(module, qt, kbuf[:, :, :4096], vbuf[:, :, :4096], static_mask),
        "SDPA default (enable_gqa)": lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True),
        "torch.empty (one CUDA tensor)": lambda: torch.empty(1, 1, 32, 128, device=dev, dtype=torch.bfloat16),
    }
    print(f"{'call':52s} host us")
    for name, run in calls.items():
        print(f"{name:52s} {host_us(run):7.1f}", flush=True)
    profiler = cProfile.Profile()
    run = calls[sys.argv[2] if len(sys.argv) > 2 else "padded_cache_decode (transformers' path)"]
    profiler.enable()
    for _ in range(500):
        run()
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
