"""`flashtune tune --decode`: the decode kernels' tiles, per (head dim, packed rows), on this GPU.

Every tile the decode kernels take on the profile's arch (keys per warp step, warps, stages;
kernels/decode_spec.py's rules) is compiled in parallel; a candidate that fails to compile or
spills more than allowed is recorded with that reason. Each survivor is checked against the fp32
reference, then all of a (head dim, rows) pair's candidates are timed side by side (interleaved
rounds, cold L2, as `bench` times) on a few decode cells: one query token of 32 heads over 8 KV
heads for 16 rows, four causal tokens over 4 KV heads for 32, each at batch 1 x 32k, 8 x 8k and
64 x 4k keys. The candidate with the lowest geomean time wins if it beats the starting tile by
more than the cells' noise (2%); the starting tile stays otherwise.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

from flashtune.kernels.decode_spec import (DECODE_BLOCK_N, DECODE_STAGES, DECODE_WARPS, DecodeSpec, DecodeTile,
                                           decode_tile_keys, decode_tile_problems)
from flashtune.kernels.profiles import Profile
from flashtune.tuning.screen import Candidate, pick_fastest, screen_builds

HEADS = 32
# (batch, cache, seqlen_q, heads per KV head) per packed-row count: 1 x 4 = 4 rows and 4 x 8 = 32 rows
CELLS = {16: ((1, 32768, 1, 4), (8, 8192, 1, 4), (64, 4096, 1, 4)),
         32: ((1, 32768, 4, 8), (8, 8192, 4, 8), (64, 4096, 4, 8))}
MAX_REL_ERR = 1e-2


@dataclass
class DecodeCandidate(Candidate):
    hdim: int
    rows: int
    tile: DecodeTile
    spec: str


@dataclass
class DecodeTuneResult:
    candidates: list[DecodeCandidate]
    winners: dict[tuple[int, int], DecodeTile]  # (hdim, rows) -> the tile written to the profile

    def changed(self) -> dict[tuple[int, int], DecodeTile]:
        start = {(c.hdim, c.rows): c.tile for c in self.candidates if c.starting}
        return {key: tile for key, tile in self.winners.items() if start.get(key) != tile}


def decode_candidates(profile: Profile, hdim: int, rows: int) -> list[DecodeTile]:
    """The starting tile first, then every other tile the kernels take on the profile's arch."""
    start = profile.decode_tile(hdim, rows)
    tiles = [start]
    for block_n in DECODE_BLOCK_N:
        for warps in DECODE_WARPS:
            for stages in DECODE_STAGES:
                tile = DecodeTile(rows, block_n, warps, stages)
                if tile != start and not decode_tile_problems(hdim, tile, profile.arch):
                    tiles.append(tile)
    return tiles


def _cell_label(cell) -> str:
    batch, cache, seqlen_q, ratio = cell
    return f"b{batch} x {cache // 1024}k, q{seqlen_q}, {ratio}:1"


def decode_inputs(cell, hdim: int, dtype, seed: int):
    """Input sets (q, k, v) for a (batch, cache, seqlen_q, heads per KV head) cell, enough to leave L2 cold."""
    import torch

    from flashtune.measure.timing import L2_FLUSH_BYTES

    batch, cache, seqlen_q, ratio = cell
    heads_kv = HEADS // ratio
    kv_bytes = 2 * batch * cache * heads_kv * hdim * 2
    gen = torch.Generator(device="cuda").manual_seed(seed)
    sets = []
    for _ in range(max(1, min(8, math.ceil(L2_FLUSH_BYTES / kv_bytes)))):
        q = torch.randn(batch, seqlen_q, HEADS, hdim, device="cuda", dtype=dtype, generator=gen)
        k = torch.randn(batch, cache, heads_kv, hdim, device="cuda", dtype=dtype, generator=gen)
        v = torch.randn(batch, cache, heads_kv, hdim, device="cuda", dtype=dtype, generator=gen)
        sets.append((q, k, v))
    return sets


def _runner(spec: DecodeSpec, profile: Profile, q, k, v):
    from flashtune.runtime.decode import run_decode

    def run():
        return run_decode(spec, q, k, v, max_seqlen_q=q.shape[1], seqlen_k=k.shape[1], softmax_scale=q.shape[-1] ** -0.5,
                          num_splits=0, with_lse=False, policy=profile.decode_split)[0]
    return run


def _check(spec: DecodeSpec, profile: Profile, cell, hdim: int, dtype) -> str | None:
    """None if the candidate matches the fp32 reference on the cell's first sequence, else why not."""
    from flashtune.measure.reference import attention_reference, rel_l2

    q, k, v = decode_inputs(cell, hdim, dtype, seed=7)[0]
    out = _runner(spec, profile, q, k, v)()
    ratio = cell[3]
    ref, _ = attention_reference(q[:1, :, :ratio], k[:1, :, :1], v[:1, :, :1], causal=q.shape[1] > 1)
    err = rel_l2(out[:1, :, :ratio], ref)
    return None if err <= MAX_REL_ERR else f"rel err {err:.1e} against fp32 (> {MAX_REL_ERR:.0e})"


def run_decode_tune(profile: Profile, dtype_name: str, hdims, repeats: int = 20, jobs: int | None = None,
                    max_spill_bytes: int = 64, on_event: Callable[[str, int, int], None] | None = None
                    ) -> DecodeTuneResult:
    import torch

    from flashtune.measure.timing import time_interleaved

    dtype = getattr(torch, dtype_name)
    candidates, specs = [], {}
    for hdim, rows in decode_tile_keys(hdims):
        for i, tile in enumerate(decode_candidates(profile, hdim, rows)):
            spec = DecodeSpec(profile.arch.name, dtype_name, hdim, tile, rows == 32, "contiguous", profile.nvcc_flags)
            candidates.append(DecodeCandidate(hdim, rows, tile, spec.name, starting=i == 0))
            specs[spec.name] = spec
    rejected = screen_builds(list(specs.values()), jobs, max_spill_bytes, on_event)
    winners = {}
    pairs = decode_tile_keys(hdims)
    for n, (hdim, rows) in enumerate(pairs):
        group = [c for c in candidates if (c.hdim, c.rows) == (hdim, rows)]
        for c in group:
            c.status = rejected.get(c.spec, "ok")
            if c.status == "ok":
                c.status = _check(specs[c.spec], profile, CELLS[rows][0], hdim, dtype) or "ok"
        alive = [c for c in group if c.status == "ok"]
        for cell in CELLS[rows]:
            sets = decode_inputs(cell, hdim, dtype, seed=0)
            timed = {c.spec: [_runner(specs[c.spec], profile, *s) for s in sets] for c in alive}
            times, _ = time_interleaved(timed, 3, repeats)
            for c in alive:
                c.us[_cell_label(cell)] = statistics.median(times[c.spec]) * 1e3
            del sets, timed
            torch.cuda.empty_cache()
        best = pick_fastest(group)
        winners[(hdim, rows)] = best.tile
        if on_event:
            on_event("timing", n + 1, len(pairs))
    return DecodeTuneResult(candidates, winners)
