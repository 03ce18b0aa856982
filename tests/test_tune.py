"""The tuner without a GPU: search-space restrictions, the resumable cache, the YAML writer,
and the search loop with the compiler and the GPU replaced by fakes."""
from __future__ import annotations

import dataclasses

import json

import pytest

from flashtune.tuning import search as tune
from flashtune.kernels.arch import get_arch
from flashtune.kernels.build import BuildError, BuildResult
from flashtune.tuning.writer import write_profile
from flashtune.commands import tune as cmd_tune
from flashtune.kernels.profiles import find_profile, load_profile
from flashtune.kernels.tiles import TileConfig, check_tile, shared_memory_bytes, sm90_tile
from flashtune.tuning.cache import TuneCache
from flashtune.tuning.space import BUCKET_EDGES, BUCKET_SEQLENS, candidates, profile_buckets


# ---------------------------------------------------------------- search space

@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_120"])
@pytest.mark.parametrize("hdim", [64, 128, 256])
def test_candidates_respect_the_arch_limits(arch, hdim):
    facts = get_arch(arch)
    cands = candidates("sm80", hdim, facts)
    assert cands and all(not check_tile("sm80", hdim, c, facts) for c in cands)
    assert all(shared_memory_bytes("sm80", hdim, c) <= facts.max_smem_per_block for c in cands)


def test_impossible_configs_are_never_candidates():
    # d256 128x64 with 8 warps needs 128 KB: fine on sm_80 (163 KB), impossible on sm_89 (99 KB).
    big = TileConfig(128, 64, 8, 1)
    assert big in candidates("sm80", 256, get_arch("sm_80"))
    assert big not in candidates("sm80", 256, get_arch("sm_89"))
    # 4 warps x 32 rows with d256 would need 256+ accumulator registers per thread.
    assert TileConfig(128, 64, 4, 1) not in candidates("sm80", 256, get_arch("sm_80"))


def test_starting_tiles_come_first_and_survive_the_limit():
    start = (TileConfig(64, 32, 4, 1),)
    cands = candidates("sm80", 128, get_arch("sm_90"), starting=start, limit=3)
    assert cands[0] == start[0] and len(cands) == 3 and len(set(cands)) == 3


def test_buckets():
    """The default buckets, measured at 512 / 1k / 4k / 16k; a profile's own edges split them
    further, so a hand split (h200: hdim 128 causal at 4k) is measured as a bucket of its own and
    survives a re-tune."""
    def edges_and_lengths(profile, hdim, causal):
        return [(b.lo, b.hi, b.seqlen) for b in profile_buckets(find_profile(profile), hdim, causal)]

    default = [(0, 1024, 512), (1024, 2048, 1024), (2048, 8192, 4096), (8192, None, 16384)]
    assert [(lo, hi) for lo, hi, _ in default] == list(zip(BUCKET_EDGES, BUCKET_EDGES[1:]))
    assert [s for _, _, s in default] == list(BUCKET_SEQLENS)
    assert edges_and_lengths("h200-sm80", 128, True) == default  # [0, null) tables add no edge
    assert edges_and_lengths("h200", 128, False) == default
    assert edges_and_lengths("h200", 128, True) == [(0, 1024, 512), (1024, 2048, 1024), (2048, 4096, 2048),
                                                    (4096, 8192, 4096), (8192, None, 16384)]
    assert edges_and_lengths("h200", 256, True) == default  # its hand split at 1k is a default edge now


def _default_buckets(*tiles):
    """(lo, hi, tile) for the four default buckets."""
    return [(lo, hi, t) for lo, hi, t in zip(BUCKET_EDGES, BUCKET_EDGES[1:], tiles)]


# ---------------------------------------------------------------- cache

STAMP = {"gpu": "NVIDIA H200", "flashtune": "0.1.0", "kernel_sources": "abc"}


def test_cache_persists_and_resumes(tmp_path):
    path = tmp_path / "t.jsonl"
    cache = TuneCache(path, STAMP)
    cache.put("a", status="ok", tflops=1.0)
    cache.put("b", status="failed", reason="compile error: x")
    again = TuneCache(path, STAMP)
    assert again.get("a")["tflops"] == 1.0 and again.get("b")["reason"] == "compile error: x"


def test_truncated_last_line_is_ignored_and_repaired(tmp_path):
    path = tmp_path / "t.jsonl"
    cache = TuneCache(path, STAMP)
    cache.put("a", status="ok")
    cache.put("b", status="ok")
    text = path.read_text()
    path.write_text(text[:-9])  # the run died mid-write
    resumed = TuneCache(path, STAMP)
    assert resumed.get("a") is not None and resumed.get("b") is None
    assert all(json.loads(line) for line in path.read_text().splitlines())  # rewritten cleanly


