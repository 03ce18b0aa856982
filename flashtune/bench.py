"""`flashtune bench`: a controlled A/B of attention backends, side by side in one process.

Same shapes, same inputs, only the backend switched. Per row: median ms of CUDA-event
timings, taken in rounds that interleave the backends, each after a timed warm-up (inputs
rotated so no run reads another's data from L2), the host time of one call (left out of ms), TFLOPS,
peak memory of the call, relative L2 error against an fp32 reference on a sample, and the
kernel names the profiler saw. The grid and the FLOP count follow the FlashAttention
papers (DESIGN.md, "Benchmark convention").
"""
from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable, Iterable

SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
HDIMS = (64, 128, 256)
TOKENS_PER_BATCH = 16384  # batch = 16384 // seqlen
HIDDEN = 2048  # heads = 2048 // hdim
L2_FLUSH_BYTES = 2 * 60 * 2**20  # rotate inputs until twice the largest L2 (H100/H200) is touched
SAMPLE_HEADS = 2  # heads of batch entry 0 checked against the fp32 reference


@dataclass(frozen=True)
class Shape:
    dtype: str
    hdim: int
    causal: bool
    seqlen_q: int
    seqlen_k: int
    batch: int
    heads: int
    heads_kv: int

    @property
    def flops(self) -> float:
        return attention_flops(self.batch, self.heads, self.seqlen_q, self.seqlen_k, self.hdim, self.causal)

    @property
    def input_bytes(self) -> int:
        elem = 2
        return elem * self.batch * self.hdim * (self.seqlen_q * self.heads + 2 * self.seqlen_k * self.heads_kv)


def attention_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, hdim: int, causal: bool) -> float:
    """4·b·h·sq·sk·d (two matmuls), halved when causal: the FlashAttention papers' count."""
    flops = 4.0 * batch * heads * seqlen_q * seqlen_k * hdim
    return flops / 2 if causal else flops


def fa_grid(seqlens: Iterable[int] = SEQLENS, hdims: Iterable[int] = HDIMS,
            causal: Iterable[bool] = (False, True), dtype: str = "bfloat16", batch: int | None = None,
            heads: int | None = None, heads_kv: int | None = None) -> list[Shape]:
    """The FA benchmark grid; batch and heads follow the convention unless given."""
    shapes = []
    for hdim in hdims:
        for is_causal in causal:
            for s in seqlens:
                b = batch or max(1, TOKENS_PER_BATCH // s)
                h = heads or max(1, HIDDEN // hdim)
                hkv = heads_kv or h
                if h % hkv:
                    raise ValueError(f"--heads-kv {hkv} must divide --heads {h}")
                shapes.append(Shape(dtype, hdim, is_causal, s, s, b, h, hkv))
    return shapes


def geomean(values: Iterable[float]) -> float | None:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


# ---------------------------------------------------------------------------- measuring

def kernel_names(run: Callable[[], object]) -> list[str]:
    """CUDA kernels one call launches, from the torch profiler (copies and memsets left out)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    names = []
    for event in prof.events():
        if event.device_type.name == "CUDA" and not event.name.startswith(("Memcpy", "Memset")):
            if event.name not in names:
                names.append(event.name)
    return names


# The GPU's clocks ramp up over tens of milliseconds after an idle gap (the reference, the
# profiler run): a fixed handful of warm-up calls leaves a 0.1 ms kernel timed at part speed,
# and the backend measured first pays for it. Warm up for a time instead, every backend alike.
WARMUP_SECONDS = 0.2
ROUNDS = 3
# A call's events time its GPU work only while the GPU has a queue: when the host takes longer
# to launch a call (Python checks, the dispatcher) than the GPU to run the one before, the
# start event fires at once and the time includes that wait. A spin kernel ahead of the timed
# calls gives the host this many cycles (about 10 ms at 2 GHz) to queue them all; if it still
# could not, the spin is lengthened and the calls timed again.
QUEUE_AHEAD_CYCLES = 20_000_000
QUEUE_AHEAD_TRIES = 4


def time_ms(runners: list[Callable[[], object]], warmup: int, repeats: int,
            warmup_seconds: float = WARMUP_SECONDS) -> list[float]:
    """CUDA-event GPU times of `repeats` calls, cycling through input sets (a cold L2 each
    time), after at least `warmup` calls and `warmup_seconds` of back-to-back calls; the calls
    are queued behind a spin kernel, so the host's launch overhead is not in their times."""
    import torch

    start, i = time.perf_counter(), 0
    while i < warmup or time.perf_counter() - start < warmup_seconds:
        runners[i % len(runners)]()
        i += 1
        if i % 4 == 0:
            torch.cuda.synchronize()  # the host clock measures GPU time, not queued launches
    spin = QUEUE_AHEAD_CYCLES
    for _ in range(QUEUE_AHEAD_TRIES):
        times, queued = _queued_calls(runners, repeats, spin)
        if queued:
            break
        spin *= 4
    return times


def _queued_calls(runners: list[Callable[[], object]], repeats: int, spin_cycles: int) -> tuple[list[float], bool]:
    """Event times of `repeats` calls launched behind a spin of `spin_cycles`, and whether the
    host launched them all before the spin ended (else some waited for their launch)."""
    import torch

    spin_end = torch.cuda.Event()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    torch.cuda._sleep(spin_cycles)
    spin_end.record()
    for i in range(repeats):
        starts[i].record()
        runners[i % len(runners)]()
        ends[i].record()
    # Queued iff the spin still runs now that every call is launched: asked of the GPU, not
    # inferred from host and event clocks (that inference once passed calls that had waited).
    spin_was_running = not spin_end.query()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)], spin_was_running


