"""csrc/backward/dq_layout.cuh on the host (nvcc, no GPU): DqStrips puts every (row, col) of dQ's fp32
sum at its own place among the tensor's rows (so the prep pass, which zeroes the tensor in storage
order, zeroes every place), the finish pass's offset() and the tiled kernel's steps from place()
agree, and each accumulator half a warp adds is one 256-byte piece."""
from __future__ import annotations

import subprocess

import pytest

from flashtune.kernels.toolchain import detect_toolchain
from flashtune.paths import csrc_dir

# Prints, per head dim and row count, every element's offset in dq_accum (row stride 3 x hdim: heads
# interleaved), then the tiled kernel's offsets for each (row, first column of a warp's run, n8 tile).
PROGRAM = r"""
#include <cstdio>
#include "backward/dq_layout.cuh"
using namespace flashtune::bwd;
template <int D> void dump(int rows) {
  const long stride = 3 * D;
  std::printf("layout %d %d\n", D, rows);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < D; ++c) std::printf("%lld ", (long long)DqStrips<D>::offset(r, c, rows, stride));
  std::printf("\nkernel\n");
  constexpr int kRun = 8 * DqStrips<D>::kTilesPerRow;
  for (int r = 0; r < rows; ++r)
    for (int c0 = 0; c0 < D; c0 += kRun)
      for (int lane_col = 0; lane_col < 8; lane_col += 2) {
        const auto p = DqStrips<D>::place(r, c0 + lane_col, rows, stride);
        for (int dt = 0; c0 + dt * 8 < D && dt < 4; ++dt) {
          const long long kernel = p.at + (dt / DqStrips<D>::kTilesPerRow) * p.tiles +
                                   (dt % DqStrips<D>::kTilesPerRow) * p.tile;
          std::printf("%d %d %lld %lld\n", r, c0 + dt * 8 + lane_col, kernel,
                      (long long)DqStrips<D>::offset(r, c0 + dt * 8 + lane_col, rows, stride));
        }
      }
  std::printf("end\n");
}
int main() {
  for (int rows : {1, 7, 8, 9, 16, 63, 64, 130}) { dump<64>(rows); dump<128>(rows); }
  return 0;
}
"""


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    tc = detect_toolchain()
    if tc.nvcc_path is None:
        pytest.skip("no nvcc")
    folder = tmp_path_factory.mktemp("dq_layout")
    (folder / "dump.cu").write_text(PROGRAM)
    proc = subprocess.run([tc.nvcc_path, "-std=c++17", f"-I{csrc_dir()}", str(folder / "dump.cu"), "-o",
                           str(folder / "dump")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = subprocess.run([str(folder / "dump")], capture_output=True, text=True, check=True).stdout.splitlines()
    out, i = [], 0
    while i < len(lines):
        _, hdim, rows = lines[i].split()
        offsets = list(map(int, lines[i + 1].split()))
        assert lines[i + 2] == "kernel"
        j = i + 3
        steps = []
        while lines[j] != "end":
            steps.append(tuple(map(int, lines[j].split())))
            j += 1
        out.append((int(hdim), int(rows), offsets, steps))
        i = j + 1
    return out


def test_every_element_has_its_own_place_within_its_rows(dumps):
    for hdim, rows, offsets, _ in dumps:
        stride = 3 * hdim
        assert len(set(offsets)) == rows * hdim, (hdim, rows)
        # within the tensor's rows and this head's columns: another head's elements are untouched
        assert all(o // stride < rows and o % stride < hdim for o in offsets), (hdim, rows)


def test_whole_strips_hold_8x8_tiles_and_a_partial_strip_stays_row_major(dumps):
    for hdim, rows, offsets, _ in dumps:
        stride = 3 * hdim
        at = {(r, c): offsets[r * hdim + c] for r in range(rows) for c in range(hdim)}
        for r0 in range(0, rows, 8):
            if r0 + 8 > rows:
                assert all(at[r, c] == r * stride + c for r in range(r0, rows) for c in range(hdim))
                continue
            for c0 in range(0, hdim, 8):
                piece = sorted(at[r, c] for r in range(r0, r0 + 8) for c in range(c0, c0 + 8))
                assert piece == list(range(piece[0], piece[0] + 64)) and piece[0] % 64 == 0, (hdim, rows, r0, c0)


def test_the_kernels_steps_reach_the_passes_places(dumps):
    for hdim, rows, _, steps in dumps:
        assert steps and all(kernel == passes for _, _, kernel, passes in steps), (hdim, rows)
