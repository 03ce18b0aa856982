"""What `flashtune tune` searches: per-family value grids, filtered by the arch's limits.

The limits themselves live in tiles.py (check_tile): shared memory per block, rows per
warp, register budget, divisibility, what each family supports. A config that fails them
is never compiled; this file only says which values are worth trying.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from flashtune.kernels.arch import ArchFacts
from flashtune.kernels.tiles import TileConfig, check_tile, sm90_schedule, sm90_tile

SEARCH_SPACE: dict[str, dict[str, tuple[int, ...]]] = {
    "sm80": {"block_m": (64, 128), "block_n": (32, 64, 128), "num_warps": (4, 8), "stages": (1, 2)},
    # 4 stages: where a block's GEMMs are short (hdim 64, small tiles) the ring must run further
    # ahead to hide a load's latency, and those tiles leave the shared memory for it.
    # schedules: a tile's own schedule keys (flashtune/kernels/schedule.py) besides the family's defaults;
    # the pingpong off where a tile's few blocks make the warpgroups' hand-overs cost more than they
    # hide (hdim 64 causal below 2k on the H200), tried after the same shape with it on.
    "sm90": {"block_m": (64, 128, 192), "block_n": tuple(range(64, 257, 16)), "stages": (2, 3, 4),
             "schedules": ((), (("pingpong", False),))},
}

# The default buckets' edges and the sequence length each is measured at (the articles' advice:
# small blocks up to about 4k, large from about 8k; and below 2k a split at 1k, because a short
# sequence's best tile is often the one whose blocks line up with it: on the H200 hdim 256 causal
# 512 took 128x64 where 1k and up take 128x80). A base profile's own edges are kept too
# (profile_buckets): a bucket split by hand stays split when the profile is tuned again.
BUCKET_EDGES = (0, 1024, 2048, 8192, None)
BUCKET_SEQLENS = (512, 1024, 4096, 16384)
# What the default buckets were measured at before the split at 1k: tune caches key those runs "run".
LEGACY_BUCKET_SEQLENS = (1024, 4096, 16384)


@dataclass(frozen=True)
class Bucket:
    lo: int
    hi: int | None  # None: no upper edge
    seqlen: int  # where its candidates are measured


def representative_seqlen(lo: int, hi: int | None) -> int:
    """Half the upper edge (at least the lower one), or twice the lower edge of the open last
    bucket: 512 for [0, 1024), 1024 for [1024, 2048) and for [0, 2048), 4096 for [2048, 8192), 16384
    for [8192, inf)."""
    return max(lo, hi // 2) if hi is not None else max(2 * lo, 1)


def buckets_from_edges(edges) -> tuple[Bucket, ...]:
    """The buckets between sorted edges, the last of which is None."""
    return tuple(Bucket(lo, hi, representative_seqlen(lo, hi)) for lo, hi in zip(edges, edges[1:]))


def profile_buckets(profile, hdim: int, causal: bool, fp8: bool = False, fp8_pv: bool = False) -> tuple[Bucket, ...]:
    """The default buckets, split further at every edge of the profile's own table for (hdim,
    causal) (the table of the FP8 or all-FP8 twins for fp8 or fp8_pv: Profile.config_table)."""
    table = profile.config_table(fp8, fp8_pv)
    own = {edge for e in table if e.hdim == hdim and e.causal in (None, causal) for edge in (e.seqlen_min, e.seqlen_max)}
    finite = sorted({edge for edge in (*BUCKET_EDGES, *own) if edge is not None})
    return buckets_from_edges((*finite, None))


def _configs(family: str) -> list[TileConfig]:
    space = SEARCH_SPACE[family]
    if family == "sm90":
        return [sm90_tile(m, n, s, keys) for m, n, s, keys in itertools.product(
            space["block_m"], space["block_n"], space["stages"], space["schedules"])]
    return [TileConfig(m, n, w, s) for m, n, w, s in itertools.product(
        space["block_m"], space["block_n"], space["num_warps"], space["stages"])]


def candidates(family: str, hdim: int, arch: ArchFacts, fp8: bool = False,
               starting: tuple[TileConfig, ...] = (), limit: int | None = None,
               shapes: tuple[tuple[int, int], ...] = (), fp8_pv: bool = False) -> list[TileConfig]:
    """Every config of the family's grid that the arch can run, starting configs first (`fp8_pv`:
    those the all-FP8 kernel takes: a block_n of whole 64-key panels).

    `shapes` ((block_m, block_n), ...) keeps only configs of those tile shapes besides the
    starting ones (every stage and warp count the grid has for them). `limit` keeps the
    starting configs and the largest tiles (most work per iteration)."""
    valid = [c for c in _configs(family)
             if not check_tile(family, hdim, c, arch, fp8, fp8_pv=fp8_pv) and not _redundant(hdim, c, fp8, fp8_pv)]
    if shapes:
        valid = [c for c in valid if (c.block_m, c.block_n) in shapes]
    rest = sorted((c for c in valid if c not in starting),
                  key=lambda c: (-c.block_m * c.block_n, len(c.schedule), c.stages))
    ordered = list(dict.fromkeys([*starting, *rest]))
    return ordered if limit is None else ordered[:max(limit, len(starting))]


def _redundant(hdim: int, cfg: TileConfig, fp8: bool, fp8_pv: bool = False) -> bool:
    """Whether a config's schedule keys change nothing (the pingpong off with one consumer
    warpgroup): the same kernel as the config without them, which the grid has already."""
    if not cfg.schedule:
        return False
    bare = replace(cfg, schedule=())
    return all(sm90_schedule(hdim, cfg, causal, fp8, fp8_pv) == sm90_schedule(hdim, bare, causal, fp8, fp8_pv)
               for causal in (False, True))


def shape_problems(family: str, hdim: int, shape: tuple[int, int], arch: ArchFacts, fp8: bool = False,
                   fp8_pv: bool = False) -> list[str]:
    """Why no config of this (block_m, block_n) can be tried at this head dim (empty when one
    can): outside the family's grid, or every variant fails the arch's limits (their reasons)."""
    variants = [c for c in _configs(family) if (c.block_m, c.block_n) == shape]
    if not variants:
        space = SEARCH_SPACE[family]
        return [f"{shape[0]}x{shape[1]} is not in the {family} search grid (block_m {list(space['block_m'])}, "
                f"block_n {list(space['block_n'])})"]
    reasons = []
    for c in variants:
        problems = check_tile(family, hdim, c, arch, fp8, fp8_pv=fp8_pv)
        if not problems:
            return []
        reasons += [str(p) for p in problems]
    return list(dict.fromkeys(reasons))
