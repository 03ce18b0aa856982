"""What `tune --decode` and `tune --backward` share: compiling every candidate with the progress
bar's events and screening out those that fail to compile or spill, and picking a group's winner
against its starting tile (the lowest geomean time over the cells, if it is at least 2% faster)."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable

MIN_GAIN = 0.98  # a winner must be at least 2% faster than the starting tile in geomean


@dataclass(kw_only=True)
class Candidate:
    """What a tune's candidate carries for pick_fastest (each mode adds its tile and kernel names)."""
    starting: bool = False
    status: str = "ok"  # or why it was rejected
    us: dict[str, float] = field(default_factory=dict)  # cell label -> median microseconds
    vs_starting: float | None = None  # geomean over cells of (its time / the starting tile's)


def screen_builds(specs: list, jobs: int | None, max_spill_bytes: int,
                  on_event: Callable[[str, int, int], None] | None = None) -> dict[str, str]:
    """Compile every spec in parallel; kernel name -> why it cannot be a candidate (it failed to
    compile, or ptxas spills more than max_spill_bytes), for those that cannot."""
    from flashtune.kernels.build import build_specs

    done = [0]

    def built(spec, result):
        done[0] += 1
        if on_event:
            on_event("compiling", done[0], len(specs))

    results, failures = build_specs(list(specs), jobs=jobs, on_done=built)
    rejected = {r.name: f"ptxas spills {r.spill_stores}/{r.spill_loads} bytes (store/load)" for r in results
                if max(r.spill_stores or 0, r.spill_loads or 0) > max_spill_bytes}
    rejected.update({spec.name: str(err).splitlines()[0][:160] for spec, err in failures})
    return rejected


def pick_fastest(group: list[Candidate]) -> Candidate:
    """A group's winner: each measured candidate's `vs_starting` (geomean over the starting tile's
    cells of its time / the starting tile's) is set; the fastest wins if it beats the starting tile
    by MIN_GAIN, else the starting tile stays. Where the starting tile failed, the fastest that works
    by mean time."""
    start = next(c for c in group if c.starting)
    alive = [c for c in group if c.status == "ok"]
    if start.status != "ok":
        return min(alive, key=lambda c: statistics.fmean(c.us.values())) if alive else start
    for c in alive:
        c.vs_starting = math.exp(statistics.fmean(math.log(c.us[k] / start.us[k]) for k in start.us))
    fastest = min(alive, key=lambda c: c.vs_starting)
    return fastest if fastest.vs_starting < MIN_GAIN else start