def test_a_cache_from_another_gpu_or_kernel_is_set_aside(tmp_path):
    path = tmp_path / "t.jsonl"
    TuneCache(path, STAMP).put("a", status="ok")
    other = TuneCache(path, {**STAMP, "kernel_sources": "def"})
    assert other.get("a") is None and other.set_aside and other.set_aside.is_file()


# ---------------------------------------------------------------- writer

def test_written_profile_loads_validates_and_keeps_untuned_parts(tmp_path):
    base = find_profile("h200-sm80")
    tiles = {(128, False): _default_buckets(*[TileConfig(128, 64, 4, 1)] * 3, TileConfig(128, 128, 8, 1)),
             (128, True): _default_buckets(*[TileConfig(64, 64, 4, 2)] * 4)}
    class Version(str):  # like torch.__version__, a str subclass plain YAML cannot represent
        pass

    prov = {"tool": "flashtune tune", "gpu": "H200", "torch": Version("2.11.0+cu130")}
    path = write_profile(base, "h200-sm80-tuned", "test", tiles, prov, tmp_path / "out.yaml")
    tuned = load_profile(path)
    assert tuned.name == "h200-sm80-tuned" and tuned.provenance["torch"] == "2.11.0+cu130"
    assert tuned.tile_for(128, False, 1024, 1024) == TileConfig(128, 64, 4, 1)
    assert tuned.tile_for(128, False, 4096, 4096) == TileConfig(128, 64, 4, 1)
    assert tuned.tile_for(128, False, 16384, 16384) == TileConfig(128, 128, 8, 1)
    assert tuned.tile_for(128, True, 100, 100) == TileConfig(64, 64, 4, 2)
    for hdim in (64, 256):  # untouched head dims are exactly the base profile's
        for causal in (False, True):
            assert tuned.tile_for(hdim, causal, 5000, 5000) == base.tile_for(hdim, causal, 5000, 5000)
    lines = [line for line in path.read_text().splitlines() if "hdim: 128, causal: false" in line]
    assert len(lines) == 2  # equal neighbouring buckets merged


def test_a_tuned_tile_without_the_pingpong_is_written_and_read_back(tmp_path):
    base = find_profile("h200")
    off = sm90_tile(128, 128, 3, (("pingpong", False),))
    tiles = {(64, True): _default_buckets(off, off, sm90_tile(192, 128, 2), sm90_tile(192, 128, 3))}
    path = write_profile(base, "h200-tuned", "test", tiles, {"tool": "flashtune tune"}, tmp_path / "out.yaml")
    assert "stages: 3, pingpong: false}" in path.read_text()
    tuned = load_profile(path)
    assert tuned.tile_for(64, True, 1024, 1024) == off and tuned.tile_for(64, True, 4096, 4096).schedule == ()


def test_fp8_tune_writes_fp8_configs_and_keeps_the_16_bit_tiles(tmp_path):
    base = find_profile("h200")  # fp8: {qk: e4m3, pv: e4m3, kv: e4m3} and fp8.pv_configs, no fp8.configs yet
    wide = sm90_tile(128, 176, 3)  # only FP8 Q/K fits it in shared memory
    tiles = {(128, False): _default_buckets(*[wide] * 4)}
    path = write_profile(base, "h200-fp8", "test", tiles, {"tool": "flashtune tune"}, tmp_path / "fp8.yaml", fp8=True)
    tuned = load_profile(path)
    assert tuned.fp8 == {"qk": "e4m3", "pv": "e4m3", "kv": "e4m3"} and tuned.fp8_configs
    assert tuned.fp8_pv_configs == base.fp8_pv_configs  # the all-FP8 twins' own tiles stay
    assert tuned.tile_for(128, False, 4096, 4096, fp8=True) == wide
    for hdim in (64, 128, 256):  # the 16-bit tiles are untouched; untuned FP8 slots keep them too
        for causal in (False, True):
            assert tuned.tile_for(hdim, causal, 5000, 5000) == base.tile_for(hdim, causal, 5000, 5000)
            if (hdim, causal) != (128, False):
                assert tuned.tile_for(hdim, causal, 5000, 5000, fp8=True) == base.tile_for(hdim, causal, 5000, 5000)
    # a later 16-bit tune of that profile keeps its fp8.configs
    again = load_profile(write_profile(tuned, "h200-fp8-2", "test", {(64, True): _default_buckets(*[sm90_tile(192, 128, 2)] * 4)},
                                       {"tool": "flashtune tune"}, tmp_path / "again.yaml"))
    assert again.tile_for(128, False, 4096, 4096, fp8=True) == wide


