"""Where the host time of one decode call goes (issue 34: at batch 1 a model's decode loop waits on
it): flashtune's flash_attn_with_kvcache and the path transformers' generate takes
(kvcache.padded_cache_decode), beside SDPA, each called back to back with the GPU kept busy by a
spin kernel so that no call waits on the device; then cProfile's top functions by own time for
flashtune's calls.

Usage: PYTHONPATH=. python3 lab/host_profile.py [PROFILE]   (default h200; prints a table)
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
    calls = {
        "flash_attn_with_kvcache (int cache_seqlens)":
            lambda: kvcache.flash_attn_with_kvcache(q, k, v, cache_seqlens=4000),
        "flash_attn_with_kvcache (tensor cache_seqlens)":
            lambda: kvcache.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens),
        "padded_cache_decode (transformers' path)":
            lambda: kvcache.padded_cache_decode(q, k, v, first, seqlens, 128 ** -0.5, False),
        "SDPA default (enable_gqa)": lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True),
        "torch.empty (one CUDA tensor)": lambda: torch.empty(1, 1, 32, 128, device=dev, dtype=torch.bfloat16),
    }
    print(f"{'call':52s} host us")
    for name, run in calls.items():
        print(f"{name:52s} {host_us(run):7.1f}", flush=True)
    profiler = cProfile.Profile()
    run = calls["padded_cache_decode (transformers' path)"]
    profiler.enable()
    for _ in range(500):
        run()
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
