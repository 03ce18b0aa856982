"""`flashtune verify` on the GPU: passes for the sm80 profile, fails loudly on a wrong expectation."""
from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.gpu


def _profile():
    return os.environ.get("FLASHTUNE_PROFILE", "h200-sm80")


def test_verify_passes_and_shows_the_exact_kernel():
    from flashtune.cli import cli

    result = CliRunner().invoke(cli, ["verify", "--profile", _profile(), "--json"])
    report = json.loads(result.output)
    # one line a failing row, in full (pytest cuts a list's repr short)
    assert result.exit_code == 0, "\n".join(f"{r['check']} {r.get('case', '')} {r.get('kernel')}: {r.get('detail')}"
                                             for r in report["rows"] if r["ok"] is False)
    identity = [r for r in report["rows"] if r["check"] == "identity"]
    # per call the expected flashtune kernel and no other, but its own passes: a decode split
    # kernel's combine; a backward's prep and finish, the group pass with GQA, the deterministic dQ kernel
    assert identity
    for r in identity:
        ours = {n for n in r["observed"] if n.startswith("flashtune_")}
        k = r["kernel"]
        own = ({k + s for s in ("", "_prep", "_finish", "_group", "_dq")} if k.startswith("flashtune_bwd_")
               else {k, k + "_combine"})
        assert k in ours and ours <= own, r
        if k.startswith("flashtune_bwd_"):
            assert {k + "_prep", k + "_finish"} <= ours, r
    sass = [r for r in report["rows"] if r["check"] == "sass"]
    assert sass and all(r["ok"] for r in sass), sass  # cuobjdump is on the GPU machine


def test_verify_fails_when_the_expected_kernel_does_not_launch():
    from flashtune.cli import cli

    result = CliRunner().invoke(cli, ["verify", "--profile", _profile(), "--json",
                                      "--expect-kernel", "flashtune_fwd_sm80_bf16_h64_64x64_w4_s2_sm90"])
    assert result.exit_code == 1
    report = json.loads(result.output)
    bad = [r for r in report["rows"] if r["check"] == "identity" and not r["ok"]]
    assert bad and "expected kernel did not launch" in bad[0]["detail"]


def test_sdpa_report_names_a_backend():
    from flashtune.commands.verify import sdpa_report

    report = sdpa_report("bfloat16", 128, 1024, causal=True)
    assert report.picked in ("flash", "cudnn", "efficient", "math")
    assert {r["backend"] for r in report.backends} == {"FLASH_ATTENTION", "CUDNN_ATTENTION",
                                                           "EFFICIENT_ATTENTION", "MATH"}
