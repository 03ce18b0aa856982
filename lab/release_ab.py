"""`flashtune bench` with one more backend, `release`: the kernels of an earlier commit (made by
lab/make_release.sh into lab/release-src as the package flashtune_release), run in the same
process, on the same inputs and in the same interleaved rounds as today's `flashtune`.

Usage (device, repository root, after building the release's kernels):
    FLASHTUNE_RELEASE_CACHE_DIR=... python3 lab/release_ab.py PROFILE bench --profile PROFILE \
        --backends flashtune,release,sdpa-cudnn --json out.json
PROFILE (first) is the release's profile to run.
"""
import os
import sys
from pathlib import Path

RELEASE = str(Path(__file__).resolve().parent / "release-src")
sys.path.insert(0, RELEASE)
os.environ["PYTHONPATH"] = os.pathsep.join([RELEASE, os.environ.get("PYTHONPATH", "")])  # its build workers

import flashtune_release  # noqa: E402

from flashtune.measure import backends  # noqa: E402
from flashtune.cli import main  # noqa: E402

flashtune_release.use_profile(sys.argv[1])
backends.BACKENDS["release"] = backends._flash_attn_module("flashtune_release")
sys.argv = [sys.argv[0], *sys.argv[2:]]
main()
