"""Which profile of an A/B (lab/experiment.sh's bench files) is fastest against a reference.

Usage: python3 lab/ab_winner.py REFERENCE_BACKEND MARGIN PROFILE=BENCH.json[,BENCH.json...] ...
   or: python3 lab/ab_winner.py REFERENCE_BACKEND MARGIN --dir FOLDER PROFILE.yaml ...
(--dir: lab/experiment.sh's folder, whose rounds of profile P are bench_<P's name>_<round>.json.)
Prints the profile whose geomean of flashtune / REFERENCE (each file its own run of both, averaged
over its rounds) is highest, if it beats the first profile (the control) by more than MARGIN
(e.g. 0.005); else the first. A visit's next step can then run on it (lab/visit.sh).
"""
import glob
import json
import os
import sys

from flashtune.measure.timing import geomean


def score(paths: list[str], reference: str) -> float:
    per_round = []
    for path in paths:
        cells: dict = {}
        for row in json.load(open(path))["rows"]:
            cells.setdefault((row["hdim"], row["causal"], row["seqlen_q"]), {})[row["backend"]] = row["tflops"]
        per_round.append(geomean([c["flashtune"] / c[reference] for c in cells.values()
                                  if c.get("flashtune") and c.get(reference)]))
    return sum(per_round) / len(per_round)


def experiment_rounds(folder: str, profile: str) -> list[str]:
    name = os.path.basename(profile).removesuffix(".yaml")
    paths = sorted(glob.glob(os.path.join(folder, f"bench_{glob.escape(name)}_[0-9]*.json")))
    if not paths:  # one round: experiment.sh numbers rounds only when there are several
        paths = glob.glob(os.path.join(folder, f"bench_{glob.escape(name)}.json"))
    if not paths:
        sys.exit(f"no bench files of {name} in {folder}")
    return paths


reference, margin = sys.argv[1], float(sys.argv[2])
args = sys.argv[3:]
if args[:1] == ["--dir"]:
    args = [f"{p}=" + ",".join(experiment_rounds(args[1], p)) for p in args[2:]]
scores = {}
for arg in args:
    profile, paths = arg.split("=", 1)
    scores[profile] = score(paths.split(","), reference)
    print(f"{profile}: {scores[profile]:.4f}", file=sys.stderr)
control = next(iter(scores))
best = max(scores, key=scores.get)
print(best if scores[best] > scores[control] + margin else control)
