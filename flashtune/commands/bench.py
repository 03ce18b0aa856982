"""`flashtune bench`: a controlled A/B of attention backends, side by side in one process.

Same shapes, same inputs, only the backend switched. Per row: median ms of CUDA-event
timings, taken in rounds that interleave the backends, each after a timed warm-up (inputs
rotated so no run reads another's data from L2), the host time of one call (left out of ms), TFLOPS,
peak memory of the call, relative L2 error against an fp32 reference on a sample, and the
kernel names the profiler saw. The grid and the FLOP count follow the FlashAttention
papers; a row is a BenchRow. How a result is shown (table, CSV, plot) is here too.
"""
from __future__ import annotations

import csv
import io
import math
import statistics
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass, fields
from typing import Callable

import click
from rich.console import Console
from rich.table import Table

from flashtune.measure.backends import BACKENDS, DEFAULT_BACKENDS
from flashtune.measure.problem import Problem, make_inputs
from flashtune.measure.timing import (geomean, host_ms_per_call, input_sets, kernel_names, time_interleaved,
                                      without_parameters)

SAMPLE_HEADS = 2  # heads of batch entry 0 checked against the fp32 reference


# Each pass's FLOPs in forwards (FlashAttention's count: the backward's five matmuls to the forward's two)
PASS_FLOPS = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}


def with_gradients(make: Callable, pass_name: str, dout) -> Callable:
    """A backend's forward runner maker -> one that runs `pass_name` on inputs that require grad:
    "bwd" the gradients from one forward kept for every repeat, "fwd+bwd" both passes. The runner
    returns dq (what the error column compares).
    dO arrives in flash_attn's (batch, seqlen, heads, hdim) layout, as a model's output projection
    hands it back. The backends meet the inputs in a model's layout too (measure/backends.py: SDPA
    on transposed views), so SDPA flash's O and dO are already where its backward reads them."""
    import torch

    def make_pass(case):
        run = make(case)
        leaves = (case.q, case.k, case.v)
        if pass_name == "bwd":
            out = run()
            return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)[0]
        return lambda: torch.autograd.grad(run(), leaves, dout)[0]
    return make_pass


def measure_shape(shape: Problem, backends: list[str], repeats: int, warmup: int = 5,
                  seed: int = 0, pass_name: str = "fwd") -> list[BenchRow]:
    """One row per backend for this shape: same inputs for all."""
    import torch

    from flashtune.measure.backends import Inputs
    from flashtune.measure.reference import attention_reference, rel_l2

    scale = 1.0 / math.sqrt(shape.hdim)
    inputs = [make_inputs(shape, seed + i) for i in range(input_sets(shape))]
    backward = pass_name != "fwd"
    if backward:
        inputs = [tuple(t.requires_grad_() for t in qkv) for qkv in inputs]
    cases = [Inputs(q, k, v, shape.causal, scale, shape.window) for q, k, v in inputs]
    window = cases[0].window_size
    q0, k0, v0 = inputs[0]
    group = shape.heads // shape.heads_kv
    sample_h = min(SAMPLE_HEADS, shape.heads)
    sample = (q0[:1, :, :sample_h].detach(), k0[:1, :, :max(1, math.ceil(sample_h / group))].detach(),
              v0[:1, :, :max(1, math.ceil(sample_h / group))].detach())
    if backward:  # the error column is dq's: the fp32 reference's, by autograd, on the sample
        dout = torch.randn(q0.shape, dtype=q0.dtype, device=q0.device,
                           generator=torch.Generator(device=q0.device).manual_seed(seed + 1000))
        sample_q = sample[0].float().requires_grad_()
        out, _ = attention_reference(sample_q, *(t.float() for t in sample[1:]), shape.causal, scale, window)
        ref = torch.autograd.grad(out, sample_q, dout[:1, :, :sample_h].float())[0]
    else:
        ref, _ = attention_reference(*sample, shape.causal, scale, window)
    def first_call(row: BenchRow, run) -> None:  # its peak memory and its error on the sample
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = run()
        torch.cuda.synchronize()
        row.peak_mem_mb = round((torch.cuda.max_memory_allocated() - before) / 2**20, 1)
        row.rel_err = rel_l2(out[:1, :, :sample_h], ref)

    rows = [BenchRow.empty(name, shape) for name in backends]
    maker = (lambda name: with_gradients(BACKENDS[name], pass_name, dout)) if backward else BACKENDS.__getitem__
    timed = time_backends(rows, lambda name: [maker(name)(case) for case in cases], first_call, warmup, repeats)
    for row in rows:
        if row.backend in timed:
            row.ms = statistics.median(timed[row.backend][0])
            row.tflops = PASS_FLOPS[pass_name] * shape.flops / (row.ms * 1e-3) / 1e12
            row.host_ms = timed[row.backend][1]
    return rows


