"""`flashtune tune --decode`'s split policy: the constants of the split-count cost model
(runtime/decode_splits.py, kernels/decode_spec.py's DecodeSplitPolicy) fitted on this GPU.

Every split count from 1 to the most the keys allow is timed side by side (interleaved rounds, cold
L2, as `bench` times) on cells from short calls to long ones, through the decode kernels the tuned
tiles give; then each set of constants on a grid is scored by how much slower the count it picks is
than the fastest measured, per cell (geomean first, then the worst cell). The best set is written to
the profile's `decode.split` when it beats the profile's own policy by more than the runs' noise.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from dataclasses import dataclass, field
from typing import Callable

from flashtune.kernels.decode_spec import DecodeSplitPolicy, DecodeTile
from flashtune.kernels.profiles import Profile

HEADS = 32
# (heads_kv, batch, cache keys) with one query token: short calls where a combine costs as much as a
# split saves, one-sequence calls that need many splits, and filled ones that need none
CELLS = ((1, 1, 16384), (1, 8, 1024), (1, 8, 16384), (1, 32, 1024), (1, 128, 1024),
         (8, 1, 16384), (8, 8, 1024), (8, 8, 16384), (8, 1, 131072), (32, 1, 16384))
COUNTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
GRID = {"ring_turnaround_us": (2, 2.5, 3, 3.5, 4, 5, 6), "combine_us": (2, 2.5, 3, 3.5, 4, 5),
        "combine_gbps": (800, 1200, 1600, 2400, 3200), "cluster_us": (1.5, 2, 2.5, 3, 3.5)}
MIN_GAIN = 0.01  # a fitted policy is written only if its geomean loss is this much below the profile's


@dataclass
class SplitCell:
    hdim: int
    heads_kv: int
    batch: int
    cache: int
    us: dict[int, float] = field(default_factory=dict)  # split count -> median microseconds
    seqlen_q: int = 1  # causal above 1

    @property
    def label(self) -> str:
        return f"h{self.hdim} {HEADS}/{self.heads_kv} b{self.batch} x {self.cache}" + \
            (f" q{self.seqlen_q}" if self.seqlen_q > 1 else "")


@dataclass
class SplitFit:
    base: DecodeSplitPolicy    # the profile's own policy
    fitted: DecodeSplitPolicy  # the grid's best
    base_loss: tuple[float, float]  # (geomean, worst) over the cells of chosen time / fastest time
    loss: tuple[float, float]       # the same for the fitted policy
    cells: list[SplitCell]

    @property
    def wins(self) -> bool:
        """Whether the fitted policy beats the profile's by more than the runs' noise."""
        return self.loss[0] < self.base_loss[0] - MIN_GAIN

    @property
    def policy(self) -> DecodeSplitPolicy:
        """The policy to write."""
        return self.fitted if self.wins else self.base


def no_clusters(spec) -> tuple[int, ...]:
    return ()


def policy_losses(cells: list[SplitCell], spec_for: Callable, policy: DecodeSplitPolicy, sm_count: int,
                  memory_gbps: float, slots_for: Callable = no_clusters) -> list[float]:
    """Per cell: the measured time at the count the policy picks (the nearest count measured) over
    the fastest count's. spec_for(cell) -> the DecodeSpec the runtime launches for the cell;
    slots_for(spec) -> its cluster slots on the GPU measured (runtime/decode.py's cluster_slots)."""
    from flashtune.runtime import decode_splits

    out = []
    for cell in cells:
        spec = spec_for(cell)
        n = decode_splits.choose_splits(spec, cell.batch, cell.heads_kv, cell.seqlen_q, HEADS // cell.heads_kv,
                                        cell.cache, sm_count, memory_gbps, policy, slots_for(spec))
        nearest = min(cell.us, key=lambda s: abs(s - n))
        out.append(cell.us[nearest] / min(cell.us.values()))
    return out


def _summary(losses: list[float]) -> tuple[float, float]:
    return math.exp(statistics.fmean(map(math.log, losses))), max(losses)


def fit_split_policy(cells: list[SplitCell], spec_for: Callable, sm_count: int, memory_gbps: float,
                     base: DecodeSplitPolicy = DecodeSplitPolicy(), slots_for: Callable = no_clusters) -> SplitFit:
    """The grid's constants with the lowest (geomean, worst) loss, the base's memory_gbps and
    max_splits kept."""
    scored = []
    for values in itertools.product(*GRID.values()):
        policy = dataclasses.replace(base, **dict(zip(GRID, values)))
        scored.append((_summary(policy_losses(cells, spec_for, policy, sm_count, memory_gbps, slots_for)), policy))
    loss, fitted = min(scored, key=lambda s: s[0])
    base_loss = _summary(policy_losses(cells, spec_for, base, sm_count, memory_gbps, slots_for))
    return SplitFit(base, fitted, base_loss, loss, cells)


def run_split_fit(profile: Profile, dtype_name: str, hdims, repeats: int,
                  on_event: Callable[[str, int, int], None] | None = None) -> SplitFit:
    """Measure CELLS on this GPU under `profile` and fit its split policy."""
    from flashtune.runtime.decode import cluster_slots
    from flashtune.runtime.decode_splits import device_facts

    cells = measure_split_cells(profile, dtype_name, hdims, repeats, on_event)
    sm_count, memory_gbps = device_facts(0)
    return fit_split_policy(cells, spec_for_profile(profile, dtype_name, 0), sm_count, memory_gbps, profile.decode_split,
                            lambda spec: cluster_slots(spec, 0))


def measure_split_cells(profile: Profile, dtype_name: str, hdims, repeats: int,
                        on_event: Callable[[str, int, int], None] | None = None) -> list[SplitCell]:
    """Every split count on CELLS at each head dim, through flash_attn_with_kvcache's kernels under
    `profile` (its decode tiles); the kernels are built first, in parallel."""
    import torch

    from flashtune.kernels.build import build_specs
    from flashtune.measure.timing import time_interleaved
    from flashtune.runtime.decode import run_decode
    from flashtune.runtime.decode_splits import kv_bytes, most_splits, short_call
    from flashtune.tuning.decode_search import decode_inputs

    dtype = getattr(torch, dtype_name)
    cells = [SplitCell(hdim, kv, batch, cache) for hdim in hdims for kv, batch, cache in CELLS]
    specs = {cell.label: spec_for_profile(profile, dtype_name, 0)(cell) for cell in cells}
    build_specs(list(dict.fromkeys(specs.values())))
    for i, cell in enumerate(cells):
        spec = specs[cell.label]
        sets = decode_inputs((cell.batch, cell.cache, 1, HEADS // cell.heads_kv), cell.hdim, dtype, seed=0)
        short = short_call(profile.decode_split, kv_bytes(cell.batch, cell.heads_kv, cell.cache, cell.hdim), 0)
        most = most_splits(spec, cell.cache, max(COUNTS), short)

        def runner(q, k, v, n):
            return lambda: run_decode(spec, q, k, v, max_seqlen_q=1, seqlen_k=cell.cache,
                                      softmax_scale=cell.hdim ** -0.5, num_splits=n, with_lse=False,
                                      policy=profile.decode_split)[0]  # its cluster_splits, as the fit's
        timed = {n: [runner(*s, n) for s in sets] for n in COUNTS if n <= most}
        times, _ = time_interleaved(timed, 3, repeats)
        cell.us = {n: statistics.median(t) * 1e3 for n, t in times.items()}
        del sets, timed
        torch.cuda.empty_cache()
        if on_event:
            on_event("timing split counts", i + 1, len(cells))
    return cells


def with_decode_tiles(profile: Profile, tiles: dict[tuple[int, int], DecodeTile]) -> Profile:
    """The profile with these decode tiles in place of its own for their (head dim, rows)."""
    merged = {(hdim, rows): tile for hdim, rows, tile in profile.decode_tiles}
    merged.update(tiles)
    return dataclasses.replace(profile, decode_tiles=tuple((h, r, t) for (h, r), t in sorted(merged.items())))


def spec_for_profile(profile: Profile, dtype_name: str, device_index: int | None = None) -> Callable:
    """cell -> the DecodeSpec the runtime launches for it under `profile` on CUDA device
    `device_index` (None, off the GPU: packed rows by shape alone, not by a short call's)."""
    import torch

    from flashtune.runtime.decode import decode_spec

    dtype = getattr(torch, dtype_name)
    return lambda cell: decode_spec(
        profile, dtype, cell.hdim, cell.seqlen_q > 1, cell.seqlen_q, HEADS // cell.heads_kv, None,
        key_rows=0 if device_index is None else cell.batch * cell.heads_kv * cell.cache, device_index=device_index or 0)
