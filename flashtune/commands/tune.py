"""`flashtune tune`: check the request, run the search (flashtune/tuning/), write and validate the
tuned profile, report.

Exit codes: 0 a profile was written (buckets where no candidate ran keep the starting tile,
and say so in its provenance), 1 no candidate could be measured (nothing written), 2 bad
input, 3 no GPU visible.
"""
from __future__ import annotations

import dataclasses
import datetime
from collections import defaultdict
from dataclasses import asdict

import click
from rich.console import Console
from rich.table import Table

from flashtune.kernels.gpu import GpuInfo
from flashtune.kernels.profiles import Profile, load_profile
from flashtune.kernels.tiles import prefill_head_dims
from flashtune.tuning.search import TuneOptions, TuneResult
from flashtune.tuning.space import shape_problems
from flashtune.tuning.writer import write_profile


def check_request(profile: Profile, gpu: GpuInfo, hdims: list[int] | None, shapes: list[tuple[int, int]] | None,
                  fp8: bool, fp8_pv: bool = False) -> list[str]:
    """Refuse, before anything is compiled, a tune that cannot run here (click.BadParameter, exit 2);
    returns notes on what is left out (a --tiles shape that runs at some head dims only)."""
    from flashtune.kernels.toolchain import check_build_toolchain
    from flashtune.runtime.selection import check_runs_on

    check_runs_on(profile, gpu)  # sm_89 SASS on an H200 would fail every launch
    check_build_toolchain(profile.arch)
    if fp8 and not (profile.fp8_qk and profile.arch.fp8):
        raise click.BadParameter(f"profile {profile.name} has no FP8 kernels (fp8: {profile.fp8}); "
                                 "tune a profile with fp8: {qk: e4m3}", param_hint="--fp8")
    if fp8_pv and not profile.fp8_pv:
        raise click.BadParameter(f"profile {profile.name} builds no all-FP8 kernels (fp8: {profile.fp8}); tune a "
                                 "profile with fp8: {qk: e4m3, pv: e4m3} (sm90 family)", param_hint="--fp8-all")
    bad = sorted(set(hdims or ()) - set(profile.head_dims))
    if bad:
        raise click.BadParameter(f"{bad} not in profile {profile.name} (head dims {profile.head_dims})",
                                 param_hint="--hdims")
    with_fp8 = prefill_head_dims(profile.head_dims, fp8=True)
    no_fp8 = sorted(set(hdims or ()) - set(with_fp8))
    if fp8 and no_fp8:
        raise click.BadParameter(f"{no_fp8}: no FP8 Q/K kernel at that head dim (FP8 Q/K: head dims "
                                 f"{', '.join(map(str, with_fp8))})", param_hint="--hdims")
    notes = []
    for shape in shapes or ():  # a shape that runs at none of the head dims is a typo or a wrong idea
        problems = {h: shape_problems(profile.family, h, shape, profile.arch, fp8, fp8_pv)
                    for h in tuned_hdims(profile, hdims, fp8)}
        said = "; ".join(f"hdim {h}: {', '.join(p)}" for h, p in problems.items() if p)
        if all(problems.values()):
            raise click.BadParameter(f"{shape[0]}x{shape[1]} cannot run on {profile.arch.name}: {said}",
                                     param_hint="--tiles")
        if said:  # fine elsewhere: say where it is not tried
            notes.append(f"--tiles {shape[0]}x{shape[1]} is not tried at {said}")
    return notes


def tuned_hdims(profile: Profile, hdims, fp8: bool) -> tuple[int, ...]:
    """The head dims a prefill tune covers: --hdims, else the profile's (with --fp8, those that have FP8 Q/K
    kernels)."""
    return tuple(hdims or prefill_head_dims(profile.head_dims, fp8))


def chosen_tiles(profile: Profile, result: TuneResult, opts: TuneOptions):
    """Per tuned (hdim, causal): (lo, hi, tile) for each of its buckets, the winner (the starting
    tile where none ran)."""
    tiles, fallbacks = {}, []
    for (hdim, causal), buckets in result.buckets.items():
        per_bucket = []
        for b in buckets:
            winner = result.winners.get((hdim, causal, b.seqlen))
            if winner is None:
                fallbacks.append(f"hdim {hdim} causal={causal} seqlen {b.seqlen}")
                per_bucket.append((b.lo, b.hi, profile.tile_for(hdim, causal, b.seqlen, b.seqlen, fp8=opts.fp8,
                                                                fp8_pv=opts.fp8_pv)))
            else:
                per_bucket.append((b.lo, b.hi, winner.tile))
        tiles[(hdim, causal)] = per_bucket
    return tiles, fallbacks


