import pytest

from flashtune.kernels.arch import get_arch
from flashtune.kernels.tiles import (TileConfig, ctas_per_sm, shared_memory_bytes, sm90_schedule, sm90_tile, threads_per_cta,
                             tile_problems)

SM89, SM80, SM90A = get_arch("sm_89"), get_arch("sm_80"), get_arch("sm_90a")


def test_sm80_shared_memory_and_occupancy():
    cfg = TileConfig(128, 64, 4, 2)
    # Q 128x128x2 + 2 stages x (K 64x128x2 + V 64x128x2)
    assert shared_memory_bytes("sm80", 128, cfg) == 32768 + 2 * 32768
    assert threads_per_cta("sm80", cfg) == 128
    assert ctas_per_sm("sm80", 64, TileConfig(128, 64, 4, 2), SM89) == 2  # 49152 B each
    assert tile_problems("sm80", 128, cfg, SM80) == []


def test_fp8_halves_q_and_k_only():
    cfg = TileConfig(64, 64, 4, 2)
    assert shared_memory_bytes("sm80", 128, cfg, fp8=True) == 64 * 128 + 2 * (64 * 128 * 1 + 64 * 128 * 2)


def test_sm90_fa3_tiles_fit():
    # FA3's 192x192 at hdim 64 is not among them: it spills with the overlap (see below)
    for hdim, bm, bn in [(64, 192, 128), (128, 128, 176), (128, 128, 128), (256, 128, 80)]:
        cfg = sm90_tile(bm, bn, 2)
        assert cfg.num_warpgroups == bm // 64
        assert tile_problems("sm90", hdim, cfg, SM90A) == []
    cfg = sm90_tile(128, 176, 2)
    assert threads_per_cta("sm90", cfg) == 384
    assert shared_memory_bytes("sm90", 128, cfg) == 2 * (128 * 128 + 2 * 2 * 176 * 128) + 1024


def _keys(family, hdim, cfg, arch, fp8=False):
    return [p.split(":")[0] for p in tile_problems(family, hdim, cfg, arch, fp8)]


@pytest.mark.parametrize("cfg, key", [
    (TileConfig(120, 64, 4, 2), "block_m"),       # not a multiple of 16
    (TileConfig(128, 40, 4, 2), "block_n"),       # not a multiple of 16
    (TileConfig(128, 64, 3, 2), "num_warps"),
    (TileConfig(128, 64, 4, 4), "stages"),
    (TileConfig(256, 64, 4, 2), "block_m"),       # 64 rows per warp
    (TileConfig(64, 128, 4, 2), "shared_memory"),  # d128 64x128 s2 = 147456 B > 99 KB
])
def test_sm80_problems(cfg, key):
    assert key in _keys("sm80", 128, cfg, SM89)


def test_sm80_register_budget():
    assert "block_n" in _keys("sm80", 256, TileConfig(128, 64, 4, 1), SM80)  # 2*(256+64)/2 = 320


def test_family_and_fp8_on_wrong_arch():
    assert "family" in _keys("sm90", 128, sm90_tile(128, 128, 2), SM89)
    assert "fp8" in _keys("sm80", 64, TileConfig(128, 64, 4, 2), SM80, fp8=True)
    assert "fp8" not in _keys("sm80", 64, TileConfig(128, 64, 4, 2), SM89, fp8=True)


@pytest.mark.parametrize("cfg, key", [
    (sm90_tile(256, 128, 2), "block_m"),   # 4 consumer warpgroups
    (sm90_tile(128, 272, 2), "block_n"),   # over the wgmma N limit
    (sm90_tile(128, 128, 5), "stages"),
    (TileConfig(128, 128, 12, 2, 3), "num_warpgroups"),
    (sm90_tile(64, 128, 2, (("pingpong", True),)), "pingpong"),  # one consumer warpgroup: no one to take turns with
])
def test_sm90_problems(cfg, key):
    assert key in _keys("sm90", 64, cfg, SM90A)


def test_schedule_keys_are_sm90_only():
    assert "pingpong" in _keys("sm80", 64, TileConfig(128, 64, 4, 2, schedule=(("pingpong", False),)), SM89)
    assert _keys("sm90", 64, sm90_tile(192, 128, 2, (("pingpong", False),)), SM90A) == []


def test_problem_text_says_what_is_allowed():
    (text,) = tile_problems("sm80", 64, TileConfig(128, 64, 4, 5), SM89)
    assert text.startswith("stages: 5 stages; allowed: 1, 2, 3")


def test_unknown_family():
    with pytest.raises(ValueError, match="unknown kernel family"):
        tile_problems("sm70", 64, TileConfig(64, 64, 4, 2), SM80)


def test_registers_limit_ctas_per_sm_when_known():
    from flashtune.kernels.arch import get_arch
    from flashtune.kernels.tiles import TileConfig, ctas_per_sm

    cfg = TileConfig(128, 64, 4, 1)  # 64 KB of shared memory on sm_90: 3 CTAs by shared memory
    arch = get_arch("sm_90")
    assert ctas_per_sm("sm80", 128, cfg, arch) == 3
    assert ctas_per_sm("sm80", 128, cfg, arch, registers=255) == 2  # 256 x 128 threads per CTA
    assert ctas_per_sm("sm80", 128, cfg, arch, registers=96) == 3


