"""One way to say each option (issue 32): --json a switch in every command, --out FILE where a
file is written, lists comma-separated with their singular as the same option, and old
spellings accepted for one release with a note."""
from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from flashtune.cli import cli


def run(*args):
    return CliRunner().invoke(cli, list(args), prog_name="flashtune")


def _commands(group: click.Group, path: str = ""):
    for name, command in group.commands.items():
        yield f"{path}{name}", command
        if isinstance(command, click.Group):
            yield from _commands(command, f"{path}{name} ")


def test_json_is_a_switch_in_every_command():
    commands = dict(_commands(cli))
    assert set(commands) == {"detect", "profiles", "profiles show", "build", "verify", "tune", "memory", "bench"}
    for name, command in commands.items():
        (option,) = [p for p in command.params if "--json" in getattr(p, "opts", ())]
        assert option.is_flag, name


def test_lists_are_comma_separated_and_their_singular_is_the_same_option():
    """Every option that takes head dims, sequence lengths, dtypes, tiles or backends takes a
    list, in both spellings; only `memory`, which describes one model, takes one head dim."""
    for name, command in _commands(cli):
        for param in command.params:
            opts = set(getattr(param, "opts", ()))
            if opts & {"--hdim", "--hdims"} and name != "memory":
                assert opts == {"--hdims", "--hdim"} and param.multiple, (name, opts)
            if opts & {"--seqlen", "--seqlens"} and name != "memory":
                assert opts == {"--seqlens", "--seqlen"} and param.multiple, (name, opts)
            if opts & {"--dtype", "--dtypes"} and name not in ("memory", "tune"):
                assert opts == {"--dtypes", "--dtype"} and param.multiple, (name, opts)


@pytest.fixture
def captured_build(monkeypatch):
    """`build` up to the compile: what it was asked for."""
    from flashtune.commands import build

    asked = []

    def fake_run_build(profile, arch, dtypes, hdims, force, jobs, console, decode=True, backward=True, narrow=True):
        asked.append((dtypes, hdims))
        raise click.exceptions.Exit(0)

    monkeypatch.setattr(build, "run_build", fake_run_build)
    return asked


def test_both_spellings_of_a_list_ask_for_the_same(captured_build):
    for args in (["--hdims", "64,128", "--dtypes", "bfloat16,float16"],
                 ["--hdim", "64", "--hdim", "128", "--dtype", "bfloat16", "--dtype", "float16"],
                 ["--hdims", "64", "--hdim", "128", "--dtypes", "bfloat16", "--dtype", "float16"]):
        assert run("build", "--profile", "rtx5090", "--arch", "sm_120", *args).exit_code == 0
    assert captured_build == [(["bfloat16", "float16"], [64, 128])] * 3


def test_bad_list_values_are_usage_errors():
    for args, part in ((["--hdims", "64,x"], "comma-separated integers"),
                       (["--dtypes", "bfloat16,fp4"], "fp4; allowed: float16, bfloat16")):
        result = run("build", "--profile", "rtx5090", *args)
        assert result.exit_code == 2 and part in result.stderr, result.stderr


@pytest.fixture
def one_gpu(monkeypatch):
    monkeypatch.setattr("flashtune.commands.common.detect_gpus", lambda: [object()])


def test_bench_json_file_is_the_old_spelling_of_out(monkeypatch, tmp_path, one_gpu):
    """`bench --json FILE` (before 0.2) still writes FILE, as `--out FILE` does, and says so."""
    from flashtune.commands import bench

    def fake_run_bench(shapes, names, repeats, on_shape=None, checkpoint=None, pass_name="fwd"):
        return bench.BenchResult({"gpu": "G", "compute_capability": "9.0", "driver": "d", "torch": "t",
                                  "cuda": "c", "cudnn": 1}, [bench.BenchRow.empty("flashtune", shapes[0])])

    monkeypatch.setattr(bench, "run_bench", fake_run_bench)
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    result = run("bench", "--hdims", "128", "--seqlens", "512", "--json", str(old))
    assert result.exit_code == 0, result.output
    assert "deprecated" in result.stderr and f"--out {old}" in result.stderr
    assert run("bench", "--hdims", "128", "--seqlens", "512", "--out", str(new)).exit_code == 0
    assert json.loads(old.read_text())["rows"] == json.loads(new.read_text())["rows"]
    switch = run("bench", "--hdims", "128", "--seqlens", "512", "--json")  # the switch: JSON on stdout
    assert switch.exit_code == 0 and json.loads(switch.stdout)["rows"][0]["backend"] == "flashtune"
    assert "deprecated" not in switch.stderr


