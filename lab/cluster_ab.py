"""A/B of decode's merge of a few splits (issue 33's short calls): in a thread block cluster
(csrc/decode/cluster_merge.cuh) against fp32 partials and the combine kernel, at every split count
up to 8, with the cost model's pick under each, one split, and SDPA cuDNN, timed side by side
(interleaved rounds, cold L2, as bench times) on the cells where SDPA's one kernel beat the split
and combine kernels. Microseconds per call.

Usage: PYTHONPATH=. python3 lab/cluster_ab.py OUT.json
"""
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashtune.kernels.build import build_specs
from flashtune.kernels.decode_spec import DecodeSplitPolicy
from flashtune.kernels.profiles import find_profile
from flashtune.measure.timing import time_interleaved
from flashtune.runtime.decode import cluster_slots, decode_spec, run_decode
from flashtune.runtime.decode_splits import choose_splits, device_facts
from flashtune.tuning.decode_search import decode_inputs

HEADS = 32
# (hdim, heads_kv, batch, cache keys), one query token
CELLS = ([(d, 1, b, 1024) for d in (64, 128) for b in (1, 8, 32)]
         + [(d, 1, b, 16384) for d in (64, 128) for b in (1, 8)] + [(128, 1, 1, 131072)]
         + [(d, 8, 1, c) for d in (64, 128) for c in (1024, 4096, 16384)]
         + [(64, 8, 8, 1024), (64, 8, 8, 16384), (64, 8, 1, 131072), (64, 32, 8, 1024), (128, 32, 1, 1024)]
         + [(128, 1, 32, 16384), (128, 32, 1, 16384), (64, 32, 1, 16384)])  # 128 CTAs in clusters of 4
COUNTS = (2, 3, 4, 6, 8)
CLUSTER, COMBINE = DecodeSplitPolicy(), DecodeSplitPolicy(cluster_splits=0)


def main():
    profile = find_profile("h200")
    specs = {c: decode_spec(profile, torch.bfloat16, c[0], False, 1, HEADS // c[1], None) for c in CELLS}
    _, failures = build_specs(list(dict.fromkeys(specs.values())), jobs=16)
    print(f"built {len(set(specs.values()))} kernels, failures: {failures or 'none'}", flush=True)
    sms, memory = device_facts(0)
    out = {"device": torch.cuda.get_device_name(0), "sms": sms, "memory_gbps": memory, "cells": []}
    for cell in CELLS:
        hdim, hkv, batch, cache = cell
        spec = specs[cell]
        sets = decode_inputs((batch, cache, 1, HEADS // hkv), hdim, torch.bfloat16, seed=0)

        def runner(n, policy):
            return [lambda q=q, k=k, v=v: run_decode(spec, q, k, v, max_seqlen_q=1, seqlen_k=cache,
                                                     softmax_scale=hdim ** -0.5, num_splits=n, with_lse=False,
                                                     policy=policy)[0] for q, k, v in sets]
        slots = cluster_slots(spec, 0)
        picks = {name: choose_splits(spec, batch, hkv, 1, HEADS // hkv, cache, sms, memory, policy, slots)
                 for name, policy in (("cluster", CLUSTER), ("combine", COMBINE))}
        timed = {"splits 1": runner(1, CLUSTER)}
        for n in COUNTS:
            if n <= cache // spec.tile.block_n:
                timed[f"cluster {n}"] = runner(n, CLUSTER)
                timed[f"combine {n}"] = runner(n, COMBINE)
        timed[f"model cluster ({picks['cluster']})"] = runner(0, CLUSTER)
        timed[f"model combine ({picks['combine']})"] = runner(0, COMBINE)

        def cudnn(q, k, v):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                      enable_gqa=True)
        timed["sdpa-cudnn"] = [lambda s=s: cudnn(*s) for s in sets]
        times, _ = time_interleaved(timed, 5, 60)
        us = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        out["cells"].append({"hdim": hdim, "heads_kv": hkv, "batch": batch, "cache": cache, "kernel": spec.name,
                             "slots": slots, "picks": picks, "us": us})
        best = {kind: min((u, n) for n, u in us.items() if n.startswith(kind + " ")) for kind in ("cluster", "combine")}
        print(f"h{hdim} kv{hkv} b{batch} x{cache} (slots {slots[2:]}): cudnn {us['sdpa-cudnn']:.1f} | 1 split {us['splits 1']:.1f} | "
              f"best cluster {best['cluster'][1]} {best['cluster'][0]:.1f}, combine {best['combine'][1]} "
              f"{best['combine'][0]:.1f} | model: " + ", ".join(f"{n} {u:.1f}" for n, u in us.items()
                                                                    if n.startswith("model")), flush=True)
        del sets, timed
        torch.cuda.empty_cache()
    json.dump(out, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
