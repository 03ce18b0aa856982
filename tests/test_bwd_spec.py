"""BwdSpec, without a GPU: names, generated source, the shared-memory fit, and the refusal of calls
the backward kernel lacks."""
from __future__ import annotations

import pytest

from flashtune.kernels.bwd_spec import BwdSpec, bwd_smem_bytes, default_bwd_spec
from flashtune.kernels.spec import SpecError


def test_the_name_spells_out_the_kernel_and_the_source_instantiates_it():
    spec = BwdSpec("sm_90a", "bfloat16", 128, 4, True)
    assert spec.name == "flashtune_bwd_bf16_h128_64x64_w4_c_sm90a"
    assert "flashtune::bwd::Traits<__nv_bfloat16, 128, 4, true, false, 2, false>" in spec.source()
    assert "nullptr, *params" in spec.source() and "_dq(" not in spec.source()
    det = BwdSpec("sm_80", "float16", 64, 2, False, deterministic=True)
    assert det.name == "flashtune_bwd_f16_h64_32x32_w2_det_sm80"
    assert f"{det.name}_dq(" in det.source() and "Traits<__half, 64, 2, false, true, 2, false>" in det.source()
    assert det.source_hash() != BwdSpec("sm_80", "float16", 64, 2, False).source_hash()


@pytest.mark.parametrize("spec", [BwdSpec("sm_80", "float16", 64, 2, False, deterministic=True),
                                  BwdSpec("sm_90a", "bfloat16", 128, 8, True, wgmma=True),
                                  BwdSpec("sm_90", "bfloat16", 128, 8, False)])  # tiled
def test_every_library_runs_its_kernel_between_its_prep_and_finish_passes(spec):
    source = spec.source()
    prep, finish, group, *dq = spec.companion_names
    assert (prep, finish, group) == (f"{spec.name}_prep", f"{spec.name}_finish", f"{spec.name}_group")
    assert dq == ([f"{spec.name}_dq"] if spec.deterministic else [])
    assert spec.launch_order(True) == [prep, spec.name, *dq, finish, group]
    elem = "__half, 64" if spec.dtype == "float16" else "__nv_bfloat16, 128"
    # the finish pass reads dq_accum in the kernel's layout of it (the tiled kernel's strips); the
    # prep pass zeroes all of it in storage order, whatever the layout
    layout = f"flashtune::bwd::DqStrips<{spec.hdim}>" if spec.tiled else "flashtune::bwd::DqRows"  # never wgmma
    assert f"{prep}(const flashtune::BwdParams params)" in source and f"prep_body<{elem}>(params)" in source
    assert f"{finish}(const flashtune::BwdParams params)" in source
    assert f"finish_body<{elem}, {layout}>(params)" in source
    assert f"{group}(const flashtune::BwdParams params)" in source and f"group_body<{elem}>(params)" in source
    launcher = source[source.index(f'extern "C" int {spec.launcher_symbol}'):]
    assert f"launch_with_passes<{spec.hdim}>(\n      {prep}, {finish}, {group}, *params, stream," in launcher
    assert f"launch<Cfg>({spec.name}, " in launcher


def test_shared_memory_picks_the_warps_and_bad_specs_say_why():
    assert bwd_smem_bytes(128, 4) == 4 * 64 * 256 + 64 * 64 * 2 + 2 * 64 * 4
    assert default_bwd_spec("sm_89", "bfloat16", 128, False).warps == 4  # 74 KB fits the RTX parts' 99 KB
    with pytest.raises(SpecError, match="head dims 64, 128, 256, not 96"):
        BwdSpec("sm_90a", "bfloat16", 96, 4, False)
    with pytest.raises(SpecError, match="warps 16"):
        BwdSpec("sm_90a", "bfloat16", 64, 16, False)
    # 8 warps, the tiled layout (P^T beside dS^T): 128 keys x 64 queries at hdim 128, 128.5 KB, and
    # 128 x 128 at hdim 64, 129 KB: past the RTX parts' 99 KB
    assert bwd_smem_bytes(128, 8, tiled=True) == 2 * (128 + 64) * 256 + 2 * 128 * 64 * 2 + 2 * 64 * 4
    assert bwd_smem_bytes(64, 8, tiled=True) == 2 * (128 + 128) * 128 + 2 * 128 * 128 * 2 + 2 * 128 * 4
    wide = BwdSpec("sm_90a", "bfloat16", 128, 8, True)
    assert wide.name == "flashtune_bwd_bf16_h128_128x64_w8_c_sm90a" and wide.block_m == 64 and wide.tiled
    assert "Traits<__nv_bfloat16, 128, 8, true, false, 2, true>" in wide.source()
    # the 16-key layout's 8 warps at hdim 128 (115200 bytes) do not fit the RTX parts either
    with pytest.raises(SpecError, match="needs 115200 bytes"):
        BwdSpec("sm_89", "bfloat16", 128, 8, False)
    with pytest.raises(SpecError, match="the dQ kernel takes warps 4 or 2, not 8"):
        BwdSpec("sm_80", "bfloat16", 64, 8, False, deterministic=True)
    with pytest.raises(SpecError, match="dtype 'float32'"):
        BwdSpec("sm_90a", "float32", 64, 4, False)


