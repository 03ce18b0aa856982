"""DecodeSpec (csrc/decode/'s kernels as a spec), the decode tile choice, a profile's decode section
and which calls go to the decode kernels; no GPU (the split count: test_decode_splits.py)."""
import pytest
import torch

from flashtune.kernels.arch import ARCHS, get_arch
import dataclasses

from flashtune.kernels.decode_spec import (DecodeSpec, DecodeSplitPolicy, DecodeTile, decode_ring_bytes,
                                           decode_row_groups, decode_rows, decode_smem_bytes, decode_tile_problems,
                                           default_decode_tile)
from flashtune.kernels.profiles import ProfileError, find_profile, load_profile
from flashtune.kernels.spec import KernelSpec, SpecError
from flashtune.runtime.decode import decode_spec, paging_for
from flashtune.runtime.selection import kernel_for

H200 = find_profile("h200")


def on_arch(arch: str):
    """The h200 profile retargeted (its decode tiles are the family defaults for that arch)."""
    return dataclasses.replace(H200, arch=get_arch(arch), family="sm80")


def test_the_name_spells_every_setting_and_names_the_combine_kernel():
    spec = DecodeSpec("sm_90a", "bfloat16", 128, DecodeTile(16, 32, 4, 3), True, "paged")
    assert spec.name == "flashtune_decode_bf16_h128_m16x32_w4_s3_c_paged_sm90a"
    assert spec.combine_name == spec.name + "_combine" and spec.launcher_symbol == spec.name + "_launch"
    plain = DecodeSpec("sm_89", "float16", 64, DecodeTile(32, 16, 4, 2), False)
    assert plain.name == "flashtune_decode_f16_h64_m32x16_w4_s2_sm89"
    source = spec.source()
    assert f"{spec.name}(" in source and f"{spec.combine_name}(" in source and "Paging(1)" in source


def test_splits_may_merge_in_a_cluster_from_sm90_on_and_the_kernel_answers_for_its_slots():
    tile = DecodeTile(32, 16, 4, 2)
    for arch, clusters in (("sm_80", False), ("sm_89", False), ("sm_90a", True), ("sm_120", True)):
        spec = DecodeSpec(arch, "bfloat16", 128, tile, False)
        source = spec.source()
        assert spec.cluster_merge == clusters and f"kCluster = {str(clusters).lower()};" in source
        assert f'extern "C" int {spec.cluster_slots_symbol}(int splits)' in source


