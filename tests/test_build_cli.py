"""`flashtune build` end to end without a GPU: the README's main job, narrowed to one head dim.

This is CI's sm_120 compile-check of the sm80 family (test_build.py covers sm_80 and sm_89).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from flashtune.cli import cli

pytestmark = pytest.mark.slow


def test_cross_compiles_rtx5090_for_sm120_then_hits_the_cache():
    args = ["build", "--profile", "rtx5090", "--arch", "sm_120", "--hdim", "64", "--dtype", "bfloat16", "--json"]
    cold = CliRunner().invoke(cli, args)
    assert cold.exit_code == 0, cold.output
    report = json.loads(cold.output)
    names = [k["name"] for k in report["kernels"]]
    assert names == ["flashtune_C", "flashtune_fwd_sm80_bf16_h64_128x64_w4_s2_sm120",
                     "flashtune_fwd_sm80_bf16_h64_128x64_w4_s2_fp8qk_sm120",
                     "flashtune_fwd_sm80_bf16_h64_128x64_w4_s2_c_sm120",
                     "flashtune_fwd_sm80_bf16_h64_128x64_w4_s2_c_fp8qk_sm120"]
    kernels = report["kernels"][1:]
    assert all(not k["cache_hit"] and k["registers"] and k["spill_stores"] == 0 for k in kernels)
    warm = json.loads(CliRunner().invoke(cli, args).output)
    assert all(k["cache_hit"] and k["seconds"] < 1.0 for k in warm["kernels"])
    assert warm["seconds"] < 1.0


def test_unknown_profile_and_bad_arch_are_input_errors():
    result = CliRunner().invoke(cli, ["build", "--profile", "rtx9999"])
    assert result.exit_code == 2 and "rtx9999" in result.output
    result = CliRunner().invoke(cli, ["build", "--profile", "rtx5090", "--arch", "sm_42"])
    assert result.exit_code == 2 and "sm_42" in result.output


@pytest.mark.parametrize("family, arch, tile, fp8_op", [
    ("sm80", "sm_89", (128, 64, 4, 2), "QMMA.16832.F32.E4M3"),
    ("sm80", "sm_120", (128, 64, 4, 1), "QMMA.16832.F32.E4M3"),  # rtx5090.yaml's d128 tile
    ("sm90", "sm_90a", (128, 176, 2), "QGMMA"),
])
def test_fp8_qk_kernels_compile_with_fp8_tensor_core_sass(family, arch, tile, fp8_op):
    """CI's compile-check of the FP8 Q/K kernels: the FP8 MMA in the SASS, no local memory."""
    from flashtune.build import build_spec
    from flashtune.spec import KernelSpec
    from flashtune.tiles import TileConfig, sm90_tile
    from flashtune.toolchain import detect_toolchain
    from flashtune.verify import sass_row

    spec = KernelSpec(family, arch, "bfloat16", 128, sm90_tile(*tile) if family == "sm90" else TileConfig(*tile),
                      False, fp8=True)
    result = build_spec(spec)
    assert result.spill_stores == 0 and result.registers
    cuobjdump = detect_toolchain().cuobjdump_path
    if cuobjdump is None:
        pytest.skip("cuobjdump not installed (pip install '.[test]' brings it)")
    row = sass_row(spec, result.library, result.spills, cuobjdump)
    assert row["ok"] is True and fp8_op in row["detail"], row


