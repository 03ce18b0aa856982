"""One line per cell of a `bench --decode` JSON with a `release` backend (lab/release_ab.py): today's
tile and split count (files that record it), today's and the release's microseconds and each one's
ratio to the fastest SDPA backend in the file; last, today's geomean over the release's.

Usage: python3 lab/ab_cells.py AB.json
"""
import collections
import json
import math
import sys

cells = collections.defaultdict(dict)
for r in json.load(open(sys.argv[1]))["rows"]:
    if r["status"] == "ok":
        key = (r["hdim"], r["heads_kv"], r["batch"], r["cache"], r["seqlen_q"], r["page_size"])
        splits = f"x{r['splits']}{'c' if r.get('merge') == 'cluster' else ''}" if r.get("splits") else ""
        cells[key][r["backend"]] = (r["us"], r.get("kernel") or "", splits)
gains = []
for key, by in sorted(cells.items()):
    ours, release = by.pop("flashtune", None), by.pop("release", None)
    sdpa = min((us, name) for name, (us, _, _) in by.items() if name.startswith("sdpa"))
    if ours and release:
        tile = ours[1].split("_")[4] if ours[1].count("_") > 4 else "?"
        gains.append(release[0] / ours[0])
        print("h{} kv{} b{} x{} q{} p{}".format(*key), f"{tile:8s} {ours[2]:5s} today {ours[0]:7.1f} release "
              f"{release[0]:7.1f} | {sdpa[1]} {sdpa[0]:7.1f} | today {sdpa[0] / ours[0]:.2f}x release "
              f"{sdpa[0] / release[0]:.2f}x")
if gains:
    print(f"{len(gains)} cells: today {math.exp(sum(map(math.log, gains)) / len(gains)):.3f}x the release in geomean, "
          f"{min(gains):.3f}x to {max(gains):.3f}x")
