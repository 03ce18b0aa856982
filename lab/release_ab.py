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


def _release_fp8kv(inputs: dict, causal: bool, scale: float):
    """The release on the same e4m3 cache as bench's flashtune-fp8kv (one descale per KV head)."""
    from flashtune_release.runtime import kvcache
    from flashtune_release.runtime.fp8 import FP8_MAX, quantise_kv

    k, v, batch = inputs["k"], inputs["v"], inputs["q"].shape[0]
    k_head, v_head = ((x.abs().amax(dim=(0, 1, 3)).float() / FP8_MAX).clamp_min(1e-12) for x in (k, v))
    k8, v8 = (quantise_kv(x, d[None].expand(x.shape[0], -1)) for x, d in ((k, k_head), (v, v_head)))
    k_descale, v_descale = (d[None].expand(batch, -1).contiguous() for d in (k_head, v_head))

    def run():
        return kvcache.flash_attn_with_kvcache(inputs["q"], k8, v8, block_table=inputs["block_table"],
                                               softmax_scale=scale, causal=causal, k_descale=k_descale,
                                               v_descale=v_descale)
    run()
    return run


decode_backends.DECODE_BACKENDS["release-fp8kv"] = _release_fp8kv
sys.argv = [sys.argv[0], *sys.argv[2:]]
main()