def test_two_query_stages_where_they_fit_without_costing_ctas():
    """kQStages: the next query block loads under this one's math where a second stage of Q, dO and
    statistics fits the arch and keeps the CTAs an SM the registers allow (8 warps one, 4 two);
    pinned to the other count, the name says so."""
    from flashtune.kernels.bwd_spec import bwd_q_stages
    from flashtune.kernels.arch import get_arch

    one, two = bwd_smem_bytes(128, 8, tiled=True), bwd_smem_bytes(128, 8, q_stages=2, tiled=True)
    assert two - one == 2 * 64 * 256 + 2 * 64 * 4  # Q, dO and two rows of statistics
    h100, rtx, a100 = get_arch("sm_90a"), get_arch("sm_89"), get_arch("sm_80")
    assert [bwd_q_stages(h100, h, w) for h in (64, 128, 256) for w in (4, 8)] == [2] * 6
    assert bwd_q_stages(rtx, 128, 4) == 1  # 105 KB would not fit the RTX parts' 99 KB
    assert bwd_q_stages(rtx, 64, 4) == 1  # 57 KB: one CTA an SM instead of two
    assert bwd_q_stages(rtx, 64, 8) == 2  # 81 KB (the 16-key layout): 8 warps have the SM to themselves anyway
    assert bwd_q_stages(a100, 128, 4) == 1 and bwd_q_stages(a100, 128, 8) == 2
    assert bwd_q_stages(a100, 256, 8) == 1  # 209 KB past the A100's 163 KB
    spec = BwdSpec("sm_90a", "bfloat16", 128, 4, False)
    assert spec.q_stages == 2 and spec == BwdSpec("sm_90a", "bfloat16", 128, 4, False, q_stages=2)
    pinned = BwdSpec("sm_90a", "bfloat16", 128, 4, False, q_stages=1)
    assert pinned.name == "flashtune_bwd_bf16_h128_64x64_w4_q1_sm90a" and pinned.smem_bytes == bwd_smem_bytes(128, 4)
    assert "Traits<__nv_bfloat16, 128, 4, false, false, 1, false>" in pinned.source()
    assert pinned.source_hash() != spec.source_hash()
    with pytest.raises(SpecError, match="needs 107520 bytes of shared memory; sm_89 has"):
        BwdSpec("sm_89", "bfloat16", 128, 4, False, q_stages=2)
    with pytest.raises(SpecError, match="q_stages 3"):
        BwdSpec("sm_90a", "bfloat16", 128, 4, False, q_stages=3)
    with pytest.raises(SpecError, match="q_stages 1"):
        BwdSpec("sm_90a", "bfloat16", 128, 8, False, wgmma=True, q_stages=1)


