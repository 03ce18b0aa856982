"""A/B of the backward kernels in one process (lab, not shipped): today's wgmma kernel and mma.sync
kernel (4 warps, and 8 warps: 128 keys a CTA), the release's (lab/release-src, lab/make_release.sh:
its h200 profile's backward, and its mma.sync kernel with 4 and 8 warps, where present), other
trees' (lab/NAME-src, `make_release.sh COMMIT NAME`: variant NAME, its h200 profile's backward, or
BWD_AB_TREE_PROFILE's) and cuDNN's
backward through SDPA, on the FA grid's
cells from 512 tokens and on GQA 4:1; at hdim 256 (1k and 4k tokens) the mma.sync kernels beside cuDNN.
Per cell: correctness (rel. L2 of dq, dk, dv against fp32 autograd on a small slice of the same
shapes) and the median time of the backward alone (the rowsum pre-pass, the dQ conversion and the
GQA sums included for ours, as attention_bwd runs them), TFLOPS counting 2.5 forwards.
Usage: python3 lab/bwd_ab.py OUT.json [NAME,...]   (NAME: the variants and release kernels to time
beside cuDNN, and sdpa-flash for SDPA's FlashAttention-2 backward; all but sdpa-flash by default.
BWD_AB_HDIMS=64,128: only those head dims' cells without GQA)
A call that runs past BWD_AB_CALL_LIMIT seconds (120) is taken for a hang: the script names it, writes
the rows so far and exits with 3 (a hung kernel cannot be interrupted; this keeps the device's time)."""
import importlib
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F

import flashtune
from flashtune.kernels.build import build_specs
from flashtune.kernels.bwd_spec import BwdSpec
from flashtune.measure.reference import attention_reference, rel_l2
from flashtune.measure.timing import time_interleaved
from flashtune.runtime import backward, ops

ops.use_profile("h200")
RELEASE = Path(__file__).resolve().parent / "release-src"
release = None
if RELEASE.is_dir():
    sys.path.insert(0, str(RELEASE))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(RELEASE), os.environ.get("PYTHONPATH", "")])
    import flashtune_release as release
    import flashtune_release.kernels.bwd_spec as release_bwd_spec
    import flashtune_release.kernels.build as release_build
    import flashtune_release.runtime.backward as release_backward

    release.use_profile("h200")
# Other trees (lab/make_release.sh COMMIT NAME: lab/NAME-src, package flashtune_NAME), each timed as
# variant NAME with its own h200 profile's backward, its build cache in /tmp/ftc-NAME unless set.
TREES = {}
TREE_PROFILE = os.environ.get("BWD_AB_TREE_PROFILE", "h200")  # h200-sm80: the trees' mma.sync kernels
for src in sorted(Path(__file__).resolve().parent.glob("*-src")):
    name = src.name.removesuffix("-src")
    if name == "release":
        continue
    os.environ.setdefault(f"FLASHTUNE_{name.upper()}_CACHE_DIR", f"/tmp/ftc-{name}")
    sys.path.insert(0, str(src))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])
    TREES[name] = importlib.import_module(f"flashtune_{name}")
    TREES[name].use_profile(TREE_PROFILE)
    importlib.import_module(f"flashtune_{name}.runtime.backward")  # for the kernels' prebuild below
    importlib.import_module(f"flashtune_{name}.kernels.build")
# the release's mma.sync kernels, by the spec class of its own code
RELEASE_VARIANTS = {} if release is None else {
    "release-mma.sync": lambda h, c: release_bwd_spec.BwdSpec("sm_90a", "bfloat16", h, 4, c),
    "release-mma.sync-w8": lambda h, c: release_bwd_spec.BwdSpec("sm_90a", "bfloat16", h, 8, c),
}
DT = torch.bfloat16
# SDPA's backends: cuDNN's, every cell's base; FlashAttention-2's, by name (the sm80 family's bar)
SDPA = {"sdpa-cudnn": torch.nn.attention.SDPBackend.CUDNN_ATTENTION,
        "sdpa-flash": torch.nn.attention.SDPBackend.FLASH_ATTENTION}
VARIANTS = {
    "wgmma-tma": lambda h, c: BwdSpec("sm_90a", "bfloat16", h, 8, c, wgmma=True),
    "mma.sync": lambda h, c: BwdSpec("sm_90a", "bfloat16", h, 4, c),
    "mma.sync-w8": lambda h, c: BwdSpec("sm_90a", "bfloat16", h, 8, c),  # 128 keys a CTA: half the dQ adds
}


def with_spec(make):
    def chosen(device, dtype, hdim, causal, deterministic=False):
        return make(hdim, causal)
    return chosen


