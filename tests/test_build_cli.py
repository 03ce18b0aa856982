"""`flashtune build` end to end without a GPU: the README's main job, narrowed to one head dim.

This is CI's sm_120 compile-check of the sm80 family and of the backward (test_build.py covers
sm_80 and sm_89).
"""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from flashtune.cli import cli

pytestmark = pytest.mark.slow


def test_cross_compiles_rtx5090_for_sm120_then_hits_the_cache():
    args = ["build", "--profile", "rtx5090", "--arch", "sm_120", "--hdim", "64", "--dtype", "bfloat16", "--no-decode",
            "--json"]  # the decode kernels' compiles are test_decode_spec.py's
    cold = CliRunner().invoke(cli, args)
    assert cold.exit_code == 0, cold.output
    report = json.loads(cold.output)
    names = [k["name"] for k in report["kernels"]]
    assert names == ["flashtune_C", "flashtune_fwd_sm80_bf16_h64_128x64_w4_s2_sm120",
                     "flashtune_fwd_sm80_bf16_h64_128x64_w4_s2_fp8qk_sm120",
                     "flashtune_fwd_sm80_bf16_h64_128x64_w4_s2_c_sm120",
                     "flashtune_fwd_sm80_bf16_h64_128x64_w4_s2_c_fp8qk_sm120",
                     "flashtune_bwd_bf16_h64_128x64_w8_sm120", "flashtune_bwd_bf16_h64_128x64_w8_c_sm120"]
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
    from flashtune.kernels.build import build_spec
    from flashtune.kernels.spec import KernelSpec
    from flashtune.kernels.tiles import TileConfig, sm90_tile
    from flashtune.kernels.toolchain import detect_toolchain
    from flashtune.commands.verify import sass_row

    spec = KernelSpec(family, arch, "bfloat16", 128, sm90_tile(*tile) if family == "sm90" else TileConfig(*tile),
                      False, fp8=True)
    result = build_spec(spec)
    assert result.spill_stores == 0 and result.registers
    cuobjdump = detect_toolchain().cuobjdump_path
    if cuobjdump is None:
        pytest.skip("cuobjdump not installed (pip install '.[test]' brings it)")
    row = sass_row(spec, result.library, result.spills, cuobjdump)
    assert row.ok is True and fp8_op in row.detail, row


@pytest.mark.parametrize("keys, causal", [
    ((("overlap", False),), False),  # one block at a time (and with it no pingpong, speculation or deferral)
    ((("pingpong", False),), False),
    ((("persistent", False),), False),  # one CTA per tile (and nothing to defer under)
    ((("lazy_rescale", False),), True),  # every block rescales O (and no speculative maxima)
    ((("spec_max", False),), True),
    ((("tma_store", False),), True),  # 16-byte direct stores
    ((("defer", False),), True),
    ((("flat", True),), True),  # hdim 128 causal 128x128: deferred, so flat tiles can run there
])
def test_sm90_schedule_variants_compile_without_spills_or_serialised_wgmma(keys, causal):
    """Each schedule field off its default (flashtune/kernels/schedule.py) still builds at hdim 128 128x128,
    with its code in the kernel's name (the default, all on, is test_sm90_kernel_compiles_with_hopper_sass)."""
    from flashtune.kernels.build import build_spec
    from flashtune.kernels.schedule import NAME_CODES
    from flashtune.kernels.spec import KernelSpec
    from flashtune.kernels.tiles import sm90_tile

    spec = KernelSpec("sm90", "sm_90a", "bfloat16", 128, sm90_tile(128, 128, 2, keys), causal)
    (name, value), = keys
    assert f"_{NAME_CODES[name][value]}" in spec.name and getattr(spec.schedule, name) == value
    result = build_spec(spec)  # raises on ptxas messages that wgmma was serialised (build.SERIALISING_WARNINGS)
    assert result.spill_stores == 0


