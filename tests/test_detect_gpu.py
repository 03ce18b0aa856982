"""`flashtune detect` on a real GPU: its facts from the device, a matching profile, exit 0."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from flashtune.kernels.gpu import detect_gpus

pytestmark = pytest.mark.gpu


def test_real_gpu_detected():
    gpus = detect_gpus()
    assert gpus and all(g.sm_count and g.memory_bytes for g in gpus)


def test_detect_names_the_device_and_a_profile_that_runs_on_it():
    from flashtune.cli import cli

    result = CliRunner().invoke(cli, ["detect", "--json"])
    assert result.exit_code == 0, result.output
    (first, *_) = json.loads(result.stdout)["gpus"]
    assert first["figures_from"] == "device" and first["sm_count"] and first["profile"], first
