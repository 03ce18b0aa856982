"""What the GPU's clock and power do while one kernel runs back to back (issue 9's long cells).

Usage: PYTHONPATH=. python3 lab/power_clock.py [--profile h200] [--dtype bfloat16] [--seconds 3] [--json FILE]
       PYTHONPATH=. python3 lab/power_clock.py --timer bench [--dtype float16] [--json FILE]

For a matrix product of the dtype (the ceiling) and the FA-grid cells hdim 128 non-causal 16k and
hdim 256 non-causal 8k, through flashtune and SDPA's cuDNN backend: each runs back to back for
a few seconds while `nvidia-smi` samples the SM clock and the board power every 100 ms. A
kernel that draws more power per FLOP runs at a lower clock under the power limit, so TFLOPS
divided by the median clock (FLOP per SM per cycle) separates the kernel's efficiency from the
clock it was given. Reads only; the card's settings stay as they are.

With `--timer bench` the same cases are timed instead as `flashtune bench` times a cell (its
warm-up, rounds that interleave the cases, the median of 30 calls), side by side: each case's
TFLOPS over the matrix product's is how close it comes to the dtype's ceiling as the bench sees it.
`--matmuls 4096,8192,16384` times square products of each size (cuBLAS through torch) and takes
the fastest as the ceiling, so that no single shape's tiling decides it.

`--dtype e4m3` (issue 36's all-FP8 bar, 1.5x flashtune's bf16): both ceilings in one process, bf16
products and e4m3 ones (torch._scaled_mm, unit scales, bf16 out, fast accumulation as wgmma's own),
beside flashtune's bf16 kernel and its all-FP8 kernel (flashtune-fp8all, inputs quantised first) on
the same cells; each case's fraction is of its own dtype's ceiling, and FLOP per SM per clock tells
a lower clock under FP8's power from a slower kernel.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

from flashtune.measure.problem import Problem, attention_flops, fa_grid, make_inputs
from flashtune.measure.timing import time_interleaved

QUERY = "clocks.sm,power.draw,temperature.gpu"


def sample_while(run, seconds: float) -> tuple[list[tuple[float, float, float]], int, float]:
    """Calls `run` back to back for `seconds` while nvidia-smi samples; returns the samples,
    the number of calls and the GPU-busy wall time."""
    for _ in range(20):  # let the clock settle on this kernel first
        run()
    torch.cuda.synchronize()
    smi = subprocess.Popen(
        ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "100"],
        stdout=subprocess.PIPE, text=True)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            run()
        calls += 10
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    smi.terminate()
    out, _ = smi.communicate()
    samples = []
    for line in out.splitlines():
        try:
            samples.append(tuple(float(x) for x in line.split(",")))
        except ValueError:
            continue
    return samples[2:], calls, wall  # the first samples can predate the loop


def attention_case(backend: str, shape: Problem):
    from flashtune.measure.backends import BACKENDS, Inputs

    q, k, v = make_inputs(shape, seed=0)
    return BACKENDS[backend](Inputs(q, k, v, shape.causal, shape.hdim ** -0.5)), attention_flops(
        shape.batch, shape.heads, shape.seqlen_q, shape.seqlen_k, shape.hdim, shape.causal)


def fp8_product(a: torch.Tensor, b: torch.Tensor):
    """a @ b with both in e4m3 (values within its range: randn), unit scales, bf16 out, cuBLAS's fast
    accumulation (the wgmma accumulator, as the attention kernels use it); b column-major, as cuBLAS's
    FP8 products take it."""
    a8 = a.to(torch.float8_e4m3fn)
    b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=a.device, dtype=torch.float32)
    return lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16, use_fast_accum=True)


def bench_timed(cases) -> list[dict]:
    """Each case's median TFLOPS under the bench's timer, all side by side in interleaved rounds,
    and its fraction of the fastest matrix product's (the cases named "matmul ...")."""
    times, _ = time_interleaved({name: [run] for name, run, _ in cases}, warmup=5, repeats=30)
    rows = [dict(case=name, tflops=flops / (statistics.median(times[name]) * 1e-3) / 1e12)
            for name, _, flops in cases]
    for row in rows:  # of the fastest product of the case's own dtype (the name's last word)
        kind = row["case"].split()[-1]
        row["of_matmul"] = row["tflops"] / max(r["tflops"] for r in rows
                                               if r["case"].startswith("matmul") and r["case"].split()[-1] == kind)
    print(f"{'case':40} {'TFLOPS':>7} {'of matmul':>9}")
    for row in rows:
        print(f"{row['case']:40} {row['tflops']:7.0f} {row['of_matmul']:9.3f}")
    return rows