def test_8_warps_tile_where_the_layout_fits_and_the_rtx_cards_keep_16_keys_a_warp():
    """kTiled: 8 warps take tiled_kernel.cuh's layout where its one stage fits the arch (at hdim 256
    FlashAttention-2's 64 x 64 tile, where the 16-key layout had two warps share 16 keys); the RTX
    parts' 99 KB keep the 16-key layout at hdim 64 (81 KB) rather than fall to 4 warps; pinned off
    the arch's choice, the name says so."""
    from flashtune.kernels.bwd_spec import mma_sync_bwd_tiled
    from flashtune.kernels.arch import get_arch

    h100, rtx, blackwell, a100 = (get_arch(a) for a in ("sm_90a", "sm_89", "sm_120", "sm_80"))
    assert [mma_sync_bwd_tiled(h100, h, 8) for h in (64, 128, 256)] == [True, True, True]
    # the A100's 163 KB hold even two stages (162 KB at hdim 64), and one at hdim 256 (145 KB)
    assert [mma_sync_bwd_tiled(a100, h, 8) for h in (64, 128, 256)] == [True, True, True]
    assert not mma_sync_bwd_tiled(rtx, 256, 8) and not mma_sync_bwd_tiled(blackwell, 256, 8)
    t256 = BwdSpec("sm_90a", "bfloat16", 256, 8, False)
    assert t256.tiled and (t256.block, t256.block_m, t256.q_stages) == (64, 64, 2)
    assert t256.name == "flashtune_bwd_bf16_h256_64x64_w8_sm90a"
    assert "Traits<__nv_bfloat16, 256, 8, false, false, 2, true>" in t256.source()
    assert t256.smem_bytes == 2 * 64 * 512 + 2 * (2 * 64 * 512 + 2 * 64 * 4) + 2 * 64 * 64 * 2
    assert BwdSpec("sm_80", "bfloat16", 256, 8, False).q_stages == 1  # two stages: 209 KB
    k16 = BwdSpec("sm_90a", "bfloat16", 256, 8, False, tiled=False)
    assert k16.name == "flashtune_bwd_bf16_h256_64x64_w8_k16_sm90a" and k16.source_hash() != t256.source_hash()
    assert not any(mma_sync_bwd_tiled(h100, h, w) for h in (64, 128) for w in (2, 4))
    for arch in ("sm_89", "sm_120"):
        rtx64 = BwdSpec(arch, "bfloat16", 64, 8, False)
        assert not rtx64.tiled and rtx64.block_m == 64 and rtx64.q_stages == 2
        assert rtx64.name == f"flashtune_bwd_bf16_h64_128x64_w8_{arch.replace('_', '')}"
        assert rtx64.smem_bytes == bwd_smem_bytes(64, 8, q_stages=2) <= get_arch(arch).max_smem_per_block
    assert not mma_sync_bwd_tiled(rtx, 64, 8) and not mma_sync_bwd_tiled(blackwell, 64, 8)
    tiled = BwdSpec("sm_90a", "bfloat16", 64, 8, True)
    assert tiled.tiled and tiled.name == "flashtune_bwd_bf16_h64_128x128_w8_c_sm90a"
    assert "Traits<__nv_bfloat16, 64, 8, true, false, 2, true>" in tiled.source()
    pinned = BwdSpec("sm_90a", "bfloat16", 64, 8, True, tiled=False)
    assert pinned.name == "flashtune_bwd_bf16_h64_128x64_w8_c_k16_sm90a" and pinned.block_m == 64
    assert "Traits<__nv_bfloat16, 64, 8, true, false, 2, false>" in pinned.source()
    assert pinned.source_hash() != tiled.source_hash()
    for bad in (dict(warps=4), dict(hdim=256, warps=4), dict(wgmma=True)):
        with pytest.raises(SpecError, match="the tiled layout is the mma.sync kernel's at 8 warps, "):
            BwdSpec(**{**dict(arch="sm_90a", dtype="bfloat16", hdim=64, warps=8, causal=False, tiled=True), **bad})
    with pytest.raises(SpecError, match="needs 165888 bytes of shared memory; sm_89 has"):
        BwdSpec("sm_89", "bfloat16", 64, 8, False, tiled=True, q_stages=2)


def test_build_takes_each_dtype_head_dim_and_mask_the_backward_has():
    from flashtune.kernels.bwd_spec import bwd_specs_for_profile
    from flashtune.kernels.profiles import find_profile

    profile = find_profile("rtx5090")
    specs = bwd_specs_for_profile(profile, arch="sm_120")
    assert {(s.dtype, s.hdim, s.causal) for s in specs} == {
        (d, h, c) for d in profile.dtypes for h in (64, 128, 256) if h in profile.head_dims for c in (False, True)}
    assert all(s.arch == "sm_120" and not s.deterministic for s in specs)
    assert bwd_specs_for_profile(profile, hdims=[96]) == []  # no backward at 96


