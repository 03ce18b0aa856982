"""Decode's split count on the cells that fill the GPU least (issue 33): each cell through
flash_attn_with_kvcache with the heuristic's choice and with explicit num_splits, timed side by side
(interleaved, cold L2, as bench times), beside SDPA cuDNN; and, from the profiler, how much of a
call the split kernel and the combine kernel take. GB/s of K/V read.

Usage: PYTHONPATH=. FLASHTUNE_TRUST_CU_SEQLENS=1 python3 lab/decode_splits.py OUT.json
"""
import json
import statistics
import sys
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import flashtune
from flashtune.kernels.profiles import find_profile
from flashtune.measure.timing import L2_FLUSH_BYTES, time_ms
from flashtune.runtime.decode import _sm_count, choose_splits, decode_spec

CELLS = [  # (hdim, heads_kv, batch, cache, seqlen_q): the cells below 0.97x the fastest SDPA backend (2026-12-05)
    (64, 1, 128, 1024, 1), (64, 1, 8, 16384, 1), (128, 1, 1, 1024, 1), (64, 8, 8, 1024, 1),
    (128, 1, 1, 16384, 1), (128, 1, 8, 1024, 1), (64, 1, 1, 1024, 1), (64, 1, 8, 1024, 1),
    (64, 1, 1, 16384, 1), (128, 1, 32, 1024, 1),
]
SPLITS = (1, 3, 8, 16, 32, 64, 128)
HEADS = 32


def kernel_us(run, calls=20):
    """Mean microseconds per call of each CUDA kernel the call launches."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    total = defaultdict(float)
    for e in prof.events():
        if e.device_type.name == "CUDA":
            total["combine" if e.name.endswith("_combine") else "split" if "decode" in e.name else e.name] += \
                e.device_time_total / calls
    return dict(total)


def main():
    torch.manual_seed(0)
    profile_ = find_profile("h200")
    x = torch.empty(2 ** 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    copy = 2 * x.numel() / statistics.median(time_ms([lambda: y.copy_(x)], 3, 20)) / 1e6
    del x, y
    out = {"copy_GBps": copy, "cells": []}
    for hdim, hkv, batch, cache, sq in CELLS:
        kv_bytes = 2 * batch * cache * hkv * hdim * 2
        sets = max(1, min(32, -(-L2_FLUSH_BYTES // kv_bytes)))
        inputs = []
        for _ in range(sets):
            q = torch.randn(batch, sq, HEADS, hdim, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(batch, cache, hkv, hdim, device="cuda", dtype=torch.bfloat16)
            inputs.append((q, k, torch.randn_like(k)))
        causal = sq > 1
        spec = decode_spec(profile_, torch.bfloat16, hdim, causal, sq, HEADS // hkv, None)
        chosen = choose_splits(spec, batch, hkv, sq, HEADS // hkv, cache, _sm_count(0))
        names, runners = [], []
        for n in (0,) + SPLITS:
            names.append(f"splits {n}" if n else f"heuristic ({chosen})")
            runners.append([lambda a=a, n=n: flashtune.flash_attn_with_kvcache(*a, causal=causal, num_splits=n)
                            for a in inputs])

        def cudnn(a):
            q, k, v = (t.transpose(1, 2) for t in a)
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=False)
        if not causal:
            names.append("sdpa-cudnn")
            runners.append([lambda a=a: cudnn(a) for a in inputs])
        times = {n: [] for n in names}
        for _ in range(3):  # interleaved rounds
            for name, rs in zip(names, runners):
                times[name] += time_ms(rs, 5, 30)
        row = {"hdim": hdim, "heads_kv": hkv, "batch": batch, "cache": cache, "seqlen_q": sq, "kv_GB": kv_bytes / 1e9,
               "kernel": spec.name, "heuristic": chosen, "GBps": {}, "kernels_us": {}}
        for name in names:
            ms = statistics.median(times[name])
            row["GBps"][name] = kv_bytes / ms / 1e6
        for n in dict.fromkeys((chosen, 1, 16)):
            row["kernels_us"][f"splits {n}"] = kernel_us(runners[0][0] if n == chosen else
                                                         (lambda n=n: runners[1 + SPLITS.index(n)][0]()))
        out["cells"].append(row)
        best = max(row["GBps"], key=row["GBps"].get)
        print(f"h{hdim} kv{hkv} b{batch} x {cache} q{sq} ({kv_bytes / 1e9:.2f} GB): "
              + ", ".join(f"{k} {v:.0f}" for k, v in row["GBps"].items()) + f" | best {best}; kernels "
              + "; ".join(f"{k}: " + " ".join(f"{n} {u:.1f}" for n, u in d.items())
                          for k, d in row["kernels_us"].items()), flush=True)
        del inputs, runners
        torch.cuda.empty_cache()
    json.dump(out, open(sys.argv[1], "w"), indent=1)
    print(f"copy {copy:.0f} GB/s")


if __name__ == "__main__":
    main()
