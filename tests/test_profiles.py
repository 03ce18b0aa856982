import copy
import textwrap
from pathlib import Path

import pytest
import yaml

from flashtune.kernels.gpu import GpuInfo, describe_target
from flashtune.kernels.arch import arch_for_compute_capability
from flashtune.paths import profiles_dir
from flashtune.kernels.profiles import (ProfileError, find_profile, list_profiles, load_profile, select_profile,
                                select_profile_with_reason)
from flashtune.kernels.tiles import TileConfig, sm90_tile, tile_problems

SHIPPED = {"rtx3090": "sm_86", "rtx4090": "sm_89", "l40s": "sm_89", "rtx5090": "sm_120",
           "a100": "sm_80", "h100": "sm_90a", "h200": "sm_90a", "h200-sm80": "sm_90"}

BASE = {
    "name": "test",
    "description": "a test profile",
    "match": {"names": ["RTX 4090"], "compute_capability": ["8.9"]},
    "family": "sm80",
    "arch": "sm_89",
    "dtypes": ["float16", "bfloat16"],
    "head_dims": [64, 128],
    "fp8": None,
    "nvcc_flags": [],
    "configs": [
        {"hdim": 64, "causal": "any", "seqlen": [0, None], "block_m": 128, "block_n": 64, "num_warps": 4, "stages": 2},
        {"hdim": 128, "causal": "any", "seqlen": [0, 2048], "block_m": 64, "block_n": 64, "num_warps": 4, "stages": 2},
        {"hdim": 128, "causal": "any", "seqlen": [2048, None], "block_m": 128, "block_n": 32, "num_warps": 4, "stages": 2},
    ],
}


