"""How the command line fails (issue 30): one line a person can act on, no traceback, an exit code
that says what happened, the same error as JSON with --json, and nothing dropped without a word."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from flashtune.commands import build as build_command
from flashtune.commands import detect
from flashtune.kernels.build import BuildResult
from flashtune.cli import cli


def run(*args, **kwargs):
    return CliRunner().invoke(cli, list(args), prog_name="flashtune", **kwargs)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(detect, "detect_gpus", lambda: [])
    monkeypatch.setattr("flashtune.commands.common.detect_gpus", lambda: [])


@pytest.fixture
def no_binding_build(monkeypatch):
    """The torch binding (a 10 s compile) stands as built: these tests are about the kernels."""
    monkeypatch.setattr(build_command, "build_binding",
                        lambda force=False: BuildResult("flashtune_C", "host", "lib.so", True, 0.0))


def _one_line_error(result, *parts):
    """stderr is one `error:` line holding every part, and no traceback anywhere."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert all(part in lines[0] for part in parts), lines[0]
    assert "Traceback" not in result.output


# ---------------------------------------------------------------- a failed compile

def test_first_compiler_error_finds_the_cause_not_the_traceback():
    from flashtune.kernels.build import first_compiler_error

    log = "\n".join([
        "[1/2] /usr/local/cuda/bin/nvcc -Werror -c k.cu -o k.o",
        "FAILED: k.o",
        "nvcc fatal   : Unknown option '--bogus'",
        "Traceback (most recent call last):",
        '  File "cpp_extension.py", line 2906, in _run_ninja_build',
        "RuntimeError: Error building extension 'k'",
    ])
    assert first_compiler_error(log) == "nvcc fatal   : Unknown option '--bogus'"
    assert first_compiler_error("k.cu(12): warning: x\nk.cu(13): error: identifier \"y\" is undefined") == \
        'k.cu(13): error: identifier "y" is undefined'
    assert first_compiler_error("ptxas fatal   : Unresolved extern function 'f'") is not None
    assert first_compiler_error("binding.cpp:3:10: fatal error: x.h: No such file or directory").endswith("directory")
    assert first_compiler_error("RuntimeError: Error building extension 'k'") is None


def test_a_failed_compile_is_one_line_per_kernel_and_a_summary(tmp_path, no_binding_build):
    profile = tmp_path / "bad.yaml"
    profile.write_text("name: bad-flags\ndescription: a bad nvcc flag\nmatch: {}\nfamily: sm80\narch: sm_89\n"
                       "dtypes: [bfloat16]\nhead_dims: [64, 128, 256]\nnvcc_flags: ['--no-such-nvcc-flag']\n"
                       "configs_from: rtx4090\n")
    result = run("build", "--profile", str(profile), "--hdim", "64", "--no-decode", "--no-backward")
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    failed = [line for line in result.stdout.splitlines() if line.startswith("failed ")]
    assert len(failed) == 2  # causal and not, each one line: kernel, first compiler error, full log
    for line in failed:
        assert "nvcc fatal" in line and "--no-such-nvcc-flag" in line and "(full log: " in line
        log = Path(line.split("(full log: ")[1].rstrip(")"))
        assert log.is_file() and "Traceback" in log.read_text()  # the whole story stays in the cache entry
    assert result.stdout.strip().splitlines()[-1] == "error: 2 of 3 modules failed to compile"
    report = json.loads(run("build", "--profile", str(profile), "--hdim", "64", "--no-decode", "--no-backward",
                            "--json").stdout)
    assert report["exit_code"] == 1 and report["error"] == "2 of 3 modules failed to compile"
    assert all("nvcc fatal" in f["error"] and Path(f["log"]).is_file() for f in report["failures"])


# ---------------------------------------------------------------- the environment

def test_cuda_home_naming_a_missing_directory(monkeypatch, no_gpu):
    monkeypatch.setenv("CUDA_HOME", "/no/such/cuda")
    report = json.loads(run("detect", "--json").stdout)
    assert any("CUDA_HOME=/no/such/cuda does not exist" in w for w in report["warnings"])
    result = run("build", "--profile", "rtx5090", "--arch", "sm_120")
    assert result.exit_code == 2
    _one_line_error(result, "CUDA_HOME=/no/such/cuda does not exist", "set CUDA_HOME")


