"""Issue 36's all-FP8 bar (1.5x flashtune's bf16 at hdim 128 non-causal >= 4k) against what the
softmax's instructions allow. Builds and runs lab/xu_ceiling.cu (exps, e4m3 and bf16 packs and FFMAs
per cycle per SM, and the SM clock), then gives each kernel a bound per score element from its
slowest pipe: the tensor cores (Q K^T and P V: 4 x hdim FLOPs at the dense rate per SM per cycle,
bf16 4,096 and FP8 8,192 on Hopper), the exps with P's pack (measured together: exps per cycle when
every two come with one pack), and three FMA-pipe ops (scale and subtract the max, the max, the sum).
Pipes are taken to overlap perfectly, so each bound is an upper one. Where the exp-and-pack pipe is
the FP8 kernel's slowest, only moving exps off it (FA4 computes part of them with polynomials on the
FMA units) raises its bound. With a bench JSON (bf16 and flashtune-fp8all rows), the speed-up an
all-FP8 kernel at its bound would have over the bf16 kernel as measured, per cell, beside the measured one.

Issue 35's sm80 bar (1.15x SDPA's FlashAttention-2 on `h200-sm80`) the same way: the mma.sync kind's
tensor term is the measured HMMA rate (m16n8k16, bf16, fp32 accumulators, operands in registers), its
exps packed to bf16. With a bench JSON of `--profile h200-sm80` beside sdpa-flash, per cell the
speed-up over FlashAttention-2 an mma.sync kernel at that bound would have, beside flashtune's.

    PYTHONPATH=. python3 lab/xu_ceiling.py OUT.json [BENCH.json ...]
"""
import json
import subprocess
import sys

TENSOR_FLOPS_PER_CYCLE = {"bf16": 4096, "fp8": 8192}  # dense, per SM (Hopper)
FMA_OPS_PER_SCORE = 3


def bound(rates: dict, hdim: int, sms: int, clock_mhz: float) -> dict:
    out = {"hdim": hdim}
    tensor = dict(TENSOR_FLOPS_PER_CYCLE, **{"mma.sync": rates["hmma_bf16_flops"]})
    for kind, pack in (("bf16", "ex2_with_bf16_pack_per_2"), ("fp8", "ex2_with_e4m3_pack_per_2"),
                       ("mma.sync", "ex2_with_bf16_pack_per_2")):
        pipes = {"tensor": 4 * hdim / tensor[kind], "exp+pack": 1 / rates[pack],
                 "fma": FMA_OPS_PER_SCORE / rates["ffma"]}
        cycles = max(pipes.values())
        out[kind] = {"cycles_per_score": {k: round(v, 4) for k, v in pipes.items()},
                     "slowest": max(pipes, key=pipes.get),
                     "tflops": round(4 * hdim / cycles * sms * clock_mhz * 1e6 / 1e12, 1)}
    return out


def bench_cells(bench: dict) -> dict:
    """{(hdim, causal, seqlen): {backend: TFLOPS}} of a bench JSON."""
    cells = {}
    for row in bench["rows"]:
        key = (row["hdim"], row["causal"], row["seqlen_k"])
        cells.setdefault(key, {})[row["backend"]] = row.get("tflops")
    return cells


def paired_cells(bench: dict, bounds: dict, backends: tuple[str, str], names: tuple[str, str]) -> list[dict]:
    """Per (hdim, causal, seqlen) with both backends: their TFLOPS (under `names`), the first's ratio
    to the second (measured), and the bound over the second (the ratio a kernel at the bound would
    show) and the second's share of it. The all-FP8 kernel over the bf16 one against the FP8 bound;
    flashtune's sm80 family over FlashAttention-2 (sdpa-flash) against the mma.sync bound."""
    (a, b), (name_a, name_b) = backends, names
    out = []
    for (hdim, causal, seqlen), got in sorted(bench_cells(bench).items()):
        x, y = got.get(a), got.get(b)
        if not x or not y or hdim not in bounds:
            continue
        out.append({"hdim": hdim, "causal": causal, "seqlen": seqlen, f"{name_a}_tflops": x, f"{name_b}_tflops": y,
                    "measured": round(x / y, 3), f"bound_over_{name_b}": round(bounds[hdim] / y, 3),
                    f"{name_b}_of_bound": round(y / bounds[hdim], 3)})
    return out


def main() -> None:
    subprocess.run(["nvcc", "-O3", "-arch=sm_90a", "-o", "/tmp/xu_ceiling", "lab/xu_ceiling.cu"], check=True)
    measured = json.loads(subprocess.run(["/tmp/xu_ceiling"], check=True, capture_output=True, text=True).stdout)
    rates = measured["per_cycle_per_sm"]
    bounds = [bound(rates, d, measured["sms"], measured["clock_mhz"]) for d in (64, 128, 256)]
    result = {"measured": measured, "bounds": bounds}
    print(json.dumps(measured))
    print(f"{'hdim':>4} {'kind':>8} {'bound TFLOPS':>12} {'slowest':>9}")
    for b in bounds:
        for kind in ("bf16", "fp8", "mma.sync"):
            print(f"{b['hdim']:4d} {kind:>8} {b[kind]['tflops']:12.0f} {b[kind]['slowest']:>9}")
    result["cells"], result["mma_sync_cells"] = [], []
    for path in sys.argv[2:]:
        bench = json.load(open(path))
        result["cells"] += paired_cells(bench, {b["hdim"]: b["fp8"]["tflops"] for b in bounds},
                                        ("flashtune-fp8all", "flashtune"), ("fp8all", "bf16"))
        result["mma_sync_cells"] += paired_cells(bench, {b["hdim"]: b["mma.sync"]["tflops"] for b in bounds},
                                                 ("flashtune", "sdpa-flash"), ("flashtune", "fa2"))
    if result["cells"]:
        print(f"{'hdim':>4} {'causal':>6} {'seqlen':>6} {'bf16':>6} {'fp8all':>6} {'measured':>8} {'at FP8 bound':>12}")
        for c in result["cells"]:
            print(f"{c['hdim']:4d} {str(c['causal']):>6} {c['seqlen']:6d} {c['bf16_tflops']:6.0f} "
                  f"{c['fp8all_tflops']:6.0f} {c['measured']:7.2f}x {c['bound_over_bf16']:11.2f}x")
    if result["mma_sync_cells"]:
        print(f"{'hdim':>4} {'causal':>6} {'seqlen':>6} {'ours':>6} {'FA2':>6} {'ours/FA2':>8} {'bound/FA2':>9} "
              f"{'FA2 of bound':>12}")
        for c in result["mma_sync_cells"]:
            print(f"{c['hdim']:4d} {str(c['causal']):>6} {c['seqlen']:6d} {c['flashtune_tflops']:6.0f} "
                  f"{c['fa2_tflops']:6.0f} {c['measured']:7.2f}x {c['bound_over_fa2']:8.2f}x {c['fa2_of_bound']:11.0%}")
    json.dump(result, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