def _all_fp8_profile(tmp_path, table: str = "pv_configs"):
    """h100 with all-FP8 twins on tiles P V takes (at hdim 128 128x128), in fp8.pv_configs (the FP8 Q/K
    twins keep h100's tiles, 128x176 there) or, with table="configs", shared with the FP8 Q/K twins."""
    import yaml

    data = yaml.safe_load(find_profile("h100").path.read_text())
    data["fp8"] = {"qk": "e4m3", "pv": "e4m3", table: [
        {"hdim": d, "causal": "any", "seqlen": [0, None], "block_m": 128, "block_n": 64 if d == 256 else 128,
         "num_warpgroups": 2, "stages": 2} for d in (64, 128, 256)]}
    (tmp_path / f"pv-{table}.yaml").write_text(yaml.safe_dump(data))
    return load_profile(tmp_path / f"pv-{table}.yaml")


def test_a_tune_keeps_the_all_fp8_twins_own_tiles(tmp_path):
    """fp8.pv_configs survive a 16-bit tune and an FP8 Q/K tune of the profile (neither times them)."""
    base = _all_fp8_profile(tmp_path)
    for fp8 in (False, True):
        tiles = {(64, True): _default_buckets(*[sm90_tile(128, 128, 2)] * 4)}
        tuned = load_profile(write_profile(base, "h100-pv", "test", tiles, {"tool": "flashtune tune"},
                                           tmp_path / f"tuned-{fp8}.yaml", fp8=fp8))
        assert tuned.fp8_pv_configs == base.fp8_pv_configs and tuned.fp8 == base.fp8
        assert tuned.tile_for(128, False, 4096, 4096, fp8=True, fp8_pv=True).block_n == 128
        assert tuned.tile_for(128, False, 4096, 4096, fp8=True).block_n == 176
    # without pv_configs the all-FP8 twins share the FP8 twins' tiles; an FP8 tune that moves those
    # to a tile P V cannot take writes the all-FP8 twins' old tiles as their own table
    shared = _all_fp8_profile(tmp_path, "configs")
    tiles = {(128, False): _default_buckets(*[sm90_tile(128, 176, 2)] * 4)}
    tuned = load_profile(write_profile(shared, "h100-pv2", "test", tiles, {"tool": "flashtune tune"},
                                       tmp_path / "moved.yaml", fp8=True))
    assert tuned.tile_for(128, False, 4096, 4096, fp8=True).block_n == 176
    assert tuned.tile_for(128, False, 4096, 4096, fp8=True, fp8_pv=True).block_n == 128
    assert tuned.fp8_pv_configs == shared.fp8_configs


# ---------------------------------------------------------------- the search loop, faked

@pytest.fixture
def fake_world(monkeypatch, tmp_path):
    """No compiler, no GPU: builds fail for block_n 32, spill for w8, and time by tile area."""
    calls = {"build": [], "measure": []}

    def fake_build_specs(specs, jobs=None, force=False, on_done=None):
        results, failures = [], []
        for s in specs:
            calls["build"].append(s.name)
            if s.tile.block_n == 32:
                failures.append((s, BuildError("x.cu(1): error: something broke")))
                continue
            log = tmp_path / f"{s.name}.log"
            log.write_text("")
            spill = 200 if s.tile.num_warps == 8 else 0
            results.append(BuildResult(s.name, s.arch, "lib.so", False, 1.0, 200, spill, spill, 0, 0, str(log)))
        return results, failures

    def fake_measure(spec, seqlens, repeats):
        calls["measure"].append(spec.name)
        if spec.tile.block_m == 64 and spec.tile.block_n == 64 and spec.tile.stages == 2:
            return [{"status": "failed", "reason": "wrong result: rel err 1 > 0.003"}]
        return [{"status": "ok", "seqlen": s, "ms": 1.0, "tflops": spec.tile.block_m * spec.tile.block_n / 100 + s / 1e4,
                 "check": "ok"} for s in seqlens]

    def fake_side_by_side(specs, seqlen, repeats):  # the first pass's order again, unless a test says otherwise
        calls["final"].append((seqlen, sorted(s.name for s in specs)))
        return {s.name: 1.0 for s in specs}

    calls["final"] = []
    monkeypatch.setattr("flashtune.kernels.build.build_specs", fake_build_specs)
    monkeypatch.setattr(tune, "measure_candidate", fake_measure)
    monkeypatch.setattr(tune, "time_side_by_side", fake_side_by_side)
    monkeypatch.setattr(tune, "stamp", lambda gpu, family: {"gpu": gpu, "family": family})
    return calls