@pytest.mark.parametrize("under", ["", "sub"])
def test_a_cache_dir_that_is_a_file(monkeypatch, tmp_path, under):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    path = blocker / under if under else blocker
    monkeypatch.setenv("FLASHTUNE_CACHE_DIR", str(path))
    result = run("build", "--profile", "rtx5090", "--arch", "sm_120")
    assert result.exit_code == 2
    _one_line_error(result, str(path), "FLASHTUNE_CACHE_DIR", "not a directory")


# ---------------------------------------------------------------- --json, exit codes, Ctrl-C

def test_errors_with_json_are_json_on_stdout_too(monkeypatch, tmp_path, no_gpu):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("FLASHTUNE_CACHE_DIR", str(blocker))
    cases = [(["build", "--profile", "rtx5090", "--arch", "sm_120", "--json"], 2, "a-file"),
             (["build", "--jobs", "0", "--json"], 2, "--jobs"),  # a click usage error
             (["profiles", "show", "rtx9999", "--json"], 2, "rtx9999"),
             (["verify", "--json"], 3, "no GPU is visible"),
             (["detect", "--arch", "sm_42", "--json"], 2, "sm_42")]
    for args, code, part in cases:
        result = run(*args)
        assert result.exit_code == code, (args, result.output)
        error = json.loads(result.stdout)
        assert error["exit_code"] == code and part in error["error"], (args, error)
        _one_line_error(result, part)
    out = tmp_path / "bench.json"  # bench's --out FILE is where its JSON goes: the error goes there
    result = run("bench", "--out", str(out))
    assert result.exit_code == 3 and json.loads(out.read_text())["exit_code"] == 3
    _one_line_error(result, "no GPU is visible")


def test_usage_errors_and_flashtunes_own_read_alike():
    usage = run("build", "--jobs", "0")
    own = run("build", "--profile", "rtx9999")
    assert usage.exit_code == own.exit_code == 2
    _one_line_error(usage, "--jobs", "`flashtune build --help` lists the options")
    _one_line_error(own, "rtx9999")