def test_the_combine_is_a_programmatic_dependent_launch_from_sm90_on():
    """griddepcontrol exists from sm_90: an sm_80-family kernel (run on an H200 too, as h200-sm80's)
    must not be launched as a dependent, since its combine could not wait for the split kernel."""
    tile = DecodeTile(32, 16, 4, 2)
    flags = {arch: DecodeSpec(arch, "bfloat16", 128, tile, False).arch_facts.dependent_launch
             for arch in ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_120")}
    assert flags == {"sm_80": False, "sm_86": False, "sm_89": False, "sm_90a": True, "sm_120": True}
    assert "constexpr bool kPdl = true;" in DecodeSpec("sm_90a", "bfloat16", 128, tile, False).source()
    assert "constexpr bool kPdl = false;" in DecodeSpec("sm_89", "bfloat16", 128, tile, False).source()


def test_equal_specs_share_source_and_cache_key_and_different_ones_do_not():
    a = DecodeSpec("sm_90a", "bfloat16", 128, DecodeTile(16, 32, 4, 3), False)
    b = DecodeSpec("sm_90a", "bfloat16", 128, DecodeTile(16, 32, 4, 3), False)
    c = DecodeSpec("sm_90a", "bfloat16", 128, DecodeTile(16, 32, 4, 3), False, "gather")
    assert a == b and a.source_hash() == b.source_hash()
    assert a.name != c.name and a.source_hash() != c.source_hash()


@pytest.mark.parametrize("hdim,tile,message", [
    (128, DecodeTile(48, 32, 4, 3), "rows 48"),
    (128, DecodeTile(16, 24, 4, 3), "block_n 24"),
    (256, DecodeTile(32, 16, 8, 8), "shared memory"),
    (128, DecodeTile(16, 64, 8, 4), "shared memory"),
])
def test_impossible_tiles_are_refused_with_the_reason(hdim, tile, message):
    with pytest.raises(SpecError, match=message):
        DecodeSpec("sm_90a", "bfloat16", hdim, tile, False)


def test_hdim_256_takes_32_rows_as_two_row_groups_sharing_each_ring():
    tile = DecodeTile(32, 16, 8, 3)  # 8 warps: 4 key groups of 2 warps, each warp 16 rows
    assert decode_row_groups(256, 32) == 2 and decode_row_groups(256, 16) == decode_row_groups(128, 32) == 1
    ring = 4 * 3 * 2 * 16 * 512  # 4 rings, not 8: a key group's warps share one
    assert decode_ring_bytes(256, tile) == ring
    assert decode_smem_bytes(256, tile) == 32 * 512 + ring + 2 * 8 * 16 * 4  # stats: each warp its 16 rows
    spec = DecodeSpec("sm_90a", "bfloat16", 256, tile, False)
    assert spec.key_groups == 4 and spec.min_blocks_per_split == 8 and spec.fewest_blocks_per_split(True) == 4
    arch = get_arch("sm_90a")
    assert not decode_tile_problems(256, DecodeTile(32, 16, 2, 2), arch)  # one key group of two warps
    assert any("e4m3 cache takes 16 rows" in p for p in decode_tile_problems(256, tile, arch, kv_fp8=True))
    # an e4m3 cache keeps 16-row blocks at hdim 256; a 16-bit one packs MQA's 32 rows in one CTA
    assert decode_rows(1, 32, 256) == 32 and decode_rows(1, 32, 256, kv_fp8=True) == 16
    assert decode_rows(1, 32, 256, short=True) == 16 and decode_rows(1, 32, 128, kv_fp8=True) == 32


def test_shared_memory_is_the_ring_or_the_merge_buffer_over_it():
    tile = DecodeTile(16, 32, 4, 3)
    assert decode_smem_bytes(128, tile) == 16 * 256 + 4 * 3 * 2 * 32 * 256 + 2 * 4 * 16 * 4
    small = DecodeTile(32, 16, 2, 2)  # the merge's fp32 O is larger than this ring
    assert decode_smem_bytes(128, small) == 32 * 256 + 2 * 32 * 136 * 4 + 2 * 2 * 32 * 4


@pytest.mark.parametrize("arch", [a for a in ARCHS.values() if a.mma_sync])
@pytest.mark.parametrize("hdim", [64, 128, 256])
@pytest.mark.parametrize("seqlen_q,ratio", [(1, 4), (4, 8), (16, 8)])
def test_every_arch_has_a_decode_tile_for_every_head_dim(arch, hdim, seqlen_q, ratio):
    rows = decode_rows(seqlen_q, ratio, hdim)
    spec = DecodeSpec(arch.name, "bfloat16", hdim, default_decode_tile(arch, hdim, rows), False)
    assert spec.smem_bytes + 1024 <= arch.max_smem_per_block
    assert rows == (32 if seqlen_q * ratio > 16 else 16)  # hdim 256: two row groups


def test_a_short_call_takes_two_16_row_blocks_for_up_to_32_packed_rows():
    assert decode_rows(1, 32, 128) == 32 and decode_rows(1, 32, 128, short=True) == 16
    assert decode_rows(2, 16, 64, short=True) == 16 and decode_rows(1, 8, 64, short=True) == 16
    assert decode_rows(4, 32, 64, short=True) == 32  # 128 rows: 32-row blocks still
    profile = dataclasses.replace(find_profile("h200"), decode_split=DecodeSplitPolicy(memory_gbps=3352))
    # MQA at hdim 128, 512 bytes a key row: 32k rows (16 MB) read in 5 us (short), 128k (64 MB) in 20 us
    assert decode_spec(profile, torch.bfloat16, 128, False, 1, 32, None, key_rows=2 ** 15).tile.rows == 16
    assert decode_spec(profile, torch.bfloat16, 128, False, 1, 32, None, key_rows=2 ** 17).tile.rows == 32
    # an e4m3 cache reads half the bytes a row: 64k rows (32 MB at 16 bits) are short
    assert decode_spec(profile, torch.bfloat16, 128, False, 1, 32, None, kv_fp8=True, key_rows=2 ** 16).tile.rows == 16
    assert decode_spec(profile, torch.bfloat16, 128, False, 1, 32, None, key_rows=2 ** 16).tile.rows == 32
    assert decode_spec(profile, torch.bfloat16, 128, False, 1, 32, None).tile.rows == 32  # bytes unknown
    assert kernel_for(profile, "bfloat16", 128, False, 1, 1024, 32, key_rows=2048).tile.rows == 16


def test_paging_bulk_where_pages_hold_whole_tiles_else_gather():
    assert paging_for(None, 32) == "contiguous"
    assert paging_for(64, 32) == "paged" and paging_for(256, 16) == "paged"
    assert paging_for(16, 32) == "gather" and paging_for(1, 16) == "gather" and paging_for(48, 32) == "gather"


def test_short_16_bit_fixed_length_queries_go_to_the_decode_kernel():
    profile = find_profile("h200")
    decode = kernel_for(profile, "bfloat16", 128, False, 1, 5000, head_ratio=4)
    assert isinstance(decode, DecodeSpec) and decode.arch == "sm_90a"
    assert isinstance(kernel_for(profile, "bfloat16", 128, True, 16, 5000, head_ratio=4), DecodeSpec)
    assert isinstance(kernel_for(profile, "bfloat16", 128, True, 17, 5000, head_ratio=4), KernelSpec)
    assert isinstance(kernel_for(profile, "bfloat16", 128, False, 1, 5000, varlen=True), KernelSpec)
    assert isinstance(kernel_for(profile, "bfloat16", 128, False, 1, 5000, fp8=True), KernelSpec)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_120"])
def test_decode_kernels_compile_for_the_rtx_and_a100_targets(arch):
    """The sm_90a kernels run on the H200; these targets are compile-checked here. hdim 256 on the 99 KB
    parts runs two warps at the register limit and may spill a few bytes (8-36 bytes on sm_120 today); more
    than the tuner's default budget (64 bytes) would be a regression."""
    from flashtune.kernels.build import build_specs

    profile = on_arch(arch)
    specs = [decode_spec(profile, torch.bfloat16, 128, True, 4, 8, 1),
             decode_spec(profile, torch.float16, 256, False, 1, 4, None)]
    results, failures = build_specs(specs, jobs=2)
    assert not failures, failures
    assert all((r.spill_stores or 0) <= 64 for r in results), [(r.name, r.spill_stores) for r in results]
    assert all(not r.spills for r in results if "_h128_" in r.name), [(r.name, r.spill_stores) for r in results]


def write_profile(tmp_path, decode: str):
    text = (H200.path.read_text().split("\nprovenance:")[0]).replace("name: h200", "name: h200-decode")
    path = tmp_path / "h200-decode.yaml"
    path.write_text(text + "\n" + decode)
    return path


def test_a_profiles_decode_section_sets_tiles_and_split_policy(tmp_path):
    profile = load_profile(write_profile(tmp_path, """decode:
  tiles:
    - {hdim: 128, rows: 16, block_n: 64, warps: 2, stages: 2}
  split: {combine_us: 5, memory_gbps: 4800, max_splits: 16, cluster_splits: 0, cluster_us: 1.5, short_call_us: 0}
"""))
    assert profile.decode_tile(128, 16) == DecodeTile(16, 64, 2, 2)
    assert profile.decode_tile(64, 16) == default_decode_tile(profile.arch, 64, 16)  # the rest: defaults
    assert profile.decode_split == DecodeSplitPolicy(combine_us=5, memory_gbps=4800, max_splits=16, cluster_splits=0,
                                                     cluster_us=1.5, short_call_us=0)
    # no call is short under it: MQA keeps its one 32-row block however little it reads
    assert decode_spec(profile, torch.bfloat16, 128, False, 1, 32, None, key_rows=1).tile.rows == 32
    assert decode_spec(profile, torch.bfloat16, 128, False, 1, 4, 64).name == \
        "flashtune_decode_bf16_h128_m16x64_w2_s2_paged_sm90a"
    # the runtime's cache of decode specs tells the profiles apart by their decode tiles
    assert decode_spec(H200, torch.bfloat16, 128, False, 1, 4, None).tile == DecodeTile(16, 32, 4, 3)
    assert decode_spec(profile, torch.bfloat16, 128, False, 1, 4, None).tile == DecodeTile(16, 64, 2, 2)


@pytest.mark.parametrize("section,message", [
    ("decode:\n  tiles:\n    - {hdim: 128, rows: 16, block_n: 64, warps: 8, stages: 4}\n", "shared memory"),
    ("decode:\n  tiles:\n    - {hdim: 96, rows: 16, block_n: 32, warps: 4, stages: 2}\n", "not in head_dims"),
    ("decode:\n  tiles:\n    - {hdim: 128, rows: 16, block_n: 32}\n", "missing"),
    ("decode:\n  tiles:\n    - {hdim: 128, rows: 16, block_n: 32, warps: 4, stages: 2}\n"
     "    - {hdim: 128, rows: 16, block_n: 16, warps: 4, stages: 2}\n", "a second tile"),
    ("decode:\n  split: {fill: 0.8}\n", "decode.split.fill: unknown key"),
    ("decode:\n  split: {combine_us: -1}\n", "decode.split.combine_us.*a positive number"),
    ("decode:\n  split: {max_splits: 300}\n", "decode.split.max_splits.*1..256"),
    ("decode:\n  split: {memory_gbps: fast}\n", "decode.split.memory_gbps"),
    ("decode:\n  split: {cluster_splits: 16}\n", "decode.split.cluster_splits.*0..8"),
    ("decode:\n  split: {cluster_splits: 2.5}\n", "decode.split.cluster_splits.*0..8"),
    ("decode:\n  split: {cluster_us: 0}\n", "decode.split.cluster_us.*a positive number"),
    ("decode:\n  split: {short_call_us: -1}\n", "decode.split.short_call_us.*0 or a positive number"),
    ("decode:\n  splits: {}\n", "splits"),
])
def test_a_bad_decode_section_names_the_key(tmp_path, section, message):
    with pytest.raises(ProfileError, match=message):
        load_profile(write_profile(tmp_path, section))


def test_head_dims_between_the_built_ones_are_computed_at_the_next():
    from flashtune.kernels.arch import get_arch
    from flashtune.kernels.decode_spec import DecodeSpec, DecodeTile, decode_smem_bytes, default_decode_tile
    from flashtune.kernels.tiles import computed_head_dim

    assert [computed_head_dim(d) for d in (32, 40, 64, 72, 96, 128, 136, 192, 256)] == [
        64, 64, 64, 128, 128, 128, 256, 256, 256]
    assert [computed_head_dim(d) for d in (24, 100, 264, 0)] == [None] * 4
    # a profile's prefill kernels: the next of its own head dims (an sm90 profile's 192 among them)
    assert [computed_head_dim(d, (64, 128, 192, 256)) for d in (136, 192, 200)] == [192, 192, 256]
    assert computed_head_dim(160, (64, 128)) is None
    tile = DecodeTile(16, 32, 4, 3)
    spec = DecodeSpec("sm_90a", "bfloat16", 96, tile, False)
    assert "_h96_" in spec.name and "Traits<__nv_bfloat16, 96," in spec.source()
    assert spec.smem_bytes == decode_smem_bytes(128, tile)  # rows held at 128 columns
    assert default_decode_tile(get_arch("sm_89"), 80, 16) == default_decode_tile(get_arch("sm_89"), 128, 16)
    with pytest.raises(SpecError, match="multiples of 8 from 32 to 256"):
        DecodeSpec("sm_90a", "bfloat16", 100, tile, False)


def test_a_decode_tile_at_192_is_refused_for_256s(tmp_path):
    """The decode kernels compute head dim 192 at 256 with 256's tile: a tile given at 192 would never be
    read, so the profile says where to give it."""
    import yaml

    from flashtune.kernels.profiles import ProfileError, find_profile, load_profile

    data = yaml.safe_load(find_profile("h200").path.read_text())
    data["decode"] = {"tiles": [{"hdim": 192, "rows": 16, "block_n": 16, "warps": 4, "stages": 2}]}
    path = tmp_path / "d192.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ProfileError, match=r"decode\.tiles\[0\]\.hdim: the decode kernels compute head dim 192 "
                                           r"at 256: give the tile there; allowed: 64, 128, 256"):
        load_profile(path)


def test_profiles_show_lists_a_decode_tile_for_every_rows_a_call_can_take():
    """hdim 256 takes 32 packed rows too (two row groups of 8 warps), so `profiles show` lists it."""
    from flashtune.commands.profiles import decode_details

    tiles = {(t["hdim"], t["rows"]): t for t in decode_details(find_profile("h200"))["tiles"]}
    assert sorted(tiles) == [(64, 16), (64, 32), (128, 16), (128, 32), (256, 16), (256, 32)]
    assert tiles[256, 32]["warps"] == 8 and tiles[256, 32]["source"] == "default"
    # h200 builds e4m3-cache twins: twice the stages, but not for row groups (an e4m3 cache takes 16 rows)
    assert tiles[128, 16]["e4m3_stages"] == 2 * tiles[128, 16]["stages"] and tiles[256, 32]["e4m3_stages"] is None
    assert all(t["e4m3_stages"] is None for t in decode_details(find_profile("rtx4090"))["tiles"])

