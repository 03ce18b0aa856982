"""Where a tile's time goes: the sm90 kernel built with -DFLASHTUNE_SM90_TRACE=1 stamps the SM
clock at each tile's steps (csrc/sm90/trace.cuh); this runs chosen FA-grid cells and prints,
per tile size (K/V blocks), the mean time of each step, in microseconds.

Run (on the GPU): python3 tools/tile_trace.py [--profile P] HDIM:CAUSAL:SEQLEN...
e.g. tools/tile_trace.py 64:1:512 128:0:512   (batch and heads as the FA grid; P defaults to
tools/experiments/exp-sm90-trace.yaml, profile h200's tiles with the trace compiled in)

Columns, per consumer warpgroup and tile, from the end of its previous tile's epilogue:
  wait Q   until Q landed          Q lat   Q landed - the producer issued its load
  wait K0  Q landed -> K_0 landed  turn    K_0 landed -> S_0 issued in its pingpong turn
  S0       issued -> S_0 complete    blocks  S_0 complete -> last P V complete (per block: /blk)
  epi      last P V -> the epilogue done, of which
    look   the tile looked up again (TMA store: and sO free)
    O+LSE  O into sO or to global memory, and the LSE
    tma    the TMA store issued
Where the epilogue is deferred (hdim 64 and 128x128 tiles: DEFER_EPILOGUE in kernel_traits.cuh), tile
n's epilogue runs in tile n+1 after S_0's issue: its 'look' then spans tile n+1's Q, K_0 and turn,
'S0' includes it, and 'wait Q' goes negative ('tile' still spans one epilogue to the next). With
flat tiles (hdim 64 causal: FLAT_TILES) tile n's last P V also completes in tile n+1, under its S_0's
softmax, so tile n's 'blocks' ends there.
The kernel gets no LSE tensor, as flash_attn_func and the bench call it, unless --lse.
"""
import argparse
import ctypes
import dataclasses
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

from flashtune import ops
from flashtune.bench import fa_grid, make_inputs
from flashtune.build import build_spec
from flashtune.profiles import find_profile

# Mirrors csrc/sm90/trace.cuh.
CTAS, TILES, CONSUMER0, CONSUMER_STEPS = 132, 64, 3, 8
STEPS = CONSUMER0 + 3 * CONSUMER_STEPS
TILE_INDEX, Q_ISSUED, KV_ISSUED = 0, 1, 2
Q_LANDED, K0_LANDED, TURN, S0_DONE, LAST_PV_DONE, EPILOGUE_READY, O_WRITTEN, STORED = range(CONSUMER_STEPS)
DEFAULT_PROFILE = str(Path(__file__).parent / "experiments" / "exp-sm90-trace.yaml")