def test_a_cache_of_the_old_default_buckets_is_not_read_for_the_new_ones(fake_world, tmp_path, monkeypatch):
    """Runs measured at the buckets before the split at 1k (1k, 4k, 16k) were cached as "run";
    a tune with today's defaults (512, 1k, 4k, 16k) measures again rather than read 1k's figures
    for [0, 1k)."""
    from flashtune.tuning import space as tune_space

    profile = find_profile("h200-sm80")
    opts = tune.TuneOptions(hdims=(128,), causal=(False,), final_round=0)
    cache = str(tmp_path / "c.jsonl")
    legacy = tune_space.buckets_from_edges((0, 2048, 8192, None))
    assert tuple(b.seqlen for b in legacy) == tune_space.LEGACY_BUCKET_SEQLENS
    with monkeypatch.context() as m:
        m.setattr(tune, "profile_buckets", lambda *args, **kw: legacy)
        old = tune.run_tune(profile, "NVIDIA H200", opts, cache)
    measured = len(fake_world["measure"])
    assert measured and (128, False, 512) not in old.winners
    new = tune.run_tune(profile, "NVIDIA H200", opts, cache)
    assert len(fake_world["measure"]) == 2 * measured  # every survivor again, at the new lengths
    assert {seqlen for (_, _, seqlen) in new.winners} == set(BUCKET_SEQLENS)
    again = tune.run_tune(profile, "NVIDIA H200", opts, cache)
    assert len(fake_world["measure"]) == 2 * measured and again.winners == new.winners  # now cached


def test_a_final_round_side_by_side_decides_each_bucket_and_is_cached(fake_world, tmp_path, monkeypatch):
    """The first pass ranks by tile area; timed again side by side, a contender other than the
    first pass's winner (a bucket's top 3 and the starting tile) is the fastest: it wins, with
    the final round's figures, and a rerun takes them from the cache."""
    profile = find_profile("h200-sm80")
    opts = tune.TuneOptions(hdims=(128,), causal=(False,))
    first = tune.run_tune(profile, "NVIDIA H200", dataclasses.replace(opts, final_round=0),
                          str(tmp_path / "first.jsonl"))
    slot = (128, False, 16384)
    ranked = sorted((r for r in first.records if r.ok and r.seqlen == 16384),
                    key=lambda r: -r.tflops)
    contenders = {r.spec for r in ranked[:3]} | {first.starting[slot].spec}
    underdog = min((r for r in ranked if r.spec in contenders - {first.winners[slot].spec}),
                   key=lambda r: r.tflops)

    def underdog_fastest(specs, seqlen, repeats):
        fake_world["final"].append((seqlen, sorted(s.name for s in specs)))
        return {s.name: 0.5 if s.name == underdog.spec else 2.0 for s in specs}

    monkeypatch.setattr(tune, "time_side_by_side", underdog_fastest)
    cache = tmp_path / "c.jsonl"
    result = tune.run_tune(profile, "NVIDIA H200", opts, str(cache))
    assert result.final_round and len(fake_world["final"]) == len(BUCKET_SEQLENS)  # one round per bucket
    assert sorted(contenders) in [names for _, names in fake_world["final"]]
    winner = result.winners[slot]
    assert winner.spec == underdog.spec != first.winners[slot].spec
    assert winner.ms == 0.5 and winner.first_ms == 1.0
    assert winner.tflops == pytest.approx(winner.first_tflops * 2)
    again = tune.run_tune(profile, "NVIDIA H200", opts, str(cache))
    assert len(fake_world["final"]) == len(BUCKET_SEQLENS) and again.winners == result.winners  # from the cache