# bench's modes (the prefill grid, --decode, --model, --train) each refuse the others' options,
# and options that cannot go together, with a usage error (exit 2) that names them.
REFUSED = [
    (("--model", "llama3-8b-like", "--seqlens", "512"),
     "--seqlens: not an option of bench --model (only of the prefill grid)"),
    (("--prefill", "512"), "--prefill: not an option of the prefill grid (only of bench --model)"),
    (("--caches", "1024"), "--caches: not an option of the prefill grid (only of bench --decode)"),
    (("--decode", "--pass", "bwd"), "--pass: not an option of bench --decode"),
    (("--decode", "--seqlens", "512", "--causal"), "--seqlens, --causal: not an option of bench --decode"),
    (("--decode", "--model", "llama3-8b-like"), "--model and --decode are different benches"),
    (("--kv-dtype", "e4m3"), "--kv-dtype: not an option of the prefill grid (only of bench --decode)"),
    (("--decode", "--kv-dtype", "e5m2"), "'e5m2' is not 'e4m3'"),
    (("--train", "--hdims", "64"), "--hdims: not an option of bench --train"),
    (("--train-steps", "50"), "--train-steps: not an option of the prefill grid (only of bench --train)"),
    (("--train", "--dtypes", "float16"), "--train trains in bf16 autocast"),
    (("--train", "--backends", "flash-attn3"), "known with --train"),
    (("--json", "--csv", "-"), "both write to stdout"),
    (("--decode", "--window", "4096"), "--window: not an option of bench --decode (only of the prefill grid)"),
    (("--window", "4096", "--no-causal"), "a sliding window here is causal; drop --no-causal"),
    (("--decode", "--hdim-v", "128"), "--hdim-v: not an option of bench --decode (only of the prefill grid)"),
    (("--hdims", "192", "--hdim-v", "100"), "100: V's head dim is a multiple of 8 up to 256"),
    (("--hdims", "192", "--hdim-v", "128", "--pass", "bwd"), "a V head dim unlike Q/K's is forward-only"),
]


@pytest.mark.parametrize("args,message", REFUSED)
def test_bench_refuses_options_of_the_other_mode(one_gpu, args, message):
    result = run("bench", *args)
    assert result.exit_code == 2 and message in result.stderr, result.stderr


@pytest.mark.parametrize("backends,expected", [(None, ["flashtune", "flashtune-fp8kv"]),
                                               ("sdpa-cudnn,flashtune", ["sdpa-cudnn", "flashtune", "flashtune-fp8kv"]),
                                               ("sdpa-cudnn", ["flashtune-fp8kv", "sdpa-cudnn"])])
def test_bench_decode_kv_dtype_e4m3_adds_flashtunes_e4m3_row(monkeypatch, one_gpu, backends, expected):
    """`--kv-dtype e4m3`: flashtune on the e4m3 cache beside its 16-bit row (or first without one)."""
    from flashtune.commands import bench_decode

    seen = {}

    def fake_run(problems, names, repeats, on_problem=None, checkpoint=None):
        seen["names"] = names
        raise SystemExit(0)

    monkeypatch.setattr(bench_decode, "run_decode_bench", fake_run)
    args = ["bench", "--decode", "--kv-dtype", "e4m3", "--hdims", "128", "--heads-kv", "8", "--batches", "1",
            "--caches", "1024", "--seqlens-q", "1"] + (["--backends", backends] if backends else [])
    run(*args)
    names = seen["names"]
    assert names[:len(expected)] == expected if backends is None else names == expected

