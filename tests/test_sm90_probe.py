"""The sm90 building blocks (issue 5, steps 1-3) compile for sm_90a with the expected SASS.

csrc/sm90/probe_qk.cu: TMA (128B swizzle) + mbarrier + wgmma m64n64k16 from shared memory.
csrc/sm90/probe_attn.cu: a one-warpgroup attention forward (wgmma for S and for P V).
Their numerics are checked on a Hopper GPU by test_sm90_probe_gpu.py.
"""
from __future__ import annotations

import re
import subprocess

import pytest

from flashtune.kernels.build import SERIALISING_WARNINGS
from flashtune.paths import csrc_dir
from flashtune.kernels.toolchain import detect_toolchain
from flashtune.commands.verify import parse_sass, run_cuobjdump



PROBES = {"probe_qk.cu": "flashtune_probe_sm90_qk", "probe_attn.cu": "flashtune_probe_sm90_attn"}


@pytest.fixture(scope="module", params=sorted(PROBES))
def probe_object(request, tmp_path_factory):
    tc = detect_toolchain()
    if tc.nvcc_path is None:
        pytest.skip("no nvcc")
    out = tmp_path_factory.mktemp("sm90") / "probe.o"
    proc = subprocess.run([tc.nvcc_path, "-O3", "-gencode=arch=compute_90a,code=sm_90a", f"-I{csrc_dir()}",
                           "-Xptxas", "-v", "-c", str(csrc_dir() / "sm90" / request.param), "-o", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out, proc.stderr, PROBES[request.param]


def test_probe_compiles_for_sm90a_without_serialised_wgmma(probe_object):
    _, log, _ = probe_object
    assert not SERIALISING_WARNINGS.search(log), log
    assert "0 bytes spill stores" in log


def test_probe_sass_has_hgmma_tma_and_mbarriers(probe_object):
    cuobjdump = detect_toolchain().cuobjdump_path
    if cuobjdump is None:
        pytest.skip("cuobjdump not installed (pip install '.[test]' brings it)")
    obj, _, kernel = probe_object
    proc = run_cuobjdump(cuobjdump, ["-sass", str(obj)])
    assert proc.returncode == 0, proc.stderr
    name = re.search(rf"Function : (\S*{kernel}\S*)", proc.stdout).group(1)
    sass = parse_sass(proc.stdout, name)
    assert sass["arch"] == "sm_90a"
    ops = {m.split(".")[0] for m in sass["mnemonics"]}
    assert {"HGMMA", "UTMALDG", "SYNCS", "WARPGROUP"} <= ops
    assert not {"LDL", "STL"} & ops
