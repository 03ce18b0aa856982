"""tune --decode without a GPU: its candidates, the profile it writes, its report, its options."""
from click.testing import CliRunner
from rich.console import Console

from flashtune.cli import cli
from flashtune.commands import tune
from flashtune.kernels.decode_spec import DecodeTile, decode_tile_keys, decode_tile_problems
from flashtune.kernels.profiles import find_profile, load_profile
from flashtune.tuning.decode_search import DecodeCandidate, DecodeTuneResult, decode_candidates
from flashtune.tuning.split_fit import SplitFit
from flashtune.tuning.writer import write_profile


def test_candidates_start_with_the_profiles_tile_and_all_fit_the_arch():
    for name in ("h200", "rtx4090"):
        profile = find_profile(name)
        for hdim, rows in decode_tile_keys(profile.head_dims):
            tiles = decode_candidates(profile, hdim, rows)
            assert tiles[0] == profile.decode_tile(hdim, rows) and len(set(tiles)) == len(tiles)
            assert len(tiles) > 3 or (name, hdim) == ("rtx4090", 256)  # 99 KB: one hdim-256 tile fits
            assert all(t.rows == rows and not decode_tile_problems(hdim, t, profile.arch) for t in tiles)
    assert decode_tile_keys((64, 256)) == [(64, 16), (64, 32), (256, 16), (256, 32)]


def fake_result(profile):
    start = profile.decode_tile(128, 16)
    better = DecodeTile(16, 64, 2, 3)
    cands = [DecodeCandidate(128, 16, start, "a", starting=True, us={"c1": 10.0, "c2": 20.0}, vs_starting=1.0),
             DecodeCandidate(128, 16, better, "b", us={"c1": 9.0, "c2": 18.0}, vs_starting=0.9),
             DecodeCandidate(128, 16, DecodeTile(16, 16, 8, 4), "c", status="ptxas spills 80/80 bytes (store/load)")]
    return DecodeTuneResult(cands, {(128, 16): better})


def test_the_written_profile_has_the_winners_and_keeps_everything_else(tmp_path):
    base = find_profile("h200")
    result = fake_result(base)
    assert result.changed() == {(128, 16): DecodeTile(16, 64, 2, 3)}
    split = SplitFit(base.decode_split, base.decode_split, (1.01, 1.05), (1.01, 1.05), [])  # no fitted gain
    written, prov = tune.write_decode_tuned(base, result, split, "bfloat16", "NVIDIA H200", "h200-decode",
                                            str(tmp_path / "out.yaml"))
    assert written.decode_tile(128, 16) == DecodeTile(16, 64, 2, 3)
    assert written.decode_tile(64, 16) == base.decode_tile(64, 16)
    assert written.configs == base.configs and written.fp8 == base.fp8 and written.decode_split == base.decode_split
    assert prov["decode_tune"]["pairs"][0]["vs_starting"] == 0.9 and "Decode tiles tuned" in written.description
    console = Console(record=True, width=200)
    tune.render_decode(result, console)
    text = console.export_text()
    assert "(written)" in text and "(starting)" in text and "ptxas spills 80/80" in text


def test_a_plain_tune_keeps_the_base_profiles_decode_section(tmp_path):
    base = load_profile(write_profile(find_profile("h200"), "h200-d", "d.", {}, {}, tmp_path / "d.yaml",
                                      decode_tiles={(256, 16): DecodeTile(16, 16, 2, 4)}))
    again = load_profile(write_profile(base, "h200-e", "e.", {}, {}, tmp_path / "e.yaml"))
    assert again.decode_tile(256, 16) == DecodeTile(16, 16, 2, 4) and again.decode_tiles == base.decode_tiles


def test_tune_decode_refuses_the_prefill_searchs_options():
    result = CliRunner().invoke(cli, ["tune", "--decode", "--tiles", "128x128", "--fp8"])
    assert result.exit_code == 2 and "--tiles, --fp8: not an option of tune --decode" in result.output