def time_backends(rows: list, make_runners: Callable[[str], list], first_call: Callable[[object, Callable], None],
                  warmup: int, repeats: int) -> dict[str, tuple[list[float], float | None]]:
    """The measuring both benches share, one row per backend (a BenchRow or a DecodeRow): each
    backend's runners made, its first call checked by `first_call(row, runner)` (which fills the row's
    error columns), its kernels named; then all timed in interleaved rounds. A backend that is
    unavailable or runs out of memory gets that as its row's status. Returns, per backend timed, its
    GPU times in ms and the host ms of one call (None if measuring that ran out of memory)."""
    import torch

    from flashtune.measure.backends import Unavailable

    timed = {}  # backend -> its runners, for those that ran and were checked
    for row in rows:
        try:
            runners = make_runners(row.backend)
            first_call(row, runners[0])
            row.kernel = "; ".join(without_parameters(n) for n in kernel_names(runners[0]))
            timed[row.backend] = runners
        except Unavailable as e:
            row.status = f"unavailable: {e}"
        except torch.cuda.OutOfMemoryError:
            row.status = "unavailable: out of memory"
            torch.cuda.empty_cache()
    times, failed = time_interleaved(timed, warmup, repeats, catch=(torch.cuda.OutOfMemoryError,))
    if failed:
        torch.cuda.empty_cache()
    result = {}
    for row in rows:
        if row.backend in failed:
            row.status = "unavailable: out of memory while timing"
        elif row.backend in times:
            try:
                host_ms = host_ms_per_call(timed[row.backend])
            except torch.cuda.OutOfMemoryError:  # timed, so shown; the host column stays empty
                host_ms = None
                torch.cuda.empty_cache()
            result[row.backend] = (times[row.backend], host_ms)
    return result


@dataclass
class BenchRow:
    """One backend on one problem: the problem, what was measured, and `status` (ok, or why the
    backend is unavailable); `host_ms` is the host side of one call, which `ms` leaves out."""
    backend: str
    dtype: str
    hdim: int
    causal: bool
    seqlen_q: int
    seqlen_k: int
    batch: int
    heads: int
    heads_kv: int
    window: int = 0  # --window: the causal window's keys (0: none); TFLOPS count the pairs inside it
    hdim_v: int = 0  # --hdim-v: V's head dim where it differs from hdim (0: the same)
    ms: float | None = None
    tflops: float | None = None
    peak_mem_mb: float | None = None
    rel_err: float | None = None
    kernel: str | None = None
    status: str = "ok"
    host_ms: float | None = None

    @classmethod
    def empty(cls, backend: str, problem: Problem) -> BenchRow:
        return cls(backend, problem.dtype, problem.hdim, problem.causal, problem.seqlen_q, problem.seqlen_k,
                   problem.batch, problem.heads, problem.heads_kv, problem.window, problem.hdim_v)

    @property
    def shape_key(self) -> tuple:
        """What identifies the row's problem (everything but the backend and the measurements)."""
        return (self.dtype, self.hdim, self.causal, self.seqlen_q, self.seqlen_k, self.batch, self.heads,
                self.heads_kv, self.window, self.hdim_v)