def write(tmp_path: Path, data, name="test.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def broken(tmp_path, mutate) -> str:
    data = copy.deepcopy(BASE)
    mutate(data)
    path = write(tmp_path, data)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and "; allowed: " in message, message
    return message


# ---------------------------------------------------------------- shipped profiles

def test_shipped_profiles_all_load():
    profiles = {p.name: p for p in list_profiles()}
    assert {name: p.arch.name for name, p in profiles.items()} == SHIPPED
    for p in profiles.values():
        assert p.path.parent == profiles_dir()
        for entry in p.configs:  # they serve the 16-bit kernels: the stricter resource model
            assert tile_problems(p.family, entry.hdim, entry.tile, p.arch, False) == []
        for entry in p.fp8_configs:
            assert tile_problems(p.family, entry.hdim, entry.tile, p.arch, True) == []


def test_shipped_descriptions_are_short_and_their_history_is_in_provenance():
    """`profiles` shows the description: at most three lines; how the tiles were chosen (commands,
    hand edits, the files that measured them) belongs in provenance."""
    for p in list_profiles():
        assert len(textwrap.wrap(p.description, 120)) <= 3, p.name
    assert len(find_profile("h200").provenance["edited_by_hand"]) == 6  # five measured edits, and hdim 192 added


def test_shipped_families():
    profiles = {p.name: p for p in list_profiles()}
    assert profiles["h100"].family == profiles["h200"].family == "sm90"
    assert all(p.family == "sm80" for n, p in profiles.items() if n not in ("h100", "h200"))
    assert profiles["h200-sm80"].match_names == () and profiles["h200-sm80"].match_compute_capabilities == ()


def test_tile_for_picks_by_hdim_causal_and_seqlen(tmp_path):
    rtx = find_profile("rtx4090")
    assert rtx.tile_for(128, False, 4096, 4096) == TileConfig(128, 32, 4, 1)
    assert rtx.tile_for(128, True, 4096, 4096) == TileConfig(64, 64, 4, 1)
    h100 = find_profile("h100")  # FA3's tiles
    assert (h100.tile_for(128, False, 8192, 8192).block_n, h100.tile_for(128, False, 1, 1).num_warpgroups) == (176, 2)
    assert h100.tile_for(64, True, 512, 512).block_n == 128
    h200 = find_profile("h200")  # measured with the overlap schedule: 192x128 at hdim 64, not FA3's 192x192
    assert h200.tile_for(64, False, 4096, 4096).block_n == 128 and h200.tile_for(128, True, 4096, 4096).block_m == 128
    custom = load_profile(write(tmp_path, BASE))
    assert custom.tile_for(128, True, 100, 2047).block_m == 64
    assert custom.tile_for(128, True, 100, 2048).block_m == 128  # max(seqlen_q, seqlen_k), max exclusive
    with pytest.raises(ProfileError, match="head dim 256 is not in profile test"):
        custom.tile_for(256, False, 1, 1)


# ---------------------------------------------------------------- validation

def test_valid_base_loads(tmp_path):
    profile = load_profile(write(tmp_path, BASE))
    assert profile.name == "test" and profile.match_compute_capabilities == ((8, 9),)


def test_unknown_key(tmp_path):
    assert "test.yaml: colour: unknown key; allowed: name, description" in broken(
        tmp_path, lambda d: d.update(colour="red"))


def test_unknown_config_key(tmp_path):
    msg = broken(tmp_path, lambda d: d["configs"][0].update(blockm=64))
    assert ": configs[0].blockm: unknown key; allowed: hdim, causal, seqlen, block_m" in msg


def test_num_warpgroups_not_for_sm80(tmp_path):
    assert "configs[0].num_warpgroups: unknown key" in broken(
        tmp_path, lambda d: d["configs"][0].update(num_warpgroups=2))


def test_missing_key(tmp_path):
    assert ": configs: missing required key" in broken(tmp_path, lambda d: d.pop("configs"))


@pytest.mark.parametrize("mutate, key", [
    (lambda d: d["configs"][0].update(block_m="128"), "configs[0].block_m: wrong type str"),
    (lambda d: d["configs"][0].update(stages=True), "configs[0].stages: wrong type bool"),
    (lambda d: d.update(head_dims=64), "head_dims: wrong type int"),
    (lambda d: d.update(name=["x"]), "name: wrong type list"),
    (lambda d: d.update(match=["RTX 4090"]), "match: wrong type list"),
])
def test_wrong_type(tmp_path, mutate, key):
    assert key in broken(tmp_path, mutate)


def test_block_not_multiple_of_16(tmp_path):
    msg = broken(tmp_path, lambda d: d["configs"][0].update(block_n=40))
    assert "configs[0].block_n: (hdim 64) 40 is not a positive multiple of 16; allowed: 16, 32, 48" in msg


def test_shared_memory_over_arch_limit(tmp_path):
    msg = broken(tmp_path, lambda d: d["configs"][1].update(block_m=64, block_n=128))  # 147456 B on sm_89
    assert "configs[1].shared_memory: (hdim 128) needs 147456 bytes, over sm_89's per-block limit" in msg
    assert "allowed: at most 101376 bytes" in msg


def test_same_config_fits_on_a100(tmp_path):
    def to_a100(d):
        d.update(arch="sm_80")
        d["configs"][1].update(block_n=128)
    data = copy.deepcopy(BASE)
    to_a100(data)
    load_profile(write(tmp_path, data))


def test_fp8_on_arch_without_fp8(tmp_path):
    msg = broken(tmp_path, lambda d: d.update(arch="sm_86", fp8={"qk": "e4m3"}))
    assert ": fp8: sm_86 has no FP8 tensor cores; allowed:" in msg


def test_fp8_on_sm89_loads_and_shrinks_smem(tmp_path):
    data = copy.deepcopy(BASE)
    data["fp8"] = {"qk": "e4m3"}
    assert load_profile(write(tmp_path, data)).fp8_qk


def test_fp8_unknown_format(tmp_path):
    assert "fp8.qk: unknown value 'e5m3'; allowed: e4m3" in broken(tmp_path, lambda d: d.update(fp8={"qk": "e5m3"}))


def test_overlapping_buckets(tmp_path):
    msg = broken(tmp_path, lambda d: d["configs"][2].update(seqlen=[1024, None]))
    assert "configs[2].seqlen: hdim 128 causal=false: overlaps configs[1] at [1024, 2048)" in msg
    assert "exactly once" in msg


def test_overlap_from_causal_any(tmp_path):
    extra = {"hdim": 64, "causal": True, "seqlen": [0, None], "block_m": 64, "block_n": 64,
             "num_warps": 4, "stages": 2}
    msg = broken(tmp_path, lambda d: d["configs"].append(extra))
    assert "hdim 64 causal=true: overlaps configs[0]" in msg


def test_missing_bucket_gap(tmp_path):
    msg = broken(tmp_path, lambda d: d["configs"][2].update(seqlen=[4096, None]))
    assert ": configs: hdim 128 causal=false: seqlen [2048, 4096) is missing" in msg


def test_missing_bucket_top(tmp_path):
    msg = broken(tmp_path, lambda d: d["configs"][2].update(seqlen=[2048, 8192]))
    assert "seqlen [8192, inf) is missing" in msg


def test_missing_causal_half(tmp_path):
    msg = broken(tmp_path, lambda d: d["configs"][0].update(causal=False))
    assert ": configs: hdim 64 causal=true: no config" in msg


def test_config_for_hdim_not_listed(tmp_path):
    msg = broken(tmp_path, lambda d: d.update(head_dims=[64]))
    assert "configs[1].hdim: 128 is not in head_dims; allowed: 64" in msg


def test_bad_seqlen(tmp_path):
    assert "configs[1].seqlen: max 0 is not an integer above min" in broken(
        tmp_path, lambda d: d["configs"][1].update(seqlen=[0, 0]))


def test_malformed_yaml(tmp_path):
    path = write(tmp_path, "name: test\nconfigs: [\n  {hdim: 64\n")
    with pytest.raises(ProfileError, match=r"test.yaml: line \d+, column \d+: malformed YAML .*allowed"):
        load_profile(path)


def test_not_a_mapping(tmp_path):
    with pytest.raises(ProfileError, match=r"\(top level\): expected a mapping"):
        load_profile(write(tmp_path, "- just\n- a list\n"))


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d.update(family="sm70"), ": family: unknown family 'sm70'; allowed: sm80, sm90"),
    (lambda d: d.update(arch="sm_75"), ": arch: unknown arch 'sm_75'; allowed: sm_80"),
    (lambda d: d.update(family="sm90"), ": family: family sm90 needs wgmma, which sm_89 lacks"),
    (lambda d: d.update(dtypes=["float32"]), ": dtypes[0]: unknown dtype 'float32'; allowed: float16, bfloat16"),
    (lambda d: d.update(head_dims=[64, 96]), ": head_dims[1]: head dim 96 is not built by family sm80; allowed: 64, 128, 256"),
    (lambda d: d.update(head_dims=[64, 192]), ": head_dims[1]: head dim 192 is not built by family sm80; allowed: 64, 128, 256"),
    (lambda d: d["match"].update(compute_capability=["sm_89"]), "match.compute_capability[0]: 'sm_89' is not MAJOR.MINOR"),
    (lambda d: d["configs"][0].update(causal="maybe"), "configs[0].causal: 'maybe'; allowed: true, false or any"),
])
def test_other_invalid_values(tmp_path, mutate, expected):
    assert expected in broken(tmp_path, mutate)