def tune_stamp(tool: str, profile: Profile, gpu_name: str, dtype: str) -> dict:
    """What every tune's provenance starts with: the tool, the base profile, where and when it ran."""
    import torch

    from flashtune import __version__

    return {"tool": tool, "base_profile": profile.name, "gpu": gpu_name, "torch": torch.__version__,
            "cuda": torch.version.cuda, "flashtune": __version__, "date": datetime.date.today().isoformat(),
            "dtype": dtype}


def tuned_description(profile: Profile, what: str, gpu_name: str, date: str) -> str:
    """Short, as a profile's description should be: the base's first sentence, then what the tune did
    (the rest of the story is the provenance)."""
    first = profile.description.strip().split(". ")[0].rstrip(".")
    return f"{first}. {what} on {gpu_name} ({date}) from profile {profile.name}."


def provenance(profile: Profile, result: TuneResult, opts: TuneOptions, gpu_name: str, fallbacks) -> dict:
    from flashtune.kernels.gpu import nvidia_smi_driver_version

    measured = []
    bucket_of = {(hdim, causal, b.seqlen): [b.lo, b.hi] for (hdim, causal), bs in result.buckets.items() for b in bs}
    for (hdim, causal, seqlen), w in sorted(result.winners.items()):
        start = result.starting.get((hdim, causal, seqlen))
        measured.append({"hdim": hdim, "causal": causal, "seqlen": seqlen, "bucket": bucket_of[(hdim, causal, seqlen)],
                         "tile": w.tile.label, "tflops": round(w.tflops, 1),
                         "starting_tile": start.tile.label if start else None,
                         "starting_tflops": round(start.tflops, 1) if start else None})
    return {**tune_stamp("flashtune tune", profile, gpu_name, opts.dtype), "driver": nvidia_smi_driver_version(),
            "kernels": "all-fp8" if opts.fp8_pv else "fp8 q/k" if opts.fp8 else "16-bit",
            "candidates_measured": len({r.spec for r in result.records if r.ok}),
            "candidates_failed": sum(1 for r in result.records if not r.ok),
            "stopped_by_time_budget": result.stopped_by_budget, "untuned_buckets": fallbacks,
            "final_round": opts.final_round if result.final_round else 0,
            "measured": measured}


def write_tuned(profile: Profile, result: TuneResult, opts: TuneOptions, gpu_name: str, name: str,
                out: str) -> tuple[Profile, dict]:
    tiles, fallbacks = chosen_tiles(profile, result, opts)
    prov = provenance(profile, result, opts, gpu_name, fallbacks)
    what = ("All-FP8 tiles (fp8.pv_configs)" if opts.fp8_pv else "FP8 Q/K tiles (fp8.configs)" if opts.fp8
            else "Tiles")
    description = tuned_description(profile, f"{what} for head dims {', '.join(map(str, opts.hdims))} tuned by "
                                    "`flashtune tune`", gpu_name, prov["date"])
    path = write_profile(profile, name, description, tiles, prov, out, fp8=opts.fp8, fp8_pv=opts.fp8_pv)
    return load_profile(path), prov  # loading validates what was written


