"""`flashtune bench --decode` end to end on the GPU, on a small grid: every row measured or
unavailable with its reason, flashtune's rows on its decode kernels and right against fp32."""
from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from flashtune.cli import cli

pytestmark = pytest.mark.gpu


def test_a_small_decode_grid(tmp_path):
    out = tmp_path / "decode.json"
    args = ["bench", "--decode", "--hdims", "64", "--heads-kv", "8", "--batches", "2", "--caches", "2048",
            "--seqlens-q", "1,4", "--pages", "0,16", "--backends", "flashtune,sdpa-cudnn,sdpa-flash",
            "--repeats", "3", "--out", str(out)]
    if os.environ.get("FLASHTUNE_PROFILE"):
        args[1:1] = ["--profile", os.environ["FLASHTUNE_PROFILE"]]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert len(rows) == 2 * 2 * 3 and report["copy_GBps"] > 100
    ours = [r for r in rows if r["backend"] == "flashtune"]
    assert all(r["status"] == "ok" and r["us"] > 0 and r["rel_err"] < 1e-2 for r in ours), ours
    assert all("flashtune_decode_" in r["kernel"] for r in ours)
    # the split count the call launched, and its merge: the combine kernel's name beside the split kernel's
    assert all(r["splits"] >= 1 and (r["merge"] == "combine kernel") == ("_combine" in r["kernel"])
               for r in ours), ours
    assert all((r["splits"] == 1) == (r["merge"] == "none") for r in ours)
    assert any("_gather_" in r["kernel"] for r in ours if r["page_size"] == 16)  # pages of 16 < 64 keys a step
    assert all(r["status"] == "ok" or r["status"].startswith("unavailable: ") for r in rows)
    assert "fastest other" in report["speedup_geomean"]
