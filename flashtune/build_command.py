"""`flashtune build`: compile a profile's kernels (cross-compiling without a GPU) and report.

Exit codes: 0 all built (or found in the cache), 1 a compile failed, 2 bad input or toolchain.
"""
from __future__ import annotations

import time
from dataclasses import asdict

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from flashtune.arch import get_arch
from flashtune.build import BuildError, BuildResult, build_binding, build_specs, cache_root
from flashtune.gpu import detect_gpus
from flashtune.profiles import Profile, select_profile_with_reason
from flashtune.spec import KernelSpec, specs_for_profile
from flashtune.toolchain import check_build_toolchain

EXIT_BUILD_FAILED = 1


def resolve_profile(profile_name: str | None) -> tuple[Profile, str]:
    """--profile NAME/PATH, else the profile matching the first visible GPU."""
    gpus = [] if profile_name else detect_gpus()  # an explicit profile needs no GPU (or torch)
    selection = select_profile_with_reason(profile_name, gpus[0] if gpus else None)
    return selection.profile, selection.reason


def run_build(profile: Profile, arch: str | None, dtypes, hdims, force: bool, jobs: int | None,
              console: Console | None, with_binding: bool = True) -> dict:
    """Build every spec of the profile (narrowed by the options); returns the report dict."""
    specs = specs_for_profile(profile, arch=arch, dtypes=dtypes or None, hdims=hdims or None)
    target = get_arch(arch or profile.arch.name)
    check_build_toolchain(target)  # once, before any compile: exit 2
    notes = []
    if profile.fp8_qk and not target.fp8:  # the profile's FP8 twins need FP8 tensor cores
        dropped = len(specs_for_profile(profile, dtypes=dtypes or None, hdims=hdims or None)) - len(specs)
        notes.append(f"{dropped} FP8 Q/K kernels of profile {profile.name} are not built: {target.name} has no FP8 "
                     "tensor cores (they exist on sm_89, sm_90 and sm_120)")
    start = time.perf_counter()
    results: list[BuildResult] = []
    failures: list[dict] = []
    progress = Progress(TextColumn("[bold]building[/]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeElapsedColumn(), TextColumn("{task.description}"),
                        console=console, transient=True, disable=console is None)
    with progress:
        task = progress.add_task("", total=len(specs) + int(with_binding))
        if with_binding:
            try:
                results.append(build_binding(force=force))
            except BuildError as err:
                failures.append(_failure("flashtune_C", err))
            progress.advance(task)

        def done(spec: KernelSpec, result: BuildResult | None) -> None:
            progress.update(task, advance=1, description=spec.name)

        built, failed = build_specs(specs, jobs=jobs, force=force, on_done=done)
        results += built
        failures += [_failure(spec.name, err) for spec, err in failed]
    modules = len(specs) + int(with_binding)
    return {
        "profile": profile.name,
        "arch": target.name,
        "family": profile.family,
        "cache": str(cache_root()),
        "seconds": round(time.perf_counter() - start, 2),
        "kernels": [asdict(r) for r in results],
        "failures": failures,
        "notes": notes,
        "error": f"{len(failures)} of {modules} modules failed to compile" if failures else None,
        "exit_code": EXIT_BUILD_FAILED if failures else 0,
    }


def _failure(kernel: str, err: Exception) -> dict:
    """One failed module: its first compiler error and where the full log is (BuildError), or the
    error itself (a cache entry that could not be written, say)."""
    if isinstance(err, BuildError):
        return {"kernel": kernel, "error": err.cause, "log": err.log}
    return {"kernel": kernel, "error": str(err).splitlines()[0] if str(err) else type(err).__name__, "log": None}


def render(report: dict, console: Console) -> None:
    table = Table(title=f"flashtune build: profile {report['profile']} for {report['arch']} "
                        f"({report['family']} family)")
    for col in ("kernel", "cache", "seconds", "registers", "smem", "spills"):
        table.add_column(col, justify="left" if col == "kernel" else "right")
    for k in report["kernels"]:
        spills = "-" if k["spill_stores"] is None else (
            f"[yellow]{k['spill_stores']}/{k['spill_loads']} B[/]" if k["spill_stores"] or k["spill_loads"] else "0")
        table.add_row(k["name"], "hit" if k["cache_hit"] else "built", f"{k['seconds']:.2f}",
                      str(k["registers"] or "-"), f"{k['smem_bytes'] // 1024} KB" if k["smem_bytes"] else "-",
                      spills)
    console.print(table)
    built = sum(not k["cache_hit"] for k in report["kernels"])
    console.print(f"{len(report['kernels'])} modules ({built} built, {len(report['kernels']) - built} from the "
                  f"cache) in {report['seconds']:.1f} s; cache: {report['cache']}")
    if any(k["spill_stores"] or k["spill_loads"] for k in report["kernels"]):
        console.print("[yellow]warning: some kernels spill registers to local memory (slower); "
                      "`flashtune tune` finds configs that do not[/]")
    for note in report["notes"]:
        console.print(f"note: {escape(note)}")
    for failure in report["failures"]:  # one line each: the kernel, its first compiler error, the full log
        log = f" [dim](full log: {escape(failure['log'])})[/]" if failure["log"] else ""
        console.print(f"[red]failed[/] {failure['kernel']}: {escape(failure['error'])}{log}", soft_wrap=True)
    if report["failures"]:
        console.print(f"[red]error: {report['error']}[/]")