def render(result: TuneResult, console: Console, top: int = 3) -> None:
    slots = defaultdict(list)
    failures = []
    for r in result.records:
        if r.ok:
            slots[r.slot].append(r)
        else:
            failures.append(r)
    title = f"flashtune tune: top {top} configs per bucket"
    if result.final_round:
        title += " (the fastest few and the starting tile: final round, timed side by side)"
    table = Table(title=title)
    for col in ("hdim", "causal", "seqlen", "rank", "tile", "TFLOPS", "ms", "vs starting"):
        table.add_column(col, justify="right" if col not in ("tile",) else "left")
    for slot in sorted(slots):
        # After a final round only its contenders are ranked, by its figures: a candidate left out
        # keeps its first pass's (timed alone, often a few % higher), which must not outrank the
        # side-by-side figures that decided (the winner is rank 1, the starting tile is shown too).
        finalists = [r for r in slots[slot] if r.first_ms is not None]
        ranked = sorted(finalists or slots[slot], key=lambda r: -r.tflops)
        start = result.starting.get(slot)
        shown = ranked[:top] + [r for r in ranked[top:] if start and r is start]
        for i, r in enumerate(shown):
            ratio = f"{r.tflops / start.tflops:.2f}x" if start else "-"
            table.add_row(str(slot[0]), "yes" if slot[1] else "no", str(slot[2]), str(i + 1),
                          r.tile.label + (" (starting)" if start and r.tile == start.tile else ""),
                          f"{r.tflops:.0f}", f"{r.ms:.3f}", ratio)
    console.print(table)
    if failures:
        reasons = Table(title="rejected candidates (recorded, never retried)")
        reasons.add_column("kernel")
        reasons.add_column("reason", overflow="fold")
        for r in failures:
            reasons.add_row(r.spec, r.reason)
        console.print(reasons)
    if result.aborted:
        console.print(f"[red]stopped: {result.aborted}[/]")
    if result.stopped_by_budget:
        console.print("[yellow]stopped by --time-budget: rerun to resume (measured candidates are cached)[/]")
    console.print(f"cache: {result.cache_path}")


def summary(written: Profile, provenance_: dict, result: TuneResult) -> dict:
    """What --json prints: the profile written, its provenance, every candidate's outcome."""
    return {"profile": str(written.path), "provenance": provenance_,
            "records": [r.to_json() for r in result.records]}


# ---------------------------------------------------------------------------- tune --decode

def write_decode_tuned(profile: Profile, result, split, dtype: str, gpu_name: str, name: str,
                       out: str) -> tuple[Profile, dict]:
    """The base profile with its decode tiles replaced by the tune's winners and its split policy by
    the fitted one where it won (`split`: tuning/split_fit.py's SplitFit), its prefill tiles as they
    were; the provenance says what each pair and each split cell measured."""
    from flashtune.tuning.decode_search import CELLS

    pairs = []
    for (hdim, rows), tile in sorted(result.winners.items()):
        group = [c for c in result.candidates if (c.hdim, c.rows) == (hdim, rows)]
        start = next(c for c in group if c.starting)
        won = next(c for c in group if c.tile == tile)
        pairs.append({"hdim": hdim, "rows": rows, "tile": tile.label, "starting_tile": start.tile.label,
                      "vs_starting": round(won.vs_starting, 3) if won.vs_starting else None,
                      "us": {k: round(v, 2) for k, v in won.us.items()},
                      "candidates_measured": sum(1 for c in group if c.us),
                      "candidates_failed": sum(1 for c in group if c.status != "ok")})
    stamp = tune_stamp("flashtune tune --decode", profile, gpu_name, dtype)
    prov = {**(profile.provenance or {}),
            "decode_tune": {**stamp,
                            "cells": {rows: [list(c) for c in cells] for rows, cells in CELLS.items()},
                            "pairs": pairs,
                            "split_fit": {"written": split.wins, "base": asdict(split.base),
                                          "fitted": asdict(split.fitted),
                                          "base_loss": [round(x, 4) for x in split.base_loss],
                                          "fitted_loss": [round(x, 4) for x in split.loss],
                                          "cells": {c.label: {n: round(u, 2) for n, u in c.us.items()}
                                                    for c in split.cells}}}}
    description = tuned_description(profile, "Decode tiles tuned by `flashtune tune --decode`", gpu_name,
                                    stamp["date"])
    base = dataclasses.replace(profile, decode_split=split.policy)
    path = write_profile(base, name, description, {}, prov, out, decode_tiles=result.winners)
    return load_profile(path), prov


# ---------------------------------------------------------------------------- tune --backward