def test_sm90_profile_rules(tmp_path):
    data = copy.deepcopy(BASE)
    data.update(family="sm90", arch="sm_90a")
    data["configs"] = [{"hdim": h, "block_m": 128, "block_n": 128, "stages": 2} for h in (64, 128)]
    assert load_profile(write(tmp_path, data)).configs[0].tile.num_warpgroups == 2
    data["configs"][0]["num_warpgroups"] = 3
    with pytest.raises(ProfileError, match=r"configs\[0\].num_warpgroups: \(hdim 64\) 3 does not match block_m/64 = 2"):
        load_profile(write(tmp_path, data))
    data["configs"][0].update(num_warpgroups=2, num_warps=12)
    with pytest.raises(ProfileError, match=r"configs\[0\].num_warps: unknown key"):
        load_profile(write(tmp_path, data))


def test_unreadable_file(tmp_path):
    with pytest.raises(ProfileError, match="cannot read it"):
        load_profile(tmp_path / "nope.yaml")


# ---------------------------------------------------------------- finding and selecting

def gpu(name, cc):
    return GpuInfo(0, name, cc, arch_for_compute_capability(*cc), None, None, None, None, None, None)


def test_find_by_name_and_path(tmp_path):
    assert find_profile("rtx5090").arch.name == "sm_120"
    assert find_profile(str(write(tmp_path, BASE))).name == "test"
    with pytest.raises(ProfileError, match="did you mean rtx4090.*allowed: a100, h100"):
        find_profile("rtx4900")


def test_explicit_profile_wins():
    assert select_profile("a100", gpu("NVIDIA GeForce RTX 4090", (8, 9))).name == "a100"


