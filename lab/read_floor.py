"""Issue 34's decode bar (a model's decode-step attention reading its KV cache at 85% or more of the
device-to-device copy bandwidth) against what any kernel reaches at the sizes a layer's decode call
reads. Per size, the time of PyTorch's own memory-bound kernels over those bytes: a sum over them (a
read, as attention's) and a copy of half as many (read and written: the same bytes moved), each in GB/s
and as a fraction of the large copy's (what `bench --decode` divides by). At the sizes of the model
bench's calls (llama3-8b-like at 1k-64k, batch 1 and 16; the recall model at batch 10) this is the
ceiling the 85% bar sits under; below it a call's fixed cost (launch, first bytes, tail) weighs.

    PYTHONPATH=. python3 lab/read_floor.py [OUT.json]
"""
import json
import statistics
import sys

import torch

from flashtune.commands.bench_decode import copy_gbps
from flashtune.measure.timing import time_ms

L2_ROTATE_BYTES = 256 << 20  # input sets rotated so that no timed call finds its bytes in L2
SIZES_MB = {  # one layer's K and V, bf16, as the model bench's decode steps read them
    "llama3-8b 1k b1": 4.2, "recall 4k b10": 41.9, "llama3-8b 16k b1 / 1k b16": 67.1, "recall 16k b10": 167.8,
    "llama3-8b 64k b1": 268.4, "llama3-8b 16k b16": 1073.7, "llama3-8b 64k b16": 4295.0,
}


def gbps(run_sets, nbytes: int) -> float:
    ms = statistics.median(time_ms(run_sets, 5, 30))
    return nbytes / (ms * 1e-3) / 1e9


def main() -> None:
    big = copy_gbps()
    rows = []
    for name, mb in SIZES_MB.items():
        n = int(mb * 1e6) // 2 * 2
        sets = max(1, min(8, -(-L2_ROTATE_BYTES // n)))
        bufs = [torch.empty(n // 2, dtype=torch.bfloat16, device="cuda").normal_() for _ in range(sets)]
        read = gbps([lambda b=b: b.sum(dtype=torch.float32) for b in bufs], n)
        halves = [(b[: b.numel() // 2], torch.empty(b.numel() // 2, dtype=b.dtype, device="cuda")) for b in bufs]
        copy = gbps([lambda s=s, d=d: d.copy_(s) for s, d in halves], n)
        rows.append({"call": name, "mb": mb, "read_gbps": round(read), "copy_gbps": round(copy),
                     "read_of_large_copy": round(read / big, 3), "copy_of_large_copy": round(copy / big, 3)})
        print(f"{name:28s} {mb:8.1f} MB  sum {read:6.0f} GB/s ({read / big:4.0%})  copy {copy:6.0f} GB/s "
              f"({copy / big:4.0%})", flush=True)
        del bufs, halves
        torch.cuda.empty_cache()
    result = {"gpu": torch.cuda.get_device_name(), "large_copy_gbps": round(big), "rows": rows}
    print(f"large copy {big:.0f} GB/s")
    if len(sys.argv) > 1:
        json.dump(result, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