def write_backward_tuned(profile: Profile, result, dtype: str, gpu_name: str, name: str,
                         out: str) -> tuple[Profile, dict]:
    """The base profile with its backward tiles replaced by the tune's winners, everything else as it
    was; the provenance says what each head dim's candidates measured."""
    from flashtune.tuning.backward_search import CELLS, cell_label

    per_hdim = []
    for hdim, tile in sorted(result.winners.items()):
        group = [c for c in result.candidates if c.hdim == hdim]
        start = next(c for c in group if c.starting)
        per_hdim.append({"hdim": hdim, "tile": tile.label(), "starting_tile": start.tile.label(),
                         "us": {c.tile.label(): {k: round(v, 1) for k, v in c.us.items()} for c in group if c.us},
                         "failed": {c.tile.label(): c.status for c in group if c.status != "ok"}})
    stamp = tune_stamp("flashtune tune --backward", profile, gpu_name, dtype)
    prov = {**(profile.provenance or {}),
            "backward_tune": {**stamp, "cells": [cell_label(c) for c in CELLS], "hdims": per_hdim}}
    description = tuned_description(profile, "Backward tiles tuned by `flashtune tune --backward`", gpu_name,
                                    stamp["date"])
    path = write_profile(profile, name, description, {}, prov, out, backward_tiles=result.winners)
    return load_profile(path), prov


def render_backward(result, console: Console) -> None:
    """Per head dim: every candidate against the starting tile, and every rejection."""
    table = Table(title="flashtune tune --backward: the backward alone, geomean over the cells")
    for column in ("hdim", "tile", "vs starting", "us per cell"):
        table.add_column(column, justify="left" if column in ("tile", "us per cell") else "right")
    for hdim in sorted(result.winners):
        group = sorted((c for c in result.candidates if c.hdim == hdim and c.vs_starting is not None),
                       key=lambda c: c.vs_starting)
        for c in group:
            label = c.tile.label() + (" (starting)" if c.starting else "") + \
                (" (written)" if c.tile == result.winners[hdim] else "")
            table.add_row(str(hdim), label, f"{c.vs_starting:.3f}x", ", ".join(f"{v:.0f}" for v in c.us.values()))
    console.print(table)
    render_rejected([(", ".join(c.specs), c.status) for c in result.candidates if c.status != "ok"], console)


def render_rejected(rows: list[tuple[str, str]], console: Console) -> None:
    """The candidates a tune rejected: (kernel names, reason)."""
    if rows:
        bad = Table(title="rejected candidates")
        bad.add_column("kernel")
        bad.add_column("reason")
        for row in rows:
            bad.add_row(*row)
        console.print(bad)


def render_split_fit(split, console: Console) -> None:
    """The split policy's fit: how far the counts each policy picks are from the fastest measured."""
    from flashtune.tuning.split_fit import GRID

    def loss(pair):
        return f"{pair[0] - 1:.1%} slower than the fastest count in geomean, {pair[1] - 1:.1%} at worst"
    fitted = ", ".join(f"{k} {v:g}" for k, v in asdict(split.fitted).items()
                       if k in GRID)
    console.print(f"decode split policy over {len(split.cells)} cells: the profile's picks counts "
                  f"{loss(split.base_loss)}; fitted ({fitted}) {loss(split.loss)}: "
                  + ("written" if split.wins else "not written (within 1% of the profile's)"))


def render_decode(result, console: Console, top: int = 3) -> None:
    """Per (head dim, packed rows): the fastest few against the starting tile, and every rejection."""
    table = Table(title="flashtune tune --decode: the fastest per (head dim, packed rows), geomean over the cells")
    for column in ("hdim", "rows", "rank", "tile", "vs starting", "us per cell"):
        table.add_column(column, justify="left" if column in ("tile", "us per cell") else "right")
    for hdim, rows in sorted(result.winners):
        group = [c for c in result.candidates if (c.hdim, c.rows) == (hdim, rows) and c.vs_starting is not None]
        ranked = sorted(group, key=lambda c: c.vs_starting)[:top]
        start = next((c for c in group if c.starting), None)
        if start is not None and start not in ranked:
            ranked.append(start)
        for i, c in enumerate(ranked):
            label = c.tile.label + (" (starting)" if c.starting else "") + \
                (" (written)" if c.tile == result.winners[(hdim, rows)] else "")
            table.add_row(str(hdim), str(rows), str(i + 1), label, f"{c.vs_starting:.3f}x",
                          ", ".join(f"{v:.1f}" for v in c.us.values()))
    console.print(table)
    render_rejected([(c.spec, c.status) for c in result.candidates if c.status != "ok"], console)