@pytest.mark.parametrize("experiment, flag, causal", [
    ("exp-sm90-control", "-DFLASHTUNE_SM90_OVERLAP=0", False),
    ("exp-sm90-overlap", "-DFLASHTUNE_SM90_PINGPONG=0", False),
    ("exp-sm90-pingpong", "-DFLASHTUNE_SM90_PERSISTENT=0", False),
    ("exp-sm90-persistent-only", "-DFLASHTUNE_SM90_PERSISTENT=1", False),
    ("exp-sm90-qbuf2", "-DFLASHTUNE_SM90_Q_BUFFERS=2", True),  # causal 128x128 has room for 2 Q tiles
    ("exp-sm90-defer-hdim64", "-DFLASHTUNE_SM90_DEFER_EPILOGUE=1", True),  # hdim 128 undeferred, one Q tile
    ("exp-sm90-no-defer", "-DFLASHTUNE_SM90_DEFER_EPILOGUE=0", True),
    ("exp-sm90-persistent", "-DFLASHTUNE_SM90_TMA_STORE=0", True),
    ("exp-sm90-narrow-stores", "-DFLASHTUNE_SM90_WIDE_STORES=0", False),  # 128x176 stores O directly
    ("exp-sm90-tree-max", "-DFLASHTUNE_SM90_TREE_MAX=1", True),
    ("exp-sm90-poly-exp2-2", "-DFLASHTUNE_SM90_POLY_EXP2=2", False),
    ("exp-sm90-eager-rescale", "-DFLASHTUNE_SM90_LAZY_RESCALE=0", True),
    ("exp-sm90-wide8", "-DFLASHTUNE_SM90_WIDE_STORES=1", False),
    ("exp-sm90-trace", "-DFLASHTUNE_SM90_TRACE=1", True),  # tools/tile_trace.py's kernels
    ("exp-sm90-split-s", "-DFLASHTUNE_SM90_SPLIT_S=1", False),
    ("exp-sm90-q-in-regs", "-DFLASHTUNE_SM90_Q_IN_REGS=1", True),
    ("exp-sm90-skip-masked", "-DFLASHTUNE_SM90_SKIP_MASKED=1", True),
    ("exp-sm90-counter-memset", "-DFLASHTUNE_SM90_COUNTER_MEMSET=1", True),
    ("exp-sm90-flat-tiles", "-DFLASHTUNE_SM90_FLAT_TILES=1", True),  # hdim 128 causal below 4k: 128x128, deferred
    ("exp-sm90-mufu-turn", "-DFLASHTUNE_SM90_MUFU_TURN=1", False),
    ("exp-sm90-cluster", "-DFLASHTUNE_SM90_CLUSTER=1", False),
    ("exp-sm90-cudnn-like", "-DFLASHTUNE_SM90_OVERLAP=0", True),
    ("exp-sm90-half-diagonal", "-DFLASHTUNE_SM90_HALF_DIAGONAL=2", True),  # hdim 128 causal with the half block
    ("exp-sm90-no-pingpong", "-DFLASHTUNE_SM90_PINGPONG=0", True),
])
def test_sm90_schedule_variants_compile_without_spills_or_serialised_wgmma(experiment, flag, causal):
    """tools/experiments/ (issue 9): the schedule with steps turned off, or the next experiment on,
    still builds (the default, all on, is test_sm90_kernel_compiles_with_hopper_sass)."""
    from flashtune.build import build_spec
    from flashtune.profiles import find_profile
    from flashtune.spec import specs_for_profile

    profile = find_profile(str(Path(__file__).parents[1] / "tools" / "experiments" / f"{experiment}.yaml"))
    spec = specs_for_profile(profile, dtypes=["bfloat16"], hdims=[128], causal=causal)[0]
    result = build_spec(spec)  # raises on ptxas messages that wgmma was serialised (build.SERIALISING_WARNINGS)
    assert result.spill_stores == 0 and flag in spec.nvcc_flags_all()


def test_only_the_trace_build_exports_the_tile_timeline():
    """tools/tile_trace.py finds flashtune_trace_clear/_copy in a kernel library built with
    -DFLASHTUNE_SM90_TRACE=1 (exp-sm90-trace.yaml); a default build has neither, and no trace."""
    import shutil
    import subprocess

    from flashtune.build import build_spec
    from flashtune.profiles import find_profile
    from flashtune.spec import specs_for_profile

    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) not installed")

    def exported(profile_path: str) -> set[str]:
        spec = specs_for_profile(find_profile(profile_path), dtypes=["bfloat16"], hdims=[128], causal=True)[0]
        out = subprocess.run(["nm", "-D", "--defined-only", build_spec(spec).library], capture_output=True,
                             text=True, check=True).stdout
        return {line.split()[-1] for line in out.splitlines() if line.split()}

    trace = exported(str(Path(__file__).parents[1] / "tools" / "experiments" / "exp-sm90-trace.yaml"))
    assert {"flashtune_trace_clear", "flashtune_trace_copy"} <= trace
    assert not {"flashtune_trace_clear", "flashtune_trace_copy"} & exported("h200")