HOST_CALLS = 20  # calls launched to time the host side of one


def host_ms_per_call(runners: list[Callable[[], object]], calls: int = HOST_CALLS) -> float:
    """Host time of one call in ms: Python checks, argument packing and the launches, which the
    event times leave out. The calls are launched while a spin kernel holds the GPU, so none
    waits for the GPU (a call that synchronised would show its GPU time here)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda._sleep(4 * QUEUE_AHEAD_CYCLES)
    start = time.perf_counter()
    for i in range(calls):
        runners[i % len(runners)]()
    host_ms = (time.perf_counter() - start) * 1e3 / calls
    torch.cuda.synchronize()
    return host_ms


def time_interleaved(timed: dict[str, list[Callable[[], object]]], warmup: int, repeats: int,
                     timer: Callable[..., list[float]] = time_ms,
                     catch: tuple[type[BaseException], ...] = ()) -> tuple[dict[str, list[float]], dict]:
    """`repeats` times per backend, taken in ROUNDS interleaved rounds whose order rotates (A B C,
    B C A, C A B): a drift of the GPU's clocks with power and heat then falls on every backend
    alike instead of on whichever ran first or last, and no backend always follows the same one
    (or the cell's input generation, which leaves the GPU idle and cool). The first round warms
    up fully, later ones briefly (the GPU is busy from the round before). A backend whose timing
    raises one of `catch` leaves the rounds; it is returned with its error."""
    times: dict[str, list[float]] = {name: [] for name in timed}
    failed: dict[str, BaseException] = {}
    per_round = max(1, math.ceil(repeats / ROUNDS))
    names = list(timed)
    for r in range(ROUNDS):
        for name in names[r % len(names):] + names[:r % len(names)]:
            runners = timed[name]
            if name in failed:
                continue
            try:
                times[name] += timer(runners, warmup, per_round,
                                     warmup_seconds=WARMUP_SECONDS if r == 0 else WARMUP_SECONDS / 4)
            except catch as e:
                failed[name] = e
    return {name: t for name, t in times.items() if name not in failed}, failed


def make_inputs(shape: Shape, seed: int):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = getattr(torch, shape.dtype)

    def rand(s, h):
        return torch.randn(shape.batch, s, h, shape.hdim, device="cuda", dtype=dtype, generator=gen)

    return rand(shape.seqlen_q, shape.heads), rand(shape.seqlen_k, shape.heads_kv), rand(shape.seqlen_k, shape.heads_kv)


def measure_shape(shape: Shape, backends: list[str], repeats: int, warmup: int = 5,
                  seed: int = 0) -> list[dict]:
    """One row per backend for this shape: same inputs for all."""
    import torch

    from flashtune.backends import BACKENDS, Case, Unavailable
    from flashtune.reference import attention_reference, rel_l2

    scale = 1.0 / math.sqrt(shape.hdim)
    inputs = [make_inputs(shape, seed + i) for i in range(input_sets(shape))]
    cases = [Case(q, k, v, shape.causal, scale) for q, k, v in inputs]
    q0, k0, v0 = inputs[0]
    group = shape.heads // shape.heads_kv
    sample_h = min(SAMPLE_HEADS, shape.heads)
    ref, _ = attention_reference(q0[:1, :, :sample_h], k0[:1, :, :max(1, math.ceil(sample_h / group))],
                                 v0[:1, :, :max(1, math.ceil(sample_h / group))], shape.causal, scale)
    rows, timed = [], {}  # timed: backend -> its runners, for those that ran and were checked
    for name in backends:
        row = empty_row(name, shape)
        rows.append(row)
        try:
            runners = [BACKENDS[name](case) for case in cases]
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            out = runners[0]()
            torch.cuda.synchronize()
            row["peak_mem_mb"] = round((torch.cuda.max_memory_allocated() - before) / 2**20, 1)
            row["rel_err"] = rel_l2(out[:1, :, :sample_h], ref)
            del out
            row["kernel"] = "; ".join(kernel_names(runners[0]))
            timed[name] = runners
        except Unavailable as e:
            row["status"] = f"unavailable: {e}"
        except torch.cuda.OutOfMemoryError:
            row["status"] = "unavailable: out of memory"
            torch.cuda.empty_cache()
    times, failed = time_interleaved(timed, warmup, repeats, catch=(torch.cuda.OutOfMemoryError,))
    if failed:
        torch.cuda.empty_cache()
    for row in rows:
        if row["backend"] in failed:
            row["status"] = "unavailable: out of memory while timing"
        elif row["backend"] in times:
            row["ms"] = statistics.median(times[row["backend"]])
            row["tflops"] = shape.flops / (row["ms"] * 1e-3) / 1e12
            try:
                row["host_ms"] = host_ms_per_call(timed[row["backend"]])
            except torch.cuda.OutOfMemoryError:  # timed, so shown; the host column stays empty
                torch.cuda.empty_cache()
    return rows


# The row schema of DESIGN.md ("Benchmark convention"), plus `status` (ok / why unavailable) and
# `host_ms` (the host side of one call, which `ms` leaves out: host_ms_per_call).
ROW_KEYS = ("backend", "dtype", "hdim", "causal", "seqlen_q", "seqlen_k", "batch", "heads", "heads_kv",
            "ms", "tflops", "peak_mem_mb", "rel_err", "kernel", "status", "host_ms")


def empty_row(backend: str, shape: Shape) -> dict:
    row = {"backend": backend, **asdict(shape), "ms": None, "tflops": None, "peak_mem_mb": None,
           "rel_err": None, "kernel": None, "status": "ok", "host_ms": None}
    assert tuple(row) == ROW_KEYS
    return row


def shape_key(row: dict) -> tuple:
    """What identifies a row's shape (everything but the backend and the measurements)."""
    return tuple(row[k] for k in ("dtype", "hdim", "causal", "seqlen_q", "seqlen_k", "batch", "heads", "heads_kv"))


def input_sets(shape: Shape) -> int:
    """How many input sets to rotate through so no timed run finds its data in L2."""
    return max(1, min(8, math.ceil(L2_FLUSH_BYTES / max(1, shape.input_bytes))))


def speedups(rows: list[dict], ours: str = "flashtune") -> dict[str, float | None]:
    """Geomean over shapes of (backend ms / flashtune ms): > 1 means flashtune is faster."""
    by_shape: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r["ms"]:
            key = shape_key(r)
            by_shape.setdefault(key, {})[r["backend"]] = r["ms"]
    others = sorted({r["backend"] for r in rows} - {ours})
    return {b: geomean(t[b] / t[ours] for t in by_shape.values() if b in t and ours in t) for b in others}


def environment() -> dict:
    """The header of every result: what ran, where."""
    import platform

    import torch

    from flashtune import __version__
    from flashtune.gpu import nvidia_smi_driver_version

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "gpu": props.name, "compute_capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count,
        "driver": nvidia_smi_driver_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "flashtune": __version__, "python": platform.python_version(),
        "command": " ".join(["flashtune", *sys.argv[1:]]),
    }


def run_bench(shapes: list[Shape], backends: list[str], repeats: int,
              on_shape: Callable[[Shape, list[dict]], None] | None = None) -> dict:
    rows = []
    for shape in shapes:
        shape_rows = measure_shape(shape, backends, repeats)
        rows += shape_rows
        if on_shape:
            on_shape(shape, shape_rows)
    return {"header": environment(), "rows": rows, "speedup_geomean": speedups(rows)}