def _sm90_128x128_sass(keys: tuple = (), hdim: int = 128, causal: bool = True, block_n: int = 128,
                       max_spill_stores: int = 0, stages: int = 2) -> str:
    """The SASS of the bf16 128x128 sm90 kernel (hdim 128, causal, 128 keys a block and 2 stages
    unless told) with these schedule keys (skips the test without cuobjdump)."""
    from flashtune.kernels.build import build_spec
    from flashtune.kernels.spec import KernelSpec
    from flashtune.kernels.tiles import sm90_tile
    from flashtune.kernels.toolchain import detect_toolchain
    from flashtune.commands.verify import parse_sass, run_cuobjdump

    cuobjdump = detect_toolchain().cuobjdump_path
    if cuobjdump is None:
        pytest.skip("cuobjdump not installed (pip install '.[test]' brings it)")
    spec = KernelSpec("sm90", "sm_90a", "bfloat16", hdim, sm90_tile(128, block_n, stages, keys), causal)
    result = build_spec(spec)
    assert result.spill_stores <= max_spill_stores
    sass = run_cuobjdump(cuobjdump, ["-sass", "-fun", spec.name, result.library]).stdout
    assert parse_sass(sass, spec.name)["found"]
    return sass


def test_spec_max_takes_a_blocks_exps_without_its_maximum():
    """spec_max (by default at hdim 64 and 128): the loop gains a third copy of a block's exps,
    with no maximum (no FMNMX, no shuffles, no alpha exps), followed by a warpgroup's vote
    (BAR.RED.OR) on whether S_j must be computed again: one more S (D/16 wgmmas) in the loop.
    Without it neither; at hdim 256 the default leaves it out (ptxas spilled)."""
    scores = 128 // 2
    spec, plain = (_sm90_128x128_sass(k) for k in ((), (("spec_max", False),)))
    assert spec.count("MUFU.EX2 ") == plain.count("MUFU.EX2 ") + scores
    assert spec.count("FMNMX") == plain.count("FMNMX")  # the maxima stay in the other two copies only
    assert spec.count("BAR.RED.OR") == 1 and plain.count("BAR.RED") == 0
    assert spec.count("HGMMA.") == plain.count("HGMMA.") + 128 // 16
    assert "BAR.RED" not in _sm90_128x128_sass((), hdim=256, block_n=64)


def test_spec_max_costs_the_160_register_tile_at_most_4_bytes():
    """The vote's barrier id is one more register through the loop: the 3-consumer hdim 64 tile (160
    registers a thread) spills 4 bytes for it, in the deferred epilogue (once a tile; the releases
    on the H200 ran this kernel), and nothing serialises the wgmmas; and the hdim 128 tile of the long
    cells, 128x176, spills nothing (mainloop.cuh: the K descriptors and the vote's barrier id)."""
    from flashtune.kernels.build import build_spec
    from flashtune.kernels.spec import KernelSpec
    from flashtune.kernels.tiles import sm90_tile

    result = build_spec(KernelSpec("sm90", "sm_90a", "bfloat16", 64, sm90_tile(192, 128, 2), False))
    assert result.spill_stores <= 4
    assert build_spec(KernelSpec("sm90", "sm_90a", "bfloat16", 128, sm90_tile(128, 176, 2), False)).spill_stores == 0


def test_lazy_rescale_lets_a_warp_skip_the_o_rescale():
    """The default (lazy_rescale): each softmax copy (the first block's and the loop's) ends in one
    warp vote on whether any row moved its maximum, and O's D/2 rescale multiplies sit behind a
    branch on it; eager (and with it no speculative maxima) there is no vote and every block rescales."""
    assert _sm90_128x128_sass(()).count("VOTE.ANY ") == 2
    assert _sm90_128x128_sass((("lazy_rescale", False),)).count("VOTE.ANY ") == 0


def test_flat_tiles_issue_a_tiles_last_pv_in_the_next_tiles_first_turn():
    """flat (by default in causal kernels at hdim 64): besides the first block's turn (S) and the
    loop's (S, P V), a turn that issues S_0 with the last tile's P V, and that P V alone for the
    CTA's last tile: at least one more S (D/16 wgmmas) and one more P V (BN/16) than without. The
    hdim 128 kernels take it only when a config says so."""
    def wgmmas(sass: str) -> int:
        return sass.count("HGMMA.")

    flat64, plain64 = (wgmmas(_sm90_128x128_sass(k, hdim=64)) for k in ((), (("flat", False),)))
    assert flat64 >= plain64 + 64 // 16 + 128 // 16
    default128 = wgmmas(_sm90_128x128_sass(()))
    assert default128 == wgmmas(_sm90_128x128_sass((("flat", False),)))
    assert wgmmas(_sm90_128x128_sass((("flat", True),))) >= default128 + 2 * 128 // 16


def _instructions(sass: str) -> list[str]:
    """A kernel's SASS instructions without their addresses (two builds compared line by line)."""
    import re

    return [re.sub(r"/\*[0-9a-f]+\*/", "", line).strip() for line in sass.splitlines()
            if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]