RELEASE_PROFILE_SPEC = None if release is None else release_backward.bwd_spec_for


def select(name):
    """Point the backward (today's or the release's) at the variant's kernel; it is looked up when
    the backward runs, so before every call."""
    if name in VARIANTS:
        backward.bwd_spec_for = with_spec(VARIANTS[name])
    elif name.startswith("release"):
        release_backward.bwd_spec_for = (with_spec(RELEASE_VARIANTS[name]) if name in RELEASE_VARIANTS
                                         else RELEASE_PROFILE_SPEC)
    # a tree of TREES runs its profile's choice, left as it is


def grads_of(name, q, k, v, dout, causal):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    select(name)
    if name.startswith("release"):
        out = release.flash_attn_func(*leaves, causal=causal)
    elif name in TREES:
        out = TREES[name].flash_attn_func(*leaves, causal=causal)
    elif name in SDPA:
        with torch.nn.attention.sdpa_kernel(SDPA[name]):
            out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in leaves), is_causal=causal,
                                                 enable_gqa=True).transpose(1, 2)
    else:
        out = flashtune.flash_attn_func(*leaves, causal=causal)
    return out, leaves


# (hdim, causal, seqlen, query heads per KV head): the FA grid's 16k tokens a cell, and GQA 4:1 cells
# (the group pass's work)
CELLS = [(hdim, causal, seqlen, 1) for hdim in (64, 128) for causal in (False, True)
         for seqlen in (512, 1024, 4096, 16384)]
CELLS += [(hdim, True, seqlen, 4) for hdim in (64, 128) for seqlen in (1024, 4096)]
CELLS += [(256, causal, seqlen, 1) for causal in (False, True) for seqlen in (1024, 4096)]
if os.environ.get("BWD_AB_HDIMS"):  # a short run: these head dims' cells without GQA
    CELLS = [c for c in CELLS if str(c[0]) in os.environ["BWD_AB_HDIMS"].split(",") and c[3] == 1]
NOT_AT_256 = ("wgmma-tma", "release", *TREES)  # hdim 256: the mma.sync kernels only
ALL = (*VARIANTS, *(["release", *RELEASE_VARIANTS] if release else []), *TREES, "sdpa-flash")
CHOSEN = sys.argv[2].split(",") if len(sys.argv) > 2 else ALL[:-1]
unknown = [n for n in CHOSEN if n not in ALL]
if unknown:
    sys.exit(f"bwd_ab: unknown variant(s) {', '.join(unknown)}; known: {', '.join(ALL)}")
# every chosen kernel built first: today's and the release's variants, and the kernels the
# release's and the other trees' profiles choose, each tree by its own build code, the trees side
# by side (else each kernel is built on its first call, one at a time)
BUILDS = []  # (what, build function, specs)
for table, build in ((VARIANTS, build_specs), (RELEASE_VARIANTS, release and release_build.build_specs)):
    specs = [table[n](h, c) for n in CHOSEN if n in table for h in {cell[0] for cell in CELLS}
             for c in (False, True) if not (h == 256 and n in NOT_AT_256)]
    if specs:
        BUILDS.append(("today's" if table is VARIANTS else "the release's", build, specs))
PROFILE_CHOICES = {**({"release": (RELEASE_PROFILE_SPEC, release_build.build_specs)} if release else {}),
                   **{n: (m.runtime.backward.bwd_spec_for, m.kernels.build.build_specs) for n, m in TREES.items()}}
for name, (choose, build) in PROFILE_CHOICES.items():
    if name in CHOSEN:
        BUILDS.append((f"{name}'s", build, [choose(torch.device("cuda", 0), DT, h, c)
                                            for h in {cell[0] for cell in CELLS} - {256} for c in (False, True)]))


