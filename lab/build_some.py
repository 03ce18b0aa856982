"""Build, in parallel, only the kernels a short visit times: the decode kernels of one query token at
hdim 64/128 (16 and 32 packed rows) and the backward kernels at hdim 64/128, for today's flashtune
and, with --release, for lab/release-src's flashtune_release (lab/make_release.sh).

Usage: PYTHONPATH=.:lab/release-src python3 lab/build_some.py [--release]
"""
import importlib
import sys

import torch


def specs(pkg):
    profile = importlib.import_module(f"{pkg}.kernels.profiles").find_profile("h200")
    decode_spec = importlib.import_module(f"{pkg}.runtime.decode").decode_spec
    bwd = importlib.import_module(f"{pkg}.kernels.bwd_spec")
    out = [decode_spec(profile, torch.bfloat16, h, False, 1, r, None) for h in (64, 128) for r in (4, 32)]
    out += [bwd.default_bwd_spec(profile.arch.name, "bfloat16", h, c) for h in (64, 128) for c in (False, True)]
    return out


packages = ["flashtune"] + (["flashtune_release"] if "--release" in sys.argv else [])
for pkg in packages:
    build_specs = importlib.import_module(f"{pkg}.kernels.build").build_specs
    _, failures = build_specs(specs(pkg), jobs=16)
    print(pkg, "built", "failures: %s" % failures if failures else "ok", flush=True)
