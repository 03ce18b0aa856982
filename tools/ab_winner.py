"""Which profile of an A/B (tools/experiment.sh's bench files) is fastest against a reference.

Usage: python3 tools/ab_winner.py REFERENCE_BACKEND MARGIN PROFILE=BENCH.json[,BENCH.json...] ...
Prints the profile whose geomean of flashtune / REFERENCE (each file its own run of both, averaged
over its rounds) is highest, if it beats the first profile (the control) by more than MARGIN
(e.g. 0.005); else the first. A visit's next step can then run on it (tools/visit.sh, PROFILE).
"""
import json
import sys

from flashtune.bench import geomean


def score(paths: list[str], reference: str) -> float:
    per_round = []
    for path in paths:
        cells: dict = {}
        for row in json.load(open(path))["rows"]:
            cells.setdefault((row["hdim"], row["causal"], row["seqlen_q"]), {})[row["backend"]] = row["tflops"]
        per_round.append(geomean([c["flashtune"] / c[reference] for c in cells.values()
                                  if c.get("flashtune") and c.get(reference)]))
    return sum(per_round) / len(per_round)


reference, margin = sys.argv[1], float(sys.argv[2])
scores = {}
for arg in sys.argv[3:]:
    profile, paths = arg.split("=", 1)
    scores[profile] = score(paths.split(","), reference)
    print(f"{profile}: {scores[profile]:.4f}", file=sys.stderr)
control = next(iter(scores))
best = max(scores, key=scores.get)
print(best if scores[best] > scores[control] + margin else control)