def test_sm90_register_budget_keeps_far_over_budget_tiles_out():
    """Measured on the H200 (2026-12-02) with the default overlap schedule, which keeps S, O and the
    previous P live: 128x176 at hdim 128 and 192x128 at hdim 64 build clean; 192x128 at hdim 128
    spills 272 bytes and 192x192 at hdim 64 400 (both clean without the overlap)."""
    from flashtune.kernels.arch import get_arch
    from flashtune.kernels.tiles import check_tile, sm90_tile

    hopper = get_arch("sm_90a")
    assert not check_tile("sm90", 128, sm90_tile(128, 176, 2), hopper)
    assert not check_tile("sm90", 64, sm90_tile(192, 128, 2), hopper)
    assert not check_tile("sm90", 256, sm90_tile(128, 80, 2), hopper)
    for hdim, m, n, allowed in ((128, 192, 128, "block_n <= 80"), (64, 192, 192, "block_n <= 128"),
                                (256, 192, 64, "block_m <= 128")):
        problems = check_tile("sm90", hdim, sm90_tile(m, n, 2), hopper)
        assert [p.key for p in problems] == ["registers"] and allowed in problems[0].allowed
    # a config that turns the overlap off gets the registers of P back: the tile tuned without it fits
    no_overlap = (("overlap", False),)
    assert not check_tile("sm90", 128, sm90_tile(192, 128, 2, no_overlap), hopper)
    problems = check_tile("sm90", 128, sm90_tile(192, 144, 2, no_overlap), hopper)
    assert [p.key for p in problems] == ["registers"] and "block_n <= 128" in problems[0].allowed


def test_sm90_o_tile_and_second_q_where_the_schedule_has_them_and_they_fit():
    """kernel_traits.cuh's kSmemBytes: the TMA store's O tile where it fits beside one Q and the rings,
    a second Q tile for the deferred epilogue where it fits too (the O tile first), as the family's
    defaults; a config's keys can leave either out, and not ask for one that does not fit."""
    q64 = 192 * 64 * 2
    hdim64 = sm90_tile(192, 128, 2)
    one_q = shared_memory_bytes("sm90", 64, sm90_tile(192, 128, 2, (("defer", False),)))
    assert one_q == q64 + 2 * 2 * 128 * 64 * 2 + 1024 + q64  # Q, rings, slack, O tile
    assert shared_memory_bytes("sm90", 64, hdim64) == one_q + q64  # deferred by default
    # without the overlap or the persistent grid there is nothing to defer under: no second Q
    assert shared_memory_bytes("sm90", 64, sm90_tile(192, 128, 2, (("overlap", False),))) == one_q
    assert shared_memory_bytes("sm90", 64, sm90_tile(192, 128, 2, (("persistent", False),))) == one_q
    no_o = sm90_tile(192, 128, 2, (("tma_store", False),))  # direct stores: two Q tiles and no O tile
    assert shared_memory_bytes("sm90", 64, no_o) == 2 * q64 + 2 * 2 * 128 * 64 * 2 + 1024

    both = sm90_tile(128, 128, 2)  # hdim 128: 32 KB Q, 128 KB of rings, 32 KB O: room for 32 KB more Q
    two_q = 2 * 32768 + 4 * 32768 + 1024 + 32768
    assert shared_memory_bytes("sm90", 128, both) == two_q
    neither = sm90_tile(128, 176, 2)  # 209 KB with one Q: room for neither an O tile nor a second Q
    assert shared_memory_bytes("sm90", 128, neither) == 32768 + 2 * 2 * 176 * 128 * 2 + 1024
    schedule = sm90_schedule(128, neither)
    assert not schedule.tma_store and not schedule.defer
    asked = [str(p) for p in check_tile_keys(128, neither, (("tma_store", True),))]
    assert asked == ["tma_store: the O tile does not fit beside Q and the rings; allowed: tma_store: false here "
                     "(fewer stages or a smaller tile make room)"]
    assert "a second Q tile does not fit" in str(check_tile_keys(128, neither, (("defer", True),))[0])


def check_tile_keys(hdim, tile, keys):
    from flashtune.kernels.tiles import check_tile

    return check_tile("sm90", hdim, sm90_tile(tile.block_m, tile.block_n, tile.stages, keys), SM90A)


def test_sm90_schedule_defaults_follow_the_fields_they_need():
    """Each default follows from the fields before it: a row that turns the overlap off gets no
    pingpong, speculative maxima or deferred epilogue; flat tiles only where the epilogue is deferred,
    and by default only in causal kernels at hdim 64; speculative maxima at hdim 64 and 128."""
    tile = sm90_tile(128, 128, 2)
    causal64 = sm90_schedule(64, tile, causal=True)
    assert causal64.flat and causal64.defer and causal64.spec_max and causal64.pingpong
    assert not sm90_schedule(64, tile, causal=False).flat
    assert not sm90_schedule(256, sm90_tile(128, 64, 2), causal=True).spec_max
    off = sm90_schedule(64, sm90_tile(128, 128, 2, (("overlap", False),)), causal=True)
    assert (off.pingpong, off.spec_max, off.defer, off.flat) == (False, False, False, False)
    assert not sm90_schedule(64, sm90_tile(128, 128, 2, (("defer", False),)), causal=True).flat
    assert not sm90_schedule(64, sm90_tile(64, 128, 2)).pingpong  # one consumer warpgroup
    # what a config says against the rules is an error, not silently changed
    problems = check_tile_keys(64, tile, (("overlap", False), ("pingpong", True)))
    assert [p.key for p in problems] == ["pingpong"]
    assert [p.key for p in check_tile_keys(64, tile, (("defer", False), ("flat", True)))] == ["flat"]
    assert [p.key for p in check_tile_keys(64, tile, (("lazy_rescale", False), ("spec_max", True)))] == ["spec_max"]
