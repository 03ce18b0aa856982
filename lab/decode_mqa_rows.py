"""MQA with one query token (32 query heads over one KV head) on 16-row decode tiles instead of the
32-row tile the runtime picks (issue 33's short calls): two row blocks of 16 per KV head double the
CTAs and halve each one's math (the m16 kernels stream at about 60 GB/s a CTA on an H100, the m32
kernel at 35-45), the second read of each key block coming from L2. Per cell and tile: every split
count from 1 up, the fastest beside SDPA cuDNN and flash, timed side by side (interleaved rounds,
cold L2, as bench times); also the 32-row tile with block_n 32 (the register budget allows it at
hdim <= 128) and with rings of 6 and 8 stages (where shared memory holds them: the m32 kernel keeps
64-128 KB in flight, the m16 ones 192). Microseconds per call; the kernels are built first, in
parallel.

Usage: PYTHONPATH=. python3 lab/decode_mqa_rows.py OUT.json
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashtune.kernels.build import build_specs
from flashtune.kernels.decode_spec import DecodeSpec, DecodeTile, decode_spec_for, decode_tile_problems
from flashtune.kernels.profiles import find_profile
from flashtune.measure.timing import L2_FLUSH_BYTES, time_interleaved
from flashtune.runtime.decode import run_decode

HEADS = 32
CELLS = [(d, b, c) for d in (64, 128) for b in (1, 8, 32) for c in (1024, 16384)] + [(128, 128, 1024)]
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128)


def tiles(profile, hdim):
    """name -> DecodeSpec: the runtime's 32-row tile, the 16-row tile, 32 rows x 32 keys, deeper rings."""
    out = {"m32 (runtime)": decode_spec_for(profile, "bfloat16", hdim, 32, False, "contiguous"),
           "m16": decode_spec_for(profile, "bfloat16", hdim, 16, False, "contiguous")}
    for name, tile in (("m32x32", DecodeTile(32, 32, 4, 3)), ("m32x16 s6", DecodeTile(32, 16, 4, 6)),
                       ("m32x16 s8", DecodeTile(32, 16, 4, 8))):  # wider steps; deeper rings
        if not decode_tile_problems(hdim, tile, profile.arch):
            out[name] = DecodeSpec(profile.arch.name, "bfloat16", hdim, tile, False)
    return out


def main():
    torch.manual_seed(0)
    profile = find_profile("h200")
    per_hdim = {d: tiles(profile, d) for d in (64, 128)}
    _, failures = build_specs([s for t in per_hdim.values() for s in t.values()], jobs=16)
    print("build failures:", failures or "none", flush=True)
    out = {"device": torch.cuda.get_device_name(0), "cells": []}
    for hdim, batch, cache in CELLS:
        kv_bytes = 2 * batch * cache * hdim * 2
        sets = max(1, min(32, -(-L2_FLUSH_BYTES // kv_bytes)))
        inputs = [(torch.randn(batch, 1, HEADS, hdim, device="cuda", dtype=torch.bfloat16),
                   torch.randn(batch, cache, 1, hdim, device="cuda", dtype=torch.bfloat16),
                   torch.randn(batch, cache, 1, hdim, device="cuda", dtype=torch.bfloat16)) for _ in range(sets)]
        timed = {}
        for name, spec in per_hdim[hdim].items():
            most = -(-cache // spec.tile.block_n)
            for n in (s for s in SPLITS if s <= most):
                timed[f"{name} splits {n}"] = [
                    lambda a=a, spec=spec, n=n: run_decode(spec, *a, max_seqlen_q=1, seqlen_k=cache,
                                                           softmax_scale=hdim ** -0.5, num_splits=n, with_lse=False)
                    for a in inputs]
        for name, backend in (("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa-flash", SDPBackend.FLASH_ATTENTION)):
            def sdpa(a, b=backend):
                with sdpa_kernel([b]):
                    return F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in a), enable_gqa=True)
            timed[name] = [lambda a=a, f=sdpa: f(a) for a in inputs]
        times, failed = time_interleaved(timed, 5, 30, catch=(RuntimeError,))
        us = {n: statistics.median(t) * 1e3 for n, t in times.items()}
        best = {}
        for name in per_hdim[hdim]:
            mine = {n: u for n, u in us.items() if n.startswith(name + " ")}
            if mine:
                fastest = min(mine, key=mine.get)
                best[name] = (fastest.split()[-1], mine[fastest])
        out["cells"].append({"hdim": hdim, "batch": batch, "cache": cache, "us": us,
                             "failed": {n: str(e)[:200] for n, e in failed.items()}})
        sdpa_us = min((u for n, u in us.items() if n.startswith("sdpa")), default=float("nan"))
        print(f"h{hdim} b{batch} x{cache}: " + ", ".join(f"{n} {u:.1f} us ({s} splits)" for n, (s, u) in best.items())
              + f" | sdpa {sdpa_us:.1f}", flush=True)
        del inputs, timed
        torch.cuda.empty_cache()
    json.dump(out, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
