"""Shrink `flashtune bench --out` files to what benchmarks/ cites, in columns (benchmarks/ has a size
cap; the full files stay under lab/results/). Each kernel name is written once, in `kernels`; a
cell lists its kernels by index.
* `--decode` files: per cell flashtune's time, GB/s, share of the copy, error, kernels and split
  count (files that have it), and every other backend's time (one row per cell where bench writes
  one per backend).
* prefill-grid files (`--pass fwd|bwd|fwd+bwd`), and `--decode` files with `--rows`: every row, every
  field (nothing lost), with the kernels by index.

Usage: python3 lab/compact_bench.py OUT.json BENCH.json... [--rows] [--note TEXT]
"""
import argparse
import json

CELL = ("hdim", "heads_kv", "batch", "cache", "seqlen_q", "page_size")


def kernel_indexes(kernels: list, joined: str) -> list:
    names = joined.split("; ") if joined else []
    kernels += [n for n in names if n not in kernels]
    return [kernels.index(n) for n in names]


def compact_decode(paths, note):
    runs, kernels, others, cells = [], [], [], {}
    for path in paths:
        data = json.load(open(path))
        runs.append({"header": data["header"], "copy_GBps": data["copy_GBps"],
                     "speedup_geomean": data["speedup_geomean"], "absent_backends": data.get("absent_backends")})
        for row in data["rows"]:
            key = tuple(row[k] for k in CELL)
            cell = cells.setdefault(key, {"run": len(runs) - 1, "other_us": {}})
            if row["backend"] == "flashtune":
                cell.update(us=row["us"], gbps=row["gbps"], copy=row["copy_fraction"], err=row.get("rel_err"),
                            status=row["status"], kernels=kernel_indexes(kernels, row.get("kernel", "")),
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


def compact_rows(paths, note):
    runs, kernels, columns, table = [], [], [], []
    for path in paths:
        data = json.load(open(path))
        runs.append({key: value for key, value in data.items() if key != "rows"})
        for row in data["rows"]:
            columns += [k for k in row if k not in columns]
            if row.get("kernel") is not None:
                row = {**row, "kernel": kernel_indexes(kernels, row["kernel"])}
            table.append([len(runs) - 1] + [row.get(k) for k in columns])
    width = len(columns) + 1  # rows written before a later column appeared: padded
    return {"converted_from": note, "runs": runs, "kernels": kernels, "columns": ["run"] + columns,
            "rows": [r + [None] * (width - len(r)) for r in table]}


def expand(data: dict) -> dict:
    """A file compact_rows wrote, back in bench's own format (rows as dicts; a file in that format is
    returned as it is): readers of bench files take either."""
    if "columns" not in data or "rows" not in data:
        return data
    rows = []
    for values in data["rows"]:
        row = {k: v for k, v in zip(data["columns"], values) if k != "run"}
        if isinstance(row.get("kernel"), list):
            row["kernel"] = "; ".join(data["kernels"][i] for i in row["kernel"])
        rows.append(row)
    return {**data["runs"][0], "rows": rows}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("inputs", nargs="+")
    parser.add_argument("--rows", action="store_true", help="every row of a --decode file, nothing dropped")
    parser.add_argument("--note")
    args = parser.parse_args()
    decode = "copy_GBps" in json.load(open(args.inputs[0])) and not args.rows
    note = args.note or (f"flashtune bench {'--decode ' if decode else ''}--out files: "
                         f"{'one row per cell' if decode else 'every row'}, kernels by index (lab/compact_bench.py)")
    with open(args.out, "w") as f:
        json.dump((compact_decode if decode else compact_rows)(args.inputs, note), f, separators=(",", ":"))


if __name__ == "__main__":
    main()
