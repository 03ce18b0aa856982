"""Summarise `ncu -i R.ncu-rep --page source --print-source sass --csv` (an ncu run over lab/ncu_cells.py):
per kernel, instructions executed and warp-stall samples per opcode with each opcode's top stall
reasons, the stall reasons, and the synchronisation skeleton of its block loop (barriers, wgmma, mbarrier waits in SASS order).

Usage: python3 lab/ncu_sass_summary.py SASS.csv [OPCODES]   (OPCODES: how many to list, 28)
"""
import collections
import csv
import sys

SYNC_OPS = ("BAR", "HGMMA", "WARPGROUP", "SYNCS")


def kernels(path: str) -> list[tuple[str, list[dict]]]:
    found, header = [], None
    for row in csv.reader(open(path)):
        if not row:
            continue
        if row[0] == "Kernel Name":
            found.append((row[1], []))
        elif row[0] == "Address":
            header = row
        elif found and header:
            found[-1][1].append(dict(zip(header, row)))
    return found


def count(ins: dict, key: str) -> int:
    return int(ins.get(key) or 0)


def opcode(ins: dict) -> str:
    words = ins["Source"].split()
    word = words[1] if words and words[0].startswith("@") and len(words) > 1 else (words[0] if words else "")
    return word.split(".")[0]


def summarise(name: str, body: list[dict], top: int) -> None:
    executed = sum(count(i, "Instructions Executed") for i in body)
    samples = sum(count(i, "Warp Stall Sampling (All Samples)") for i in body) or 1
    print(f"== {name}: {executed} instructions executed, {samples} stall samples, {len(body)} in SASS")
    per_op, stalls = collections.Counter(), collections.Counter()
    op_reasons = collections.defaultdict(collections.Counter)
    for ins in body:
        per_op[opcode(ins)] += count(ins, "Instructions Executed")
        stalls[opcode(ins)] += count(ins, "Warp Stall Sampling (All Samples)")
        for key in ins:
            if key.startswith("stall_") and "(Not" not in key:
                op_reasons[opcode(ins)][key[6:]] += count(ins, key)
    for op, n in per_op.most_common(top):
        why = ", ".join(f"{r} {100 * k / samples:.1f}" for r, k in op_reasons[op].most_common(3) if k)
        print(f"  {op:12} {n:10d} {100 * n / executed:5.1f}%  stall samples {stalls[op]:6d} {100 * stalls[op] / samples:5.1f}%"
              f"  ({why})")
    reasons = collections.Counter()
    for ins in body:
        for key in ins:
            if key.startswith("stall_") and "(Not" not in key:
                reasons[key[6:]] += count(ins, key)
    print("  stalls: " + ", ".join(f"{r} {100 * n / samples:.1f}%" for r, n in reasons.most_common(10)))
    # the block loop: where the wgmmas run most often
    hottest = max((count(i, "Instructions Executed") for i in body if opcode(i) == "HGMMA"), default=0)
    print(f"  the block loop ({hottest} executions of its wgmmas), its synchronisation in SASS order:")
    for ins in body:
        if count(ins, "Instructions Executed") == hottest and opcode(ins) in SYNC_OPS:
            print(f"    {ins['Source'].strip()[:60]:60} stall samples {count(ins, 'Warp Stall Sampling (All Samples)')}")


if __name__ == "__main__":
    for name, body in kernels(sys.argv[1]):
        summarise(name, body, int(sys.argv[2]) if len(sys.argv) > 2 else 28)
