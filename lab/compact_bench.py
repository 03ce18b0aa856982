"""Shrink `flashtune bench --decode --out` files to what benchmarks/ cites, in columns: per cell
flashtune's time, GB/s, share of the copy, error, kernels and split count (files that have it), and
every other backend's time (one row per cell where bench writes one per backend). benchmarks/ has a
size cap; the full files stay under lab/results/.

Usage: python3 lab/compact_bench.py OUT.json BENCH.json... [--note TEXT]
"""
import argparse
import json

CELL = ("hdim", "heads_kv", "batch", "cache", "seqlen_q", "page_size")


def compact(paths, note):
    runs, kernels, others, cells = [], [], [], {}
    for path in paths:
        data = json.load(open(path))
        runs.append({"header": data["header"], "copy_GBps": data["copy_GBps"],
                     "speedup_geomean": data["speedup_geomean"], "absent_backends": data.get("absent_backends")})
        for row in data["rows"]:
            key = tuple(row[k] for k in CELL)
            cell = cells.setdefault(key, {"run": len(runs) - 1, "other_us": {}})
            if row["backend"] == "flashtune":
                names = row.get("kernel", "").split("; ")
                kernels += [n for n in names if n not in kernels]
                cell.update(us=row["us"], gbps=row["gbps"], copy=row["copy_fraction"], err=row.get("rel_err"),
                            status=row["status"], kernels=[kernels.index(n) for n in names],
                            splits=row.get("splits"), merge=row.get("merge"))
            elif row.get("status") == "ok":
                if row["backend"] not in others:
                    others.append(row["backend"])
                cell["other_us"][row["backend"]] = row["us"]
    columns = list(CELL) + ["run", "us", "gbps", "copy_fraction", "rel_err", "status", "kernels", "splits",
                            "merge"] + [f"{b}_us" for b in others]
    table = [list(key) + [c["run"], c.get("us"), c.get("gbps"), c.get("copy"), c.get("err"), c.get("status"),
                          c.get("kernels"), c.get("splits"), c.get("merge")] + [c["other_us"].get(b) for b in others]
             for key, c in sorted(cells.items())]
    return {"converted_from": note, "runs": runs, "kernels": kernels, "columns": columns, "cells": table}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("inputs", nargs="+")
    parser.add_argument("--note", default="flashtune bench --decode --out files, one row per cell (lab/compact_bench.py)")
    args = parser.parse_args()
    with open(args.out, "w") as f:
        json.dump(compact(args.inputs, args.note), f, separators=(",", ":"))


if __name__ == "__main__":
    main()
