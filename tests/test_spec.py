"""KernelSpec: names, generated source, cache key, and the specs a profile asks for."""
from __future__ import annotations

import pytest

from flashtune.kernels.profiles import find_profile
from flashtune.kernels.spec import KernelSpec, SpecError, specs_for_profile
from flashtune.kernels.tiles import TileConfig, sm90_tile


def _spec(**kw):
    args = dict(family="sm80", arch="sm_89", dtype="bfloat16", hdim=128, tile=TileConfig(128, 64, 4, 2),
                causal=False)
    args.update(kw)
    return KernelSpec(**args)


def test_name_spells_out_the_configuration():
    assert _spec().name == "flashtune_fwd_sm80_bf16_h128_128x64_w4_s2_sm89"
    assert _spec(dtype="float16", hdim=64, causal=True, arch="sm_120").name == \
        "flashtune_fwd_sm80_f16_h64_128x64_w4_s2_c_sm120"
    assert _spec(arch="sm_90").name.endswith("_sm90")


def test_source_defines_exactly_that_extern_c_kernel_and_launcher():
    spec = _spec(causal=True)
    src = spec.source()
    assert f'extern "C" __global__ void __launch_bounds__(Cfg::kThreads, 1)\n{spec.name}(' in src
    assert f'extern "C" int {spec.name}_launch(' in src
    assert "Traits<__nv_bfloat16, 128, 128, 64, 4, 2, true>" in src


def test_cache_key_follows_everything_the_build_reads():
    base = _spec()
    assert base.source_hash() == _spec().source_hash()
    assert base.source_hash() != _spec(nvcc_flags=("-DFOO",)).source_hash()
    assert base.source_hash() != _spec(causal=True).source_hash()
    assert base.source_hash() != _spec(arch="sm_120").source_hash()


def test_specs_are_hashable_and_equal_by_value():
    assert len({_spec(), _spec(), _spec(causal=True)}) == 2


@pytest.mark.parametrize("kw, message", [
    (dict(dtype="float32"), "dtype 'float32' is not supported"),
    (dict(fp8=True, arch="sm_80"), "sm_80 has no FP8 tensor cores"),
    (dict(tile=TileConfig(128, 64, 2, 2)), "rows per warp"),
    (dict(hdim=96), "head dim 96 is not built by family sm80"),
    (dict(hdim=192), "head dim 192 is not built by family sm80"),
    (dict(tile=TileConfig(128, 128, 4, 3), hdim=256), "128x128_w4_s3"),
])
def test_unbuildable_specs_are_refused_with_the_reason(kw, message):
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        _spec(**kw)


def test_specs_for_profile_cover_dtypes_hdims_and_both_causal_flags():
    profile = find_profile("rtx5090")
    specs = specs_for_profile(profile)
    assert {s.dtype for s in specs} == set(profile.dtypes)
    assert {s.hdim for s in specs} == set(profile.head_dims)
    assert {s.causal for s in specs} == {False, True}
    assert all(s.arch == "sm_120" for s in specs)
    narrowed = specs_for_profile(profile, dtypes=["bfloat16"], hdims=[64])
    assert {(s.dtype, s.hdim) for s in narrowed} == {("bfloat16", 64)}
    # causal and not, each as a 16-bit kernel and (fp8: {qk: e4m3}) its FP8 Q/K twin
    assert sorted((s.causal, s.fp8) for s in narrowed) == [(False, False), (False, True), (True, False), (True, True)]


def test_an_sm90_profile_builds_192_without_fp8_twins_and_its_decode_kernels_too():
    from flashtune.kernels.decode_spec import decode_specs_for_profile

    profile = find_profile("h200")
    at_192 = [s for s in specs_for_profile(profile) if s.hdim == 192]
    assert {(s.dtype, s.causal) for s in at_192} == {(d, c) for d in profile.dtypes for c in (False, True)}
    assert not any(s.fp8 for s in at_192)  # FP8 Q/K rows of 192 bytes are not whole swizzle panels
    assert all(s.tile.shape_label == "128x112_wg2_s2" for s in at_192)
    assert {s.hdim for s in decode_specs_for_profile(profile) if not s.kv_fp8} == {64, 128, 192, 256}
    with pytest.raises(SpecError, match="head dim 192 has no FP8 Q/K kernel"):
        _spec(family="sm90", arch="sm_90a", tile=sm90_tile(128, 112, 2), hdim=192, fp8=True)


