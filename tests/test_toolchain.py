import os
import stat

import pytest

from flashtune.kernels import toolchain as tcmod
from flashtune.kernels.arch import get_arch
from flashtune.kernels.toolchain import Toolchain, ToolchainError, check_build_toolchain, detect_toolchain


def _tc(**overrides) -> Toolchain:
    values = dict(torch_version="2.14.1+cu130", torch_cuda="13.0", nvcc_path="/opt/cuda/bin/nvcc",
                  nvcc_version=(13, 0), cuda_home="/opt/cuda", ninja_version="1.13", cuobjdump_path=None)
    values.update(overrides)
    return Toolchain(**values)


def test_detect_toolchain_never_raises_and_reports_torch():
    tc = detect_toolchain()
    assert tc.torch_version != ""
    assert tc.cuda_home != "/usr/local"


def test_good_toolchain_passes():
    assert check_build_toolchain(get_arch("sm_120"), _tc()).nvcc_version == (13, 0)


@pytest.mark.parametrize("tc, pattern", [
    (_tc(nvcc_path=None, nvcc_version=None), r"no working nvcc.*install the CUDA toolkit >= 12.8.*CUDA_HOME"),
    (_tc(nvcc_version=(12, 4), torch_cuda="12.4"), r"nvcc 12.4 .*cannot target sm_120.*>= 12.8"),
    (_tc(torch_cuda=None, torch_version="2.14.1+cpu"), r"CPU-only build; install a CUDA build of torch"),
    (_tc(nvcc_version=(12, 8)), r"nvcc is CUDA 12.8 but torch .* CUDA 13.0"),
])
def test_check_build_toolchain_errors(tc, pattern):
    with pytest.raises(ToolchainError, match=pattern):
        check_build_toolchain(get_arch("sm_120"), tc)


def test_old_nvcc_fine_for_older_arch():
    check_build_toolchain(get_arch("sm_89"), _tc(nvcc_version=(12, 4), torch_cuda="12.4"))


def _write_exe(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_real_nvcc_follows_exec_wrapper(tmp_path):
    real = tmp_path / "cuda-13.0" / "bin" / "nvcc"
    real.parent.mkdir(parents=True)
    _write_exe(real, "#!/bin/sh\necho release 13.0\n" + "x" * 70000)  # big: not a wrapper
    wrapper = tmp_path / "wrapper-nvcc"
    _write_exe(wrapper, f'#!/bin/sh\nexec {real} "$@"\n')
    assert tcmod.real_nvcc(wrapper) == real.resolve()
    link = tmp_path / "link-nvcc"
    os.symlink(real, link)
    assert tcmod.real_nvcc(link) == real.resolve()


def test_cuda_home_resolution_order(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", "/from/env")
    assert tcmod.resolve_cuda_home() == "/from/env"
    monkeypatch.delenv("CUDA_HOME")
    monkeypatch.delenv("CUDA_PATH", raising=False)

    # No /usr/local/cuda: fall back to the real nvcc behind a /usr/local/bin-style wrapper.
    monkeypatch.setattr(tcmod, "_DEFAULT_CUDA", tmp_path / "missing")
    real = tmp_path / "cuda-13.0" / "bin" / "nvcc"
    real.parent.mkdir(parents=True)
    _write_exe(real, "x" * 70000)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _write_exe(bindir / "nvcc", f"#!/bin/sh\nexec {real} \"$@\"\n")
    monkeypatch.setenv("PATH", str(bindir))
    assert tcmod.resolve_cuda_home() == str(tmp_path / "cuda-13.0")


def test_cuda_home_prefers_usr_local_cuda(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    fake = tmp_path / "cuda"
    (fake / "bin").mkdir(parents=True)
    _write_exe(fake / "bin" / "nvcc", "#!/bin/sh\n")
    monkeypatch.setattr(tcmod, "_DEFAULT_CUDA", fake)
    assert tcmod.resolve_cuda_home() == str(fake)


def test_cuda_home_never_usr_local(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(tcmod, "_DEFAULT_CUDA", tmp_path / "missing")
    monkeypatch.setattr(tcmod.shutil, "which", lambda name: "/usr/local/bin/nvcc")
    monkeypatch.setattr(tcmod, "real_nvcc", lambda path: tcmod.Path("/usr/local/bin/nvcc"))
    assert tcmod.resolve_cuda_home() is None


def test_cuobjdump_from_wheel_layout(tmp_path, monkeypatch):
    exe = tmp_path / "nvidia" / "cu13" / "bin" / "cuobjdump"
    exe.parent.mkdir(parents=True)
    _write_exe(exe, "")

    class Spec:
        submodule_search_locations = [str(tmp_path / "nvidia")]

    monkeypatch.setattr(tcmod.shutil, "which", lambda name: None)
    monkeypatch.setattr(tcmod.importlib.util, "find_spec", lambda name: Spec())
    assert tcmod.find_cuobjdump(str(tmp_path / "no-cuda")) == str(exe)


def test_nvcc_version_parse(tmp_path):
    nvcc = tmp_path / "nvcc"
    _write_exe(nvcc, "#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    assert tcmod.nvcc_version(str(nvcc)) == (12, 8)
    assert tcmod.nvcc_version(str(tmp_path / "missing")) is None


def test_a_cuda_home_without_nvcc_is_the_one_problem_named(tmp_path, monkeypatch):
    """$CUDA_HOME naming no toolkit is what builds would use, whatever nvcc PATH offers: said first,
    alone, before a compile fails on its missing headers (issue 30)."""
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "gone"))
    tc = detect_toolchain()
    assert tc.cuda_home == str(tmp_path / "gone") and tc.cuda_home_has_nvcc is False
    with pytest.raises(ToolchainError, match=r"^CUDA_HOME=.*gone does not exist, and builds would use it"):
        check_build_toolchain(get_arch("sm_89"), tc)
    (tmp_path / "gone").mkdir()
    with pytest.raises(ToolchainError, match=r"gone has no bin/nvcc"):
        check_build_toolchain(get_arch("sm_89"), detect_toolchain())
