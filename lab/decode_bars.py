"""Issue 33's bars read off `flashtune bench --decode` JSON files (one run or several of one visit):
per contiguous cell flashtune against the fastest of SDPA's backends and, where an anchor file
gives FA4's ratio to cuDNN for the cell, FA4 (its GB/s taken as that ratio times this run's cuDNN);
the geomean and the lowest cells; the share of the run's copy bandwidth where the cache read is
0.5 GB or more; the named cells; paged against contiguous per page size. A later file's row replaces
an earlier one's for the same cell and backend (a focused rerun over a full grid); flashtune's own
other rows (`release` of an A/B, `flashtune-fp8kv`) are not competitors.

Usage: python3 lab/decode_bars.py BENCH.json... [--anchors FA4_ANCHORS.json]
"""
import argparse
import json
import math
from collections import defaultdict

from compact_bench import expand


def load_rows(paths):
    rows, copies = [], []
    for path in paths:
        data = expand(json.load(open(path)))  # benchmarks/ keeps some files compacted
        copies.append(data["copy_GBps"])
        rows += data["rows"]
    return rows, copies


def fa4_ratios(path):
    """(heads_kv, batch, cache, seqlen_q) -> FA4 GB/s / cuDNN GB/s, from the anchor file (hdim 128, bf16)."""
    if not path:
        return {}
    return {(r["heads_kv"], r["batch"], r["cache"], r["sq"]): r["fa4"] / r["sdpa_cudnn"]
            for r in json.load(open(path))["rows"] if r.get("fa4") and r.get("sdpa_cudnn")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench", nargs="+")
    ap.add_argument("--anchors")
    args = ap.parse_args()
    rows, copies = load_rows(args.bench)
    fa4 = fa4_ratios(args.anchors)
    cells = defaultdict(dict)  # problem -> backend -> row
    for r in rows:
        if r["gbps"]:
            key = (r["dtype"], r["hdim"], r["heads"], r["heads_kv"], r["batch"], r["cache"], r["seqlen_q"],
                   r["page_size"])
            cells[key][r["backend"]] = r
    ratios, lines = [], []
    for key, by in sorted(cells.items()):
        dtype, hdim, heads, hkv, batch, cache, sq, page = key
        if page or "flashtune" not in by:
            continue
        ours = by["flashtune"]["gbps"]
        others = {b: r["gbps"] for b, r in by.items() if not b.startswith("flashtune") and b != "release"}
        anchor = fa4.get((hkv, batch, cache, sq)) if hdim == 128 and dtype == "bfloat16" else None
        if anchor and "sdpa-cudnn" in others:
            others["fa4 (anchor)"] = anchor * others["sdpa-cudnn"]
        if not others:
            continue
        best = max(others, key=others.get)
        ratio = ours / others[best]
        ratios.append(ratio)
        gb = by["flashtune"]["kv_bytes"] / 1e9
        lines.append((ratio, f"h{hdim} {heads}/{hkv} b{batch} x {cache} q{sq}: {gb:.2f} GB, flashtune {ours:.0f} GB/s "
                             f"({by['flashtune']['copy_fraction']:.0%} copy), best other {best} {others[best]:.0f}: "
                             f"{ratio:.2f}x"))
    print(f"copy GB/s per run: {', '.join(f'{c:.0f}' for c in copies)}")
    if ratios:
        print(f"contiguous cells: {len(ratios)}, geomean vs fastest other {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x"
              f" (bar 1.2x), below 0.97x: {sum(r < 0.97 for r in ratios)}")
        print("lowest ten:")
        for _, line in sorted(lines)[:10]:
            print("  " + line)
    big = [(by["flashtune"]["copy_fraction"], key) for key, by in cells.items()
           if "flashtune" in by and not key[7] and by["flashtune"]["kv_bytes"] >= 0.5e9]
    if big:
        low = sorted(big)[:5]
        print(f">= 0.5 GB cells: {len(big)}, below 90% copy: {sum(f < 0.9 for f, _ in big)}; lowest: "
              + ", ".join(f"{f:.0%} {k[1]}/{k[3]} b{k[4]}x{k[5]} q{k[6]}" for f, k in low))
    for name, (hkv, batch, cache, bar) in {"1 x 128k kv8": (8, 1, 131072, 0.8),
                                            "1 x 16k kv8": (8, 1, 16384, 0.5)}.items():
        for key, by in sorted(cells.items()):
            if key[3:7] == (hkv, batch, cache, 1) and not key[7] and "flashtune" in by:
                f = by["flashtune"]["copy_fraction"]
                print(f"{name} h{key[1]}: {f:.0%} copy (bar {bar:.0%})")
    paged = defaultdict(list)
    for key, by in cells.items():
        if key[7] and "flashtune" in by:
            base = cells.get(key[:7] + (0,), {}).get("flashtune")
            if base:
                paged[key[7]].append(by["flashtune"]["gbps"] / base["gbps"])
    for page, fs in sorted(paged.items()):
        print(f"pages of {page}: {len(fs)} cells, paged/contiguous min {min(fs):.2f}, median {sorted(fs)[len(fs) // 2]:.2f}")


if __name__ == "__main__":
    main()