def forward_specs(pkg, cells):
    """The forward kernels `pkg` (flashtune, the release's or a tree's package) picks for the cells'
    timed calls and their correctness checks, by its own selection: built up front beside the
    backward's (else each is built on its first call, one at a time and inside the hang watchdog's limit)."""
    selection = importlib.import_module(f"{pkg.__name__}.runtime.selection")
    profile = selection.active_profile(torch.device("cuda", 0))
    specs = {}
    for hdim, causal, seqlen, group in cells:
        batch, heads = max(1, 16384 // seqlen), 2048 // hdim
        for n, b, heads_kv in ((seqlen, batch, heads // group), (min(seqlen, 2048), 1, 2)):
            spec = selection.kernel_for(profile, DT, hdim, causal, n, n, head_ratio=group,
                                        key_rows=b * heads_kv * n, device_index=0)
            specs[spec.name] = spec
    return list(specs.values())


if any(n in VARIANTS for n in CHOSEN):
    BUILDS.append(("today's forward", build_specs, forward_specs(flashtune, CELLS)))
for name, pkg in [*([("release", release)] if release else []), *TREES.items()]:
    if name in CHOSEN or (name == "release" and any(n.startswith("release") for n in CHOSEN)):
        BUILDS.append((f"{name}'s forward", importlib.import_module(f"{pkg.__name__}.kernels.build").build_specs,
                       forward_specs(pkg, [c for c in CELLS if c[0] != 256])))
with ThreadPoolExecutor(max(1, len(BUILDS))) as pool:
    results = list(pool.map(lambda job: job[1](job[2], jobs=8), BUILDS))
for (what, _, _), (_, failures) in zip(BUILDS, results):
    if failures:
        sys.exit(f"bwd_ab: {len(failures)} of {what} kernel(s) failed to build: {failures[0][1]}")
rows = []


def dump():
    json.dump({"command": " ".join(["python3 lab/bwd_ab.py", *sys.argv[1:]]), "gpu": torch.cuda.get_device_name(),
               "rows": rows}, open(sys.argv[1], "w"), indent=1)


CALL_LIMIT = float(os.environ.get("BWD_AB_CALL_LIMIT", "120"))
WATCHED = {"what": "", "since": 0.0}  # what runs now, since when (time.monotonic)


def watch(what):
    WATCHED.update(what=what, since=time.monotonic())


def watchdog():
    while True:
        time.sleep(1)
        if WATCHED["what"] and time.monotonic() - WATCHED["since"] > CALL_LIMIT:
            print(f"bwd_ab: {WATCHED['what']} (or the launch before it: launches are asynchronous) still "
                  f"running after {CALL_LIMIT:.0f} s: taken for a hang; {len(rows)} rows written", flush=True)
            dump()
            os._exit(3)


threading.Thread(target=watchdog, daemon=True).start()
for hdim, causal, seqlen, group in CELLS:
    if hdim == 256 and all(n in NOT_AT_256 for n in CHOSEN):
        continue  # cuDNN alone
    batch, heads = max(1, 16384 // seqlen), 2048 // hdim
    torch.manual_seed(seqlen + hdim)
    q, dout = (torch.randn(batch, seqlen, heads, hdim, device="cuda", dtype=DT) for _ in range(2))
    k, v = (torch.randn(batch, seqlen, heads // group, hdim, device="cuda", dtype=DT) for _ in range(2))
    # correctness on the first 2 KV heads (and their query heads) of batch entry 0, up to 2048 positions
    s = min(seqlen, 2048)
    small = [t[:1, :s, :2 * (group if t.shape[2] == heads else 1)].contiguous() for t in (q, k, v, dout)]
    ref = [t.float().requires_grad_() for t in small[:3]]
    attention_reference(*ref, causal)[0].backward(small[3].float())
    timed, errors = {}, {}
    cell = f"h{hdim} {'causal' if causal else 'full'} {seqlen} {group}:1"
    for name in (*CHOSEN, "sdpa-cudnn"):
        if hdim == 256 and name in NOT_AT_256:
            continue
        watch(f"{name} on {cell}")
        o, leaves = grads_of(name, *small[:3], small[3], causal)
        o.backward(small[3])
        errors[name] = [rel_l2(a.grad.float(), b.grad) for a, b in zip(leaves, ref)]
        out, leaves = grads_of(name, q, k, v, dout, causal)

        def run(name=name, out=out, leaves=leaves):
            select(name)
            return torch.autograd.grad(out, leaves, dout, retain_graph=True)
        timed[name] = [run]
    watch(f"the timing of {cell}")
    times, failed = time_interleaved(timed, warmup=3, repeats=30)
    flops = 2.5 * 4 * batch * heads * seqlen * seqlen * hdim / (2 if causal else 1)
    row = {"hdim": hdim, "causal": causal, "seqlen": seqlen, "batch": batch, "heads": heads,
           "heads_kv": heads // group}
    for name, t in times.items():
        ms = statistics.median(t)
        row[name] = {"ms": ms, "tflops": flops / ms / 1e9, "rel_l2": errors[name]}
    rows.append(row)
    base = row["sdpa-cudnn"]["ms"]
    print(f"h{hdim} {'causal' if causal else 'full  '} {seqlen:>6} {group}:1: " + "  ".join(
        f"{n} {row[n]['tflops']:.0f} TF ({base / row[n]['ms']:.2f}x cudnn, dq {row[n]['rel_l2'][0]:.1e})"
        for n in times), flush=True)
watch("")
dump()
