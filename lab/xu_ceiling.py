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

    PYTHONPATH=. python3 lab/xu_ceiling.py OUT.json [BENCH.json]
"""
import json
import subprocess
import sys

TENSOR_FLOPS_PER_CYCLE = {"bf16": 4096, "fp8": 8192}  # dense, per SM (Hopper)
FMA_OPS_PER_SCORE = 3


def bound(rates: dict, hdim: int, sms: int, clock_mhz: float) -> dict:
    out = {"hdim": hdim}
    for kind, pack in (("bf16", "ex2_with_bf16_pack_per_2"), ("fp8", "ex2_with_e4m3_pack_per_2")):
        pipes = {"tensor": 4 * hdim / TENSOR_FLOPS_PER_CYCLE[kind], "exp+pack": 1 / rates[pack],
                 "fma": FMA_OPS_PER_SCORE / rates["ffma"]}
        cycles = max(pipes.values())
        out[kind] = {"cycles_per_score": {k: round(v, 4) for k, v in pipes.items()},
                     "slowest": max(pipes, key=pipes.get),
                     "tflops": round(4 * hdim / cycles * sms * clock_mhz * 1e6 / 1e12, 1)}
    return out


def cell_ceilings(bench: dict, bounds: dict) -> list[dict]:
    """Per (hdim, causal, seqlen): the bf16 and all-FP8 TFLOPS measured, the measured speed-up, and
    the FP8 bound over the measured bf16 (the speed-up a kernel at the bound would show)."""
    cells = {}
    for row in bench["rows"]:
        key = (row["hdim"], row["causal"], row["seqlen_k"])
        cells.setdefault(key, {})[row["backend"]] = row.get("tflops")
    out = []
    for (hdim, causal, seqlen), got in sorted(cells.items()):
        bf16, fp8 = got.get("flashtune"), got.get("flashtune-fp8all")
        if not bf16 or not fp8 or hdim not in bounds:
            continue
        out.append({"hdim": hdim, "causal": causal, "seqlen": seqlen, "bf16_tflops": bf16, "fp8all_tflops": fp8,
                    "measured": round(fp8 / bf16, 3), "bound_over_measured_bf16": round(bounds[hdim] / bf16, 3)})
    return out


def main() -> None:
    subprocess.run(["nvcc", "-O3", "-arch=sm_90a", "-o", "/tmp/xu_ceiling", "lab/xu_ceiling.cu"], check=True)
    measured = json.loads(subprocess.run(["/tmp/xu_ceiling"], check=True, capture_output=True, text=True).stdout)
    rates = measured["per_cycle_per_sm"]
    bounds = [bound(rates, d, measured["sms"], measured["clock_mhz"]) for d in (64, 128, 256)]
    result = {"measured": measured, "bounds": bounds}
    print(json.dumps(measured))
    print(f"{'hdim':>4} {'bf16 bound TFLOPS':>17} {'slowest':>9} {'FP8 bound TFLOPS':>16} {'slowest':>9}")
    for b in bounds:
        print(f"{b['hdim']:4d} {b['bf16']['tflops']:17.0f} {b['bf16']['slowest']:>9} {b['fp8']['tflops']:16.0f} "
              f"{b['fp8']['slowest']:>9}")
    if len(sys.argv) > 2:
        result["cells"] = cell_ceilings(json.load(open(sys.argv[2])), {b["hdim"]: b["fp8"]["tflops"] for b in bounds})
        print(f"{'hdim':>4} {'causal':>6} {'seqlen':>6} {'bf16':>6} {'fp8all':>6} {'measured':>8} {'at FP8 bound':>12}")
        for c in result["cells"]:
            print(f"{c['hdim']:4d} {str(c['causal']):>6} {c['seqlen']:6d} {c['bf16_tflops']:6.0f} "
                  f"{c['fp8all_tflops']:6.0f} {c['measured']:7.2f}x {c['bound_over_measured_bf16']:11.2f}x")
    json.dump(result, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
