import json

import pytest
from click.testing import CliRunner

from flashtune import __version__

from flashtune.commands import detect
from flashtune.cli import cli
from flashtune.kernels.gpu import detect_gpus


def run(*args):
    return CliRunner().invoke(cli, list(args))


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(detect, "detect_gpus", lambda: [])


@pytest.fixture
def fake_4090(monkeypatch, fake_props):
    monkeypatch.setattr(detect, "detect_gpus",
                        lambda: detect_gpus(lambda: [fake_props()], lambda: "580.65.06"))


def test_version():
    result = run("--version")
    assert result.exit_code == 0 and __version__ in result.output


def test_help_lists_commands():
    result = run("--help")
    assert result.exit_code == 0 and "detect" in result.output and "profiles" in result.output


def test_detect_no_gpu_exit_3_with_toolchain(no_gpu):
    result = run("detect")
    assert result.exit_code == 3
    assert "No NVIDIA GPU is visible" in result.output
    assert "Toolchain" in result.output and "CUDA_HOME for builds" in result.output


def test_detect_json_no_gpu(no_gpu):
    result = run("detect", "--json")
    assert result.exit_code == 3
    report = json.loads(result.output)
    assert report["gpus"] == [] and report["gpu_visible"] is False
    assert "No NVIDIA GPU is visible" in report["message"]
    assert set(report["toolchain"]) >= {"torch_version", "torch_cuda", "nvcc_path", "nvcc_version",
                                        "cuda_home", "ninja_version", "cuobjdump_path"}
    assert report["toolchain"]["cuda_home"] != "/usr/local"


@pytest.mark.parametrize("arch, fp8, tma, wgmma, family", [
    ("sm_120", True, True, False, "sm80"),
    ("sm_89", True, False, False, "sm80"),
    ("sm_90a", True, True, True, "sm90"),
    ("sm_80", False, False, False, "sm80"),
])
def test_detect_arch_json(arch, fp8, tma, wgmma, family):
    result = run("detect", "--arch", arch, "--json")
    assert result.exit_code == 0, result.output
    (target,) = json.loads(result.output)["gpus"]
    assert target["arch"] == arch and target["described_target"]
    assert target["capabilities"] == {"mma_sync": True, "fp8": fp8, "tma": tma, "wgmma": wgmma}
    assert target["kernel_family"] == family


def test_detect_target_warnings():
    rtx = json.loads(run("detect", "--gpu", "RTX 5090", "--json").output)["gpus"][0]
    assert rtx["arch"] == "sm_120" and rtx["profile"]["name"] == "rtx5090"
    assert any("FA3-style (wgmma) kernels need sm_90a" in w for w in rtx["warnings"])
    a100 = json.loads(run("detect", "--arch", "sm_80", "--json").output)["gpus"][0]
    assert any("no FP8 tensor cores" in w for w in a100["warnings"])
    h = json.loads(run("detect", "--arch", "sm_90a", "--json").output)["gpus"][0]
    assert not any("wgmma" in w for w in h["warnings"]) and h["profile"]["name"] == "h100"


def test_detect_old_nvcc_warns(monkeypatch):
    from flashtune.kernels.toolchain import Toolchain

    old = Toolchain("2.5.0+cu124", "12.4", "/opt/cuda/bin/nvcc", (12, 4), "/opt/cuda", "1.11", None)
    monkeypatch.setattr(detect, "detect_toolchain", lambda **_: old)
    report = json.loads(run("detect", "--arch", "sm_120", "--json").output)
    assert any("older than 12.8 and cannot target sm_120" in w for w in report["warnings"])
    assert any("too old for sm_120" in w for w in report["gpus"][0]["warnings"])


