"""`flashtune bench` with one more backend, `release`: the kernels of an earlier commit (made by
lab/make_release.sh into lab/release-src as the package flashtune_release), run in the same
process, on the same inputs and in the same interleaved rounds as today's `flashtune`; with
`bench --decode`, the release's flash_attn_with_kvcache (its index checks trusted, as bench
trusts today's).

Usage (device, repository root, after building the release's kernels):
    FLASHTUNE_RELEASE_CACHE_DIR=... python3 lab/release_ab.py PROFILE bench --profile PROFILE \
        --backends flashtune,release,sdpa-cudnn --out out.json
    ... python3 lab/release_ab.py PROFILE bench --profile PROFILE --decode --hdims 128 \
        --backends flashtune,release,sdpa-cudnn --out out.json
(`release-fp8kv`: the release on bench's e4m3 cache, beside `flashtune-fp8kv`.)
PROFILE (first) is the release's profile to run.
"""
import os
import sys
from pathlib import Path

RELEASE = str(Path(__file__).resolve().parent / "release-src")
sys.path.insert(0, RELEASE)
os.environ["PYTHONPATH"] = os.pathsep.join([RELEASE, os.environ.get("PYTHONPATH", "")])  # its build workers

import flashtune_release  # noqa: E402

from flashtune.measure import backends, decode_backends  # noqa: E402
from flashtune.cli import main  # noqa: E402

flashtune_release.use_profile(sys.argv[1])
backends.BACKENDS["release"] = backends._flash_attn_module("flashtune_release")
decode_backends.DECODE_BACKENDS["release"] = decode_backends._flash_attn_kvcache("flashtune_release")
try:  # a release with the KV-cache functions: its block tables trusted, as bench trusts today's
    from flashtune_release.runtime import checks as release_checks

    release_checks.TRUST_CU_SEQLENS = True
except ImportError:
    pass

# the release on bench's e4m3 cache, beside flashtune-fp8kv
decode_backends.DECODE_BACKENDS["release-fp8kv"] = decode_backends._flashtune_fp8kv("flashtune_release")
sys.argv = [sys.argv[0], *sys.argv[2:]]
main()