@pytest.mark.slow
def test_the_192_kernel_compiles_without_spills_on_wgmma():
    """The sm90 kernel at 192 is the 64/128/256 template at another size: ptxas's registers and spills,
    and wgmma in its SASS, before a GPU runs it (168 registers, no spills with nvcc 13.0)."""
    import subprocess

    from flashtune.kernels.build import build_specs
    from flashtune.kernels.toolchain import detect_toolchain

    cuobjdump = detect_toolchain().cuobjdump_path
    if cuobjdump is None:
        pytest.skip("cuobjdump not installed (pip install '.[test]' brings it)")
    spec = next(s for s in specs_for_profile(find_profile("h200"), dtypes=["bfloat16"], hdims=[192]) if s.causal)
    results, failures = build_specs([spec], jobs=1)
    assert not failures, failures
    assert results[0].spill_stores == 0 and results[0].spill_loads == 0
    sass = subprocess.run([cuobjdump, "-sass", results[0].library], capture_output=True, text=True).stdout
    assert "HGMMA" in sass and spec.name in sass


def test_build_takes_an_sm90_profiles_narrow_twins_unless_told_not_to():
    h200 = find_profile("h200")
    plain, both = specs_for_profile(h200), specs_for_profile(h200, narrow=True)
    twins = [s for s in both if s.narrow]
    assert sorted(s.name.replace("_narrow", "") for s in twins) == sorted(s.name for s in plain if not s.fp8)
    v_own = {(s.hdim, s.hdim_v, s.dtype, s.causal) for s in both if s.hdim_v}  # MLA's 192/128 and 128/64, prebuilt
    assert v_own == {(h, v, d, c) for h, v in ((192, 128), (128, 64)) for d in h200.dtypes for c in (False, True)}
    assert not any(s.narrow for s in specs_for_profile(find_profile("h200-sm80"), narrow=True))


def test_a_narrow_kernel_is_named_and_built_apart_and_only_in_the_sm90_family():
    plain = _spec(family="sm90", arch="sm_90a", tile=sm90_tile(128, 176, 2), causal=True)
    narrow = _spec(family="sm90", arch="sm_90a", tile=sm90_tile(128, 176, 2), causal=True, narrow=True)
    assert narrow.name == "flashtune_fwd_sm90_bf16_h128_128x176_wg2_s2_c_narrow_sm90a"
    assert ("Traits<__nv_bfloat16, 128, 128, 176, 2, true, false, KernelSchedule, flashtune::Variants<false, false, "
            "false, false>, flashtune::sm90::KvCache::kNone, true>") in narrow.source()
    assert "KvCache" not in plain.source() and narrow.source_hash() != plain.source_hash()
    with pytest.raises(SpecError, match="narrow kernel .* is the sm90 family's, 16-bit"):
        _spec(narrow=True)  # sm80
    with pytest.raises(SpecError, match="narrow kernel"):
        _spec(family="sm90", arch="sm_90a", tile=sm90_tile(128, 128, 2), fp8=True, narrow=True)


@pytest.mark.slow
def test_a_narrow_kernel_compiles_without_spills():
    """Phi-3's head dim 96 in place on h200's hdim-128 tile (168 registers, no spills with nvcc 13.0)."""
    from flashtune.kernels.build import build_specs

    spec = _spec(family="sm90", arch="sm_90a", tile=sm90_tile(128, 176, 2), causal=True, narrow=True)
    results, failures = build_specs([spec], jobs=1)
    assert not failures, failures
    assert results[0].spill_stores == 0 and results[0].spill_loads == 0 and results[0].registers


def test_specs_for_profile_retargets_and_rejects_unknown_choices():
    profile = find_profile("rtx4090")
    assert {s.arch for s in specs_for_profile(profile, arch="sm_120")} == {"sm_120"}
    with pytest.raises(SpecError, match="hdim 96 is not in profile rtx4090"):
        specs_for_profile(profile, hdims=[96])


def test_sm90_spec_names_and_source():
    spec = _spec(family="sm90", arch="sm_90a", tile=sm90_tile(128, 176, 2), causal=True)
    assert spec.name == "flashtune_fwd_sm90_bf16_h128_128x176_wg2_s2_c_sm90a"  # the example in docs/design.md
    assert spec.threads == 384
    src = spec.source()
    assert "sm90::Traits<__nv_bfloat16, 128, 128, 176, 2, true, false, KernelSchedule>" in src and "TmaMaps maps" in src
    # the schedule as the kernel's template argument: this tile has room for neither the O tile nor a second Q
    assert ("static constexpr bool overlap = true, pingpong = true, persistent = true, lazy_rescale = true, "
            "spec_max = true, tma_store = false, defer = false, flat = false;") in src
    # a tile without the pingpong: named (_np) and built apart
    off = _spec(family="sm90", arch="sm_90a", tile=sm90_tile(128, 128, 3, (("pingpong", False),)), causal=True, hdim=64)
    assert off.name == "flashtune_fwd_sm90_bf16_h64_128x128_wg2_s3_np_c_sm90a"
    assert "pingpong = false" in off.source() and "flat = true" in off.source()
    fp8 = _spec(family="sm90", arch="sm_90a", tile=sm90_tile(128, 128, 3, (("pingpong", False),)), hdim=64, fp8=True)
    assert fp8.name.endswith("_128x128_wg2_s3_np_fp8qk_sm90a")
    assert "Traits<__nv_bfloat16, 64, 128, 128, 3, false, true, KernelSchedule>" in fp8.source()
    assert off.source_hash() != _spec(family="sm90", arch="sm_90a", tile=sm90_tile(128, 128, 3), causal=True,
                                      hdim=64).source_hash()