@pytest.mark.parametrize("name, cc, expected", [
    ("NVIDIA GeForce RTX 4090", (8, 9), "rtx4090"),
    ("NVIDIA L40S", (8, 9), "l40s"),
    ("NVIDIA L4", (8, 9), "l40s"),
    ("NVIDIA GeForce RTX 3090", (8, 6), "rtx3090"),
    ("NVIDIA A10", (8, 6), "rtx3090"),
    ("NVIDIA A100-SXM4-80GB", (8, 0), "a100"),
    ("NVIDIA H100 80GB HBM3", (9, 0), "h100"),
    ("NVIDIA H200", (9, 0), "h200"),
    ("NVIDIA GeForce RTX 5090", (12, 0), "rtx5090"),
])
def test_auto_match_by_name(name, cc, expected):
    selection = select_profile_with_reason(gpu=gpu(name, cc))
    assert selection.profile.name == expected
    assert "matched by name" in selection.reason


def test_unknown_card_falls_back_to_compute_capability():
    selection = select_profile_with_reason(gpu=gpu("NVIDIA RTX 4000 Ada Generation", (8, 9)))
    assert selection.profile.name == "rtx4090"
    assert "compute capability 8.9" in selection.reason
    assert select_profile(gpu=gpu("NVIDIA RTX PRO 6000 Blackwell", (12, 0))).name == "rtx5090"


def test_target_from_arch_matches():
    assert select_profile(gpu=describe_target(arch="sm_90a")).name == "h100"
    assert select_profile(gpu=describe_target(gpu_name="L40S")).name == "l40s"


def test_no_match_names_closest_and_how_to_write_one():
    with pytest.raises(ProfileError) as info:
        select_profile(gpu=gpu("NVIDIA B200", (10, 0)))
    message = str(info.value)
    assert "no profile matches GPU 'NVIDIA B200' (compute capability 10.0)" in message
    assert "docs/profiles.md" in message and "flashtune profiles show" in message
    # the closest profile named is one whose kernels build for sm_100a: not h100 (sm90 needs wgmma)
    assert "none ships for sm_100a; the closest whose kernels build for it is h200-sm80" in message
    assert "--profile h200-sm80 --arch sm_100a" in message and "h100" not in message


def test_plain_sm90_target_suggests_h200_sm80():
    with pytest.raises(ProfileError, match="closest is h200-sm80"):
        select_profile(gpu=describe_target(arch="sm_90"))


def test_no_gpu_no_profile():
    with pytest.raises(ProfileError, match="no GPU is visible"):
        select_profile()


# ---------------------------------------------------------------- FP8 tiles

def _with_fp8(fp8_configs=None):
    data = copy.deepcopy(BASE)
    data["fp8"] = {"qk": "e4m3"}
    if fp8_configs is not None:
        data["fp8"]["configs"] = fp8_configs
    return data


def test_fp8_configs_give_the_fp8_twins_their_own_tiles(tmp_path):
    from flashtune.kernels.spec import specs_for_profile

    fp8_tiles = [{"hdim": 64, "causal": "any", "seqlen": [0, None], "block_m": 64, "block_n": 64, "num_warps": 4,
                  "stages": 2},
                 {"hdim": 128, "causal": "any", "seqlen": [0, None], "block_m": 64, "block_n": 128, "num_warps": 4,
                  "stages": 1}]
    profile = load_profile(write(tmp_path, _with_fp8(fp8_tiles)))
    assert profile.fp8 == {"qk": "e4m3"} and len(profile.fp8_configs) == 2
    assert profile.tile_for(128, False, 4096, 4096, fp8=True) == TileConfig(64, 128, 4, 1)
    assert profile.tile_for(128, False, 4096, 4096) == TileConfig(128, 32, 4, 2)  # 16-bit: configs
    specs = specs_for_profile(profile, dtypes=["bfloat16"], hdims=[128], causal=False)
    assert {(s.fp8, s.tile) for s in specs} == {(False, TileConfig(64, 64, 4, 2)), (False, TileConfig(128, 32, 4, 2)),
                                                (True, TileConfig(64, 128, 4, 1))}
    plain = load_profile(write(tmp_path, _with_fp8(), "plain.yaml"))  # no fp8.configs: twins on configs' tiles
    assert plain.tile_for(128, False, 4096, 4096, fp8=True) == TileConfig(128, 32, 4, 2)


def test_fp8_configs_are_validated_like_configs_with_the_fp8_resource_model(tmp_path):
    gap = [{"hdim": 64, "causal": "any", "seqlen": [0, 1024], "block_m": 64, "block_n": 64, "num_warps": 4,
            "stages": 2}]
    message = broken(tmp_path, lambda d: d.update(_with_fp8(gap)))
    assert "fp8.configs" in message and "missing" in message
    message = broken(tmp_path, lambda d: d.update(fp8={"configs": gap}))
    assert "fp8.configs: tiles for FP8 kernels the profile does not ask for" in message
    # a tile the arch cannot run is refused there too, naming the fp8 table's entry
    big = {"hdim": 128, "causal": "any", "seqlen": [0, None], "block_m": 128, "block_n": 128, "num_warps": 4,
           "stages": 3}
    message = broken(tmp_path, lambda d: d.update(_with_fp8([BASE["configs"][0], big])))
    assert "fp8.configs[1]." in message