def test_the_table_ranks_a_final_round_by_its_own_figures(fake_world, tmp_path, monkeypatch):
    """A candidate outside the final round keeps its first-pass figure, timed alone and often a
    few % higher than side by side (an H200 tune showed one as rank 1 above the winner); the
    table ranks only the final round's contenders, by its figures: rank 1 is the tile written."""
    from rich.console import Console

    from flashtune.commands.tune import render

    def slow_side_by_side(specs, seqlen, repeats):  # every contender 10% slower than alone
        fake_world["final"].append((seqlen, sorted(s.name for s in specs)))
        return {s.name: 1.1 for s in specs}

    monkeypatch.setattr(tune, "time_side_by_side", slow_side_by_side)
    profile = find_profile("h200-sm80")
    result = tune.run_tune(profile, "NVIDIA H200", tune.TuneOptions(hdims=(128,), causal=(False,)),
                           str(tmp_path / "c.jsonl"))
    slot = (128, False, 16384)
    left_out = [r for r in result.records if r.ok and r.seqlen == 16384 and r.first_ms is None]
    assert left_out and max(r.tflops for r in left_out) > result.winners[slot].tflops  # the trap is set
    console = Console(record=True, width=200)
    render(result, console)
    rows = [line for line in console.export_text().splitlines() if "16384" in line]
    assert result.winners[slot].tile.label in rows[0] and "│    1 │" in rows[0]
    assert not any(f" {r.tile.label} " in " ".join(rows) for r in left_out)


def test_final_round_0_lets_the_first_pass_decide(fake_world, tmp_path):
    profile = find_profile("h200-sm80")
    result = tune.run_tune(profile, "NVIDIA H200", tune.TuneOptions(hdims=(128,), causal=(False,), final_round=0),
                           str(tmp_path / "c.jsonl"))
    assert not result.final_round and fake_world["final"] == [] and result.winners
    assert all(r.first_ms is None for r in result.records)


def test_a_retune_keeps_a_hand_split_bucket(fake_world, tmp_path, monkeypatch):
    """h200 splits hdim 256 causal at 1k (by hand, now a default edge too): the tuner measures
    [0, 1024) at 512 as a bucket of its own, and where another tile wins there the written profile
    keeps the split (the tuner used to measure 1k for all of [0, 2048) and write its own edges
    over the split)."""
    from flashtune.commands.tune import chosen_tiles

    short = sm90_tile(128, 64, 2)

    def short_wins_at_512(spec, seqlens, repeats):
        return [{"status": "ok", "seqlen": s, "ms": 1.0, "check": "ok",
                 "tflops": (999.0 if (s == 512) == (spec.tile == short) else spec.tile.block_n / 100)}
                for s in seqlens]

    monkeypatch.setattr(tune, "measure_candidate", short_wins_at_512)
    profile = find_profile("h200")
    opts = tune.TuneOptions(hdims=(256,), causal=(True,), final_round=0, max_candidates=4)
    result = tune.run_tune(profile, "NVIDIA H200", opts, str(tmp_path / "c.jsonl"))
    assert [b.seqlen for b in result.buckets[(256, True)]] == [512, 1024, 4096, 16384]
    assert result.winners[(256, True, 512)].tile == short != result.winners[(256, True, 1024)].tile
    tiles, _ = chosen_tiles(profile, result, opts)
    path = write_profile(profile, "h200-again", "test", tiles, {"tool": "flashtune tune"}, tmp_path / "again.yaml")
    again = load_profile(path)
    assert again.tile_for(256, True, 512, 512) == again.tile_for(256, True, 1023, 1023) == short
    assert again.tile_for(256, True, 1024, 1024) == result.winners[(256, True, 1024)].tile


def test_search_records_reasons_picks_winners_and_never_retries(fake_world, tmp_path):
    profile = find_profile("h200-sm80")
    opts = tune.TuneOptions(hdims=(128,), causal=(False,))
    cache = tmp_path / "c.jsonl"
    result = tune.run_tune(profile, "NVIDIA H200", opts, str(cache))
    reasons = {r.spec: r.reason for r in result.records if not r.ok}
    assert any(r.startswith("compile error") for r in reasons.values())
    assert any(r.startswith("ptxas spills") for r in reasons.values())
    assert any(r.startswith("wrong result") for r in reasons.values())
    # The fake times by tile area; the largest tiles that built without spills are 128x64/64x128.
    winner = result.winners[(128, False, 16384)].tile
    assert winner.block_m * winner.block_n == 128 * 64 and winner.num_warps == 4
    assert (128, False, 1024) in result.starting  # the starting tile was measured too
    builds, measures = len(fake_world["build"]), len(fake_world["measure"])
    again = tune.run_tune(profile, "NVIDIA H200", opts, str(cache))
    assert len(fake_world["build"]) == builds and len(fake_world["measure"]) == measures  # all from cache
    assert again.winners == result.winners
    records = json.loads(json.dumps([r.to_json() for r in result.records]))  # what `tune --json` prints
    assert {r["tile"] for r in records if r["status"] == "ok"} >= {winner.label}
    assert all(r["reason"] for r in records if r["status"] == "failed")


