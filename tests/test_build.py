"""The JIT build on this (GPU-less) machine: real nvcc compiles, the cache, the lock, errors.

These compile the sm80 family for sm_80 and sm_89 (the CLI test compiles sm_120), which is
CI's compile-check of the portable family on every arch it targets.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flashtune.kernels import build
from flashtune.kernels.spec import KernelSpec
from flashtune.kernels.tiles import TileConfig
from flashtune.kernels.toolchain import Toolchain, ToolchainError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("build-cache")


@pytest.fixture(autouse=True)
def flashtune_cache_dir(module_cache, monkeypatch):
    monkeypatch.setenv("FLASHTUNE_CACHE_DIR", str(module_cache))
    return module_cache


def _spec(arch="sm_89", causal=False, hdim=64):
    return KernelSpec("sm80", arch, "bfloat16", hdim, TileConfig(128, 64, 4, 2), causal)


@pytest.mark.parametrize("arch", ["sm_80", "sm_89"])
def test_cold_build_reports_ptxas_numbers_then_hits_the_cache(arch):
    spec = _spec(arch)
    cold = build.build_spec(spec)
    assert not cold.cache_hit and Path(cold.library).is_file()
    assert cold.registers and 0 < cold.registers <= 255
    assert cold.spill_stores == 0 and cold.spill_loads == 0  # this config fits in registers
    assert cold.smem_bytes == 2 * (128 * 64 + 2 * 2 * 64 * 64)
    assert Path(cold.library).parent == build.spec_dir(spec)
    start = time.perf_counter()
    warm = build.build_spec(spec)
    assert warm.cache_hit and time.perf_counter() - start < 1.0
    assert (warm.registers, warm.library) == (cold.registers, cold.library)


def test_the_library_holds_the_exact_kernel_name():
    spec = _spec()
    lib = Path(build.build_spec(spec).library).read_bytes()
    assert spec.name.encode() in lib and spec.launcher_symbol.encode() in lib


def test_corrupt_or_half_built_entries_are_rebuilt_never_loaded():
    spec = _spec()
    first = build.build_spec(spec)
    library = Path(first.library)
    library.write_bytes(library.read_bytes()[:1000])  # truncated library
    again = build.build_spec(spec)
    assert not again.cache_hit and library.stat().st_size > 1000
    (build.spec_dir(spec) / build.MANIFEST).unlink()  # build died before publishing
    assert not build.build_spec(spec).cache_hit
    (build.spec_dir(spec) / build.MANIFEST).write_text("{not json")
    assert not build.build_spec(spec).cache_hit
    assert build.build_spec(spec).cache_hit


def test_concurrent_requests_build_once(module_cache):
    spec = _spec(causal=True)
    code = ("import json, sys; from flashtune.kernels.build import build_spec; from flashtune.kernels.spec import KernelSpec;"
            "from flashtune.kernels.tiles import TileConfig;"
            "r = build_spec(KernelSpec('sm80', 'sm_89', 'bfloat16', 64, TileConfig(128, 64, 4, 2), True));"
            "print(json.dumps(r.cache_hit))")
    env = {**os.environ, "FLASHTUNE_CACHE_DIR": str(module_cache)}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, text=True)
             for _ in range(3)]
    hits = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
    assert sorted(hits) == [False, True, True]
    assert build.build_spec(spec).cache_hit


def test_compile_errors_surface_with_the_log(monkeypatch):
    spec = _spec(hdim=128)
    monkeypatch.setattr(KernelSpec, "source", lambda self: "this is not C++;\n")
    with pytest.raises(build.BuildError, match="build.log"):
        build.build_spec(spec)
    assert not (build.spec_dir(spec) / build.MANIFEST).exists()


def test_missing_nvcc_says_what_to_install(monkeypatch):
    fake = Toolchain(torch_version="2.14.1", torch_cuda="13.0", nvcc_path=None, nvcc_version=None,
                     cuda_home=None, ninja_version="1.13", cuobjdump_path=None)
    monkeypatch.setattr("flashtune.kernels.toolchain.detect_toolchain", lambda **_: fake)
    with pytest.raises(ToolchainError, match="install the CUDA toolkit"):
        build.build_spec(KernelSpec("sm80", "sm_120", "float16", 64, TileConfig(64, 64, 4, 1), False))


def test_old_nvcc_cannot_target_sm120(monkeypatch):
    fake = Toolchain(torch_version="2.14.1", torch_cuda="12.4", nvcc_path="/opt/cuda-12.4/bin/nvcc",
                     nvcc_version=(12, 4), cuda_home="/opt/cuda-12.4", ninja_version="1.13", cuobjdump_path=None)
    monkeypatch.setattr("flashtune.kernels.toolchain.detect_toolchain", lambda **_: fake)
    with pytest.raises(ToolchainError, match=r"nvcc 12.4 .*cannot target sm_120.*>= 12.8"):
        build.build_spec(KernelSpec("sm80", "sm_120", "float16", 64, TileConfig(64, 64, 4, 1), False))


def test_parse_ptxas():
    log = """ptxas info    : Compiling entry function 'k1' for 'sm_89'
ptxas info    : Function properties for k1
    64 bytes stack frame, 112 bytes spill stores, 96 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 552 bytes cmem[0]
ptxas info    : Function properties for k2
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 200 registers, used 1 barriers
"""
    assert build.parse_ptxas(log, "k1") == {"registers": 255, "spill_stores": 112, "spill_loads": 96,
                                             "stack_bytes": 64}
    assert build.parse_ptxas(log, "k2")["registers"] == 200
    assert build.parse_ptxas(log, "k3")["registers"] is None


def test_sass_of_a_built_kernel_has_the_family_instructions_and_no_local_memory():
    from flashtune.kernels.toolchain import detect_toolchain
    from flashtune.commands.verify import sass_row

    cuobjdump = detect_toolchain().cuobjdump_path
    if cuobjdump is None:
        pytest.skip("cuobjdump not installed (pip install '.[test]' brings it)")
    spec = _spec()
    result = build.build_spec(spec)
    row = sass_row(spec, result.library, result.spills, cuobjdump)
    assert row.ok is True, row
    assert row.detail.startswith("sm_89:") and "HMMA" in row.detail and "LDGSTS" in row.detail
    wrong = KernelSpec("sm80", "sm_80", "bfloat16", 64, TileConfig(128, 64, 4, 2), False)
    row = sass_row(wrong, result.library, result.spills, cuobjdump)  # not in this library
    assert row.ok is False and "kernel not in the library" in row.detail


@pytest.mark.parametrize("line, serialising", [
    # what ptxas 13.0 printed for a deferred epilogue that left a wgmma in flight across a loop
    ("ptxas info    : (C7518) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
     "program dependence on compiler-inserted WG.DP in divergent path in the function 'k'", True),
    ("ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
     "non wgmma instructions reading accumulator registers of  a wgmma between start and end of the pipeline "
     "stage in the function 'k'", True),
    ("ptxas info    : (C7517) warpgroup.wait is injected in around line 738 by compiler to allow use of "
     "registers defined by GMMA in function 'k'", True),
    ("ptxas warning : (C7508) ...", True),  # setmaxnreg ignored: by its code
    ("ptxas info    : Used 168 registers, used 1 barriers, 0 bytes smem", False),
])
def test_serialising_ptxas_messages_fail_an_sm90_build(line, serialising):
    """ptxas reports serialised wgmma (and waits it injected) as "info", not warnings, under codes
    that vary with the cause: the build refuses every one, the text as well as the codes."""
    assert bool(build.SERIALISING_WARNINGS.search(line)) is serialising