def _sm90_128x128_sass(flags: tuple[str, ...], hdim: int = 128, causal: bool = True, block_n: int = 128,
                       max_spill_stores: int = 0, stages: int = 2, pingpong: bool = True) -> str:
    """The SASS of the bf16 128x128 sm90 kernel (hdim 128, causal, 128 keys a block, 2 stages and
    the pingpong on unless told) built with these nvcc flags (skips the test without cuobjdump)."""
    from flashtune.build import build_spec
    from flashtune.spec import KernelSpec
    from flashtune.tiles import sm90_tile
    from flashtune.toolchain import detect_toolchain
    from flashtune.verify import parse_sass, run_cuobjdump

    cuobjdump = detect_toolchain().cuobjdump_path
    if cuobjdump is None:
        pytest.skip("cuobjdump not installed (pip install '.[test]' brings it)")
    spec = KernelSpec("sm90", "sm_90a", "bfloat16", hdim, sm90_tile(128, block_n, stages, pingpong), causal,
                      nvcc_flags=flags)
    result = build_spec(spec)
    assert result.spill_stores <= max_spill_stores
    sass = run_cuobjdump(cuobjdump, ["-sass", "-fun", spec.name, result.library]).stdout
    assert parse_sass(sass, spec.name)["found"]
    return sass