def test_the_written_profile_is_short_to_read_and_carries_its_story_in_provenance(fake_world, tmp_path):
    import textwrap

    from flashtune.commands.tune import write_tuned

    profile = find_profile("h200")
    opts = tune.TuneOptions(hdims=(128,), causal=(False,))
    result = tune.run_tune(profile, "NVIDIA H200", opts, str(tmp_path / "c.jsonl"))
    written, prov = write_tuned(profile, result, opts, "NVIDIA H200", "h200-tuned", str(tmp_path / "t.yaml"))
    assert len(textwrap.wrap(written.description, 120)) <= 3 and "from profile h200" in written.description
    assert written.provenance["base_profile"] == "h200" and written.provenance["measured"] == prov["measured"]


def test_fp8_search_builds_and_measures_fp8_twins(fake_world, tmp_path):
    profile = find_profile("h200")
    opts = tune.TuneOptions(hdims=(128,), causal=(False,), max_candidates=3, fp8=True)
    result = tune.run_tune(profile, "H200", opts, tmp_path / "c.jsonl")
    assert fake_world["build"] and all("_fp8qk_" in name for name in fake_world["build"])
    assert result.winners and all(w.spec.endswith("_fp8qk_sm90a") for w in result.winners.values())


def test_fp8_all_search_builds_and_measures_all_fp8_twins_on_whole_panels(fake_world, tmp_path):
    """--fp8-all: only the all-FP8 twins, on tiles whose block_n is whole 64-key panels; the winners
    become fp8.pv_configs and the other tables stay as they were."""
    profile = _all_fp8_profile(tmp_path)
    opts = tune.TuneOptions(hdims=(128,), causal=(False,), fp8=True, fp8_pv=True)
    result = tune.run_tune(profile, "H100", opts, tmp_path / "c.jsonl")
    assert fake_world["build"] and all("_fp8all_" in name for name in fake_world["build"])
    widths = {int(name.split("_h128_")[1].split("_")[0].split("x")[1]) for name in fake_world["build"]}
    assert widths and all(n % 64 == 0 for n in widths) and 128 in widths
    assert result.winners and all(w.spec.endswith("_fp8all_sm90a") for w in result.winners.values())
    written, prov = cmd_tune.write_tuned(profile, result, opts, "H100", "h100-pv-tuned", str(tmp_path / "w.yaml"))
    assert prov["kernels"] == "all-fp8" and "fp8.pv_configs" in written.description
    assert written.configs == profile.configs and written.fp8_configs == profile.fp8_configs
    best = max(result.winners.values(), key=lambda w: w.tflops).tile
    assert written.tile_for(128, False, 16384, 16384, fp8=True, fp8_pv=True) == best
    assert written.tile_for(128, False, 16384, 16384, fp8=True).block_n == 176  # the Q/K twins' own


