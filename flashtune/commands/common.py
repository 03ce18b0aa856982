"""What every command shares: its exit codes and one-line errors, the profile and GPU it works
on, and how it shows work and results (console, JSON, a file, the progress bar, sizes).
"""
from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager, suppress
from typing import Iterator

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from flashtune.kernels.gpu import GpuInfo, detect_gpus
from flashtune.kernels.profiles import Profile, ProfileError, find_profile, select_profile_with_reason

# What an exit code means, in every command (README: "Exit codes").
EXIT_OK = 0
EXIT_FAILED = 1  # the command ran and what it checks failed: a compile, a verify check, a tune
EXIT_INPUT_ERROR = 2  # bad profile, bad option value, unusable toolchain (click uses 2 for usage too)
EXIT_NO_GPU = 3
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports a command it stopped


class CliError(Exception):
    """A command's own failure, said in one line, with the exit code it means."""

    def __init__(self, message: str, exit_code: int = EXIT_INPUT_ERROR):
        super().__init__(message)
        self.exit_code = exit_code


def require_gpu(command: str) -> list[GpuInfo]:
    gpus = detect_gpus()
    if not gpus:
        raise CliError(f"no GPU is visible; {command} needs one (see `flashtune detect`)", EXIT_NO_GPU)
    return gpus


def resolve_profile(profile_name: str | None, arch: str | None = None) -> tuple[Profile, str]:
    """--profile NAME/PATH, else $FLASHTUNE_PROFILE (the one the runtime then uses too), else the
    profile matching the first visible GPU; and why. `arch`: the target of a cross-compile, whose
    profiles the error names when there is no GPU to match."""
    if not profile_name and os.environ.get("FLASHTUNE_PROFILE"):
        try:
            return find_profile(os.environ["FLASHTUNE_PROFILE"]), "chosen with FLASHTUNE_PROFILE"
        except ProfileError as err:
            raise ProfileError(f"FLASHTUNE_PROFILE: {err}") from err
    gpus = [] if profile_name else detect_gpus()  # an explicit profile needs no GPU (or torch)
    selection = select_profile_with_reason(profile_name, gpus[0] if gpus else None, for_arch=arch)
    return selection.profile, selection.reason


def make_console(stderr: bool = False) -> Console:
    # Rich falls back to 80 columns when not on a terminal; wide tables would be cut.
    stream = sys.stderr if stderr else sys.stdout
    return Console(width=None if stream.isatty() else 160, soft_wrap=False, stderr=stderr)


def print_json(data) -> None:
    click.echo(json.dumps(data, indent=2))


def results_json(data: dict) -> str:
    """A result file's JSON: its header fields indented, then one line per row; floats to five
    significant digits (a GPU timing repeats to about three); a backend absent throughout is named
    once, with why, under "absent_backends". A decode grid is hundreds of rows: this keeps a file
    a reader can scan a row at a time, at a third of the size pretty-printed."""
    def rounded(x):
        if isinstance(x, float):
            return float(f"{x:.5g}")
        if isinstance(x, dict):
            return {k: rounded(v) for k, v in x.items()}
        if isinstance(x, list):
            return [rounded(v) for v in x]
        return x

    data = rounded(data)
    rows = data.pop("rows", None)
    # A backend unavailable in every row for one reason (not importable here) is listed once
    # instead of in every row; a row with any other status keeps its backend's rows.
    reasons: dict[str, set] = {}
    for r in rows or ():
        if isinstance(r, dict) and "backend" in r and "status" in r:
            unavailable = str(r["status"]).startswith("unavailable")
            reasons.setdefault(r["backend"], set()).add(r["status"] if unavailable else None)
    absent = {b: s.pop() for b, s in reasons.items() if len(s) == 1 and None not in s}
    if absent:
        data["absent_backends"] = absent
        rows = [r for r in rows if not (isinstance(r, dict) and r.get("backend") in absent)]
    fields = [f" {json.dumps(k)}: " + json.dumps(v, indent=1).replace("\n", "\n ") for k, v in data.items()]
    if rows is not None:
        fields.append(' "rows": [' + ",".join("\n  " + json.dumps(r) for r in rows) + ("\n ]" if rows else "]"))
    return "{\n" + ",\n".join(fields) + "\n}\n"


def write_text(path: str, text: str) -> None:
    """Write a result to a file, or to stdout for '-'."""
    if path == "-":
        click.echo(text)
        return
    partial = f"{path}.partial"
    try:  # whole or not at all: a Ctrl-C mid-write leaves the last checkpoint, not half of this one
        with open(partial, "w") as f:
            f.write(text)
        os.replace(partial, path)
    except OSError as err:
        raise CliError(f"cannot write {path}: {err.strerror or err}") from err
    finally:
        with suppress(OSError):
            os.remove(partial)  # there only when the write did not finish


def check_writable(path: str | None, option: str) -> None:
    """Before a long run: the folder of a file it will write exists and takes files, so that the
    run does not end in a failed write of what it measured."""
    if not path or path == "-":
        return
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise CliError(f"{option} {path} is a folder; give a file name")
    if not os.path.isdir(folder):
        raise CliError(f"{option} {path}: there is no folder {folder}; create it or give another path")
    if not os.access(folder, os.W_OK):
        raise CliError(f"{option} {path}: the folder {folder} is not writable; give another path")


PLAIN_PROGRESS_SECONDS = 10.0  # a log's progress lines: at most one this often, and the last


class ProgressStep:
    """The handle a long command moves its bar with. Where the console is not a terminal (a log, a
    pipe), rich draws no bar: a plain line `label done/total what` then says how far the command
    is, at most every PLAIN_PROGRESS_SECONDS and when it ends, so a log of a long build or verify
    is not silent for minutes."""

    def __init__(self, bar: Progress, task: TaskID, label: str, console: Console | None):
        self._bar, self._task, self._label = bar, task, label
        self._console = console if console is not None and not console.is_terminal else None
        self._printed = time.monotonic()

    def advance(self, description: str = "") -> None:
        self._bar.update(self._task, advance=1, description=description)
        self._plain(description)

    def update(self, done: int, total: int, description: str = "") -> None:
        self._bar.update(self._task, completed=done, total=max(total, 1), description=description)
        self._plain(description)

    def _plain(self, description: str) -> None:
        if self._console is None:
            return
        task = self._bar.tasks[0]
        now = time.monotonic()
        if task.completed >= (task.total or 0) or now - self._printed >= PLAIN_PROGRESS_SECONDS:
            self._printed = now
            self._console.print(f"{self._label} {task.completed:g}/{task.total:g} {description}".rstrip(),
                                markup=False, highlight=False)


@contextmanager
def progress_bar(label: str, console: Console | None, total: int = 1) -> Iterator[ProgressStep]:
    """The one progress bar of every long command: label, bar, done/total, time, what runs now.
    It disappears when done; there is none without a console (JSON on stdout, nothing else)."""
    bar = Progress(TextColumn(f"[bold]{label}[/]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TimeElapsedColumn(), TextColumn("{task.description}"), console=console, transient=True,
                   disable=console is None)
    with bar:
        yield ProgressStep(bar, bar.add_task("", total=total), label, console)


def human_bytes(n: int | None) -> str | None:
    """1024-based sizes as people read them: 99 KB, 80 GB."""
    if n is None:
        return None
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) or value >= 100 else f"{value:.1f} {unit}"
    return f"{n} B"


def yes_no(flag: bool | None) -> str | None:
    return None if flag is None else ("yes" if flag else "no")
