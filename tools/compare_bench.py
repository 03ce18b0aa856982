"""Print TFLOPS per shape from several `flashtune bench --json` files side by side.

Usage: python3 tools/compare_bench.py LABEL=FILE.json [LABEL=FILE.json ...]
The flashtune column of each file is shown under its label; other backends once.
"""
import json
import sys
from collections import defaultdict

from flashtune.bench import geomean

cols, table = [], defaultdict(dict)
for arg in sys.argv[1:]:
    label, path = arg.split("=", 1)
    cols.append(label)
    for r in json.load(open(path))["rows"]:
        key = (r["hdim"], r["causal"], r["seqlen_q"])
        name = label if r["backend"] == "flashtune" else r["backend"]
        if name not in cols:
            cols.append(name)
        table[key][name] = r["tflops"]
print("hdim causal seqlen " + " ".join(f"{c:>14}" for c in cols))
for key in sorted(table):
    print(f"{key[0]:4} {str(key[1]):6} {key[2]:6} " + " ".join(
        f"{table[key].get(c) or 0:14.0f}" for c in cols))
for c in cols:
    ratio = geomean(table[k][c] / table[k]["sdpa-flash"] for k in table if table[k].get(c) and table[k].get("sdpa-flash"))
    if ratio:
        print(f"{c}: geomean vs sdpa-flash {ratio:.3f}")
