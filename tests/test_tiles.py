import pytest

from flashtune.arch import get_arch
from flashtune.tiles import (TileConfig, ctas_per_sm, shared_memory_bytes, sm90_flag_defaults, sm90_flag_value,
                             sm90_step_on, sm90_tile, threads_per_cta, tile_problems)

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
    (sm90_tile(64, 128, 2, pingpong=False), "pingpong"),  # one consumer warpgroup: no turns to give up
])
def test_sm90_problems(cfg, key):
    assert key in _keys("sm90", 64, cfg, SM90A)


def test_pingpong_is_sm90_only():
    assert "pingpong" in _keys("sm80", 64, TileConfig(128, 64, 4, 2, pingpong=False), SM89)
    assert _keys("sm90", 64, sm90_tile(192, 128, 2, pingpong=False), SM90A) == []


def test_problem_text_says_what_is_allowed():
    (text,) = tile_problems("sm80", 64, TileConfig(128, 64, 4, 5), SM89)
    assert text.startswith("stages: 5 stages; allowed: 1, 2, 3")


def test_unknown_family():
    with pytest.raises(ValueError, match="unknown kernel family"):
        tile_problems("sm70", 64, TileConfig(64, 64, 4, 2), SM80)


def test_registers_limit_ctas_per_sm_when_known():
    from flashtune.arch import get_arch
    from flashtune.tiles import TileConfig, ctas_per_sm

    cfg = TileConfig(128, 64, 4, 1)  # 64 KB of shared memory on sm_90: 3 CTAs by shared memory
    arch = get_arch("sm_90")
    assert ctas_per_sm("sm80", 128, cfg, arch) == 3
    assert ctas_per_sm("sm80", 128, cfg, arch, registers=255) == 2  # 256 x 128 threads per CTA
    assert ctas_per_sm("sm80", 128, cfg, arch, registers=96) == 3


def test_sm90_register_budget_keeps_far_over_budget_tiles_out():
    """Measured on the H200 (2026-12-02) with the default overlap schedule, which keeps S, O and the
    previous P live: 128x176 at hdim 128 and 192x128 at hdim 64 build clean; 192x128 at hdim 128
    spills 272 bytes and 192x192 at hdim 64 400 (both clean without the overlap)."""
    from flashtune.arch import get_arch
    from flashtune.tiles import check_tile, sm90_tile

    hopper = get_arch("sm_90a")
    assert not check_tile("sm90", 128, sm90_tile(128, 176, 2), hopper)
    assert not check_tile("sm90", 64, sm90_tile(192, 128, 2), hopper)
    assert not check_tile("sm90", 256, sm90_tile(128, 80, 2), hopper)
    for hdim, m, n, allowed in ((128, 192, 128, "block_n <= 80"), (64, 192, 192, "block_n <= 128"),
                                (256, 192, 64, "block_m <= 128")):
        problems = check_tile("sm90", hdim, sm90_tile(m, n, 2), hopper)
        assert [p.key for p in problems] == ["registers"] and allowed in problems[0].allowed
    # a profile that turns the overlap off gets the registers of P back: the tile tuned without it fits
    no_overlap = ("-DFLASHTUNE_SM90_OVERLAP=0",)
    assert not check_tile("sm90", 128, sm90_tile(192, 128, 2), hopper, nvcc_flags=no_overlap)
    problems = check_tile("sm90", 128, sm90_tile(192, 144, 2), hopper, nvcc_flags=no_overlap)
    assert [p.key for p in problems] == ["registers"] and "block_n <= 128" in problems[0].allowed
    # the WIDE_CONSUMERS experiment gives two consumer warpgroups 240 registers (=2 everywhere, =1 at
    # hdim 256 only): 128x192 at hdim 128 needs 240, past 232 (ptxas: no consumer spills at 240)
    wide = sm90_tile(128, 192, 2)
    assert [p.key for p in check_tile("sm90", 128, wide, hopper)] == ["registers"]
    assert [p.key for p in check_tile("sm90", 128, wide, hopper,
                                      nvcc_flags=("-DFLASHTUNE_SM90_WIDE_CONSUMERS=1",))] == ["registers"]
    assert not check_tile("sm90", 128, wide, hopper, nvcc_flags=("-DFLASHTUNE_SM90_WIDE_CONSUMERS=2",))