def test_detect_cpu_torch_and_mismatch_warn(monkeypatch):
    from flashtune.kernels.toolchain import Toolchain

    cpu = Toolchain("2.14.1+cpu", None, "/opt/cuda/bin/nvcc", (13, 0), "/opt/cuda", "1.13", None)
    monkeypatch.setattr(detect, "detect_toolchain", lambda **_: cpu)
    assert any("CPU-only" in w for w in json.loads(run("detect", "--arch", "sm_89", "--json").output)["warnings"])
    mismatch = Toolchain("2.14.1+cu130", "13.0", "/opt/cuda/bin/nvcc", (12, 9), "/opt/cuda", "1.13", None)
    monkeypatch.setattr(detect, "detect_toolchain", lambda **_: mismatch)
    assert any("major versions must match" in w
               for w in json.loads(run("detect", "--arch", "sm_89", "--json").output)["warnings"])


def test_detect_faked_gpu(fake_4090):
    result = run("detect")
    assert result.exit_code == 0, result.output
    assert "NVIDIA GeForce RTX 4090" in result.output and "sm_89" in result.output
    assert "rtx4090" in result.output and "580.65.06" in result.output
    report = json.loads(run("detect", "--json").output)
    (g,) = report["gpus"]
    assert report["gpu_visible"] and g["sm_count"] == 128 and g["profile"]["name"] == "rtx4090"


def test_detect_gpu_table_for_target():
    result = run("detect", "--gpu", "L40S")
    assert result.exit_code == 0 and "l40s" in result.output and "FP8 tensor cores" in result.output


@pytest.mark.parametrize("args, message", [
    (["detect", "--arch", "sm_77"], "unknown arch 'sm_77'"),
    (["detect", "--gpu", "GTX 9999"], "unknown GPU 'GTX 9999'"),
    (["profiles", "show", "nope"], "no profile named 'nope'"),
])
def test_user_errors_exit_2_one_line(args, message):
    result = run(*args)
    assert result.exit_code == 2
    assert message in result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1
    assert "Traceback" not in result.output


def test_broken_profile_path_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    result = run("profiles", "show", str(bad))
    assert result.exit_code == 2 and "malformed YAML" in result.output and str(bad) in result.output


def test_profiles_list():
    result = run("profiles")
    assert result.exit_code == 0
    for name in ("rtx3090", "rtx4090", "l40s", "rtx5090", "a100", "h100", "h200", "h200-sm80"):
        assert name in result.output


def test_profiles_list_json():
    names = [p["name"] for p in json.loads(run("profiles", "--json").output)]
    assert names == ["a100", "h100", "h200", "h200-sm80", "l40s", "rtx3090", "rtx4090", "rtx5090"]


def test_profiles_show_says_which_fp8_recipes_a_profile_builds(tmp_path):
    import yaml

    from flashtune.kernels.profiles import find_profile

    rtx4090 = " ".join(run("profiles", "show", "rtx4090").output.split())
    assert "FP8: Q and K in e4m3 (prefill twins" in rtx4090 and "all-FP8" not in rtx4090
    h200 = " ".join(run("profiles", "show", "h200").output.split())
    assert "Q and K in e4m3" in h200 and "an e4m3 KV cache (decode twins" in h200
    assert "all-FP8 (prefill twins" in h200 and "fp8.pv_configs (the all-FP8 twins' own tiles)" in h200
    assert "FP8: none" in run("profiles", "show", "a100").output
    data = yaml.safe_load(find_profile("h100").path.read_text())
    data["fp8"] = {"qk": "e4m3", "pv": "e4m3", "configs": [
        {"hdim": d, "causal": "any", "seqlen": [0, None], "block_m": 128, "block_n": 64, "num_warpgroups": 2,
         "stages": 2} for d in (64, 128, 256)]}
    (tmp_path / "all.yaml").write_text(yaml.safe_dump(data))
    shown = " ".join(run("profiles", "show", str(tmp_path / "all.yaml")).output.split())
    assert "all-FP8 (prefill twins: Q, K, P and V in e4m3" in shown
    # fp8.pv_configs: the all-FP8 twins' own table, whose shared memory counts V at one byte
    data["fp8"] = {"qk": "e4m3", "pv": "e4m3", "pv_configs": data["fp8"].pop("configs")}
    # (the Q/K twins keep h100's configs, 128x176 at hdim 128, which P V could not take)
    (tmp_path / "own.yaml").write_text(yaml.safe_dump(data))
    assert "fp8.pv_configs (the all-FP8 twins' own tiles)" in run("profiles", "show", str(tmp_path / "own.yaml")).output
    rows = json.loads(run("profiles", "show", str(tmp_path / "own.yaml"), "--json").output)["fp8_pv_configs"]
    qk = json.loads(run("profiles", "show", str(tmp_path / "all.yaml"), "--json").output)["fp8_configs"]
    assert [r["block_n"] for r in rows] == [64, 64, 64]
    assert [a["smem_bytes"] - b["smem_bytes"] for a, b in zip(qk, rows)] == [2 * 64 * d for d in (64, 128, 256)]


