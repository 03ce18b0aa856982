"""tools/tile_trace.py's arithmetic on a made-up timeline: the kernel side (csrc/sm90/trace.cuh)
needs a GPU, the step columns and the tile sizes do not."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).parents[1] / "tools" / "tile_trace.py"


@pytest.fixture(scope="module")
def tt():
    spec = importlib.util.spec_from_file_location("tile_trace", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tile_sizes_mirror_the_kernels_causal_lookup(tt):
    # 512 rows of 128x128 tiles, heaviest m-block first: 4, 3, 2, 1 blocks, then the next head.
    assert [tt.n_blocks(t, 512, 128, 128, True) for t in range(6)] == [4, 3, 2, 1, 4, 3]
    assert [tt.n_blocks(t, 512, 128, 128, False) for t in range(3)] == [4, 4, 4]
    assert tt.n_blocks(0, 512, 128, 80, True) == 7  # 128x80 at hdim 256: keys 0..511 in 7 blocks


def test_steps_become_per_tile_columns(tt):
    """One CTA at 1 GHz (1 ns a clock), one consumer warpgroup, two causal tiles of 4 and 3
    blocks: each column is the difference of its two stamps, from the CTA's start for the first."""
    steps = [-1] * (tt.CTAS * tt.TILES * tt.STEPS)
    clocks = [-1] * (tt.CTAS * 4)
    clocks[0:4] = [0, 0, 40_000, 40_000]  # globaltimer and clock64 at the start and the end

    def stamp(tile, step, value):
        steps[tile * tt.STEPS + step] = value

    base = tt.CONSUMER0
    for tile, (index, t0) in enumerate([(0, 1000), (1, 20_000)]):
        stamp(tile, tt.TILE_INDEX, index)
        stamp(tile, tt.Q_ISSUED, t0 - 800)
        for step, at in [(tt.Q_LANDED, 0), (tt.K0_LANDED, 200), (tt.TURN, 400), (tt.S0_DONE, 500),
                         (tt.LAST_PV_DONE, 4500), (tt.EPILOGUE_READY, 4700), (tt.O_WRITTEN, 5200),
                         (tt.STORED, 5400)]:
            stamp(tile, base + step, t0 + at)
    rows, tiles_per_cta, span_ns = tt.summarise(steps, clocks, 512, 128, 128, True, consumers=1)
    assert tiles_per_cta == [2] and span_ns == 40_000
    first, second = rows[4], rows[3]

    def us(r, column):
        (value,) = r[column]  # one warpgroup, one tile of each size
        return pytest.approx(value, abs=1e-9)

    assert us(first, "wait Q") == 1.0 and us(first, "tile") == 6.4  # from the CTA's start
    assert us(second, "wait Q") == 20.0 - 6.4 and us(second, "tile") == 25.4 - 6.4  # from the first tile's end
    for r in (first, second):
        assert (us(r, "Q lat"), us(r, "wait K0"), us(r, "turn"), us(r, "S0")) == (0.8, 0.2, 0.2, 0.1)
        assert (us(r, "blocks"), us(r, "epi"), us(r, "look"), us(r, "O+LSE"), us(r, "tma")) == (4.0, 0.9, 0.2, 0.5, 0.2)
    assert us(first, "/blk") == 1.0 and us(second, "/blk") == 4 / 3
