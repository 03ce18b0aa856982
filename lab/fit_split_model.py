"""Fit decode's split cost model (flashtune/runtime/decode_splits.py) to a split sweep
(lab/decode_splits.py's JSON), on the CPU: for each set of policy constants on a grid, how much slower
the split count the model picks is than the fastest measured, per cell; prints the defaults' figures,
then the best constants' (geomean loss first, then the worst cell). The memory's rate is the device's
peak (--gbps, e.g. 3352 for the H100 SXM, 4800 for the H200).

Usage: PYTHONPATH=. python3 lab/fit_split_model.py SWEEP.json --gbps 3352
"""
import argparse
import dataclasses
import itertools
import json
import math

import torch

from flashtune.kernels.decode_spec import DecodeSplitPolicy
from flashtune.kernels.profiles import find_profile
from flashtune.runtime import decode_splits
from flashtune.runtime.decode import decode_spec

HEADS = 32
GRID = {"ring_turnaround_us": (2, 2.5, 3, 3.5, 4, 5, 6), "combine_us": (2, 2.5, 3, 3.5, 4, 5),
        "combine_gbps": (800, 1200, 1600, 2400, 3200)}


def losses(cells, sms, gbps, policy):
    """Per cell: the measured time at the model's count (the nearest count measured) over the fastest."""
    out = []
    profile = find_profile("h200")
    for c in cells:
        ratio = HEADS // c["heads_kv"]
        spec = decode_spec(profile, torch.bfloat16, c["hdim"], c["seqlen_q"] > 1, c["seqlen_q"], ratio, None)
        n = decode_splits.choose_splits(spec, c["batch"], c["heads_kv"], c["seqlen_q"], ratio, c["cache"], sms, gbps,
                                        policy)
        times = {int(k.split()[1]): us for k, us in c["us"].items() if k.startswith("splits ")}
        nearest = min(times, key=lambda s: abs(s - n))
        out.append(times[nearest] / min(times.values()))
    return out


def summary(values):
    return math.exp(sum(map(math.log, values)) / len(values)), max(values)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("sweep")
    parser.add_argument("--gbps", type=float, required=True)
    args = parser.parse_args()
    data = json.load(open(args.sweep))
    cells, sms = data["cells"], data["sms"]
    geo, worst = summary(losses(cells, sms, args.gbps, DecodeSplitPolicy()))
    print(f"defaults {dataclasses.asdict(DecodeSplitPolicy())}: {geo:.4f} geomean, worst {worst:.3f}")
    fits = []
    for values in itertools.product(*GRID.values()):
        policy = DecodeSplitPolicy(**dict(zip(GRID, values)))
        decode_splits._fastest_split.cache_clear()
        fits.append((summary(losses(cells, sms, args.gbps, policy)), dict(zip(GRID, values))))
    for (geo, worst), constants in sorted(fits, key=lambda f: f[0])[:5]:
        print(f"{constants}: {geo:.4f} geomean, worst {worst:.3f}")


if __name__ == "__main__":
    main()
