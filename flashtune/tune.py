"""`flashtune tune`: search tile configs on this GPU and write a tuned profile.

For each (head dim, causal) the candidates (tune_space) are compiled in parallel; a
candidate that fails to compile, spills more than allowed, or whose ptxas log says wgmma
was serialised is recorded with that reason. Each survivor is checked for correctness
against the fp32 reference first, then timed with the bench harness at one sequence
length per bucket. Every result goes to a resumable JSON-lines cache, so an interrupted
tune resumes without re-measuring, and a failure is never retried.
"""
from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from flashtune import __version__
from flashtune.build import SERIALISING_WARNINGS
from flashtune.profiles import Profile
from flashtune.spec import KernelSpec, family_source_files
from flashtune.tiles import TileConfig
from flashtune.tune_cache import TuneCache
from flashtune.tune_space import BUCKET_SEQLENS, bucket_of, candidates

DEFAULT_MAX_SPILL_BYTES = 64  # a few spilled bytes outside the hot loop cost nothing measurable


@dataclass
class TuneOptions:
    hdims: tuple[int, ...]
    causal: tuple[bool, ...] = (False, True)
    dtype: str = "bfloat16"
    seqlens: tuple[int, ...] = BUCKET_SEQLENS
    max_candidates: int | None = None
    time_budget_s: float | None = None
    max_spill_bytes: int = DEFAULT_MAX_SPILL_BYTES
    repeats: int = 20
    jobs: int | None = None
    gpus: int = 1


@dataclass
class TuneResult:
    records: list[dict] = field(default_factory=list)  # every candidate's outcome, cached or new
    winners: dict = field(default_factory=dict)  # (hdim, causal, seqlen) -> record
    starting: dict = field(default_factory=dict)  # (hdim, causal, seqlen) -> the base profile's record
    stopped_by_budget: bool = False
    cache_path: str = ""


