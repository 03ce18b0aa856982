"""One line per cell of a `bench --decode` JSON with a `release` backend (lab/release_ab.py): today's
and the release's microseconds and each one's ratio to the fastest SDPA backend in the file.

Usage: python3 lab/ab_cells.py AB.json
"""
import collections
import json
import sys

cells = collections.defaultdict(dict)
for r in json.load(open(sys.argv[1]))["rows"]:
    if r["status"] == "ok":
        key = (r["hdim"], r["heads_kv"], r["batch"], r["cache"], r["seqlen_q"], r["page_size"])
        cells[key][r["backend"]] = (r["us"], r.get("kernel") or "")
for key, by in sorted(cells.items()):
    ours, release = by.pop("flashtune", None), by.pop("release", None)
    sdpa = min((us, name) for name, (us, _) in by.items() if name.startswith("sdpa"))
    if ours and release:
        tile = ours[1].split("_")[4] if ours[1].count("_") > 4 else "?"
        print("h{} kv{} b{} x{} q{} p{}".format(*key), f"{tile:8s} today {ours[0]:7.1f} release {release[0]:7.1f} "
              f"| {sdpa[1]} {sdpa[0]:7.1f} | today {sdpa[0] / ours[0]:.2f}x release {sdpa[0] / release[0]:.2f}x")