def write_json(args, rows: list[dict]) -> None:
    """The rows with the command that made them, where --json asks for them."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(command=" ".join(sys.argv), gpu=torch.cuda.get_device_name(), dtype=args.dtype,
                           timer=args.timer, rows=rows), f, indent=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "e4m3"], default="bfloat16",
                    help="e4m3: bf16 and FP8 products, flashtune's bf16 and all-FP8 kernels, side by side")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--timer", choices=["back-to-back", "bench"], default="back-to-back",
                    help="bench: the bench's timer, the cases side by side (no clock or power samples)")
    ap.add_argument("--matmuls", default="8192",
                    help="sizes of the square matrix products, comma-separated; the fastest is the ceiling")
    args = ap.parse_args()
    from flashtune.runtime import ops

    ops.use_profile(args.profile)

    fp8 = args.dtype == "e4m3"
    dtype = "bfloat16" if fp8 else args.dtype  # the 16-bit side
    cases = []
    for n in (int(x) for x in args.matmuls.split(",")):
        a, b = (torch.randn(n, n, device="cuda", dtype=getattr(torch, dtype)) for _ in range(2))
        cases.append((f"matmul {n}^3 {dtype}", lambda a=a, b=b: a @ b, 2.0 * n ** 3))
        if fp8:
            cases.append((f"matmul {n}^3 e4m3", fp8_product(a, b), 2.0 * n ** 3))
    backends = (("flashtune", dtype), ("flashtune-fp8all", "e4m3")) if fp8 else (("flashtune", dtype),
                                                                                  ("sdpa-cudnn", dtype))
    for hdim, seqlen in ((128, 16384), (256, 8192)):
        shape = fa_grid(seqlens=[seqlen], hdims=[hdim], causal=[False], dtype=dtype)[0]
        for backend, kind in backends:
            run, flops = attention_case(backend, shape)
            cases.append((f"{backend} hdim {hdim} non-causal {seqlen} {kind}", run, flops))

    if args.timer == "bench":
        write_json(args, bench_timed(cases))
        return 0

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    print(f"{'case':40} {'TFLOPS':>7} {'MHz':>6} {'W':>5} {'C':>3} {'FLOP/SM/clk':>11}")
    for name, run, flops in cases:
        samples, calls, wall = sample_while(run, args.seconds)
        tflops = flops * calls / wall / 1e12
        mhz = statistics.median(s[0] for s in samples) if samples else float("nan")
        watts = statistics.median(s[1] for s in samples) if samples else float("nan")
        temp = max(s[2] for s in samples) if samples else float("nan")
        per_clk = tflops * 1e12 / (sms * mhz * 1e6)
        rows.append(dict(case=name, tflops=tflops, sm_mhz=mhz, watts=watts, max_temp_c=temp,
                         flop_per_sm_clk=per_clk, samples=len(samples), calls=calls))
        print(f"{name:40} {tflops:7.0f} {mhz:6.0f} {watts:5.0f} {temp:3.0f} {per_clk:11.0f}")
    print("dense peaks (sm_90): 4096 FLOP per SM per clock in 16 bits, 8192 in e4m3")
    write_json(args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