def default_jobs() -> int:
    """Parallel compiles: one per core, at most one per 2 GB of memory (nvcc's peak)."""
    cores = os.cpu_count() or 1
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gb = 2 * cores
    return max(1, min(cores, int(mem_gb // 2)))


def stamp(gpu_name: str, family: str) -> dict:
    """What a cached measurement is only valid for."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for path in family_source_files(family):
        h.update(path.read_bytes())
    return {"gpu": gpu_name, "flashtune": __version__, "torch": torch.__version__,
            "cuda": torch.version.cuda, "kernel_sources": h.hexdigest()[:16]}


def default_cache_path(gpu_name: str, profile: Profile) -> Path:
    from flashtune.paths import cache_dir

    slug = re.sub(r"[^A-Za-z0-9]+", "-", gpu_name).strip("-").lower()
    return cache_dir() / "tune" / f"{slug}_{profile.name}.jsonl"


# ---------------------------------------------------------------------------- one candidate

def check_correct(spec: KernelSpec, seed: int = 0) -> tuple[bool, str]:
    """Run the candidate on an odd-sized random case against the fp32 reference."""
    import torch

    from flashtune import ops
    from flashtune.baseline import tolerance
    from flashtune.reference import attention_reference, rel_l2

    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = getattr(torch, spec.dtype)
    q = torch.randn(2, 333, 4, spec.hdim, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(2, 517, 2, spec.hdim, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(2, 517, 2, spec.hdim, device="cuda", dtype=dtype, generator=gen)
    scale = 1.0 / math.sqrt(spec.hdim)
    poison, ops.poison_outputs = ops.poison_outputs, True
    try:
        out, _ = ops.run_spec(spec, q, k, v, None, None, 333, 517, scale)
        torch.cuda.synchronize()
    except RuntimeError as e:
        return False, f"launch failure: {str(e).splitlines()[0][:200]}"
    finally:
        ops.poison_outputs = poison
    ref, _ = attention_reference(q, k, v, spec.causal, scale)
    err, tol = rel_l2(out, ref), tolerance(q, k, v, spec.causal, scale, ref)
    return (True, f"rel err {err:.2e}") if err <= tol else (False, f"wrong result: rel err {err:.2e} > {tol:.2e}")


def time_spec(spec: KernelSpec, seqlen: int, repeats: int) -> dict:
    """Median ms and TFLOPS of the candidate on the FA-convention shape for `seqlen`."""
    import statistics

    from flashtune import ops
    from flashtune.bench import Shape, make_inputs, time_ms, L2_FLUSH_BYTES

    shape = Shape(spec.dtype, spec.hdim, spec.causal, seqlen, seqlen, max(1, 16384 // seqlen),
                  max(1, 2048 // spec.hdim), max(1, 2048 // spec.hdim))
    sets = max(1, min(4, math.ceil(L2_FLUSH_BYTES / shape.input_bytes)))
    inputs = [make_inputs(shape, seed) for seed in range(sets)]
    scale = 1.0 / math.sqrt(spec.hdim)
    runners = [lambda q=q, k=k, v=v: ops.run_spec(spec, q, k, v, None, None, seqlen, seqlen, scale)
               for q, k, v in inputs]
    ms = statistics.median(time_ms(runners, warmup=3, repeats=repeats))
    return {"ms": ms, "tflops": shape.flops / (ms * 1e-3) / 1e12}


def measure_candidate(spec: KernelSpec, seqlens: tuple[int, ...], repeats: int) -> list[dict]:
    """Correctness, then one timing per seqlen; runs in a GPU worker or in-process."""
    ok, detail = check_correct(spec)
    if not ok:
        return [{"status": "failed", "reason": detail}]
    try:
        return [{"status": "ok", "seqlen": s, **time_spec(spec, s, repeats), "check": detail} for s in seqlens]
    except RuntimeError as e:
        return [{"status": "failed", "reason": f"launch failure: {str(e).splitlines()[0][:200]}"}]


def _init_gpu_worker(queue) -> None:
    # Each worker owns one GPU; set before torch initialises CUDA in this process.
    os.environ["CUDA_VISIBLE_DEVICES"] = str(queue.get())


def _measure_task(args):
    spec, seqlens, repeats = args
    return spec, measure_candidate(spec, seqlens, repeats)


# ---------------------------------------------------------------------------- the search

def build_failure(result, max_spill_bytes: int) -> str | None:
    """Why a built candidate is rejected before it runs, or None."""
    spilled = (result.spill_stores or 0) + (result.spill_loads or 0)
    if spilled > max_spill_bytes:
        return f"ptxas spills {result.spill_stores}/{result.spill_loads} bytes (store/load)"
    log = Path(result.log).read_text(errors="replace") if result.log and Path(result.log).is_file() else ""
    found = sorted(set(SERIALISING_WARNINGS.findall(log)))
    if found:
        return f"serialised wgmma (ptxas warning {', '.join(found)})"
    return None


def run_tune(profile: Profile, gpu_name: str, opts: TuneOptions, cache_path: str | None = None,
             on_event: Callable[[str, int, int], None] | None = None) -> TuneResult:
    """Compile, check and time every candidate; pick the fastest per (hdim, causal, bucket)."""
    from flashtune.build import BuildError, build_specs

    cache = TuneCache(cache_path or default_cache_path(gpu_name, profile), stamp(gpu_name, profile.family))
    result = TuneResult(cache_path=str(cache.path))
    deadline = time.monotonic() + opts.time_budget_s if opts.time_budget_s else None
    event = on_event or (lambda *a: None)

    specs: list[KernelSpec] = []
    for hdim in opts.hdims:
        for causal in opts.causal:
            start_tiles = tuple(dict.fromkeys(
                profile.tile_for(hdim, causal, s, s) for s in opts.seqlens))
            for tile in candidates(profile.family, hdim, profile.arch, profile.fp8_qk, start_tiles,
                                   opts.max_candidates):
                specs.append(KernelSpec(profile.family, profile.arch.name, opts.dtype, hdim, tile, causal,
                                        fp8=profile.fp8_qk, nvcc_flags=profile.nvcc_flags))

    def key(spec: KernelSpec, what) -> str:
        return TuneCache.key(spec.name, spec.source_hash()[:12], what)

    # 1. Compile what has no verdict yet, in parallel. Failures are final.
    to_build = [s for s in specs if cache.get(key(s, "build")) is None]
    done = 0

    def built(spec, _):
        nonlocal done
        done += 1
        event("compile", done, len(to_build))

    results, failures = build_specs(to_build, jobs=opts.jobs or default_jobs(), on_done=built)
    by_name = {r.name: r for r in results}
    for spec in to_build:
        if spec.name in by_name:
            reason = build_failure(by_name[spec.name], opts.max_spill_bytes)
            cache.put(key(spec, "build"), status="failed" if reason else "ok", reason=reason,
                      registers=by_name[spec.name].registers,
                      spills=[by_name[spec.name].spill_stores, by_name[spec.name].spill_loads])
    for spec, err in failures:
        first = next((line for line in str(err).splitlines() if "error" in line.lower()), str(err).splitlines()[0])
        reason = f"compile error: {first[:200]}" if isinstance(err, BuildError) else f"build failed: {err}"
        cache.put(key(spec, "build"), status="failed", reason=reason)

    # 2. Check and time the survivors that have no measurement yet.
    runnable = [s for s in specs if cache.get(key(s, "build"))["status"] == "ok"]
    pending = [s for s in runnable if cache.get(key(s, "run")) is None]
    tasks = [(s, opts.seqlens, opts.repeats) for s in pending]
    if opts.gpus > 1 and tasks:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        for i in range(opts.gpus):
            queue.put(i)
        with ctx.Pool(opts.gpus, initializer=_init_gpu_worker, initargs=(queue,)) as pool:
            outcomes = pool.imap_unordered(_measure_task, tasks)
            result.stopped_by_budget = _collect(outcomes, cache, key, deadline, event, len(tasks))
            if result.stopped_by_budget:
                pool.terminate()
    else:
        outcomes = (_measure_task(t) for t in tasks)
        result.stopped_by_budget = _collect(outcomes, cache, key, deadline, event, len(tasks))

    # 3. Winners per (hdim, causal, seqlen), from the cache (this run's and earlier ones).
    for spec in specs:
        build_rec = cache.get(key(spec, "build"))
        run_rec = cache.get(key(spec, "run"))
        outcome = run_rec["outcome"] if run_rec else [build_rec] if build_rec["status"] == "failed" else []
        for o in outcome:
            record = {"spec": spec.name, "hdim": spec.hdim, "causal": spec.causal, "tile": spec.tile, **o}
            result.records.append(record)
            if o.get("status") != "ok":
                continue
            slot = (spec.hdim, spec.causal, o["seqlen"])
            if slot not in result.winners or o["tflops"] > result.winners[slot]["tflops"]:
                result.winners[slot] = record
            if spec.tile == profile.tile_for(spec.hdim, spec.causal, o["seqlen"], o["seqlen"]):
                result.starting[slot] = record
    return result


def _collect(outcomes, cache: TuneCache, key, deadline, event, total: int) -> bool:
    """Store each candidate's outcome as it arrives; True if the time budget ran out."""
    for i, (spec, outcome) in enumerate(outcomes, 1):
        cache.put(key(spec, "run"), outcome=outcome)
        event("measure", i, total)
        if deadline is not None and time.monotonic() > deadline and i < total:
            return True
    return False