def test_fp8_all_is_refused_with_a_line_that_says_what_to_do(tmp_path):
    """--fp8-all beside --fp8, with another dtype than the kernels' output, or on a profile without
    all-FP8 twins: exit 2 before anything is compiled (the dtype and flag checks before a GPU is sought)."""
    import click
    from click.testing import CliRunner

    from flashtune.cli import cli
    from flashtune.kernels.gpu import GpuInfo
    from flashtune.kernels.arch import arch_for_compute_capability

    for args, said in ((["--fp8", "--fp8-all"], "--fp8 and --fp8-all: one at a time"),
                       (["--fp8-all", "--dtype", "float16"], "the all-FP8 kernels write bfloat16 only")):
        result = CliRunner().invoke(cli, ["tune", *args])
        assert result.exit_code == 2 and said in result.output, result.output
    h100 = GpuInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), arch_for_compute_capability(9, 0), None, None, None, None,
                   None, None)
    import yaml

    data = yaml.safe_load(find_profile("h100").path.read_text())
    data["fp8"] = {"qk": "e4m3", "kv": "e4m3"}  # FP8 Q/K twins alone
    (tmp_path / "qk.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(click.BadParameter, match=r"builds no all-FP8 kernels .*fp8: \{qk: e4m3, pv: e4m3\}"):
        cmd_tune.check_request(load_profile(tmp_path / "qk.yaml"), h100, None, None, True, True)
    assert cmd_tune.check_request(_all_fp8_profile(tmp_path), h100, [128], [(128, 192)], True, True) == []
    with pytest.raises(click.BadParameter, match="176.*panels of 64"):  # a tile the all-FP8 kernel refuses
        cmd_tune.check_request(_all_fp8_profile(tmp_path), h100, [128], [(128, 176)], True, True)


def test_gpus_2_times_candidates_in_one_worker_per_gpu(fake_world, tmp_path, monkeypatch):
    """--gpus 2: a pool of two workers, each pinned to its own device by CUDA_VISIBLE_DEVICES
    before CUDA starts; every candidate is measured once, by one of them."""
    import os

    fake = tune.measure_candidate

    def pinned(spec, seqlens, repeats):  # runs in the worker: report which device it was given
        import time

        time.sleep(0.2)  # long enough that both workers take candidates
        return [{**o, "check": os.environ["CUDA_VISIBLE_DEVICES"]} for o in fake(spec, seqlens, repeats)]

    monkeypatch.setattr(tune, "measure_candidate", pinned)
    monkeypatch.setattr(tune, "POOL_START_METHOD", "fork")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    profile = find_profile("h200-sm80")
    opts = tune.TuneOptions(hdims=(128,), causal=(False, True), max_candidates=6, gpus=2)
    result = tune.run_tune(profile, "H200", opts, tmp_path / "c.jsonl")
    ok = [r for r in result.records if r.ok]
    assert ok and {r.check for r in ok} <= {"0", "1"} and len({r.check for r in ok}) == 2
    measured = [r.spec for r in ok if r.seqlen == 1024]
    assert len(measured) == len(set(measured))  # each candidate once


def test_time_budget_stops_and_a_rerun_resumes(fake_world, tmp_path, monkeypatch):
    profile = find_profile("h200-sm80")
    opts = tune.TuneOptions(hdims=(64,), causal=(True,), time_budget_s=1)
    clock = iter(range(0, 10_000, 5))
    monkeypatch.setattr(tune.time, "monotonic", lambda: next(clock))
    cache = tmp_path / "c.jsonl"
    first = tune.run_tune(profile, "NVIDIA H200", opts, str(cache))
    assert first.stopped_by_budget
    measured_once = list(fake_world["measure"])
    monkeypatch.setattr(tune.time, "monotonic", lambda: 0)
    second = tune.run_tune(profile, "NVIDIA H200", tune.TuneOptions(hdims=(64,), causal=(True,)), str(cache))
    assert not second.stopped_by_budget
    remeasured = fake_world["measure"][len(measured_once):]
    assert not set(remeasured) & set(measured_once)  # nothing measured twice


def test_cached_builds_are_rejudged_with_a_new_spill_limit(fake_world, tmp_path):
    profile = find_profile("h200-sm80")
    cache = tmp_path / "c.jsonl"
    strict = tune.run_tune(profile, "NVIDIA H200", tune.TuneOptions(hdims=(128,), causal=(False,)), str(cache))
    assert any(r.reason.startswith("ptxas spills") for r in strict.records)
    builds = len(fake_world["build"])
    lenient = tune.run_tune(profile, "NVIDIA H200",
                            tune.TuneOptions(hdims=(128,), causal=(False,), max_spill_bytes=10_000), str(cache))
    assert len(fake_world["build"]) == builds  # nothing recompiled
    assert not any(r.reason.startswith("ptxas spills") for r in lenient.records)
    assert any(r.tile.num_warps == 8 and r.ok for r in lenient.records)


def test_an_unusable_toolchain_raises_and_caches_nothing(fake_world, tmp_path, monkeypatch):
    from flashtune.kernels.toolchain import ToolchainError

    def broken(*a, **k):
        raise ToolchainError("nvcc 12.4 cannot target sm_120")

    monkeypatch.setattr("flashtune.kernels.build.build_specs", broken)
    cache = tmp_path / "c.jsonl"
    with pytest.raises(ToolchainError):
        tune.run_tune(find_profile("h200-sm80"), "NVIDIA H200", tune.TuneOptions(hdims=(64,)), str(cache))
    assert len(cache.read_text().splitlines()) == 1  # the stamp only


def test_a_candidate_that_breaks_the_cuda_context_stops_the_run(fake_world, tmp_path, monkeypatch):
    def fatal_once(spec, seqlens, repeats):
        fake_world["measure"].append(spec.name)
        return [{"status": "failed", "reason": "launch failure: illegal address (it left the CUDA context "
                 "unusable)", "fatal": True}]

    monkeypatch.setattr(tune, "measure_candidate", fatal_once)
    result = tune.run_tune(find_profile("h200-sm80"), "NVIDIA H200",
                           tune.TuneOptions(hdims=(64,), causal=(True,)), str(tmp_path / "c.jsonl"))
    assert result.aborted and "rerun to resume" in result.aborted
    assert len(fake_world["measure"]) == 1  # nothing after it was attempted in the broken process


# ---------------------------------------------------------------- --tiles

def test_tiles_keep_only_those_shapes_and_the_starting_tiles():
    from flashtune.tuning.space import shape_problems

    h200 = get_arch("sm_90a")
    start = (sm90_tile(128, 176, 2),)
    cands = candidates("sm90", 128, h200, starting=start, shapes=((128, 128), (64, 128)))
    assert cands[0] == start[0]
    assert {(c.block_m, c.block_n) for c in cands[1:]} == {(128, 128), (64, 128)}
    assert {c.stages for c in cands if (c.block_m, c.block_n) == (128, 128)} == {2, 3}  # every stage count
    # and each with the pingpong on (the default), then off (one consumer warpgroup: only the default)
    assert [(c.stages, c.schedule) for c in cands if (c.block_m, c.block_n) == (128, 128)] == \
        [(2, ()), (3, ()), (2, (("pingpong", False),)), (3, (("pingpong", False),))]
    assert all(c.schedule == () for c in cands if c.block_m == 64)
    assert shape_problems("sm90", 128, (128, 128), h200) == []
    assert "not in the sm90 search grid" in shape_problems("sm90", 128, (100, 128), h200)[0]
    # 192-row tiles at hdim 256 exceed the registers (or shared memory) in every variant: the reasons say so
    reasons = shape_problems("sm90", 256, (192, 256), h200)
    assert reasons and all("not in the" not in r for r in reasons)


def test_tune_rejects_a_tile_shape_that_cannot_run_before_building(monkeypatch, fake_props):
    """A shape that runs at none of the head dims is an input error (exit 2) with each reason;
    one that runs at some is tried there, with a note for the others."""
    from click.testing import CliRunner

    from flashtune import cli as cli_mod
    from flashtune.kernels.gpu import detect_gpus

    h200 = fake_props(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132,
                      shared_memory_per_multiprocessor=233472, shared_memory_per_block_optin=232448)
    monkeypatch.setattr("flashtune.commands.common.detect_gpus", lambda: detect_gpus(lambda: [h200], lambda: "580.159.04"))
    monkeypatch.setattr("flashtune.kernels.toolchain.check_build_toolchain", lambda arch: None)
    monkeypatch.setattr(tune, "run_tune", lambda *a, **k: pytest.fail("tuned despite a bad --tiles"))
    result = CliRunner().invoke(cli_mod.cli, ["tune", "--profile", "h200", "--hdims", "128,256", "--tiles", "192x256"])
    assert result.exit_code == 2 and "--tiles" in result.output and "192x256 cannot run" in result.output
    assert "hdim 128:" in result.output and "hdim 256:" in result.output
    result = CliRunner().invoke(cli_mod.cli, ["tune", "--profile", "h200", "--tiles", "128"])
    assert result.exit_code == 2 and "BLOCK_MxBLOCK_N" in result.output
    # 192x128 runs at hdim 64 but not at 128: the tune goes ahead with it at 64 only, and says so
    class Reached(Exception):
        pass

    def fake_run_tune(profile, gpu, opts, cache_path, on_event):
        raise Reached(opts.shapes)

    monkeypatch.setattr(tune, "run_tune", fake_run_tune)
    result = CliRunner().invoke(cli_mod.cli, ["tune", "--profile", "h200", "--hdims", "64,128", "--tiles", "192x128"])
    assert isinstance(result.exception, Reached) and result.exception.args[0] == ((192, 128),)
    assert "not tried at hdim 128" in result.output and "hdim 64" not in result.output.split("not tried at")[1]


def test_final_round_1_is_a_duel_of_the_first_pass_winner_and_the_starting_tile(fake_world, tmp_path):
    profile = find_profile("h200-sm80")
    result = tune.run_tune(profile, "NVIDIA H200", tune.TuneOptions(hdims=(256,), causal=(False,), final_round=1),
                           str(tmp_path / "c.jsonl"))
    duels = {seqlen: names for seqlen, names in fake_world["final"]}
    assert duels  # the fake's larger tiles beat h200-sm80's starting 64x64 at hdim 256
    for seqlen in (b.seqlen for b in result.buckets[(256, False)]):
        start = result.starting[(256, False, seqlen)].spec
        best = max((r for r in result.records if r.ok and r.seqlen == seqlen),
                   key=lambda r: r.first_tflops or r.tflops).spec
        assert duels.get(seqlen) == (sorted({best, start}) if best != start else None)
