"""`flashtune bench --train`: the backward where a user meets it, in training.

A small Llama-style model (the recall model's first architecture: GQA 8:2, head dim 64) is trained from
one seed on associative recall with each backend's attention in forward and backward (the same
initial weights and the same batches for every backend), in bf16 autocast: a curriculum of prompts
of 1k and then 4k tokens. The first backend trains twice, so the difference between two runs of
the same attention (its backward's atomics make runs differ) is measured beside the difference
between backends. Per run: the final loss (the mean over the last tenth of the steps), its relative
difference from the first backend's first run, milliseconds per step, tokens per second, peak
memory, the loss curve. The bar (issue 37): flashtune's final loss within 1% of SDPA's.

Before the runs, one step of each prompt length per backend builds and warms its kernels, so no
run's time includes a compile.
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import torch
from rich.console import Console
from rich.table import Table

from flashtune.commands.bench import checked_backends, environment, pyplot
from flashtune.commands.bench_model import MODEL_BACKENDS
from flashtune.measure import recall_model

TRAIN_BACKENDS = {name: MODEL_BACKENDS[name] for name in ("sdpa", "flashtune", "sdpa-flash", "sdpa-cudnn",
                                                          "sdpa-efficient", "sdpa-math", "eager")}
DEFAULT_TRAIN_BACKENDS = ("sdpa", "flashtune")
DEFAULT_STEPS = 300
FINAL_LOSS_BAR = 0.01  # flashtune's final loss within 1% of the first backend's


# The training rows' model: the recall model as it stood when they were first measured (heads of 64,
# GQA 8:2, 512 keys, learning rate 3e-3; benchmarks/h100/2026-12-06m_train.json), so later runs compare.
TRAIN_MODEL = replace(recall_model.Recipe(), task=recall_model.RecallTask(keys=512, values=512), heads=8,
                      head_dim=64, lr=3e-3)


def recipe_for(steps: int) -> recall_model.Recipe:
    """The training rows' recipe with `steps` steps: two thirds at 1k tokens (batch 16), a third at 4k (batch 4)."""
    short = max(1, round(steps * 2 / 3))
    return replace(TRAIN_MODEL, stages=(recall_model.Stage(1024, 16, short),
                                                  recall_model.Stage(4096, 4, max(1, steps - short))),
                   warmup=min(100, max(1, steps // 10)))


@dataclass
class TrainRow:
    backend: str
    run: int  # 1, or 2 for the first backend's second run
    status: str = "ok"
    steps: int = 0
    ms_per_step: float | None = None
    tokens_per_s: float | None = None
    peak_mem_mb: float | None = None
    final_loss: float | None = None
    vs: str | None = None  # the run compared with
    final_loss_rel_diff: float | None = None  # |final loss - vs's| / vs's
    loss_curve: list[list] = field(default_factory=list)


@dataclass
class TrainBenchResult:
    header: dict | None
    recipe: dict
    rows: list[TrainRow] = field(default_factory=list)
    bar: float = FINAL_LOSS_BAR

    @property
    def noise(self) -> float | None:
        """The first backend's two runs apart: the run-to-run difference of one attention."""
        second = [r for r in self.rows if r.run == 2 and r.final_loss_rel_diff is not None]
        return second[0].final_loss_rel_diff if second else None

    def to_json(self) -> dict:
        return {**asdict(self), "noise": self.noise}


def backend_names(names: list[str] | None) -> list[str]:
    return checked_backends(names, TRAIN_BACKENDS, DEFAULT_TRAIN_BACKENDS, " with --train")


def _context(sdpa_backend: str | None):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return (lambda: sdpa_kernel([getattr(SDPBackend, sdpa_backend)])) if sdpa_backend else nullcontext


def _warm_up(recipe: recall_model.Recipe, impl: str, context, device: str) -> None:
    """One step of each prompt length: kernels built and loaded before any run is timed."""
    warm = replace(recipe, stages=tuple(replace(s, steps=1) for s in recipe.stages), warmup=1)
    recall_model.train(warm, device, attn_implementation=impl, context=context)


def run_train_bench(backends: list[str], steps: int = DEFAULT_STEPS, device: str = "cuda",
                    checkpoint: Callable[[TrainBenchResult], None] | None = None,
                    progress: Callable[[str], None] | None = None,
                    recipe: recall_model.Recipe | None = None) -> TrainBenchResult:
    """Train the recipe (recipe_for(steps) unless given) once per backend, the first backend twice;
    a backend that fails keeps its row with the reason as its status, and the run goes on."""
    from flashtune import hf  # noqa: F401  (registers the "ftune" attention)

    recipe = recipe or recipe_for(steps)
    cuda = device.startswith("cuda")
    result = TrainBenchResult(environment() if cuda else None, asdict(recipe))
    runs = [(backends[0], 1), (backends[0], 2)] + [(name, 1) for name in backends[1:]]
    tokens = sum(s.length * s.batch * s.steps for s in recipe.stages)
    for name in dict.fromkeys(backends):
        impl, sdpa_backend = TRAIN_BACKENDS[name]
        try:
            _warm_up(recipe, impl, _context(sdpa_backend), device)
        except (RuntimeError, ValueError) as e:
            if progress:
                progress(f"{name}: warm-up failed: {str(e).splitlines()[0][:160]}")
    first = None
    for name, run in runs:
        impl, sdpa_backend = TRAIN_BACKENDS[name]
        row = TrainRow(name, run, steps=sum(s.steps for s in recipe.stages))
        report = (lambda step, total, loss, name=name, run=run:
                  progress(f"{name} run {run}: step {step}/{total}, loss {loss:.3f}")) if progress else None
        try:
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            model, record = recall_model.train(recipe, device, report, attn_implementation=impl,
                                               context=_context(sdpa_backend))
            del model
            if cuda:
                row.peak_mem_mb = round(torch.cuda.max_memory_allocated() / 2**20, 1)
            row.ms_per_step = round(1e3 * record.seconds / row.steps, 2)
            row.tokens_per_s = round(tokens / record.seconds) if record.seconds else None
            row.final_loss, row.loss_curve = record.final_loss, record.loss_curve
            if first is None:
                first = row
            elif first.final_loss and row.final_loss is not None and math.isfinite(row.final_loss):
                row.vs = f"{first.backend} run 1"
                row.final_loss_rel_diff = round(abs(row.final_loss - first.final_loss) / first.final_loss, 5)
            elif row.final_loss is None or not math.isfinite(row.final_loss):
                row.status = "the loss is not finite"
        except (RuntimeError, ValueError) as e:  # out of memory, an unsupported shape: the row says so
            row.status = str(e).splitlines()[0][:200]
        result.rows.append(row)
        if checkpoint:
            checkpoint(result)
    return result


def plot(result: TrainBenchResult, path: str) -> None:
    """`bench --train`: each run's loss curve."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in result.rows:
        if r.loss_curve:
            style = dict(linewidth=2.5) if r.backend == "flashtune" else dict(linewidth=1, alpha=0.8)
            ax.plot([p[0] for p in r.loss_curve], [p[1] for p in r.loss_curve],
                    label=f"{r.backend} (run {r.run})", **style)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("flashtune bench --train: recall model, same seed and batches")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def render(result: TrainBenchResult, console: Console) -> None:
    noise = result.noise
    title = (f"flashtune bench --train ({result.rows[0].steps if result.rows else 0} steps; final loss: mean of "
             f"the last tenth; bar: within {result.bar:.0%} of the first backend"
             + (f"; its own two runs differ by {noise:.2%})" if noise is not None else ")"))
    table = Table(title=title)
    for heading in ("backend", "run", "final loss", "vs", "rel diff", "ms/step", "tokens/s", "peak MB", "status"):
        table.add_column(heading, justify="left" if heading in ("backend", "vs", "status") else "right",
                         overflow="fold")

    def num(value, fmt):
        return format(value, fmt) if value is not None else "-"

    for r in result.rows:
        diff = num(r.final_loss_rel_diff, ".2%")
        if r.final_loss_rel_diff is not None and r.final_loss_rel_diff > result.bar:
            diff = f"[red]{diff}[/]"
        table.add_row(r.backend, str(r.run), num(r.final_loss, ".4f"), r.vs or "-", diff, num(r.ms_per_step, ".1f"),
                      num(r.tokens_per_s, ",.0f"), num(r.peak_mem_mb, ".0f"),
                      r.status if r.status == "ok" else f"[yellow]{r.status}[/]")
    console.print(table)