ROW_KEYS = tuple(f.name for f in fields(BenchRow))  # the JSON and CSV columns


@dataclass
class BenchResult:
    header: dict  # what ran, where: environment()
    rows: list[BenchRow]

    @property
    def speedup_geomean(self) -> dict[str, float | None]:
        return speedups(self.rows)

    def to_json(self) -> dict:
        return {"header": self.header, "rows": [asdict(r) for r in self.rows], "speedup_geomean": self.speedup_geomean}


def speedups(rows: list[BenchRow], ours: str = "flashtune") -> dict[str, float | None]:
    """Geomean over shapes of (backend ms / flashtune ms): > 1 means flashtune is faster."""
    by_shape: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if r.ms:
            by_shape.setdefault(r.shape_key, {})[r.backend] = r.ms
    others = sorted({r.backend for r in rows} - {ours})
    return {b: geomean(t[b] / t[ours] for t in by_shape.values() if b in t and ours in t) for b in others}


def checked_backends(names: list[str] | None, known, default, where: str = "") -> list[str]:
    """--backends of one bench mode, checked against that mode's backends (`where`: " with --model")."""
    names = names or list(default)
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)}; known{where}: {', '.join(known)}", param_hint="--backends")
    return names


def backend_names(text: list[str] | None) -> list[str]:
    """--backends, checked: the known ones (absent ones show as unavailable); default all but FP8."""
    return checked_backends(text, BACKENDS, DEFAULT_BACKENDS)


def environment() -> dict:
    """The header of every result: what ran, where."""
    import platform

    import torch

    from flashtune import __version__
    from flashtune.kernels.gpu import nvidia_smi_driver_version

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "gpu": props.name, "compute_capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count,
        "driver": nvidia_smi_driver_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "flashtune": __version__, "python": platform.python_version(),
        "command": " ".join(["flashtune", *sys.argv[1:]]),
    }


def run_bench(shapes: list[Problem], backends: list[str], repeats: int,
              on_shape: Callable[[Problem, list[BenchRow]], None] | None = None,
              checkpoint: Callable[[BenchResult], None] | None = None, pass_name: str = "fwd") -> BenchResult:
    """Every shape's rows for one pass (fwd, bwd, fwd+bwd); `checkpoint` gets the result so far after
    each shape (bench --out writes it, so an interrupted run keeps what it measured)."""
    result = BenchResult({**environment(), "pass": pass_name}, [])
    for shape in shapes:
        shape_rows = measure_shape(shape, backends, repeats, pass_name=pass_name)
        result.rows += shape_rows
        if on_shape:
            on_shape(shape, shape_rows)
        if checkpoint:
            checkpoint(result)
    return result


# ---------------------------------------------------------------------------- how it is shown

def shape_table(rows: list[BenchRow], ours: str = "flashtune") -> Table:
    """One line per (shape, backend), with flashtune's speed-up over that backend."""
    table = Table(show_lines=False)
    several_dtypes = len({r.dtype for r in rows}) > 1
    for col in ("dtype",) * several_dtypes + ("hdim", "causal", "seqlen", "b x h", "backend", "ms", "host ms",
                                              "TFLOPS", "peak MB", "rel err", "flashtune x", "kernel / status"):
        table.add_column(col, justify="left" if col in ("dtype", "backend", "kernel / status") else "right",
                         overflow="fold")
    ours_ms = {r.shape_key: r.ms for r in rows if r.backend == ours and r.ms}
    for r in rows:
        mine = ours_ms.get(r.shape_key)
        ratio = f"{r.ms / mine:.2f}" if (r.ms and mine and r.backend != ours) else ""
        table.add_row(
            *(r.dtype,) * several_dtypes, f"{r.hdim}/{r.hdim_v}" if r.hdim_v else str(r.hdim),
            f"window {r.window}" if r.window else "yes" if r.causal else "no",
            str(r.seqlen_q) if r.seqlen_q == r.seqlen_k else f"{r.seqlen_q}/{r.seqlen_k}",
            f"{r.batch}x{r.heads}" + (f"/{r.heads_kv}" if r.heads_kv != r.heads else ""),
            r.backend,
            f"{r.ms:.3f}" if r.ms else "-",
            f"{r.host_ms:.3f}" if r.host_ms is not None else "-",
            f"{r.tflops:.0f}" if r.tflops else "-",
            f"{r.peak_mem_mb:.0f}" if r.peak_mem_mb is not None else "-",
            f"{r.rel_err:.1e}" if r.rel_err is not None else "-",
            ratio,
            (r.kernel or "")[:70] if r.status == "ok" else f"[yellow]{r.status}[/]")
    return table


