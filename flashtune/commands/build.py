"""`flashtune build`: compile a profile's kernels (cross-compiling without a GPU) and report.

Exit codes: 0 all built (or found in the cache), 1 a compile failed, 2 bad input or toolchain.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flashtune.commands.common import EXIT_FAILED, EXIT_OK, progress_bar
from flashtune.kernels.arch import get_arch
from flashtune.kernels.build import BuildError, BuildResult, build_binding, build_specs, cache_root
from flashtune.kernels.profiles import Profile
from flashtune.kernels.bwd_spec import bwd_specs_for_profile
from flashtune.kernels.cache_spec import cache_specs_for_profile
from flashtune.kernels.decode_spec import decode_specs_for_profile
from flashtune.kernels.spec import KernelSpec, specs_for_profile
from flashtune.kernels.toolchain import check_build_toolchain


@dataclass(frozen=True)
class BuildFailure:
    kernel: str
    error: str  # the first compiler error, or the error itself
    log: str | None  # the full build log


@dataclass
class BuildReport:
    profile: str
    arch: str
    family: str
    cache: str
    seconds: float = 0.0
    kernels: list[BuildResult] = field(default_factory=list)
    failures: list[BuildFailure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def error(self) -> str | None:
        modules = len(self.kernels) + len(self.failures)
        return f"{len(self.failures)} of {modules} modules failed to compile" if self.failures else None

    @property
    def exit_code(self) -> int:
        return EXIT_FAILED if self.failures else EXIT_OK

    def to_json(self) -> dict:
        return {**asdict(self), "error": self.error, "exit_code": self.exit_code}


def run_build(profile: Profile, arch: str | None, dtypes, hdims, force: bool, jobs: int | None,
              console: Console | None, with_binding: bool = True, decode: bool = True,
              backward: bool = True, narrow: bool = True) -> BuildReport:
    """Build every kernel of the profile (narrowed by the options), the decode and backward kernels
    and an sm90 profile's narrow twins included; a progress bar on the console."""
    specs = specs_for_profile(profile, arch=arch, dtypes=dtypes or None, hdims=hdims or None, narrow=narrow)
    target = get_arch(arch or profile.arch.name)
    check_build_toolchain(target)  # once, before any compile: exit 2
    report = BuildReport(profile.name, target.name, profile.family, str(cache_root()))
    if profile.fp8_qk and not target.fp8:  # the profile's FP8 twins need FP8 tensor cores
        every = specs_for_profile(profile, dtypes=dtypes or None, hdims=hdims or None, narrow=narrow)
        dropped = len(every) - len(specs)
        report.notes.append(f"{dropped} FP8 Q/K kernels of profile {profile.name} are not built: {target.name} has "
                            "no FP8 tensor cores (they exist on sm_89, sm_90 and sm_120)")
    if decode:
        specs += decode_specs_for_profile(profile, arch=arch, dtypes=dtypes or None, hdims=hdims or None)
        specs += cache_specs_for_profile(profile, arch=arch, dtypes=dtypes or None, hdims=hdims or None)
    if backward:
        specs += bwd_specs_for_profile(profile, arch=arch, dtypes=dtypes or None, hdims=hdims or None)
    start = time.perf_counter()
    with progress_bar("building", console, len(specs) + int(with_binding)) as bar:
        if with_binding:
            try:
                report.kernels.append(build_binding(force=force))
            except BuildError as err:
                report.failures.append(_failure("flashtune_C", err))
            bar.advance("flashtune_C")

        def done(spec: KernelSpec, result: BuildResult | None) -> None:
            bar.advance(spec.name)

        built, failed = build_specs(specs, jobs=jobs, force=force, on_done=done)
    report.kernels += built
    report.failures += [_failure(spec.name, err) for spec, err in failed]
    report.seconds = round(time.perf_counter() - start, 2)
    return report


def _failure(kernel: str, err: Exception) -> BuildFailure:
    """One failed module: its first compiler error and where the full log is (BuildError), or the
    error itself (a cache entry that could not be written, say)."""
    if isinstance(err, BuildError):
        return BuildFailure(kernel, err.cause, err.log)
    return BuildFailure(kernel, str(err).splitlines()[0] if str(err) else type(err).__name__, None)


def render(report: BuildReport, console: Console, verbose: bool = False) -> None:
    table = Table(title=f"flashtune build: profile {report.profile} for {report.arch} "
                        f"({report.family} family)")
    for col in ("kernel", "cache", "seconds", "registers", "smem", "spills"):
        table.add_column(col, justify="left" if col == "kernel" else "right")
    for k in report.kernels:
        spills = "-" if k.spill_stores is None else (
            f"[yellow]{k.spill_stores}/{k.spill_loads} B[/]" if k.spill_stores or k.spill_loads else "0")
        table.add_row(k.name, "hit" if k.cache_hit else "built", f"{k.seconds:.2f}",
                      str(k.registers or "-"), f"{k.smem_bytes // 1024} KB" if k.smem_bytes else "-",
                      spills)
    console.print(table)
    built = sum(not k.cache_hit for k in report.kernels)
    console.print(f"{len(report.kernels)} modules ({built} built, {len(report.kernels) - built} from the "
                  f"cache) in {report.seconds:.1f} s; cache: {report.cache}")
    spilled = [k for k in report.kernels if k.spill_stores or k.spill_loads]
    if spilled:
        decode = sum(k.name.startswith("flashtune_decode_") for k in spilled)
        backward = sum(k.name.startswith("flashtune_bwd_") for k in spilled)
        tools = [t for t, n in (("`flashtune tune`", len(spilled) - decode - backward),
                                ("`flashtune tune --decode`", decode)) if n]
        hints = ([f"{' and '.join(tools)} can look for tiles that do not"] if tools else []) + (
            [f"the backward's {backward} have one tile per head dim, not tuned yet"] if backward else [])
        console.print(f"[yellow]warning: {len(spilled)} kernels spill registers to local memory (slower; the "
                      f"spills column); {'; '.join(hints)}[/]")
    for note in report.notes:
        console.print(f"note: {escape(note)}")
    for failure in report.failures:  # one line each: the kernel, its first compiler error, the full log
        log = f" [dim](full log: {escape(failure.log)})[/]" if failure.log else ""
        console.print(f"[red]failed[/] {failure.kernel}: {escape(failure.error)}{log}", soft_wrap=True)
    if report.failures:
        console.print(f"[red]error: {report.error}[/]")
    if verbose:
        for k in report.kernels:
            console.print(f"{k.name}: log {k.log}")