def test_a_kernels_name_spells_each_schedule_field_off_its_default():
    """The name determines the code: every field that differs from the family's default for the tile
    has its code after the tile, in the Schedule's order; a key equal to the default adds nothing."""
    tile = sm90_tile(128, 128, 2, (("defer", False), ("tma_store", False), ("lazy_rescale", False),
                                   ("spec_max", False)))
    spec = _spec(family="sm90", arch="sm_90a", tile=tile, causal=True, hdim=64)
    # flat is on by default in causal kernels at hdim 64, with the deferred epilogue: off with it, and
    # spelled, since the tile's default has it
    assert spec.name == "flashtune_fwd_sm90_bf16_h64_128x128_wg2_s2_eager_nospec_direct_nodefer_noflat_c_sm90a"
    assert spec.schedule.flat is False
    same = _spec(family="sm90", arch="sm_90a", tile=sm90_tile(128, 128, 2, (("pingpong", True),)), hdim=64)
    assert same.name == "flashtune_fwd_sm90_bf16_h64_128x128_wg2_s2_sm90a"
    assert same.source() == _spec(family="sm90", arch="sm_90a", tile=sm90_tile(128, 128, 2), hdim=64).source()


def test_cache_key_changes_when_a_kernel_header_changes(tmp_path, monkeypatch):
    import shutil

    from flashtune.kernels import spec as spec_mod
    from flashtune.paths import csrc_dir

    copy = tmp_path / "csrc"
    shutil.copytree(csrc_dir(), copy)
    monkeypatch.setattr(spec_mod, "csrc_dir", lambda: copy)
    before = _spec().source_hash()
    header = copy / "sm80" / "fwd_kernel.cuh"
    header.write_text(header.read_text() + "\n// an edit\n")
    assert _spec().source_hash() != before
    probe = copy / "sm90" / "probe_qk.cu"  # not a header any sm80 kernel includes
    probe.write_text(probe.read_text() + "\n// an edit\n")
    (copy / "sm80" / "notes.txt").write_text("editor leftovers")
    assert _spec().source_hash() == spec_mod.KernelSpec(**{f: getattr(_spec(), f) for f in (
        "family", "arch", "dtype", "hdim", "tile", "causal")}).source_hash()


def test_fp8_twins_only_where_the_target_has_fp8_tensor_cores():
    profile = find_profile("rtx4090")  # fp8: {qk: e4m3}
    assert any(s.fp8 for s in specs_for_profile(profile))
    retargeted = specs_for_profile(profile, arch="sm_86")  # an RTX 3090: no FP8 tensor cores
    assert retargeted and not any(s.fp8 for s in retargeted)


