"""Decode's split count, swept (issue 33): cells from the short calls to the large ones, each through
flash_attn_with_kvcache with the cost model's choice and with explicit num_splits from 1 to one key
block a split (past the model's limit of two blocks a warp, to show whether that limit costs),
timed side by side (interleaved rounds, cold L2, as bench times) beside SDPA cuDNN and flash.
Microseconds per call; the data a split policy is fitted to (lab/fit_split_model.py). The kernels
of every cell are built first, 16 at a time.

Usage: PYTHONPATH=. FLASHTUNE_TRUST_CU_SEQLENS=1 python3 lab/decode_splits.py OUT.json [--quick]
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashtune
from flashtune.kernels.build import build_specs
from flashtune.kernels.profiles import find_profile
from flashtune.measure.timing import L2_FLUSH_BYTES, time_ms
from flashtune.runtime.decode import decode_spec
from flashtune.runtime.decode_splits import choose_splits, device_facts

HEADS = 32
# (hdim, heads_kv, batch, cache, seqlen_q)
CELLS = ([(d, 1, b, c, 1) for d in (64, 128) for b in (1, 8, 32, 128) for c in (1024, 16384)]
         + [(d, 1, 1, 131072, 1) for d in (64, 128)]
         + [(d, 8, b, c, 1) for d in (64, 128) for b in (1, 8, 32) for c in (1024, 16384)]
         + [(d, 8, 1, 131072, 1) for d in (64, 128)]
         + [(128, 32, b, c, 1) for b in (1, 8) for c in (1024, 16384)] + [(64, 32, 1, 1024, 1)]
         + [(256, 8, 1, 16384, 1), (256, 1, 8, 1024, 1), (256, 8, 8, 1024, 1)]
         + [(128, 8, b, c, 4) for b in (1, 8) for c in (1024, 16384)])
QUICK = [(64, 1, 128, 1024, 1), (64, 8, 8, 1024, 1), (128, 1, 1, 16384, 1), (128, 8, 1, 16384, 1)]
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def sdpa(backend, a):
    q, k, v = (t.transpose(1, 2) for t in a)
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def main():
    torch.manual_seed(0)
    cells = QUICK if "--quick" in sys.argv else CELLS
    profile_ = find_profile("h200")
    specs = {c: decode_spec(profile_, torch.bfloat16, c[0], c[4] > 1, c[4], HEADS // c[1], None) for c in cells}
    _, failures = build_specs(list(dict.fromkeys(specs.values())), jobs=16)
    print(f"built {len(set(specs.values()))} kernels, failures: {failures or 'none'}", flush=True)
    x = torch.empty(2 ** 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    copy = 2 * x.numel() / statistics.median(time_ms([lambda: y.copy_(x)], 3, 20)) / 1e6
    del x, y
    sms, memory = device_facts(0)
    out = {"device": torch.cuda.get_device_name(0), "sms": sms, "copy_GBps": copy, "cells": []}
    for cell in cells:
        hdim, hkv, batch, cache, sq = cell
        spec = specs[cell]
        kv_bytes = 2 * batch * cache * hkv * hdim * 2
        sets = max(1, min(32, -(-L2_FLUSH_BYTES // kv_bytes)))
        inputs = []
        for _ in range(sets):
            q = torch.randn(batch, sq, HEADS, hdim, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(batch, cache, hkv, hdim, device="cuda", dtype=torch.bfloat16)
            inputs.append((q, k, torch.randn_like(k)))
        causal = sq > 1
        chosen = choose_splits(spec, batch, hkv, sq, HEADS // hkv, cache, sms, memory)
        most = max(1, -(-cache // spec.tile.block_n))  # one key block a split
        runners = {f"heuristic ({chosen})": [lambda a=a: flashtune.flash_attn_with_kvcache(*a, causal=causal)
                                             for a in inputs]}
        for n in (s for s in SPLITS if s <= min(most, 128)):
            runners[f"splits {n}"] = [lambda a=a, n=n: flashtune.flash_attn_with_kvcache(*a, causal=causal, num_splits=n)
                                      for a in inputs]
        for name, backend in (("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa-flash", SDPBackend.FLASH_ATTENTION)):
            if causal:  # SDPA's causal mask is top-left aligned: another problem
                break
            try:
                sdpa(backend, inputs[0])
            except RuntimeError:
                continue
            runners[name] = [lambda a=a, b=backend: sdpa(b, a) for a in inputs]
        times = {n: [] for n in runners}
        for _ in range(3):  # interleaved rounds
            for name, rs in runners.items():
                times[name] += time_ms(rs, 5, 30, warmup_seconds=0.02)
        row = {"hdim": hdim, "heads_kv": hkv, "batch": batch, "cache": cache, "seqlen_q": sq, "kv_GB": kv_bytes / 1e9,
               "kernel": spec.name, "heuristic": chosen, "us": {n: statistics.median(t) * 1e3 for n, t in times.items()}}
        out["cells"].append(row)
        splits = {n: u for n, u in row["us"].items() if n.startswith("splits")}
        best = min(splits, key=splits.get)
        fastest_sdpa = min((u for n, u in row["us"].items() if n.startswith("sdpa")), default=float("nan"))
        heur = row["us"][f"heuristic ({chosen})"]
        print(f"h{hdim} kv{hkv} b{batch} x{cache} q{sq}: heuristic {chosen} {heur:.1f} us | best {best} "
              f"{splits[best]:.1f} | sdpa {fastest_sdpa:.1f} | " + " ".join(f"{n.split()[1]}:{u:.1f}" for n, u in splits.items()),
              flush=True)
        del inputs, runners
        torch.cuda.empty_cache()
    json.dump(out, open(sys.argv[1], "w"), indent=1)
    print(f"copy {copy:.0f} GB/s, {sms} SMs")


if __name__ == "__main__":
    main()