def test_poly_exp2_moves_k_of_every_8_exps_off_the_mufu_unit():
    """-DFLASHTUNE_SM90_POLY_EXP2=2 (without SPEC_MAX's third copy): the softmax's MUFU.EX2 count
    drops by 2/8 of a block's scores in each of its two copies (the first block's and the loop's);
    the rescale's 2 per copy stay on MUFU."""
    scores = 128 // 2  # per thread per block: a 64 x 128 S per warpgroup
    plain = ("-DFLASHTUNE_SM90_SPEC_MAX=0",)
    assert _sm90_128x128_sass(plain).count("MUFU.EX2 ") == 2 * scores + 4
    poly = _sm90_128x128_sass((*plain, "-DFLASHTUNE_SM90_POLY_EXP2=2"))
    assert poly.count("MUFU.EX2 ") == 2 * (scores - scores * 2 // 8) + 4


def test_spec_max_takes_a_blocks_exps_without_its_maximum():
    """SPEC_MAX (1 by default: hdim 64 and 128): the loop gains a third copy of a block's exps,
    with no maximum (no FMNMX, no shuffles, no alpha exps), followed by a warpgroup's vote
    (BAR.RED.OR) on whether S_j must be computed again: one more S (D/16 wgmmas) in the loop.
    With the flag at 0 neither; at hdim 256 the default leaves it out (ptxas spilled)."""
    scores = 128 // 2
    spec, plain = (_sm90_128x128_sass(f) for f in ((), ("-DFLASHTUNE_SM90_SPEC_MAX=0",)))
    assert spec.count("MUFU.EX2 ") == plain.count("MUFU.EX2 ") + scores
    assert spec.count("FMNMX") == plain.count("FMNMX")  # the maxima stay in the other two copies only
    assert spec.count("BAR.RED.OR") == 1 and plain.count("BAR.RED") == 0
    assert spec.count("HGMMA.") == plain.count("HGMMA.") + 128 // 16
    assert "BAR.RED" not in _sm90_128x128_sass((), hdim=256, block_n=64)


def test_spec_max_costs_the_160_register_tile_at_most_4_bytes():
    """The vote's barrier id is one more register through the loop: the 3-consumer hdim 64 tile (160
    registers a thread) spills 4 bytes for it, in the deferred epilogue (once a tile; the release
    on the H200 ran this kernel), and nothing serialises the wgmmas."""
    from flashtune.build import build_spec
    from flashtune.spec import KernelSpec
    from flashtune.tiles import sm90_tile

    result = build_spec(KernelSpec("sm90", "sm_90a", "bfloat16", 64, sm90_tile(192, 128, 2), False))
    assert result.spill_stores <= 4


def test_lazy_rescale_lets_a_warp_skip_the_o_rescale():
    """The default (LAZY_RESCALE=1): each softmax copy (the first block's and the loop's) ends
    in one warp vote on whether any row moved its maximum, and O's D/2 rescale multiplies sit
    behind a branch on it; with the flag at 0 there is no vote and every block rescales."""
    assert _sm90_128x128_sass(()).count("VOTE.ANY ") == 2
    assert _sm90_128x128_sass(("-DFLASHTUNE_SM90_LAZY_RESCALE=0",)).count("VOTE.ANY ") == 0


def test_flat_tiles_issue_a_tiles_last_pv_in_the_next_tiles_first_turn():
    """FLAT_TILES (2 by default: hdim 64 causal only): besides the first block's turn (S) and the
    loop's (S, P V), a turn that issues S_0 with the last tile's P V, and that P V alone for the
    CTA's last tile: at least one more S (D/16 wgmmas) and one more P V (BN/16) than with the
    flag at 0. The hdim 128 kernels keep the old schedule unless the flag is 1."""
    def wgmmas(sass: str) -> int:
        return sass.count("HGMMA.")

    flat64, plain64 = (wgmmas(_sm90_128x128_sass(f, hdim=64)) for f in ((), ("-DFLASHTUNE_SM90_FLAT_TILES=0",)))
    assert flat64 >= plain64 + 64 // 16 + 128 // 16
    default128 = wgmmas(_sm90_128x128_sass(()))
    assert default128 == wgmmas(_sm90_128x128_sass(("-DFLASHTUNE_SM90_FLAT_TILES=0",)))
    assert wgmmas(_sm90_128x128_sass(("-DFLASHTUNE_SM90_FLAT_TILES=1",))) >= default128 + 2 * 128 // 16


def test_half_diagonal_block_takes_s_on_its_first_half():
    """HALF_DIAGONAL=1 (exp-sm90-half-diagonal; hdim 64 causal): where a warpgroup's rows see only
    the first half of its tile's last block, S is one m64n128 k step and D/16 - 1 m64n64 ones (both
    operands from shared memory) in each of S's three copies (the first block's two turns and the
    loop's), P V the first half's k steps; by default, and in the non-causal kernel, no m64n64 S.
    The build itself fails if ptxas serialised the wgmmas (a path that leaves some accumulators
    out did)."""
    import re

    half_s = re.compile(r"HGMMA\.64x64x16\.F32\.BF16 R\d+, gdesc\[UR\d+\], R")
    flag = ("-DFLASHTUNE_SM90_HALF_DIAGONAL=1",)
    assert len(half_s.findall(_sm90_128x128_sass(flag, hdim=64))) == 3 * (64 // 16 - 1)
    assert not half_s.search(_sm90_128x128_sass((), hdim=64))
    assert not half_s.search(_sm90_128x128_sass(flag, hdim=64, causal=False))


def test_s_ahead_issues_s_one_block_ahead_in_its_own_copies():
    """S_AHEAD=1 (exp-sm90-s-ahead; hdim 64 causal 128x128, measured slower on the H200): S is
    issued in each of the first turn's four paths (with or without a carried P V, with or without
    S_1 ahead), S_(j+1) in the two unrolled loop blocks that have a next block, and SPEC_MAX's S
    again in all four loop blocks: 12 S of D/16 m64n128 wgmmas against the default's 4, and the
    softmax waits with one group (S_(j+1)) still in flight. The scalars it spills stay at 20 bytes,
    nothing serialises the wgmmas (the build checks), and kernels without room for a second S
    (hdim 128) are built as by default."""
    import re

    s_wgmma = re.compile(r"HGMMA\.64x128x16\.F32\.BF16 ")
    flag = ("-DFLASHTUNE_SM90_S_AHEAD=1",)
    ahead = _sm90_128x128_sass(flag, hdim=64, max_spill_stores=20)
    default = _sm90_128x128_sass((), hdim=64)
    assert len(s_wgmma.findall(default)) == 4 * (64 // 16)
    assert len(s_wgmma.findall(ahead)) == 12 * (64 // 16)
    assert ahead.count("DEPBAR.LE gsb0, 0x1") >= default.count("DEPBAR.LE gsb0, 0x1") + 2
    assert _sm90_128x128_sass(flag).count("HGMMA.") == _sm90_128x128_sass(()).count("HGMMA.")


def _instructions(sass: str) -> list[str]:
    """A kernel's SASS instructions without their addresses (two builds compared line by line)."""
    import re

    return [re.sub(r"/\*[0-9a-f]+\*/", "", line).strip() for line in sass.splitlines()
            if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]


def test_a_tiles_pingpong_off_builds_the_kernel_the_flag_measured():
    """A profile config's `pingpong: false` (h200's hdim 64 causal below 2k) gives exactly the kernel
    that -DFLASHTUNE_SM90_PINGPONG=0 built for the A/B that chose it (exp-sm90-no-pingpong), and one
    without the turns' hand-overs (BAR.ARV) that the default tile has."""
    off = _sm90_128x128_sass((), hdim=64, stages=3, pingpong=False)
    flag = _sm90_128x128_sass(("-DFLASHTUNE_SM90_PINGPONG=0",), hdim=64, stages=3)
    on = _sm90_128x128_sass((), hdim=64, stages=3)
    assert len(_instructions(off)) > 1000
    assert _instructions(off) == _instructions(flag)
    assert "BAR.ARV" in on and "BAR.ARV" not in off


def test_cluster_multicasts_each_kv_block_and_releases_its_slot_in_both_ctas():
    """CLUSTER=1 (exp-sm90-cluster.yaml): a non-causal hdim 128 kernel loads its K and V halves as
    multicast TMA boxes (one per 64-column panel of each: 2 + 2) and its consumers' releases are
    remote arrives, without the GPU-wide memory barrier that .release.cluster adds to each (4 more);
    causal kernels and the default build load as before."""
    cluster = _sm90_128x128_sass(("-DFLASHTUNE_SM90_CLUSTER=1",), causal=False)
    default = _sm90_128x128_sass((), causal=False)
    assert cluster.count("UTMALDG.4D.MULTICAST") == 4 and "MULTICAST" not in default
    assert "SYNCS.ARRIVE.TRANS64.RED" in cluster and "UCGABAR_WAIT" in cluster
    assert cluster.count("MEMBAR.ALL.GPU") <= 1  # the barrier-init fence's, once; none per release
    assert "MULTICAST" not in _sm90_128x128_sass(("-DFLASHTUNE_SM90_CLUSTER=1",))


def test_split_tail_merges_pieces_without_spills():
    """SPLIT_TAIL=1 (exp-sm90-split-tail.yaml): a non-causal kernel counts each finished piece of a
    split tile on a global counter (an atomic add, and the last piece's exchange back to 0) and
    merges the others' partial results read past L1 (ld.global.cg); no spills (the helper checks).
    Causal kernels and the default build have no merge."""
    split = _sm90_128x128_sass(("-DFLASHTUNE_SM90_SPLIT_TAIL=1",), causal=False)
    default = _sm90_128x128_sass((), causal=False)
    assert "LDG.E.STRONG.GPU" in split and "LDG.E.STRONG.GPU" not in default
    assert split.count("ATOMG.E.EXCH") > default.count("ATOMG.E.EXCH")  # beside the tile counter's (per inlined epilogue)
    causal = _sm90_128x128_sass(("-DFLASHTUNE_SM90_SPLIT_TAIL=1",))
    assert "LDG.E.STRONG.GPU" not in causal


def test_split_tail_rule_is_the_launchers():
    """flashtune.tiles.sm90_split_tail_tiles (which the GPU tests choose their shapes by) gives what
    csrc/sm90/launch.cuh's split_tail_tiles does, over a grid of calls: a host program built by nvcc."""
    import itertools
    import subprocess
    import tempfile

    from flashtune.paths import csrc_dir
    from flashtune.tiles import sm90_split_tail_tiles
    from flashtune.toolchain import detect_toolchain

    nvcc = detect_toolchain().nvcc_path
    if nvcc is None:
        pytest.skip("no nvcc")
    cases = list(itertools.product([1, 60, 68, 130, 131, 132, 200, 264, 2048, 2112, 3072, 10**6],
                                   [132, 264], [1, 4, 7, 8, 12, 94, 10**5], [1, 2, 3]))
    program = "#include \"sm90/launch.cuh\"\n#include <cstdio>\nint main() {\n" + "".join(
        f"  printf(\"%d\\n\", flashtune::sm90::split_tail_tiles({t}, {c}, {b}, {w}));\n" for t, c, b, w in cases) + "}\n"
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "rule.cu", Path(tmp) / "rule"
        src.write_text(program)
        subprocess.run([nvcc, "-std=c++17", "-arch=sm_90a", f"-I{csrc_dir()}", str(src), "-o", str(exe)],
                       check=True, capture_output=True)
        got = [int(x) for x in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()]
    assert got == [sm90_split_tail_tiles(*case) for case in cases]
    assert sm90_split_tail_tiles(2048, 132, 94, 2) == 68  # hdim 128 non-causal 16k on the H200
    assert sm90_split_tail_tiles(3072, 132, 4, 3) == 0  # hdim 64 512: 4-block tiles stay whole


def test_split_s_issues_each_block_as_two_halves_waited_for_in_turn():
    """-DFLASHTUNE_SM90_SPLIT_S=1: S = Q K^T of a 128-key block is two groups of m64n64 wgmmas (8
    k-steps each at hdim 128), and the loop waits for them one at a time (wait_group 2, then 1,
    then 0 for P V); the default issues m64n128 and waits with at most one group outstanding."""
    default = _sm90_128x128_sass(())
    assert "HGMMA.64x64x16" not in default and "DEPBAR.LE gsb0, 0x2" not in default
    split = _sm90_128x128_sass(("-DFLASHTUNE_SM90_SPLIT_S=1",))
    assert split.count("HGMMA.64x64x16") % (2 * 8) == 0 and split.count("HGMMA.64x64x16") >= 2 * 2 * 8
    assert "HGMMA.64x128x16.F32.BF16 R" in split  # P V keeps N = head dim
    assert "DEPBAR.LE gsb0, 0x2" in split


def test_q_in_regs_loads_q_by_ldmatrix_and_s_takes_it_from_registers():
    """-DFLASHTUNE_SM90_Q_IN_REGS=1: Q's fragments come from D/16 ldmatrix.x4 per tile, and every
    S wgmma (three copies, the first block's, the loop's and SPEC_MAX's second S, of D/16 k steps)
    takes A from registers with K-major B; by default S reads Q from shared memory (both operands
    descriptors)."""
    import re

    rs_s = re.compile(r"HGMMA\.64x128x16\.F32\.BF16 R\d+, R\d+, gdesc\[UR\d+\](?!\.tnspB)")
    default = _sm90_128x128_sass(())
    assert "LDSM" not in default and not rs_s.search(default)
    q_regs = _sm90_128x128_sass(("-DFLASHTUNE_SM90_Q_IN_REGS=1",))
    assert q_regs.count("LDSM.16.M88.4 ") == 128 // 16
    assert len(rs_s.findall(q_regs)) == 3 * 128 // 16


def test_skip_masked_adds_a_masked_copy_of_the_exps():
    """-DFLASHTUNE_SM90_SKIP_MASKED=1 (which turns SPEC_MAX off): each softmax copy (the first
    block's and the loop's) gets a second copy of its exps for masked blocks, where each 8-key
    group sits behind a branch; without it one copy each (scores per thread per block = 128 / 2 at
    128x128)."""
    scores = 128 // 2
    assert _sm90_128x128_sass(("-DFLASHTUNE_SM90_SPEC_MAX=0",)).count("MUFU.EX2 ") == 2 * scores + 4
    assert _sm90_128x128_sass(("-DFLASHTUNE_SM90_SKIP_MASKED=1",)).count("MUFU.EX2 ") == 4 * scores + 4


def test_o_leaves_by_stmatrix_and_16_byte_stores():
    """The epilogue's defaults: O into shared memory for the TMA store by stmatrix (four 8x8
    matrices, D/16 per thread), and where O is stored directly (varlen calls of the same kernel)
    16 bytes per store; the flags bring back 32-bit shared stores and 8-byte global ones. The
    deferred epilogue (the default at 128x128) inlines the epilogue at each place a tile's O is
    flushed, each copy D/16 stmatrix; undeferred there is one."""
    sass = _sm90_128x128_sass(())
    copies, rest = divmod(sass.count("STSM.16.M88.4 "), 128 // 16)
    assert copies >= 1 and rest == 0 and "STG.E.128 " in sass
    undeferred = _sm90_128x128_sass(("-DFLASHTUNE_SM90_DEFER_EPILOGUE=0",))
    assert undeferred.count("STSM.16.M88.4 ") == 128 // 16
    assert "STSM" not in _sm90_128x128_sass(("-DFLASHTUNE_SM90_STMATRIX=0",))
    assert "STG.E.128 " not in _sm90_128x128_sass(("-DFLASHTUNE_SM90_WIDE_STORES=1",))


def test_h200_profile_kernels_build_within_the_tuners_spill_limit():
    """Every 16-bit bf16 kernel the shipped h200 profile launches (the default schedule): ptxas
    accepts it and spills at most what `flashtune tune` tolerates (the hdim 64 3-warpgroup
    producer's persistent loop spills 60 bytes; measured harmless in the A/B)."""
    from flashtune.build import build_specs
    from flashtune.profiles import find_profile
    from flashtune.spec import specs_for_profile
    from flashtune.tune import DEFAULT_MAX_SPILL_BYTES

    profile = find_profile("h200")
    specs = [s for s in specs_for_profile(profile, dtypes=["bfloat16"]) if not s.fp8]
    # one kernel per distinct (head dim, causal, tile) of the tuned table
    assert len(specs) == len({(c.hdim, causal, c.tile) for c in profile.configs
                              for causal in ((False, True) if c.causal is None else (c.causal,))})
    results, failures = build_specs(specs)
    assert not failures and len(results) == len(specs)
    assert all(r.spill_stores <= DEFAULT_MAX_SPILL_BYTES for r in results), [(r.spill_stores) for r in results]


@pytest.mark.parametrize("block_n, causal, flags, tma_store", [
    (128, True, (), True),  # hdim 128, 128x128: an O tile fits beside Q and the rings
    (176, False, (), False),  # 128x176: it does not, direct stores
    (128, True, ("-DFLASHTUNE_SM90_TMA_STORE=0",), False),  # turned off by the flag
])
def test_sm90_tma_store_epilogue_is_where_an_o_tile_fits(block_n, causal, flags, tma_store):
    """The TMA-store epilogue (UTMASTG in the SASS) is in exactly the kernels that have room for
    it, and the reported shared memory counts its O tile."""
    from flashtune.build import build_spec
    from flashtune.spec import KernelSpec
    from flashtune.tiles import sm90_tile, shared_memory_bytes
    from flashtune.toolchain import detect_toolchain
    from flashtune.verify import parse_sass, run_cuobjdump

    spec = KernelSpec("sm90", "sm_90a", "bfloat16", 128, sm90_tile(128, block_n, 2), causal, nvcc_flags=flags)
    result = build_spec(spec)
    o_tile = 2 * spec.tile.block_m * 128
    no_o = shared_memory_bytes("sm90", 128, spec.tile, nvcc_flags=("-DFLASHTUNE_SM90_TMA_STORE=0",))
    assert shared_memory_bytes("sm90", 128, spec.tile, nvcc_flags=spec.nvcc_flags) == no_o + (o_tile if tma_store else 0)
    cuobjdump = detect_toolchain().cuobjdump_path
    if cuobjdump is None:
        pytest.skip("cuobjdump not installed (pip install '.[test]' brings it)")
    sass = parse_sass(run_cuobjdump(cuobjdump, ["-sass", "-fun", spec.name, result.library]).stdout, spec.name)
    assert sass["found"] and any(m.startswith("UTMALDG") for m in sass["mnemonics"])
    assert any(m.startswith("UTMASTG") for m in sass["mnemonics"]) == tma_store, sorted(set(sass["mnemonics"]))


def test_sm90_kernel_compiles_with_hopper_sass():
    """CI's compile-check of the sm90 family: FA3's d128 tile, no serialised wgmma, HGMMA + TMA."""
    from flashtune.build import build_spec
    from flashtune.spec import KernelSpec
    from flashtune.tiles import sm90_tile
    from flashtune.toolchain import detect_toolchain
    from flashtune.verify import sass_row

    spec = KernelSpec("sm90", "sm_90a", "bfloat16", 128, sm90_tile(128, 176, 2), False)
    result = build_spec(spec)  # raises on ptxas messages that wgmma was serialised (build.SERIALISING_WARNINGS)
    assert result.spill_stores == 0 and result.registers
    cuobjdump = detect_toolchain().cuobjdump_path
    if cuobjdump is None:
        pytest.skip("cuobjdump not installed (pip install '.[test]' brings it)")
    row = sass_row(spec, result.library, result.spills, cuobjdump)
    assert row["ok"] is True and "HGMMA" in row["detail"] and "UTMALDG" in row["detail"], row


def test_sm90_hdim64_kernel_defers_its_epilogue_without_spills_or_serialised_wgmma():
    """The default hdim 64 kernels defer each tile's epilogue under the next tile's S_0 (O then lives
    across the tile loop beside S, with a second Q tile): the 3-consumer tile, 160 registers a
    thread, still builds clean (without SPEC_MAX, whose vote costs it 4 bytes: see below), and its
    reported shared memory counts the second Q."""
    from flashtune.build import build_spec
    from flashtune.spec import KernelSpec
    from flashtune.tiles import sm90_tile, shared_memory_bytes

    spec = KernelSpec("sm90", "sm_90a", "bfloat16", 64, sm90_tile(192, 128, 2), False,
                      nvcc_flags=("-DFLASHTUNE_SM90_SPEC_MAX=0",))
    result = build_spec(spec)  # raises on ptxas messages that wgmma was serialised (C7514/C7517/C7518 included)
    assert result.spill_stores == 0
    one_q = shared_memory_bytes("sm90", 64, spec.tile, nvcc_flags=("-DFLASHTUNE_SM90_DEFER_EPILOGUE=0",))
    assert result.smem_bytes == one_q + 192 * 64 * 2


def test_sm90_two_ctas_an_sm_halve_the_registers_a_64_row_tile_launches_with():
    """-DFLASHTUNE_SM90_CTAS_PER_SM=2 (tools/experiments/exp-sm90-two-ctas.yaml): a 64-row tile's
    kernel is bounded to two CTAs an SM, so ptxas gives it at most 65536 / 2 / 256 = 128 registers a
    thread at launch (setmaxnreg then moves them to the consumer), and it still builds clean."""
    from flashtune.build import build_spec
    from flashtune.spec import KernelSpec
    from flashtune.tiles import sm90_tile

    spec = KernelSpec("sm90", "sm_90a", "bfloat16", 64, sm90_tile(64, 128, 2), True,
                      nvcc_flags=("-DFLASHTUNE_SM90_CTAS_PER_SM=2",))
    result = build_spec(spec)  # raises on serialised wgmma or an ignored setmaxnreg (C7508)
    assert result.spill_stores == 0 and result.registers <= 128, result


def test_a_too_old_nvcc_is_an_input_error_said_once(monkeypatch):
    from flashtune.toolchain import Toolchain

    old = Toolchain(torch_version="2.14.1", torch_cuda="12.4", nvcc_path="/opt/cuda-12.4/bin/nvcc",
                    nvcc_version=(12, 4), cuda_home="/opt/cuda-12.4", ninja_version="1.13", cuobjdump_path=None)
    monkeypatch.setattr("flashtune.toolchain.detect_toolchain", lambda **_: old)
    result = CliRunner().invoke(cli, ["build", "--profile", "rtx5090", "--arch", "sm_120"])
    assert result.exit_code == 2
    assert result.output.count("cannot target sm_120") == 1 and ">= 12.8" in result.output