def test_a_tiles_pingpong_off_leaves_out_the_turns():
    """A profile config's `pingpong: false` (h200's hdim 64 causal below 2k): a kernel without the
    turns' hand-overs (BAR.ARV) that the default tile has, and otherwise the same loop."""
    off = _sm90_128x128_sass((("pingpong", False),), hdim=64, stages=3)
    on = _sm90_128x128_sass((), hdim=64, stages=3)
    assert len(_instructions(off)) > 1000
    assert "BAR.ARV" in on and "BAR.ARV" not in off
    assert off.count("HGMMA.") == on.count("HGMMA.") and off.count("MUFU.EX2") == on.count("MUFU.EX2")


def test_o_leaves_by_stmatrix_and_16_byte_stores():
    """The epilogue: O into shared memory for the TMA store by stmatrix (four 8x8 matrices, D/16 per
    thread), and where O is stored directly (varlen calls of the same kernel) 16 bytes per store.
    The deferred epilogue (the default at 128x128) inlines the epilogue at each place a tile's O is
    flushed, each copy D/16 stmatrix; undeferred there is one; without the TMA store, none."""
    sass = _sm90_128x128_sass(())
    copies, rest = divmod(sass.count("STSM.16.M88.4 "), 128 // 16)
    assert copies >= 1 and rest == 0 and "STG.E.128 " in sass
    undeferred = _sm90_128x128_sass((("defer", False),))
    assert undeferred.count("STSM.16.M88.4 ") == 128 // 16
    direct = _sm90_128x128_sass((("tma_store", False),))
    assert "STSM" not in direct and "STG.E.128 " in direct


def test_h200_profile_kernels_build_within_the_tuners_spill_limit():
    """Every 16-bit bf16 kernel the shipped h200 profile launches (the default schedule): ptxas
    accepts it and spills at most what `flashtune tune` tolerates (the hdim 64 3-warpgroup
    producer's persistent loop spills 60 bytes; measured harmless in the A/B)."""
    from flashtune.kernels.build import build_specs
    from flashtune.kernels.profiles import find_profile
    from flashtune.kernels.spec import specs_for_profile
    from flashtune.tuning.search import DEFAULT_MAX_SPILL_BYTES

    profile = find_profile("h200")
    specs = [s for s in specs_for_profile(profile, dtypes=["bfloat16"]) if not s.fp8]
    # one kernel per distinct (head dim, causal, tile) of the tuned table
    assert len(specs) == len({(c.hdim, causal, c.tile) for c in profile.configs
                              for causal in ((False, True) if c.causal is None else (c.causal,))})
    results, failures = build_specs(specs)
    assert not failures and len(results) == len(specs)
    assert all(r.spill_stores <= DEFAULT_MAX_SPILL_BYTES for r in results), [(r.spill_stores) for r in results]


@pytest.mark.parametrize("block_n, causal, keys, tma_store", [
    (128, True, (), True),  # hdim 128, 128x128: an O tile fits beside Q and the rings
    (176, False, (), False),  # 128x176: it does not, direct stores
    (128, True, (("tma_store", False),), False),  # turned off by a config
])
def test_sm90_tma_store_epilogue_is_where_an_o_tile_fits(block_n, causal, keys, tma_store):
    """The TMA-store epilogue (UTMASTG in the SASS) is in exactly the kernels that have room for
    it, and the reported shared memory counts its O tile."""
    from flashtune.kernels.build import build_spec
    from flashtune.kernels.spec import KernelSpec
    from flashtune.kernels.tiles import sm90_tile
    from flashtune.kernels.toolchain import detect_toolchain
    from flashtune.commands.verify import parse_sass, run_cuobjdump

    spec = KernelSpec("sm90", "sm_90a", "bfloat16", 128, sm90_tile(128, block_n, 2, keys), causal)
    assert spec.schedule.tma_store == tma_store
    result = build_spec(spec)
    q_and_rings = 2 * 128 * 128 + 2 * 2 * block_n * 128 * 2 + 1024
    second_q = 2 * 128 * 128 if spec.schedule.defer else 0
    assert result.smem_bytes == q_and_rings + second_q + (2 * 128 * 128 if tma_store else 0)
    cuobjdump = detect_toolchain().cuobjdump_path
    if cuobjdump is None:
        pytest.skip("cuobjdump not installed (pip install '.[test]' brings it)")
    sass = parse_sass(run_cuobjdump(cuobjdump, ["-sass", "-fun", spec.name, result.library]).stdout, spec.name)
    assert sass["found"] and any(m.startswith("UTMALDG") for m in sass["mnemonics"])
    assert any(m.startswith("UTMASTG") for m in sass["mnemonics"]) == tma_store, sorted(set(sass["mnemonics"]))


def test_sm90_kernel_compiles_with_hopper_sass():
    """CI's compile-check of the sm90 family: FA3's d128 tile, no serialised wgmma, HGMMA + TMA."""
    from flashtune.kernels.build import build_spec
    from flashtune.kernels.spec import KernelSpec
    from flashtune.kernels.tiles import sm90_tile
    from flashtune.kernels.toolchain import detect_toolchain
    from flashtune.commands.verify import sass_row

    spec = KernelSpec("sm90", "sm_90a", "bfloat16", 128, sm90_tile(128, 176, 2), False)
    result = build_spec(spec)  # raises on ptxas messages that wgmma was serialised (build.SERIALISING_WARNINGS)
    assert result.spill_stores == 0 and result.registers
    cuobjdump = detect_toolchain().cuobjdump_path
    if cuobjdump is None:
        pytest.skip("cuobjdump not installed (pip install '.[test]' brings it)")
    row = sass_row(spec, result.library, result.spills, cuobjdump)
    assert row.ok is True and "HGMMA" in row.detail and "UTMALDG" in row.detail, row


def test_sm90_hdim64_kernel_defers_its_epilogue_without_spills_or_serialised_wgmma():
    """The default hdim 64 kernels defer each tile's epilogue under the next tile's S_0 (O then lives
    across the tile loop beside S, with a second Q tile): the 3-consumer tile, 160 registers a
    thread, still builds clean (without speculative maxima, whose vote costs it 4 bytes: see above),
    and its reported shared memory counts the second Q."""
    from flashtune.kernels.build import build_spec
    from flashtune.kernels.spec import KernelSpec
    from flashtune.kernels.tiles import shared_memory_bytes, sm90_tile

    spec = KernelSpec("sm90", "sm_90a", "bfloat16", 64, sm90_tile(192, 128, 2, (("spec_max", False),)), False)
    result = build_spec(spec)  # raises on ptxas messages that wgmma was serialised (C7514/C7517/C7518 included)
    assert result.spill_stores == 0
    one_q = shared_memory_bytes("sm90", 64, sm90_tile(192, 128, 2, (("spec_max", False), ("defer", False))))
    assert result.smem_bytes == one_q + 192 * 64 * 2


def test_a_too_old_nvcc_is_an_input_error_said_once(monkeypatch):
    from flashtune.kernels.toolchain import Toolchain

    old = Toolchain(torch_version="2.14.1", torch_cuda="12.4", nvcc_path="/opt/cuda-12.4/bin/nvcc",
                    nvcc_version=(12, 4), cuda_home="/opt/cuda-12.4", ninja_version="1.13", cuobjdump_path=None)
    monkeypatch.setattr("flashtune.kernels.toolchain.detect_toolchain", lambda **_: old)
    result = CliRunner().invoke(cli, ["build", "--profile", "rtx5090", "--arch", "sm_120"])
    assert result.exit_code == 2
    assert result.output.count("cannot target sm_120") == 1 and ">= 12.8" in result.output


def test_verify_knows_the_hopper_backwards_sass():
    """verify's SASS row for the wgmma backward asks for wgmma, TMA loads and the dQ reduce-adds (not
    the mma.sync kernel's HMMA/LDSM/LDGSTS), and the compiled kernel has them."""
    from flashtune.commands.verify import sass_row
    from flashtune.kernels.build import build_spec
    from flashtune.kernels.bwd_spec import BwdSpec
    from flashtune.kernels.toolchain import detect_toolchain

    spec = BwdSpec("sm_90a", "bfloat16", 64, 8, True, wgmma=True)
    result = build_spec(spec)
    assert result.spill_stores == 0 and result.spill_loads == 0
    cuobjdump = detect_toolchain().cuobjdump_path
    if cuobjdump is None:
        pytest.skip("cuobjdump not installed (pip install '.[test]' brings it)")
    row = sass_row(spec, result.library, False, cuobjdump)
    assert row.ok, row.detail
    assert row.detail == "sm_90a: HGMMA, UTMALDG, UTMAREDG"
