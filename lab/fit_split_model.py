"""Fit decode's split cost model (flashtune/runtime/decode_splits.py) to a split sweep
(lab/decode_splits.py's JSON) on the CPU, with tune --decode's fit (flashtune/tuning/split_fit.py):
how much slower the count each policy picks is than the fastest measured (geomean, worst cell), for
today's defaults and the grid's best. The memory's rate is the device's peak (--gbps: 3352 for the
H100 SXM, 4800 for the H200).

Usage: PYTHONPATH=. python3 lab/fit_split_model.py SWEEP.json --gbps 3352
"""
import argparse
import dataclasses
import json

from flashtune.kernels.profiles import find_profile
from flashtune.tuning.split_fit import SplitCell, fit_split_policy, spec_for_profile


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("sweep")
    parser.add_argument("--gbps", type=float, required=True)
    args = parser.parse_args()
    data = json.load(open(args.sweep))
    cells = [SplitCell(c["hdim"], c["heads_kv"], c["batch"], c["cache"],
                       {int(k.split()[1]): us for k, us in c["us"].items() if k.startswith("splits ")}, c["seqlen_q"])
             for c in data["cells"]]
    fit = fit_split_policy(cells, spec_for_profile(find_profile("h200"), "bfloat16"), data["sms"], args.gbps)
    for name, policy, (geo, worst) in (("defaults", fit.base, fit.base_loss), ("fitted", fit.fitted, fit.loss)):
        print(f"{name} {dataclasses.asdict(policy)}: {geo:.4f} geomean, worst {worst:.3f}")


if __name__ == "__main__":
    main()