def test_sm90_second_q_buffer_where_asked_for_and_it_fits_beside_the_o_tile():
    """kernel_traits.cuh: a second Q tile comes with the deferred epilogue (by default at every head
    dim, =1 at hdim 64 only) or -DFLASHTUNE_SM90_Q_BUFFERS=2, on the persistent grid only, and only
    where it fits beside the rings and the TMA-store O tile."""
    q64 = 192 * 64 * 2
    hdim64 = sm90_tile(192, 128, 2)
    off = ("-DFLASHTUNE_SM90_DEFER_EPILOGUE=0",)
    one_q = shared_memory_bytes("sm90", 64, hdim64, nvcc_flags=off)
    assert one_q == q64 + 2 * 2 * 128 * 64 * 2 + 1024 + q64  # Q, rings, slack, O tile
    assert shared_memory_bytes("sm90", 64, hdim64) == one_q + q64  # deferred by default
    assert shared_memory_bytes("sm90", 64, hdim64, nvcc_flags=("-DFLASHTUNE_SM90_DEFER_EPILOGUE=1",)) == one_q + q64
    assert shared_memory_bytes("sm90", 64, hdim64, nvcc_flags=("-DFLASHTUNE_SM90_OVERLAP=0",)) == one_q
    assert shared_memory_bytes("sm90", 64, hdim64, nvcc_flags=("-DFLASHTUNE_SM90_PERSISTENT=0",)) == one_q
    assert shared_memory_bytes("sm90", 64, hdim64, nvcc_flags=off + ("-DFLASHTUNE_SM90_Q_BUFFERS=2",)) == one_q + q64

    both = sm90_tile(128, 128, 2)  # hdim 128: 32 KB Q, 128 KB of rings, 32 KB O: room for 32 KB more Q
    two_q = 2 * 32768 + 4 * 32768 + 1024 + 32768
    assert shared_memory_bytes("sm90", 128, both) == two_q  # deferred by default
    assert shared_memory_bytes("sm90", 128, both, nvcc_flags=("-DFLASHTUNE_SM90_DEFER_EPILOGUE=1",)) == two_q - 32768
    assert shared_memory_bytes("sm90", 128, both, nvcc_flags=off + ("-DFLASHTUNE_SM90_Q_BUFFERS=2",)) == two_q
    neither = sm90_tile(128, 176, 2)  # 209 KB with one Q: room for neither an O tile nor a second Q
    assert (shared_memory_bytes("sm90", 128, neither, nvcc_flags=off)
            == shared_memory_bytes("sm90", 128, neither) == 32768 + 2 * 2 * 176 * 128 * 2 + 1024)  # Q, 2 stages of K and V, slack


def test_sm90_flag_defaults_come_from_kernel_traits():
    """The resource model reads kernel_traits.cuh's flag defaults from the header (one source):
    every step it asks about is there, and a profile's flag overrides it (the last one wins)."""
    defaults = sm90_flag_defaults()
    assert {"OVERLAP", "PERSISTENT", "TMA_STORE", "Q_BUFFERS", "DEFER_EPILOGUE"} <= defaults.keys()
    assert sm90_flag_value("DEFER_EPILOGUE") == defaults["DEFER_EPILOGUE"]
    flags = ("-DFLASHTUNE_SM90_DEFER_EPILOGUE=0", "-DFLASHTUNE_SM90_DEFER_EPILOGUE=1")
    assert sm90_flag_value("DEFER_EPILOGUE", flags) == 1
    assert not sm90_step_on("OVERLAP", ("-DFLASHTUNE_SM90_OVERLAP=0",)) and sm90_step_on("OVERLAP")
