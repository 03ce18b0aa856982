"""`flashtune tune --backward`: the backward kernel per head dim, on this GPU.

Every backward tile the profile's arch takes (kernels/bwd_spec.py: the wgmma kernel on sm_90a; the
mma.sync kernel with 4, 2 or 8 warps everywhere) is compiled
in parallel, causal and not; a candidate that fails to compile or spills more than allowed is
recorded with that reason. Each survivor's gradients are checked against fp32 autograd, then a head
dim's candidates are timed side by side (interleaved rounds, cold L2, as `bench` times) on the
backward alone of four cells: 4 x 2k and 1 x 8k tokens, causal and not, 2048 / hdim heads. The
candidate with the lowest geomean time wins if it beats the starting tile by more than the cells'
noise (2%); the starting tile stays otherwise.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

from flashtune.kernels.bwd_spec import (BWD_HEAD_DIMS, MMA_SYNC_TILES, WGMMA_TILES, BwdSpec, BwdTile,
                                        bwd_spec_of_tile, bwd_tile_problems)
from flashtune.kernels.profiles import Profile
from flashtune.tuning.screen import Candidate, pick_fastest, screen_builds

CELLS = ((4, 2048, False), (4, 2048, True), (1, 8192, False), (1, 8192, True))  # (batch, seqlen, causal)
MAX_REL_ERR = 2e-2  # dq, dk and dv against fp32 autograd (16-bit inputs: a few 1e-3 when right)


@dataclass
class BackwardCandidate(Candidate):
    hdim: int
    tile: BwdTile
    specs: tuple[str, str]  # non-causal and causal kernels


@dataclass
class BackwardTuneResult:
    candidates: list[BackwardCandidate]
    winners: dict[int, BwdTile]  # hdim -> the tile written to the profile


def backward_hdims(hdims) -> list[int]:
    """The head dims among `hdims` that the backward kernels take."""
    return [h for h in hdims if h in BWD_HEAD_DIMS]


def backward_candidates(profile: Profile, hdim: int) -> list[BwdTile]:
    """The starting tile first, then every other tile the backward kernels take on the profile's arch."""
    start = profile.backward_tile(hdim)
    return [start, *(t for t in (*WGMMA_TILES, *MMA_SYNC_TILES)
                     if t != start and not bwd_tile_problems(hdim, t, profile.arch))]


def cell_label(cell) -> str:
    batch, seqlen, causal = cell
    return f"{batch} x {seqlen // 1024}k{' causal' if causal else ''}"


def backward_inputs(cell, hdim: int, dtype, seed: int):
    """Input sets (q, k, v, dout, out, lse) of a cell, enough to leave L2 cold; out and lse from
    flashtune's forward under the active profile."""
    import torch

    from flashtune.measure.timing import L2_FLUSH_BYTES
    from flashtune.runtime import ops

    batch, seqlen, causal = cell
    heads = 2048 // hdim
    gen = torch.Generator(device="cuda").manual_seed(seed)
    tensor_bytes = batch * seqlen * heads * hdim * 2
    sets = []
    for _ in range(max(1, min(4, math.ceil(L2_FLUSH_BYTES / (6 * tensor_bytes))))):
        q, k, v, dout = (torch.randn(batch, seqlen, heads, hdim, device="cuda", dtype=dtype, generator=gen)
                         for _ in range(4))
        out, lse = ops.flash_attn_func(q, k, v, causal=causal, return_lse=True)
        sets.append((q, k, v, dout, out, lse))
    return sets


def _runner(spec: BwdSpec, q, k, v, dout, out, lse):
    from flashtune.runtime.backward import run_bwd_spec

    def run():
        return run_bwd_spec(spec, dout, q, k, v, out, lse, None, None, None, q.shape[1], k.shape[1],
                            q.shape[-1] ** -0.5)
    return run


def _check(specs: dict[bool, BwdSpec], hdim: int, dtype) -> str | None:
    """None if the candidate's gradients match fp32 autograd on 1 x 300 queries x 500 keys, causal
    and not, else why not."""
    import torch

    from flashtune.measure.reference import attention_reference, rel_l2
    from flashtune.runtime import ops

    gen = torch.Generator(device="cuda").manual_seed(11)
    q, dout = (torch.randn(1, 300, 2, hdim, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    k, v = (torch.randn(1, 500, 2, hdim, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
    for causal, spec in specs.items():
        out, lse = ops.flash_attn_func(q, k, v, causal=causal, return_lse=True)
        got = _runner(spec, q, k, v, dout, out, lse)()
        ref = [t.float().requires_grad_() for t in (q, k, v)]
        attention_reference(*ref, causal)[0].backward(dout.float())
        for name, ours, r in zip(("dq", "dk", "dv"), got, ref):
            err = rel_l2(ours.float(), r.grad)
            if not err <= MAX_REL_ERR:
                return f"{name} rel err {err:.1e} against fp32{' (causal)' if causal else ''} (> {MAX_REL_ERR:.0e})"
    return None


def run_backward_tune(profile: Profile, dtype_name: str, hdims, repeats: int = 20, jobs: int | None = None,
                      max_spill_bytes: int = 64, on_event: Callable[[str, int, int], None] | None = None
                      ) -> BackwardTuneResult:
    import torch

    from flashtune.measure.timing import time_interleaved
    from flashtune.runtime.selection import use_profile

    use_profile(profile)  # the forward that makes each cell's out and lse
    dtype = getattr(torch, dtype_name)
    candidates, specs = [], {}
    tuned = backward_hdims(hdims)
    for hdim in tuned:
        for i, tile in enumerate(backward_candidates(profile, hdim)):
            pair = {causal: bwd_spec_of_tile(profile.arch.name, dtype_name, hdim, causal, tile,
                                             nvcc_flags=profile.nvcc_flags) for causal in (False, True)}
            candidates.append(BackwardCandidate(hdim, tile, (pair[False].name, pair[True].name), starting=i == 0))
            specs.update({s.name: s for s in pair.values()})
    rejected = screen_builds(list(specs.values()), jobs, max_spill_bytes, on_event)
    winners = {}
    for n, hdim in enumerate(tuned):
        group = [c for c in candidates if c.hdim == hdim]
        for c in group:
            c.status = next((rejected[s] for s in c.specs if s in rejected), None) or \
                _check({False: specs[c.specs[0]], True: specs[c.specs[1]]}, hdim, dtype) or "ok"
        alive = [c for c in group if c.status == "ok"]
        for cell in CELLS:
            sets = backward_inputs(cell, hdim, dtype, seed=0)
            timed = {c.specs[cell[2]]: [_runner(specs[c.specs[cell[2]]], *s) for s in sets] for c in alive}
            times, _ = time_interleaved(timed, 3, repeats)
            for c in alive:
                c.us[cell_label(cell)] = statistics.median(times[c.specs[cell[2]]]) * 1e3
            del sets, timed
            torch.cuda.empty_cache()
        best = pick_fastest(group)
        winners[hdim] = best.tile
        if on_event:
            on_event("timing", n + 1, len(tuned))
    return BackwardTuneResult(candidates, winners)
