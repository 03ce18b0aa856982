"""Timing GPU work: CUDA-event times of calls queued behind a spin kernel, interleaved rounds of
several candidates, the host time of a call, and the kernels a call launched (the profiler).
`flashtune bench` and `flashtune tune` time through here.
"""
from __future__ import annotations

import math
import time
from typing import Callable, Iterable

L2_FLUSH_BYTES = 2 * 60 * 2**20  # rotate inputs until twice the largest L2 (H100/H200) is touched


def geomean(values: Iterable[float]) -> float | None:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


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


def without_parameters(name: str) -> str:
    """A demangled kernel name without its trailing parameter list: `f<T>(int, float*, ...)` ->
    `f<T>`. The name and template arguments tell kernels apart; cuDNN's and ATen's parameter lists
    run to hundreds of characters, repeated in every row of a result file."""
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0:
            return name[:i]
    return name


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


def warm_up(runners: list[Callable[[], object]], calls: int = 1, seconds: float = WARMUP_SECONDS) -> None:
    """Untimed back-to-back calls, cycling through `runners`: at least `calls` of them, and on until
    `seconds` have passed (the clocks' ramp: WARMUP_SECONDS says why)."""
    import torch

    start, i = time.perf_counter(), 0
    while i < calls or time.perf_counter() - start < seconds:
        runners[i % len(runners)]()
        i += 1
        if i % 4 == 0:
            torch.cuda.synchronize()  # the host clock measures GPU time, not queued launches


def time_ms(runners: list[Callable[[], object]], warmup: int, repeats: int,
            warmup_seconds: float = WARMUP_SECONDS) -> list[float]:
    """CUDA-event GPU times of `repeats` calls, cycling through input sets (a cold L2 each
    time), after at least `warmup` calls and `warmup_seconds` of back-to-back calls; the calls
    are queued behind a spin kernel, so the host's launch overhead is not in their times."""
    warm_up(runners, warmup, warmup_seconds)
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


def input_sets(shape) -> int:
    """How many input sets to rotate through so no timed run finds its data in L2."""
    return max(1, min(8, math.ceil(L2_FLUSH_BYTES / max(1, shape.input_bytes))))
