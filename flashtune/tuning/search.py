"""`flashtune tune`: search tile configs on this GPU and write a tuned profile.

For each (head dim, causal) the candidates (tune_space) are compiled in parallel; a
candidate that fails to compile, spills more than allowed, or whose ptxas log says wgmma
was serialised is recorded with that reason. Each survivor is checked for correctness
against the fp32 reference first, then timed with the bench harness at one sequence
length per bucket. Every result goes to a resumable JSON-lines cache, so an interrupted
tune resumes without re-measuring, and a failure is never retried. A bucket's fastest few
and the starting tile are then timed again side by side (interleaved, as the bench does),
and that final round decides.
"""
from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable

from flashtune import __version__
from flashtune.kernels.build import SERIALISING_WARNINGS
from flashtune.kernels.profiles import Profile
from flashtune.kernels.spec import KernelSpec, family_source_files, spec_for
from flashtune.kernels.tiles import TileConfig
from flashtune.tuning.cache import TuneCache
from flashtune.tuning.space import LEGACY_BUCKET_SEQLENS, candidates, profile_buckets

DEFAULT_MAX_SPILL_BYTES = 64  # a few spilled bytes outside the hot loop cost nothing measurable


@dataclass
class TuneOptions:
    hdims: tuple[int, ...]
    causal: tuple[bool, ...] = (False, True)
    dtype: str = "bfloat16"
    max_candidates: int | None = None
    shapes: tuple[tuple[int, int], ...] = ()  # only these (block_m, block_n) besides the starting tiles
    time_budget_s: float | None = None
    max_spill_bytes: int = DEFAULT_MAX_SPILL_BYTES
    repeats: int = 20
    final_round: int = 3  # per bucket, this many fastest (and the starting tile) timed again side by side; 0: off
    jobs: int | None = None
    gpus: int = 1
    fp8: bool = False  # tune the FP8 Q/K twins (written as the profile's fp8.configs)
    fp8_pv: bool = False  # with fp8: tune the all-FP8 twins instead (written as fp8.pv_configs)


@dataclass
class Measurement:
    """A candidate's outcome: its time at one bucket's seqlen (ok), or why it was rejected."""
    spec: str  # the kernel's name
    hdim: int
    causal: bool
    tile: TileConfig
    status: str  # "ok" or "failed"
    seqlen: int | None = None
    ms: float | None = None
    tflops: float | None = None
    check: str = ""  # ok: the correctness check's figure
    reason: str = ""  # failed: why
    fatal: bool = False  # failed: the CUDA context was left unusable
    first_ms: float | None = None  # after a final round re-timed it: the first pass's figures
    first_tflops: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def slot(self) -> tuple[int, bool, int | None]:
        return self.hdim, self.causal, self.seqlen

    @classmethod
    def of(cls, spec: KernelSpec, outcome: dict) -> Measurement:
        """From an outcome as measure_candidate returns it and the cache keeps it."""
        known = {f.name for f in fields(cls)}
        return cls(spec.name, spec.hdim, spec.causal, spec.tile, **{k: v for k, v in outcome.items() if k in known})

    def to_json(self) -> dict:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "tile": self.tile.label}