def test_ctrl_c_exits_130(monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(build_command, "run_build", interrupted)
    result = run("build", "--profile", "rtx5090", "--arch", "sm_120")
    assert result.exit_code == 130
    _one_line_error(result, "interrupted", "run the same command again to build the rest")


# ---------------------------------------------------------------- nothing dropped silently

def test_fp8_kernels_left_out_for_an_arch_without_fp8_are_named(monkeypatch, no_binding_build):
    built = []

    def fake_build_specs(specs, jobs=None, force=False, on_done=None):
        built.extend(specs)
        return [BuildResult(s.name, s.arch, "k.so", True, 0.0) for s in specs], []

    monkeypatch.setattr(build_command, "build_specs", fake_build_specs)
    report = json.loads(run("build", "--profile", "rtx5090", "--arch", "sm_80", "--json").stdout)
    assert len(built) == 12 + 72 + 12 and not any(getattr(s, "fp8", False) for s in built)
    # 3 head dims x 16 and 32 rows x 2 dtypes x causal or not x 3 pagings, retargeted, as the 12
    # backward (3 head dims x 2 dtypes x causal or not)
    assert sum(s.family == "decode" and s.arch == "sm_80" for s in built) == 72
    assert sum(s.family == "backward" and s.arch == "sm_80" for s in built) == 12
    assert report["notes"] == ["12 FP8 Q/K kernels of profile rtx5090 are not built: sm_80 has no FP8 tensor "
                               "cores (they exist on sm_89, sm_90 and sm_120)"]
    assert "note: 12 FP8 Q/K kernels of profile rtx5090 are not built" in run(
        "build", "--profile", "rtx5090", "--arch", "sm_80").stdout
    assert json.loads(run("build", "--profile", "rtx5090", "--arch", "sm_120", "--json").stdout)["notes"] == []


def test_detect_suggests_only_a_profile_that_builds_for_the_arch():
    from flashtune.kernels.profiles import builds_for, find_profile
    from flashtune.kernels.arch import get_arch

    error = json.loads(run("detect", "--arch", "sm_100a", "--json").stdout)["gpus"][0]["profile_error"]
    assert "closest whose kernels build for it is h200-sm80" in error and "h100" not in error
    assert builds_for(find_profile("h200-sm80"), get_arch("sm_100a"))
    assert not builds_for(find_profile("h100"), get_arch("sm_100a"))  # what detect used to suggest


def test_an_error_keeps_an_earlier_result_and_this_runs_rows(monkeypatch, tmp_path, no_gpu):
    import flashtune.cli as cli_module
    from flashtune.commands import bench

    earlier = tmp_path / "earlier.json"
    earlier.write_text('{"rows": ["measured yesterday"]}')
    result = run("bench", "--out", str(earlier), "--seqlens", "abc")  # a typo: the file stays as it was
    assert result.exit_code == 2 and earlier.read_text() == '{"rows": ["measured yesterday"]}'
    assert "error: " in result.stderr and f"note: {earlier} is left as it was" in result.stderr

    class Partial:
        def to_json(self):
            return {"header": {"gpu": "test"}, "rows": [{"us": 1.0}]}

    def one_shape_then_ctrl_c(shapes, names, repeats, on_shape, checkpoint, pass_name):
        checkpoint(Partial())
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_module, "require_gpu", lambda command: [])
    monkeypatch.setattr(bench, "run_bench", one_shape_then_ctrl_c)
    result = run("bench", "--out", str(earlier), "--hdims", "64", "--seqlens", "512")
    saved = json.loads(earlier.read_text())  # this run's checkpoint, its rows kept and the error added
    assert result.exit_code == 130 and saved["rows"] == [{"us": 1.0}]
    assert saved["complete"] is False and saved["exit_code"] == 130 and saved["error"] == "interrupted"
    assert [p.name for p in tmp_path.iterdir()] == ["earlier.json"]  # no half-written file left beside it
    kept = earlier.read_text()
    assert run("bench", "--out", str(earlier), "--seqlens", "abc").exit_code == 2  # a later command line's typo
    assert earlier.read_text() == kept  # does not touch what the earlier one wrote