def test_sm90_schedule_keys_per_config_and_for_the_whole_profile(tmp_path):
    """Schedule keys (flashtune/kernels/schedule.py) on an sm90 config (h200's `pingpong: false` for hdim 64
    causal below 2k) or in the profile's `schedule:` for every config, a config's own winning: bools,
    checked against the schedule's rules, and not sm80 keys."""
    h200 = find_profile("h200")
    assert h200.tile_for(64, True, 1024, 1024) == sm90_tile(128, 128, 3, (("pingpong", False),))
    assert h200.tile_for(64, True, 4096, 4096).schedule == () and h200.tile_for(64, False, 1024, 1024).schedule == ()
    data = copy.deepcopy(BASE)
    data.update(family="sm90", arch="sm_90a")
    data["configs"] = [{"hdim": h, "block_m": 128, "block_n": 128, "stages": 2, "pingpong": False} for h in (64, 128)]
    assert [e.tile.label for e in load_profile(write(tmp_path, data)).configs] == ["128x128_wg2_s2_np"] * 2
    data["schedule"] = {"defer": False, "pingpong": True}
    assert [e.tile.label for e in load_profile(write(tmp_path, data)).configs] == ["128x128_wg2_s2_np_nodefer"] * 2
    data["configs"][0]["pingpong"] = "off"
    with pytest.raises(ProfileError, match=r"configs\[0\]\.pingpong: wrong type str \('off'\); allowed: true or false"):
        load_profile(write(tmp_path, data))
    data["configs"][0].update(pingpong=True, block_m=64)
    with pytest.raises(ProfileError, match=r"configs\[0\]\.pingpong: \(hdim 64\) on without the overlap or with one"):
        load_profile(write(tmp_path, data))
    data["configs"][0].update(block_m=128, flat=True)  # flat needs the deferred epilogue the profile turned off
    with pytest.raises(ProfileError, match=r"configs\[0\]\.flat: \(hdim 64\) on without the deferred epilogue"):
        load_profile(write(tmp_path, data))
    message = broken(tmp_path, lambda d: d["configs"][0].update(pingpong=False))  # sm80
    assert "configs[0].pingpong: unknown key" in message
    assert "schedule: a schedule is the sm90 family's" in broken(tmp_path, lambda d: d.update(schedule={"defer": False}))


def test_the_old_schedule_switches_say_where_the_schedule_went(tmp_path):
    data = yaml.safe_load(find_profile("h200").path.read_text())
    data["nvcc_flags"] = ["-O3", "-DFLASHTUNE_SM90_OVERLAP=0"]
    with pytest.raises(ProfileError) as info:
        load_profile(write(tmp_path, data, "old.yaml"))
    message = str(info.value)
    assert "nvcc_flags[1]: -DFLASHTUNE_SM90_OVERLAP=0 chooses nothing any more" in message
    assert "overlap, pingpong" in message and "docs/experiments.md" in message


def test_fp8_configs_may_hold_tiles_only_fp8_fits(tmp_path):
    """Hopper, hdim 128: 3 stages of 128x176 need 296 KB with 16-bit Q/K, 215 KB with FP8 Q/K (227 KB
    limit). (128x256, the wider FP8-only tile, is over the overlap schedule's register budget.)"""
    data = yaml.safe_load(find_profile("h200").path.read_text())
    wide = {"hdim": 128, "causal": "any", "seqlen": [0, None], "block_m": 128, "block_n": 176, "stages": 3}
    data["fp8"] = {"qk": "e4m3", "configs": [c for c in data["configs"] if c["hdim"] not in (128, 192)] + [wide]}
    profile = load_profile(write(tmp_path, data, "h200-fp8.yaml"))
    assert profile.tile_for(128, True, 8192, 8192, fp8=True).stages == 3
    data["fp8"]["configs"].append({**wide, "hdim": 192, "block_n": 112, "stages": 2})  # no FP8 Q/K kernel at 192
    with pytest.raises(ProfileError, match=r"fp8\.configs\[\d+\]\.hdim: .*head dim 192 has no FP8 Q/K kernel"):
        load_profile(write(tmp_path, data, "h200-fp8-192.yaml"))
    data["fp8"]["configs"].pop()
    data["configs"] = data["fp8"]["configs"]  # the same tile for the 16-bit kernels: refused
    with pytest.raises(ProfileError, match=r"configs\[\d+\]\.shared_memory"):
        load_profile(write(tmp_path, data, "h200-wide16.yaml"))