@dataclass
class TuneResult:
    records: list[Measurement] = field(default_factory=list)  # every candidate's outcome, cached or new
    buckets: dict = field(default_factory=dict)  # (hdim, causal) -> its buckets (tune_space.Bucket)
    winners: dict[tuple, Measurement] = field(default_factory=dict)  # (hdim, causal, seqlen) -> the fastest
    starting: dict[tuple, Measurement] = field(default_factory=dict)  # (hdim, causal, seqlen) -> the base profile's
    stopped_by_budget: bool = False
    final_round: bool = False  # the winners were decided by the final, side-by-side round
    aborted: str | None = None  # a candidate left the CUDA context unusable: rerun to resume
    cache_path: str = ""


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
    """Run the candidate on an odd-sized random case against the fp32 reference (for FP8
    candidates: the reference of their dequantised inputs, as `flashtune verify` does; for all-FP8
    ones with their P's rounding to e4m3 allowed for, as tests/test_fp8_all_gpu.py does)."""
    import torch

    from flashtune.runtime import ops
    from flashtune.measure.tolerance import tolerance
    from flashtune.measure.reference import attention_reference, rel_l2
    from flashtune.commands.verify import FP8_KERNEL_MAX_REL_ERR, all_fp8_reference, dequantised_qk
    from flashtune.runtime.fp8 import quantised_inputs

    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = getattr(torch, spec.dtype)
    q = torch.randn(2, 333, 4, spec.hdim, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(2, 517, 2, spec.hdim, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(2, 517, 2, spec.hdim, device="cuda", dtype=dtype, generator=gen)
    scale = 1.0 / math.sqrt(spec.hdim)
    (q_in, k_in, v_in), descales = quantised_inputs(q, k, v, spec.fp8, spec.fp8_pv)
    poison, ops.poison_outputs = ops.poison_outputs, True
    try:
        out, _ = ops.run_spec(spec, q_in, k_in, v_in, None, None, 333, 517, scale, with_lse=False, **descales)
        torch.cuda.synchronize()
    except RuntimeError as e:
        return False, f"launch failure: {str(e).splitlines()[0][:200]}"
    finally:
        ops.poison_outputs = poison
    if spec.fp8_pv:
        ref, _, tol = all_fp8_reference(q, k, v, spec.causal, scale)
    elif spec.fp8:
        ref, _ = attention_reference(*dequantised_qk(q, k), v, spec.causal, scale)
        tol = FP8_KERNEL_MAX_REL_ERR
    else:
        ref, _ = attention_reference(q, k, v, spec.causal, scale)
        tol = tolerance(q, k, v, spec.causal, scale, ref)
    err = rel_l2(out, ref)
    return (True, f"rel err {err:.2e}") if err <= tol else (False, f"wrong result: rel err {err:.2e} > {tol:.2e}")


def _runners(spec: KernelSpec, seqlen: int, inputs: list | None = None):
    """The FA-convention shape for `seqlen` (the one bench times), its input sets (one per
    L2-sized rotation; pass them to share one set among candidates), and one call per set."""
    from flashtune.runtime import ops
    from flashtune.measure.problem import fa_grid, make_inputs
    from flashtune.measure.timing import input_sets
    from flashtune.runtime.fp8 import quantised_inputs

    shape = fa_grid([seqlen], [spec.hdim], [spec.causal], spec.dtype)[0]
    if inputs is None:
        inputs = [make_inputs(shape, seed) for seed in range(input_sets(shape))]
    scale = 1.0 / math.sqrt(spec.hdim)
    operands = [quantised_inputs(*qkv, spec.fp8, spec.fp8_pv) for qkv in inputs]
    runners = [lambda args=args, descales=descales: ops.run_spec(spec, *args, None, None, seqlen, seqlen, scale,
                                                                 with_lse=False, **descales)  # as the bench calls
               for args, descales in operands]
    return shape, inputs, runners


def time_spec(spec: KernelSpec, seqlen: int, repeats: int) -> dict:
    """Median ms and TFLOPS of the candidate on the FA-convention shape for `seqlen`."""
    import statistics

    from flashtune.measure.timing import time_ms

    shape, _, runners = _runners(spec, seqlen)
    ms = statistics.median(time_ms(runners, warmup=3, repeats=repeats))
    return {"ms": ms, "tflops": shape.flops / (ms * 1e-3) / 1e12}


def time_side_by_side(specs: list[KernelSpec], seqlen: int, repeats: int) -> dict[str, float]:
    """Median ms per candidate, timed on the same inputs in interleaved rounds (bench's
    harness), so a drift of the clocks falls on all of them alike. A candidate whose launch
    fails here is left out."""
    import statistics

    from flashtune.measure.timing import time_interleaved

    timed, inputs = {}, None
    for spec in specs:
        _, inputs, timed[spec.name] = _runners(spec, seqlen, inputs)
    times, _ = time_interleaved(timed, warmup=3, repeats=repeats, catch=(RuntimeError,))  # OOM is one too
    return {name: statistics.median(t) for name, t in times.items()}


def _context_usable() -> bool:
    """After a failed launch: is the CUDA context still usable, or did the fault stick?"""
    import torch

    try:
        torch.ones(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        return True
    except RuntimeError:
        return False


def measure_candidate(spec: KernelSpec, seqlens: tuple[int, ...], repeats: int) -> list[dict]:
    """Correctness, then one timing per seqlen; runs in a GPU worker or in-process.

    A failure that leaves the CUDA context unusable (an illegal address is sticky) is marked
    `fatal`: nothing after it in this process could be measured."""
    ok, detail = check_correct(spec)
    if ok:
        try:
            return [{"status": "ok", "seqlen": s, **time_spec(spec, s, repeats), "check": detail} for s in seqlens]
        except RuntimeError as e:
            ok, detail = False, f"launch failure: {str(e).splitlines()[0][:200]}"
    failed = {"status": "failed", "reason": detail}
    if detail.startswith("launch failure") and not _context_usable():
        failed.update(fatal=True, reason=detail + " (it left the CUDA context unusable)")
    return [failed]


# CUDA needs freshly spawned workers; the CPU tests fork them instead, so their fakes carry over.
POOL_START_METHOD = "spawn"


def _init_gpu_worker(queue) -> None:
    # Each worker owns one GPU; set before torch initialises CUDA in this process.
    os.environ["CUDA_VISIBLE_DEVICES"] = queue.get()


def _measure_task(args):
    spec, seqlens, repeats = args
    return spec, measure_candidate(spec, seqlens, repeats)


# ---------------------------------------------------------------------------- the search

def build_facts(result) -> dict:
    """What the build of a candidate says about it (cached; judged by build_verdict)."""
    log = Path(result.log).read_text(errors="replace") if result.log and Path(result.log).is_file() else ""
    return {"status": "built", "registers": result.registers,
            "spills": [result.spill_stores or 0, result.spill_loads or 0],
            "serialising_warnings": sorted(set(SERIALISING_WARNINGS.findall(log)))}


def build_verdict(facts: dict, max_spill_bytes: int) -> str | None:
    """Why a candidate is rejected before it runs (None: run it). Judged at each run, so a
    different --max-spill-bytes re-judges cached builds."""
    if facts["status"] == "failed":
        return facts["reason"]
    if sum(facts["spills"]) > max_spill_bytes:
        return "ptxas spills {}/{} bytes (store/load)".format(*facts["spills"])
    if facts["serialising_warnings"]:
        return f"serialised wgmma (ptxas warning {', '.join(facts['serialising_warnings'])})"
    return None


def run_tune(profile: Profile, gpu_name: str, opts: TuneOptions, cache_path: str | None = None,
             on_event: Callable[[str, int, int], None] | None = None) -> TuneResult:
    """Compile, check and time every candidate; pick the fastest per (hdim, causal, bucket)."""
    from flashtune.kernels.build import BuildError, build_specs

    cache = TuneCache(cache_path or default_cache_path(gpu_name, profile), stamp(gpu_name, profile.family))
    result = TuneResult(cache_path=str(cache.path))
    deadline = time.monotonic() + opts.time_budget_s if opts.time_budget_s else None
    event = on_event or (lambda *a: None)

    specs: list[KernelSpec] = []
    starting: dict[tuple, KernelSpec] = {}  # (hdim, causal, bucket seqlen) -> the base profile's kernel
    for hdim in opts.hdims:
        for causal in opts.causal:
            buckets = result.buckets[(hdim, causal)] = profile_buckets(profile, hdim, causal, opts.fp8, opts.fp8_pv)
            for b in buckets:
                tile = profile.tile_for(hdim, causal, b.seqlen, b.seqlen, fp8=opts.fp8, fp8_pv=opts.fp8_pv)
                starting[(hdim, causal, b.seqlen)] = spec_for(profile, tile, opts.dtype, hdim, causal, opts.fp8,
                                                              fp8_pv=opts.fp8_pv)
            start_tiles = tuple(dict.fromkeys(starting[(hdim, causal, b.seqlen)].tile for b in buckets))
            for tile in candidates(profile.family, hdim, profile.arch, opts.fp8, start_tiles,
                                   opts.max_candidates, opts.shapes, fp8_pv=opts.fp8_pv):
                specs.append(spec_for(profile, tile, opts.dtype, hdim, causal, opts.fp8, fp8_pv=opts.fp8_pv))
    hashes = {s: s.source_hash()[:12] for s in specs}  # reads every kernel header: once per spec

    def key(spec: KernelSpec, what) -> str:
        return TuneCache.key(spec.name, hashes[spec], what)

    def seqlens(spec: KernelSpec) -> tuple[int, ...]:
        return tuple(b.seqlen for b in result.buckets[(spec.hdim, spec.causal)])

    def run_key(spec: KernelSpec) -> str:  # earlier caches keyed the old default buckets' runs "run"
        lengths = seqlens(spec)
        return key(spec, "run" if lengths == LEGACY_BUCKET_SEQLENS else "run@" + ",".join(map(str, lengths)))

    # 1. Compile what has no verdict yet, in parallel. Compile errors are final; a toolchain
    #    that cannot build at all raises (ToolchainError) and records nothing.
    to_build = [s for s in specs if cache.get(key(s, "build")) is None]
    done = 0

    def built(spec, _):
        nonlocal done
        done += 1
        event("compile", done, len(to_build))

    results, failures = build_specs(to_build, jobs=opts.jobs, on_done=built)
    by_name = {r.name: r for r in results}
    for spec in to_build:
        if spec.name in by_name:
            cache.put(key(spec, "build"), **build_facts(by_name[spec.name]))
    for spec, err in failures:
        if isinstance(err, BuildError):
            cache.put(key(spec, "build"), status="failed", reason=f"compile error: {err.cause[:200]}")

    # 2. Check and time the survivors that have no measurement yet.
    def verdict(spec):
        facts = cache.get(key(spec, "build"))
        return "not built (see the build error above)" if facts is None else build_verdict(facts, opts.max_spill_bytes)

    runnable = [s for s in specs if verdict(s) is None]
    pending = [s for s in runnable if cache.get(run_key(s)) is None]
    tasks = [(s, seqlens(s), opts.repeats) for s in pending]
    if opts.gpus > 1 and tasks:
        import multiprocessing as mp

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        devices = visible.split(",") if visible else [str(i) for i in range(opts.gpus)]
        ctx = mp.get_context(POOL_START_METHOD)
        queue = ctx.Queue()
        for device in devices[:opts.gpus]:
            queue.put(device)
        with ctx.Pool(opts.gpus, initializer=_init_gpu_worker, initargs=(queue,)) as pool:
            outcomes = pool.imap_unordered(_measure_task, tasks)
            result.stopped_by_budget, result.aborted = _collect(outcomes, cache, run_key, deadline, event, len(tasks))
            if result.stopped_by_budget or result.aborted:
                pool.terminate()
    else:
        outcomes = (_measure_task(t) for t in tasks)
        result.stopped_by_budget, result.aborted = _collect(outcomes, cache, run_key, deadline, event, len(tasks))

    # 3. Winners per (hdim, causal, seqlen), from the cache (this run's and earlier ones).
    for spec in specs:
        rejected = verdict(spec)
        run_rec = cache.get(run_key(spec))
        outcome = ([{"status": "failed", "reason": rejected}] if rejected
                   else run_rec["outcome"] if run_rec else [])
        for o in outcome:
            record = Measurement.of(spec, o)
            result.records.append(record)
            if not record.ok:
                continue
            if record.slot not in result.winners or record.tflops > result.winners[record.slot].tflops:
                result.winners[record.slot] = record
            if spec == starting.get(record.slot):
                result.starting[record.slot] = record

    # 4. The final round. Each candidate was timed alone, minutes apart from the others, and
    #    the clocks drift by a few percent over that: two tunes of one day disagreed by 5% on a
    #    bucket. A bucket's fastest few and its starting tile are timed again side by side, on
    #    the same inputs, and that decides (cached like the rest, so a rerun writes the same).
    if opts.final_round > 0 and not result.aborted and not result.stopped_by_budget:
        _final_round(result, opts, {s.name: s for s in specs}, cache, hashes, event)
        result.final_round = True
    return result


def _final_round(result: TuneResult, opts: TuneOptions, by_name: dict, cache: TuneCache, hashes: dict,
                 event) -> None:
    """Re-time each bucket's contenders side by side; their records then carry the final
    round's ms and TFLOPS (the first pass's stay as first_ms / first_tflops), and the fastest
    of them is the bucket's winner."""
    slots: dict[tuple, list[Measurement]] = {}
    for r in result.records:
        if r.ok:
            slots.setdefault(r.slot, []).append(r)
    rounds = []
    for slot, records in sorted(slots.items()):
        contenders = sorted(records, key=lambda r: -r.tflops)[:opts.final_round]
        start = result.starting.get(slot)
        if start is not None and start not in contenders:
            contenders.append(start)
        if len(contenders) > 1:
            rounds.append((slot, contenders))
    for i, (slot, contenders) in enumerate(rounds, 1):
        names = sorted(r.spec for r in contenders)
        key = TuneCache.key("final", slot[2], *(f"{n}:{hashes[by_name[n]]}" for n in names))
        timed = cache.get(key)
        if timed is None:
            timed = cache.put(key, ms=time_side_by_side([by_name[n] for n in names], slot[2], opts.repeats))
        event("final round", i, len(rounds))
        for r in contenders:
            if r.spec in timed["ms"] and r.first_ms is None:
                r.first_ms, r.first_tflops = r.ms, r.tflops
                r.ms = timed["ms"][r.spec]
                r.tflops = r.first_tflops * r.first_ms / r.ms
        finalists = [r for r in contenders if r.first_ms is not None]
        if finalists:
            result.winners[slot] = max(finalists, key=lambda r: r.tflops)


def _collect(outcomes, cache: TuneCache, run_key, deadline, event, total: int) -> tuple[bool, str | None]:
    """Store each candidate's outcome as it arrives. Returns (stopped by the time budget,
    why the run was aborted: a candidate broke the CUDA context)."""
    for i, (spec, outcome) in enumerate(outcomes, 1):
        cache.put(run_key(spec), outcome=outcome)
        event("measure", i, total)
        if any(o.get("fatal") for o in outcome):
            return False, f"{spec.name}: {outcome[0]['reason']}; rerun to resume with the rest"
        if deadline is not None and time.monotonic() > deadline and i < total:
            return True, None
    return False, None