def n_blocks(t: int, seqlen: int, block_m: int, block_n: int, causal: bool) -> int:
    """K/V blocks of tile t (fwd_kernel.cuh's tile_at, fixed-length)."""
    num_m = -(-seqlen // block_m)
    m_block = num_m - 1 - t % num_m
    n = -(-seqlen // block_n)
    return min(n, ((m_block + 1) * block_m - 1) // block_n + 1) if causal else n


def record(spec, q, k, v, lse: bool) -> tuple[list[int], list[int]]:
    """One steady call of the traced kernel `spec`: its steps [cta][tile][step] and per CTA
    (globaltimer, clock64) at its start and end, flattened; -1 where nothing was stamped."""
    def run():
        ops.run_spec(spec, q, k, v, None, None, q.shape[1], k.shape[1], q.shape[-1] ** -0.5, with_lse=lse)

    run()  # builds or loads it; then its library is open here and ctypes hands out the same handle
    lib = ctypes.CDLL(build_spec(spec).library)
    if not hasattr(lib, "flashtune_trace_copy"):
        sys.exit(f"{spec.name} has no trace: build it with -DFLASHTUNE_SM90_TRACE=1 (profile {DEFAULT_PROFILE})")
    for _ in range(3):  # warm: the timeline of a steady call, not the first one
        run()
    torch.cuda.synchronize()
    assert lib.flashtune_trace_clear() == 0
    run()
    torch.cuda.synchronize()
    steps = (ctypes.c_longlong * (CTAS * TILES * STEPS))()
    clocks = (ctypes.c_longlong * (CTAS * 4))()
    assert lib.flashtune_trace_copy(steps, clocks) == 0
    return list(steps), list(clocks)


COLUMNS = ["tile", "wait Q", "Q lat", "wait K0", "turn", "S0", "blocks", "/blk", "epi", "look", "O+LSE", "tma"]


def summarise(steps, clocks, seqlen: int, block_m: int, block_n: int, causal: bool, consumers: int):
    """Per tile size (K/V blocks): each column's microseconds, one entry per warpgroup and tile;
    with the tiles each CTA ran and the kernel's span in nanoseconds (globaltimer)."""
    def at(cta, tile, step):
        return steps[(cta * TILES + tile) * STEPS + step]

    ctas = [c for c in range(CTAS) if clocks[c * 4 + 1] >= 0 and clocks[c * 4 + 3] >= 0]
    span_ns = max(clocks[c * 4 + 2] for c in ctas) - min(clocks[c * 4] for c in ctas)
    rows = defaultdict(lambda: defaultdict(list))  # n_blocks -> column -> microseconds
    tiles_per_cta = []
    for c in ctas:
        g0, c0, g1, c1 = (clocks[c * 4 + i] for i in range(4))
        us = (g1 - g0) / (c1 - c0) / 1e3  # microseconds per SM clock
        count = 0
        for i in range(TILES):
            t = at(c, i, TILE_INDEX)
            if t < 0:
                break
            count += 1
            nb = n_blocks(t, seqlen, block_m, block_n, causal)
            for w in range(consumers):
                def step(s, tile=i, base=CONSUMER0 + CONSUMER_STEPS * w):
                    return at(c, tile, base + s)

                prev = step(STORED, i - 1) if i > 0 else c0
                if min(step(Q_LANDED), step(STORED), prev) < 0 or nb == 0:
                    continue
                r = rows[nb]
                r["tile"].append((step(STORED) - prev) * us)
                r["wait Q"].append((step(Q_LANDED) - prev) * us)
                r["Q lat"].append((step(Q_LANDED) - at(c, i, Q_ISSUED)) * us)
                r["wait K0"].append((step(K0_LANDED) - step(Q_LANDED)) * us)
                r["turn"].append((step(TURN) - step(K0_LANDED)) * us)
                r["S0"].append((step(S0_DONE) - step(TURN)) * us)
                r["blocks"].append((step(LAST_PV_DONE) - step(S0_DONE)) * us)
                r["/blk"].append((step(LAST_PV_DONE) - step(S0_DONE)) * us / nb)
                r["epi"].append((step(STORED) - step(LAST_PV_DONE)) * us)
                r["look"].append((step(EPILOGUE_READY) - step(LAST_PV_DONE)) * us)
                r["O+LSE"].append((step(O_WRITTEN) - step(EPILOGUE_READY)) * us)
                r["tma"].append((step(STORED) - step(O_WRITTEN)) * us)
        tiles_per_cta.append(count)
    return rows, tiles_per_cta, span_ns


def trace_cell(hdim: int, causal: bool, seqlen: int, dtype: str, lse: bool) -> None:
    (shape,) = fa_grid(seqlens=[seqlen], hdims=[hdim], causal=[causal], dtype=dtype)
    q, k, v = make_inputs(shape, seed=0)
    spec = ops.select_spec(ops.active_profile(q.device), q.dtype, hdim, causal, seqlen, seqlen)
    steps, clocks = record(spec, q, k, v, lse)
    rows, tiles_per_cta, span_ns = summarise(steps, clocks, seqlen, spec.tile.block_m, spec.tile.block_n, causal,
                                             spec.tile.block_m // 64)
    print(f"\n{spec.name}: {hdim}:{int(causal)}:{seqlen} batch {shape.batch} heads {shape.heads}, "
          f"{len(tiles_per_cta)} CTAs, {min(tiles_per_cta)}-{max(tiles_per_cta)} tiles each, "
          f"kernel {span_ns / 1e3:.1f} us (globaltimer){', with LSE' if lse else ''}")
    print(f"{'blocks':>6} {'n':>6} " + " ".join(f"{c:>8}" for c in COLUMNS) + "   (us, mean per warpgroup-tile)")
    for nb in sorted(rows):
        r = rows[nb]
        print(f"{nb:>6} {len(r['tile']):>6} " + " ".join(f"{statistics.fmean(r[c]):8.2f}" for c in COLUMNS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default=DEFAULT_PROFILE)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--lse", action="store_true", help="launch with an LSE tensor (return_lse=True)")
    parser.add_argument("--flag", action="append", default=[], help="an nvcc flag on top of the profile's, "
                        "e.g. --flag=-DFLASHTUNE_SM90_WIDE_STORES=2 (repeatable)")
    parser.add_argument("cells", nargs="+", help="HDIM:CAUSAL:SEQLEN, e.g. 64:1:512")
    args = parser.parse_args()
    profile = find_profile(args.profile)
    ops.use_profile(dataclasses.replace(profile, nvcc_flags=profile.nvcc_flags + tuple(args.flag)))
    for cell in args.cells:
        hdim, causal, seqlen = (int(x) for x in cell.split(":"))
        trace_cell(hdim, bool(causal), seqlen, args.dtype, lse=args.lse)


if __name__ == "__main__":
    main()