def render(result: BenchResult, console: Console) -> None:
    if result.header.get("pass", "fwd") != "fwd":
        console.print(f"pass: {result.header['pass']} (TFLOPS count the backward as 2.5 forwards; rel err: dq's)")
    console.print(shape_table(result.rows))
    h = result.header
    console.print(f"{h['gpu']} (cc {h['compute_capability']}), driver {h['driver']}, torch {h['torch']}, "
                  f"CUDA {h['cuda']}, cuDNN {h['cudnn']}")
    parts = [f"{b}: {g:.2f}x" for b, g in result.speedup_geomean.items() if g]
    if parts:
        console.print("flashtune speed-up, geomean over shapes (backend ms / flashtune ms): " + ", ".join(parts))


def to_csv(rows: list) -> str:
    """Rows of one dataclass (BenchRow, DecodeRow) as CSV, a column per field."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[f.name for f in fields(rows[0])] if rows else list(ROW_KEYS))
    writer.writeheader()
    writer.writerows(asdict(r) for r in rows)
    return buf.getvalue()


def pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ValueError("--plot needs matplotlib: pip install 'flashtune[plot]'") from e
    return plt


def plot(result: BenchResult, path: str) -> None:
    """TFLOPS against seqlen per backend, one panel per (hdim, causal). Needs the `plot` extra."""
    plt = pyplot()
    panels: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in result.rows:
        if r.tflops:
            panels[(r.dtype, r.hdim, r.causal, r.window, r.hdim_v)][r.backend].append((r.seqlen_q, r.tflops))
    keys = sorted(panels)
    if not keys:
        raise ValueError("nothing to plot: no backend produced a timing")
    cols = 2
    rows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.6 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        for backend, points in sorted(panels[key].items()):
            points.sort()
            style = dict(linewidth=2.5, marker="o") if backend == "flashtune" else dict(marker=".")
            ax.plot([p[0] for p in points], [p[1] for p in points], label=backend, **style)
        ax.set_xscale("log", base=2)
        mask = f"causal, window {key[3]}" if key[3] else "causal" if key[2] else "non-causal"
        ax.set_title(f"{key[0]}, hdim {key[1]}" + (f"/{key[4]}" if key[4] else "") + f", {mask}")
        ax.set_xlabel("seqlen")
        ax.set_ylabel("TFLOPS")
        ax.grid(alpha=0.3)
    h = result.header
    finish_figure(fig, axes, len(keys), f"flashtune bench on {h['gpu']} ({h['torch']}, CUDA {h['cuda']})", path)


def finish_figure(fig, axes, used: int, title: str, path: str, columns: int = 8) -> None:
    """The unused panels off, one legend for the figure below the panels (so no curve is hidden
    behind it), the title, saved; a PNG with a 64-colour palette (a quarter of the bytes, the same
    picture: a plot's lines use a dozen colours and their antialiasing)."""
    for ax in list(axes.flat)[used:]:
        ax.axis("off")
    handles: dict = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(columns, len(handles)), fontsize=8)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    if path.lower().endswith(".png"):
        from PIL import Image  # matplotlib's own dependency

        with Image.open(path) as image:
            palette = image.convert("RGB").quantize(colors=64)
        palette.save(path, optimize=True)