def test_all_fp8_twins_are_the_sm90_familys_on_tiles_of_64_keys(tmp_path):
    """fp8: {qk: e4m3, pv: e4m3}: an sm90 profile builds all-FP8 twins (bfloat16, their output) beside
    the FP8 Q/K ones, named fp8all, with V's bytes at one byte in shared memory; their tiles' block_n
    is a multiple of 64 (V^T's panels); sm80 and a block_n of 176 are refused with the rule."""
    import yaml

    from flashtune.kernels.profiles import ProfileError, load_profile
    from flashtune.kernels.spec import SpecError
    from flashtune.kernels.tiles import sm90_tile

    data = yaml.safe_load(find_profile("h100").path.read_text())
    data["fp8"] = {"qk": "e4m3", "pv": "e4m3", "configs": [
        {"hdim": d, "causal": "any", "seqlen": [0, None], "block_m": 128, "block_n": 64 if d == 256 else 128,
         "num_warpgroups": 2, "stages": 2} for d in (64, 128, 256)]}
    (tmp_path / "all.yaml").write_text(yaml.safe_dump(data))
    profile = load_profile(tmp_path / "all.yaml")
    assert profile.fp8_pv
    specs = specs_for_profile(profile, hdims=[128], causal=False)
    twins = {s.dtype: s for s in specs if s.fp8_pv}
    assert set(twins) == {"bfloat16"} and twins["bfloat16"].fp8
    qk_only = next(s for s in specs if s.fp8 and not s.fp8_pv and s.dtype == "bfloat16")
    assert twins["bfloat16"].name == qk_only.name.replace("_fp8qk_", "_fp8all_")
    assert qk_only.smem_bytes - twins["bfloat16"].smem_bytes == 2 * 128 * 128  # two stages of V at half the bytes
    assert ", true>;" in twins["bfloat16"].source() and ", true>;" not in qk_only.source()
    with pytest.raises(SpecError, match="multiple of 64"):
        KernelSpec("sm90", "sm_90a", "bfloat16", 128, sm90_tile(128, 176, 2, ()), False, True, fp8_pv=True)
    with pytest.raises(SpecError, match="FP8 P V is the sm90 family's"):
        KernelSpec("sm80", "sm_89", "bfloat16", 128, TileConfig(128, 64, 4, 2), False, True, fp8_pv=True)
    data["fp8"].pop("configs")  # h100's own tiles: 128x176 at hdim 128
    (tmp_path / "wide.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=r"configs\[1\]\.block_n: \(hdim 128, fp8.pv\) 176.*fp8.pv_configs"):
        load_profile(tmp_path / "wide.yaml")
    # fp8.pv_configs: the all-FP8 twins on tiles of their own, the FP8 Q/K twins keep h100's 128x176
    data["fp8"]["pv_configs"] = [{"hdim": d, "causal": "any", "seqlen": [0, None], "block_m": 128,
                                  "block_n": 64 if d == 256 else 128, "num_warpgroups": 2, "stages": 2}
                                 for d in (64, 128, 256)]
    (tmp_path / "own.yaml").write_text(yaml.safe_dump(data))
    own = load_profile(tmp_path / "own.yaml")
    specs = specs_for_profile(own, hdims=[128], causal=False)
    assert {(s.tile.block_m, s.tile.block_n) for s in specs if s.fp8_pv} == {(128, 128)}
    assert {(s.tile.block_m, s.tile.block_n) for s in specs if s.fp8 and not s.fp8_pv} == {(128, 176)}
    assert len([s for s in specs if s.fp8_pv]) == 1 and len([s for s in specs if not s.fp8]) == 2  # bf16, fp16
    assert own.tile_for(128, False, 4096, 4096, fp8=True, fp8_pv=True).block_n == 128
    assert own.tile_for(128, False, 4096, 4096, fp8=True).block_n == 176
    data["fp8"]["pv_configs"][1]["block_n"] = 176
    (tmp_path / "own-wide.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=r"fp8.pv_configs\[1\]\.block_n: \(hdim 128\) 176: FP8 P V reads V\^T"):
        load_profile(tmp_path / "own-wide.yaml")
    data["fp8"] = {"qk": "e4m3", "pv_configs": data["fp8"]["pv_configs"]}
    (tmp_path / "no-pv.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match="fp8.pv_configs: tiles for all-FP8 kernels the profile does not ask for"):
        load_profile(tmp_path / "no-pv.yaml")
    data["fp8"] = {"pv": "e4m3"}
    (tmp_path / "no-qk.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match="fp8.pv: FP8 P V is the sm90 family's all-FP8 kernel"):
        load_profile(tmp_path / "no-qk.yaml")


def test_a_v_head_dim_of_its_own_is_named_and_built_apart_and_only_below_qks():
    """DeepSeek's MLA prefill: Q/K 192, V 128. The kernel's P V and O have V's panels only (the traits'
    last argument); the plain kernel's source is untouched."""
    plain = _spec(family="sm90", arch="sm_90a", tile=sm90_tile(128, 112, 2), hdim=192, causal=True)
    mla = _spec(family="sm90", arch="sm_90a", tile=sm90_tile(128, 112, 2), hdim=192, causal=True, hdim_v=128)
    assert mla.name == "flashtune_fwd_sm90_bf16_h192v128_128x112_wg2_s2_c_sm90a"
    assert ("Traits<__nv_bfloat16, 192, 128, 112, 2, true, false, KernelSchedule, flashtune::Variants<false, false, "
            "false, false>, flashtune::sm90::KvCache::kNone, false, false, 128>") in mla.source()
    assert "KvCache" not in plain.source() and mla.source_hash() != plain.source_hash()
    for bad in (dict(hdim_v=96), dict(hdim_v=192), dict(hdim_v=256)):  # whole panels, below Q/K's
        with pytest.raises(SpecError, match="V head dim of its own"):
            _spec(family="sm90", arch="sm_90a", tile=sm90_tile(128, 112, 2), hdim=192, **bad)
    with pytest.raises(SpecError, match="V head dim of its own"):
        _spec(hdim_v=64)  # sm80