def test_register_budget_follows_the_schedules_overlap(tmp_path):
    """192x128 with 3 warpgroups at hdim 128 (the tune before the overlap schedule) fits only a
    profile that turns the overlap off."""
    data = yaml.safe_load(find_profile("h200").path.read_text())
    data["configs"] = [c for c in data["configs"] if c["hdim"] != 128] + [
        {"hdim": 128, "causal": "any", "seqlen": [0, None], "block_m": 192, "block_n": 128, "stages": 2}]
    with pytest.raises(ProfileError, match=r"configs\[\d+\]\.registers: .*S, O and P"):
        load_profile(write(tmp_path, data, "h200-3wg.yaml"))
    data["schedule"] = {"overlap": False}
    assert load_profile(write(tmp_path, data, "h200-3wg-no-overlap.yaml")).tile_for(128, False, 1, 1).block_m == 192


@pytest.mark.parametrize("change, problem", [
    ({"configs_from": "h200"}, r"configs: give configs or configs_from, not both"),
    ({"configs": None, "configs_from": "h2000"}, r"configs_from: no shipped profile 'h2000'; allowed: .*h200"),
    ({"configs": None, "configs_from": "rtx4090"}, r"configs_from: rtx4090 is a sm80 profile, this one sm90"),
    ({"configs": None}, r"configs: missing required key; allowed: a tile table \(configs\), or configs_from"),
    ({"configs_replace": []}, r"configs_replace: only with configs_from"),
    ({"configs": None, "configs_from": "h200", "configs_replace": [{"hdim": 64, "causal": "any"}]},
     r"configs_replace\[0\]: needs an int hdim and causal true or false"),
    ({"configs": None, "configs_from": "rtx4090", "configs_replace": []}, r"configs_from: rtx4090 is a sm80 profile"),
])
def test_configs_from_needs_one_shipped_profile_of_the_same_family(tmp_path, change, problem):
    data = yaml.safe_load(find_profile("h200").path.read_text())
    for key, value in change.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    with pytest.raises(ProfileError, match=problem):
        load_profile(write(tmp_path, data, "exp.yaml"))


def test_configs_replace_swaps_only_the_buckets_it_names(tmp_path):
    """configs_from: h200 with configs_replace for hdim 256 causal: that pair's entries are the
    replacement's, every other entry is h200's, in h200's order; a replacement that leaves a gap
    in the sequence lengths fails as a gap in an own table would."""
    data = yaml.safe_load(find_profile("h200").path.read_text())
    del data["configs"]
    data["configs_from"] = "h200"
    data["configs_replace"] = [{"hdim": 256, "causal": True, "seqlen": [0, None], "block_m": 128, "block_n": 64,
                                "num_warpgroups": 2, "stages": 2}]
    mixed, h200 = load_profile(write(tmp_path, data, "exp.yaml")), find_profile("h200")
    assert [c for c in mixed.configs if (c.hdim, c.causal) != (256, True)] == \
        [c for c in h200.configs if (c.hdim, c.causal) != (256, True)]
    assert [c.tile for c in mixed.configs if (c.hdim, c.causal) == (256, True)] == [sm90_tile(128, 64, 2)]
    assert mixed.tile_for(256, True, 16384, 16384) == sm90_tile(128, 64, 2) != h200.tile_for(256, True, 16384, 16384)
    data["configs_replace"][0]["seqlen"] = [0, 1024]
    with pytest.raises(ProfileError, match=r"hdim 256"):
        load_profile(write(tmp_path, data, "gap.yaml"))


def test_configs_from_validates_the_tiles_against_this_profile(tmp_path):
    """A tile table taken over is checked as this profile's own would be, not trusted: here
    h200's hdim 256 rows serve a head dim this profile does not build."""
    data = yaml.safe_load(find_profile("h200").path.read_text())
    del data["configs"]
    data["configs_from"] = "h200"
    data["head_dims"] = [64, 128]
    with pytest.raises(ProfileError, match=r"configs\[\d+\]\.hdim"):
        load_profile(write(tmp_path, data, "exp.yaml"))