@pytest.mark.parametrize("args, part", [
    (["build", "--hdims", ","], "an empty list"),  # was: every head dim of the profile
    (["build", "--dtypes", ""], "an empty list"),
    (["bench", "--backends", ","], "an empty list"),
    (["bench", "--seqlens", "0"], "0: each value must be 1 or more"),
    (["bench", "--batches", "4,-2"], "-2: each value must be 1 or more"),
    (["bench", "--decode", "--pages", "-1"], "-1: each value must be 0 or more"),
    (["tune", "--hdims", "7"], "7: a head dim is a multiple of 8 from 32 to 256"),
    (["tune", "--hdims", "264"], "264: a head dim"),
    (["build", "--hdims", "100"], "100: a head dim"),
    (["tune", "--tiles", "0x128"], "BLOCK_MxBLOCK_N"),
    (["verify", "--hdims", "64"], "--hdims: only with --sdpa"),  # was: ignored, the whole profile ran
    (["verify", "--sdpa", "--profile", "h100"], "--profile: not an option of verify --sdpa"),
    (["memory", "--model", "llama3-8b-like", "--gpu-memory", "inf"], "give the GPU's memory in GiB"),
    (["bench", "--model", "nope"], "unknown model 'nope'"),  # was: "no GPU is visible" first
    (["bench", "--model", "recall", "--layers", "2"], "--layers does not apply to --model recall"),
    (["bench", "--out", "no-such-folder/out.json"], "there is no folder"),
    (["bench", "--csv", "no-such-folder/out.csv"], "there is no folder"),
    (["tune", "--out", "no-such-folder/my.yaml"], "there is no folder"),
])
def test_bad_values_are_refused_before_any_work(args, part, no_gpu, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run(*args)
    assert result.exit_code == 2, (args, result.output)
    _one_line_error(result, part)
    assert not list(tmp_path.iterdir())  # nothing written


def test_the_profile_comes_from_flashtune_profile_as_in_the_runtime(monkeypatch, no_gpu):
    from flashtune.commands.common import resolve_profile

    monkeypatch.setenv("FLASHTUNE_PROFILE", "rtx5090")
    profile, reason = resolve_profile(None)  # was: the GPU's match, while the runtime took rtx5090
    assert profile.name == "rtx5090" and reason == "chosen with FLASHTUNE_PROFILE"
    assert resolve_profile("h100")[0].name == "h100"  # --profile still wins
    monkeypatch.setenv("FLASHTUNE_PROFILE", "bogus")
    result = run("build")
    assert result.exit_code == 2
    _one_line_error(result, "FLASHTUNE_PROFILE: profile: no profile named 'bogus'")


def test_a_cross_compile_without_a_profile_names_the_arch_profiles(no_gpu, monkeypatch):
    monkeypatch.delenv("FLASHTUNE_PROFILE", raising=False)
    _one_line_error(run("build", "--arch", "sm_89"), "allowed: --profile l40s or rtx4090 for sm_89")
    monkeypatch.setenv("FLASHTUNE_PROFILE", "bogus")  # the variable's own error, not the hint
    _one_line_error(run("build", "--arch", "sm_89"), "FLASHTUNE_PROFILE: profile: no profile named 'bogus'")
    _one_line_error(run("build", "--profile", "h100", "--arch", "sm_90"), "--arch sm_90a")


def test_values_other_backends_take_pass_the_options(no_gpu, tmp_path):
    assert run("bench", "--decode", "--pages", "0,16").exit_code == 3  # past the options, to the GPU check
    assert run("bench", "--hdims", "512", "--backends", "sdpa-flash").exit_code == 3  # SDPA's row is measured
    assert run("verify", "--sdpa", "--hdim", "100").exit_code == 3  # which SDPA backend takes 100, and why
    assert run("tune", "--cache", str(tmp_path / "new" / "c.jsonl")).exit_code == 3  # the cache makes its folder


def test_short_help_and_the_groups_json():
    assert run("-h").stdout == run("--help").stdout and run("bench", "-h").exit_code == 0
    assert json.loads(run("profiles", "--json", "show", "h100").stdout)["name"] == "h100"


# ---------------------------------------------------------------- help and described GPUs

@pytest.mark.parametrize("command", ["build", "verify", "tune", "bench", "memory"])
def test_help_keeps_each_example_on_its_own_line(command):
    examples = [line.strip() for line in cli.commands[command].help.splitlines()
                if line.strip().startswith("flashtune ")]
    shown = [line.strip() for line in run(command, "--help").stdout.splitlines()]
    assert examples and all(example in shown for example in examples)


def test_a_described_gpu_carries_its_datasheet_figures():
    entry = json.loads(run("detect", "--gpu", "RTX 4090", "--json").stdout)["gpus"][0]
    assert (entry["sm_count"], entry["l2_bytes"], entry["memory_bytes"]) == (128, 72 * 2**20, 24 * 2**30)
    assert entry["figures_from"] == "datasheet"
    text = run("detect", "--gpu", "RTX 4090").stdout
    assert "128 (datasheet)" in text and "72 MB (datasheet)" in text and "24 GB (datasheet)" in text
    h100 = json.loads(run("detect", "--gpu", "H100", "--json").stdout)["gpus"][0]
    assert h100["sm_count"] is None and "PCIe 114 SMs" in h100["figures_vary"]  # versions differ: not a guess
    assert json.loads(run("detect", "--arch", "sm_89", "--json").stdout)["gpus"][0]["figures_from"] == "unknown"


def test_readme_says_how_to_run_the_fast_tests():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "pytest -q -m \"not slow\"" in readme and "about 0.3 s" in readme and "85 s" not in readme
