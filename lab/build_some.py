"""Build, in parallel, only the kernels a short visit times, by group: `decode` (one query token at
hdim 64/128/256, 4 and 32 packed rows, long and short calls), `cache` (the KV-cache kernels of MQA
with 4 causal query tokens at hdim 64/128, contiguous), `bwd` (hdim 64/128); with --release, the
same of lab/release-src's flashtune_release (lab/make_release.sh) too.

Usage: PYTHONPATH=.:lab/release-src python3 lab/build_some.py GROUP... [--release]
"""
import importlib
import sys

import torch


def specs(pkg, groups):
    profile = importlib.import_module(f"{pkg}.kernels.profiles").find_profile("h200")
    decode_spec = importlib.import_module(f"{pkg}.runtime.decode").decode_spec
    out = []
    if "decode" in groups:
        out += [decode_spec(profile, torch.bfloat16, h, False, 1, r, None, key_rows=keys)
                for h in (64, 128, 256) for r in (4, 32) for keys in (0, 1024)]  # 1024 key rows: a short call
    if "cache" in groups:
        out += [decode_spec(profile, torch.bfloat16, h, True, 4, 32, None) for h in (64, 128)]
    if "bwd" in groups:
        bwd = importlib.import_module(f"{pkg}.kernels.bwd_spec")
        out += [bwd.default_bwd_spec(profile.arch.name, "bfloat16", h, c) for h in (64, 128) for c in (False, True)]
    return list({spec.name: spec for spec in out}.values())


groups = [a for a in sys.argv[1:] if not a.startswith("--")]
packages = ["flashtune"] + (["flashtune_release"] if "--release" in sys.argv else [])
for pkg in packages:
    build_specs = importlib.import_module(f"{pkg}.kernels.build").build_specs
    _, failures = build_specs(specs(pkg, groups), jobs=16)
    print(pkg, "built", "failures: %s" % failures if failures else "ok", flush=True)