def test_profiles_show():
    result = run("profiles", "show", "rtx4090")
    assert result.exit_code == 0
    assert "CTAs/SM" in result.output and "49152 B" in result.output


def test_profiles_show_json_derived_numbers():
    data = json.loads(run("profiles", "show", "h100", "--json").output)
    d128 = next(c for c in data["configs"] if c["hdim"] == 128 and c["causal"] == "no")
    assert (d128["block_m"], d128["block_n"], d128["num_warpgroups"], d128["threads"]) == (128, 176, 2, 384)
    assert d128["smem_bytes"] == 214016 and d128["smem_limit_bytes"] == 232448 and d128["ctas_per_sm"] == 1
    schedule = d128["schedule"]["non-causal"]  # no room for an O tile or a second Q: stored directly
    assert schedule["pingpong"] and schedule["spec_max"] and not schedule["tma_store"] and not schedule["defer"]
    assert schedule["name_suffix"] == ""


def test_profiles_show_says_which_sm90_tiles_run_off_the_default_schedule():
    data = json.loads(run("profiles", "show", "h200", "--json").output)
    off = [(c["hdim"], c["causal"], c["seqlen"], s["name_suffix"]) for c in data["configs"]
           for s in c["schedule"].values() if s["name_suffix"]]
    assert off == [(64, "yes", [0, 2048], "_np")]
    assert "128x128, no pingpong" in run("profiles", "show", "h200").output
    assert all(c["schedule"] is None for c in json.loads(run("profiles", "show", "rtx4090", "--json").output)["configs"])


def test_detect_picks_the_sm90_profile_for_hopper_without_warnings():
    result = CliRunner().invoke(cli, ["detect", "--gpu", "H200", "--json"])
    entry = json.loads(result.output)["gpus"][0]
    assert entry["profile"]["name"] == "h200" and entry["warnings"] == []


def test_profiles_show_lists_fp8_tiles_with_their_own_resource_numbers(tmp_path):
    import yaml

    from flashtune.kernels.profiles import find_profile

    data = yaml.safe_load(find_profile("h200").path.read_text())
    # 3 stages of 128x176 fit only with 1-byte Q/K (16-bit: 296 KB)
    wide = {"hdim": 128, "causal": "any", "seqlen": [0, None], "block_m": 128, "block_n": 176, "stages": 3}
    data["fp8"] = {"qk": "e4m3", "configs": [c for c in data["configs"] if c["hdim"] not in (128, 192)] + [wide]}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    shown = json.loads(run("profiles", "show", str(tmp_path / "p.yaml"), "--json").output)
    row = shown["fp8_configs"][-1]
    assert (row["block_n"], row["smem_bytes"]) == (176, 220160)  # FP8 Q/K: 16K + 3 x (22K + 44K) + barriers
    assert "fp8.configs" in run("profiles", "show", str(tmp_path / "p.yaml")).output
