"""Print TFLOPS per shape from several `flashtune bench --json` files side by side.

Usage: python3 lab/compare_bench.py LABEL=FILE.json [LABEL=FILE.json ...]
The flashtune column of each file is shown under its label; other backends once (from the
last file that has them). Ratios against a reference backend use that file's own run of it
(same process), with the geomean and the worst cell.
"""
import json
import sys
from collections import defaultdict

from flashtune.measure.timing import geomean

REFERENCES = ("sdpa-flash", "sdpa-cudnn")
cols, table = [], defaultdict(dict)
ratios = defaultdict(dict)  # (label, reference) -> {shape key: flashtune / reference}
for arg in sys.argv[1:]:
    label, path = arg.split("=", 1)
    cols.append(label)
    per_file = defaultdict(dict)
    for r in json.load(open(path))["rows"]:
        key = (r["hdim"], r["causal"], r["seqlen_q"])
        # flashtune's own backends (flashtune, flashtune-fp8) belong to this file's label
        backend = r["backend"]
        name = label + backend[len("flashtune"):] if backend.startswith("flashtune") else backend
        if name not in cols:
            cols.append(name)
        table[key][name] = r["tflops"]
        per_file[key][r["backend"]] = r["tflops"]
    for key, row in per_file.items():
        for ref in REFERENCES:
            if row.get("flashtune") and row.get(ref):
                ratios[(label, ref)][key] = row["flashtune"] / row[ref]
print("hdim causal seqlen " + " ".join(f"{c:>14}" for c in cols))
for key in sorted(table):
    print(f"{key[0]:4} {str(key[1]):6} {key[2]:6} " + " ".join(
        f"{table[key].get(c) or 0:14.0f}" for c in cols))
for (label, ref), cells in ratios.items():
    worst = min(cells, key=cells.get)
    # issue 9's terms: the geomean, the short (< 2k) and long halves, and the cells below 0.95x
    short = [x for k, x in cells.items() if k[2] < 2048]
    long = [x for k, x in cells.items() if k[2] >= 2048]
    low = sorted(k for k, x in cells.items() if x < 0.95)
    print(f"{label}: geomean vs {ref} {geomean(cells.values()):.3f}, worst {cells[worst]:.3f} at {worst}; "
          f"below 2k {geomean(short) if short else float('nan'):.3f}, 2k+ {geomean(long) if long else float('nan'):.3f}, "
          f"{len(low)} of {len(cells)} cells below 0.95 {low}")