def test_a_profile_becomes_a_backward_spec_in_one_place():
    from flashtune.kernels.bwd_spec import bwd_spec_for_profile
    from flashtune.kernels.profiles import find_profile

    profile = find_profile("h200")
    spec = bwd_spec_for_profile(profile, "bfloat16", 128, True, deterministic=True)
    assert spec == default_bwd_spec(profile.arch.name, "bfloat16", 128, True, True, profile.nvcc_flags)
    assert spec.name.endswith("_c_det_" + profile.arch.name.replace("_", "")) and not spec.wgmma
    # the sm90 family's: the wgmma kernel; the sm80 family on the same GPU: mma.sync
    assert bwd_spec_for_profile(profile, "bfloat16", 128, True).name == "flashtune_bwd_bf16_h128_128x64_wg2_c_sm90a"
    assert not bwd_spec_for_profile(find_profile("h200-sm80"), "bfloat16", 128, True).wgmma


def test_the_wgmma_kernel_is_named_by_its_shape_and_refuses_what_it_lacks():
    spec = BwdSpec("sm_90a", "float16", 64, 8, False, wgmma=True)
    assert spec.name == "flashtune_bwd_f16_h64_128x128_wg2_sm90a"  # 128 keys x 128 queries a step
    assert spec.threads == 384 and spec.block_m == 128
    assert "sm90_bwd::Traits<__half, 64, false>" in spec.source() and "__grid_constant__" in spec.source()
    assert spec.source_hash() != BwdSpec("sm_90a", "float16", 64, 4, False).source_hash()
    h128 = BwdSpec("sm_90a", "bfloat16", 128, 8, True, wgmma=True)
    assert h128.name == "flashtune_bwd_bf16_h128_128x64_wg2_c_sm90a"
    # K, V, two slots of Q, dO and statistics, two dS^T, two dQ staging tiles, the alignment's slack
    assert h128.smem_bytes == 2 * 32768 + 2 * (2 * 16384 + 512) + 2 * 16384 + 2 * 16384 + 1024
    assert "128, true>" in h128.source()
    with pytest.raises(SpecError, match="needs sm_90a, not sm_80"):
        BwdSpec("sm_80", "bfloat16", 128, 8, False, wgmma=True)
    with pytest.raises(SpecError, match="deterministic=True is the mma.sync kernel's"):
        BwdSpec("sm_90a", "bfloat16", 128, 8, False, deterministic=True, wgmma=True)


def test_hdim_256_shares_each_key_group_between_two_warps():
    """At hdim 256 two warps share 16 keys (each half the head dim of dK and dV), so 4 warps are 32
    keys x 32 queries and 8 warps 64 x 64, with P^T beside dS^T in shared memory; no wgmma kernel."""
    from flashtune.kernels.bwd_spec import bwd_spec_for_profile, default_bwd_tile, dq_kernel_smem_bytes
    from flashtune.kernels.arch import get_arch
    from flashtune.kernels.profiles import find_profile

    small = BwdSpec("sm_89", "bfloat16", 256, 4, True)
    assert small.name == "flashtune_bwd_bf16_h256_32x32_w4_c_sm89" and small.block_m == 32
    assert small.smem_bytes == 4 * 32 * 512 + 2 * 32 * 32 * 2 + 2 * 32 * 4  # 68.3 KB: fits the RTX parts
    assert "Traits<__nv_bfloat16, 256, 4, true, false, 1, false>" in small.source()
    wide = BwdSpec("sm_80", "float16", 256, 8, False)
    assert wide.name == "flashtune_bwd_f16_h256_64x64_w8_sm80" and wide.smem_bytes == 147968
    with pytest.raises(SpecError, match="needs 147968 bytes of shared memory; sm_120 has"):
        BwdSpec("sm_120", "float16", 256, 8, False)
    with pytest.raises(SpecError, match="at hdim 256 takes 4 or 8 warps, not 2"):
        BwdSpec("sm_90a", "bfloat16", 256, 2, False)
    with pytest.raises(SpecError, match="wgmma backward kernel takes head dims 64, 128, not 256"):
        BwdSpec("sm_90a", "bfloat16", 256, 8, False, wgmma=True)
    # deterministic: the dQ kernel's 64 queries of Q and dO beside 32 keys of K and V, 96 KB
    det = BwdSpec("sm_89", "bfloat16", 256, 4, False, deterministic=True)
    assert det.name.endswith("_det_sm89") and dq_kernel_smem_bytes(256, 4) == 98304
    # the sm90 family falls back to mma.sync at 256, with 4 warps on every arch
    assert default_bwd_tile("sm90", get_arch("sm_90a"), 256).kernel == "mma_sync"
    assert default_bwd_tile("sm80", get_arch("sm_120"), 256).warps == 4
    assert not bwd_spec_for_profile(find_profile("h200"), "bfloat16", 256, True).wgmma
