"""The backward's tiles without a GPU: the `backward:` profile section, tune --backward's candidates,
the profile it writes, its report and its options."""
import pytest
from click.testing import CliRunner
from rich.console import Console

from flashtune.cli import cli
from flashtune.commands import tune
from flashtune.kernels.bwd_spec import BwdTile, bwd_spec_for_profile, bwd_tile_problems
from flashtune.kernels.profiles import ProfileError, find_profile, load_profile
from flashtune.tuning.backward_search import BackwardCandidate, BackwardTuneResult, backward_candidates
from flashtune.tuning.writer import write_profile

WGMMA, MMA_SYNC_2 = BwdTile("wgmma", 8), BwdTile("mma_sync", 2)


def test_candidates_start_with_the_profiles_tile_and_all_run_on_the_arch():
    h200 = find_profile("h200")
    assert backward_candidates(h200, 128) == [WGMMA, BwdTile("mma_sync", 4), MMA_SYNC_2, BwdTile("mma_sync", 8)]
    rtx = find_profile("rtx4090")  # no wgmma off sm_90a; 8 warps (16 keys a warp) fit its 99 KB at hdim 64 only
    assert backward_candidates(rtx, 64) == [BwdTile("mma_sync", 8), BwdTile("mma_sync", 4), MMA_SYNC_2]
    assert backward_candidates(rtx, 128) == [BwdTile("mma_sync", 4), MMA_SYNC_2]
    assert backward_candidates(rtx, 256) == [BwdTile("mma_sync", 4)]  # 8 warps: 145 KB; 2: not at 256
    # deterministic=True where the tile is 8 warps: the first the dQ kernel takes that fits
    assert bwd_spec_for_profile(rtx, "bfloat16", 64, False, True).warps == 4
    assert bwd_spec_for_profile(h200, "bfloat16", 256, False, True).warps == 4
    assert bwd_tile_problems(128, WGMMA, rtx.arch) == ["the wgmma backward kernel needs sm_90a, not sm_89"]
    assert "not a backward tile" in bwd_tile_problems(128, BwdTile("mma_sync", 16), rtx.arch)[0]
    assert "needs 115200 bytes of shared memory; sm_89 has" in bwd_tile_problems(128, BwdTile("mma_sync", 8), rtx.arch)[0]


def write_yaml(tmp_path, backward: str):
    base = (find_profile("h200").path).read_text()
    path = tmp_path / "mine.yaml"
    path.write_text(base.replace("name: h200\n", "name: mine\n") + backward)
    return path


def test_the_backward_section_chooses_the_kernel_per_head_dim(tmp_path):
    mine = load_profile(write_yaml(tmp_path, "backward:\n  tiles:\n    - {hdim: 64, kernel: mma_sync, warps: 2}\n"
                                             "    - {hdim: 128, kernel: mma_sync}\n"))
    # without warps: the most the arch fits (sm_90a: 8, 128.5 KB at hdim 128)
    assert mine.backward_tile(64) == MMA_SYNC_2 and mine.backward_tile(128) == BwdTile("mma_sync", 8)
    assert bwd_spec_for_profile(mine, "bfloat16", 64, True).name == "flashtune_bwd_bf16_h64_32x32_w2_c_sm90a"
    assert bwd_spec_for_profile(mine, "bfloat16", 128, False).name == "flashtune_bwd_bf16_h128_128x64_w8_sm90a"
    # deterministic=True: the mma.sync kernel's fixed-order dQ, with the tile's warps where the dQ
    # kernel takes them (2), else 4
    assert bwd_spec_for_profile(mine, "bfloat16", 64, False, True).name == "flashtune_bwd_bf16_h64_32x32_w2_det_sm90a"
    assert bwd_spec_for_profile(mine, "bfloat16", 128, False, True).name == "flashtune_bwd_bf16_h128_64x64_w4_det_sm90a"


@pytest.mark.parametrize("entry,said", [
    ("{hdim: 128, kernel: tensor}", "backward.tiles[0].kernel: 'tensor'; allowed: wgmma or mma_sync"),
    ("{hdim: 128, kernel: wgmma, warps: 4}", "backward.tiles[0].warps: the wgmma kernel has two consumer warpgroups"),
    ("{hdim: 128, kernel: wgmma, dq: tma}", "backward.tiles[0].dq: unknown key"),
    ("{hdim: 128, kernel: mma_sync, warps: 16}", "not a backward tile"),
    ("{hdim: 96, kernel: wgmma}", "backward.tiles[0].hdim: head dim 96 is not in head_dims"),
    ("{kernel: wgmma}", "hdim"),
])
def test_a_bad_backward_tile_says_what_is_wrong(tmp_path, entry, said):
    with pytest.raises(ProfileError, match="backward") as err:
        load_profile(write_yaml(tmp_path, f"backward:\n  tiles:\n    - {entry}\n"))
    assert said in str(err.value)


def test_the_wgmma_kernel_is_refused_off_sm90a(tmp_path):
    base = find_profile("rtx4090").path.read_text().replace("name: rtx4090\n", "name: mine\n")
    path = tmp_path / "mine.yaml"
    path.write_text(base + "backward:\n  tiles:\n    - {hdim: 128, kernel: wgmma}\n")
    with pytest.raises(ProfileError, match="needs sm_90a, not sm_89"):
        load_profile(path)


def fake_result():
    cands = [BackwardCandidate(128, WGMMA, ("a", "a_c"), starting=True, us={"4 x 2k": 100.0}, vs_starting=1.0),
             BackwardCandidate(128, BwdTile("mma_sync", 4), ("b", "b_c"), us={"4 x 2k": 90.0}, vs_starting=0.9),
             BackwardCandidate(128, MMA_SYNC_2, ("c", "c_c"), status="dq rel err 3.0e-01 against fp32")]
    return BackwardTuneResult(cands, {128: BwdTile("mma_sync", 4)})


def test_the_written_profile_has_the_winners_and_keeps_everything_else(tmp_path):
    base = find_profile("h200")
    written, prov = tune.write_backward_tuned(base, fake_result(), "bfloat16", "NVIDIA H200", "h200-bwd",
                                              str(tmp_path / "out.yaml"))
    assert written.backward_tile(128) == BwdTile("mma_sync", 4) and written.backward_tile(64) == WGMMA
    assert written.configs == base.configs and written.decode_tiles == base.decode_tiles
    assert prov["backward_tune"]["hdims"][0]["tile"] == "mma.sync, 4 warps" and "Backward tiles tuned" in \
        written.description
    again = load_profile(write_profile(written, "h200-e", "e.", {}, {}, tmp_path / "e.yaml"))  # a later tune keeps it
    assert again.backward_tiles == written.backward_tiles
    console = Console(record=True, width=200)
    tune.render_backward(fake_result(), console)
    text = console.export_text()
    assert "(written)" in text and "(starting)" in text and "dq rel err 3.0e-01" in text


def test_tune_backward_refuses_the_prefill_searchs_options_and_decode():
    result = CliRunner().invoke(cli, ["tune", "--backward", "--tiles", "128x128"])
    assert result.exit_code == 2 and "--tiles: not an option of tune --backward" in result.output
    result = CliRunner().invoke(cli, ["tune", "--backward", "--decode"])
    assert result.exit_code == 2 and "one at a time" in result.output
