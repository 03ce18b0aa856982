"""`flashtune bench --decode`: decode steps (1 or 4 query tokens against a KV cache, contiguous
or paged) side by side in one process, as bench does prefill. A decode step is bound by reading
the cache, so a row reports microseconds, GB/s of K/V read and that as a fraction of a
device-to-device copy measured in the same run (the card's practical memory bandwidth), beside
the host time of a call, the error against fp32 and the kernels that ran; a row is a DecodeRow.
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Callable

from rich.console import Console
from rich.table import Table

from flashtune.commands.bench import checked_backends, environment, finish_figure, pyplot, time_backends
from flashtune.measure.decode_backends import DECODE_BACKENDS
from flashtune.measure.decode_problem import DecodeProblem, contiguous_kv, make_decode_inputs
from flashtune.measure.timing import L2_FLUSH_BYTES, geomean, time_ms

DEFAULT_DECODE_BACKENDS = tuple(name for name in DECODE_BACKENDS if name != "flashtune-fp8kv")
MAX_INPUT_SETS = 64  # small caches: enough sets that no timed call finds its cache in L2
COPY_BYTES = 2**30


@dataclass
class DecodeRow:
    backend: str
    dtype: str
    hdim: int
    heads: int
    heads_kv: int
    batch: int
    cache: int
    seqlen_q: int
    page_size: int
    kv_bytes: int
    us: float | None = None
    gbps: float | None = None
    copy_fraction: float | None = None  # gbps / the run's device-to-device copy GB/s
    host_us: float | None = None
    rel_err: float | None = None
    kernel: str | None = None
    splits: int | None = None  # flashtune's rows: the split count its call ran with ...
    merge: str | None = None   # ... and how the splits merged (none, cluster, combine kernel)
    status: str = "ok"

    @classmethod
    def empty(cls, backend: str, p: DecodeProblem) -> DecodeRow:
        return cls(backend, p.dtype, p.hdim, p.heads, p.heads_kv, p.batch, p.cache, p.seqlen_q, p.page_size,
                   p.kv_bytes)

    @property
    def problem_key(self) -> tuple:
        return (self.dtype, self.hdim, self.heads, self.heads_kv, self.batch, self.cache, self.seqlen_q,
                self.page_size)


@dataclass
class DecodeBenchResult:
    header: dict
    copy_gbps: float
    rows: list[DecodeRow]

    @property
    def speedup_geomean(self) -> dict[str, float | None]:
        """Geomean over problems of (backend us / flashtune us), and "fastest other": each problem's
        fastest backend other than flashtune."""
        by_problem: dict[tuple, dict[str, float]] = defaultdict(dict)
        for r in self.rows:
            if r.us:
                by_problem[r.problem_key][r.backend] = r.us
        others = sorted({r.backend for r in self.rows} - {"flashtune"})
        result = {b: geomean(t[b] / t["flashtune"] for t in by_problem.values() if b in t and "flashtune" in t)
                  for b in others}
        result["fastest other"] = geomean(
            min(us for b, us in t.items() if b != "flashtune") / t["flashtune"]
            for t in by_problem.values() if "flashtune" in t and len(t) > 1)
        return result

    def to_json(self) -> dict:
        return {"header": self.header, "copy_GBps": self.copy_gbps, "rows": [asdict(r) for r in self.rows],
                "speedup_geomean": self.speedup_geomean}


def backend_names(text: list[str] | None) -> list[str]:
    return checked_backends(text, DECODE_BACKENDS, DEFAULT_DECODE_BACKENDS, " with --decode")


def copy_gbps() -> float:
    """A device-to-device copy's bandwidth (bytes read + written per second), median of 20."""
    import torch

    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = statistics.median(time_ms([lambda: dst.copy_(src)], 3, 20))
    return 2 * COPY_BYTES / (ms * 1e-3) / 1e9


def measure_problem(p: DecodeProblem, backends: list[str], repeats: int, copy: float, seed: int = 0,
                    warmup: int = 5) -> list[DecodeRow]:
    from flashtune.measure.reference import attention_reference, rel_l2
    from flashtune.runtime import decode

    scale = 1.0 / math.sqrt(p.hdim)
    sets = max(1, min(MAX_INPUT_SETS, math.ceil(L2_FLUSH_BYTES / p.kv_bytes)))
    inputs = [make_decode_inputs(p, seed + i) for i in range(sets)]
    ratio = p.heads // p.heads_kv
    k0, v0 = contiguous_kv(inputs[0], 1)  # the sample: batch entry 0, the heads of its first KV head
    ref, _ = attention_reference(inputs[0]["q"][:1, :, :ratio], k0[:1, :, :1], v0[:1, :, :1], p.causal, scale)
    del k0, v0
    def first_call(row: DecodeRow, run) -> None:  # its error on the sample; flashtune's split count
        decode.last_launch = None
        row.rel_err = rel_l2(run()[:1, :, :ratio], ref)
        if row.backend.startswith("flashtune") and decode.last_launch is not None:
            row.splits, row.merge = decode.last_launch.splits, decode.last_launch.merge

    rows = [DecodeRow.empty(name, p) for name in backends]
    timed = time_backends(rows, lambda name: [DECODE_BACKENDS[name](x, p.causal, scale) for x in inputs], first_call,
                          warmup, repeats)
    for row in rows:
        if row.backend in timed:
            times, host_ms = timed[row.backend]
            ms = statistics.median(times)
            row.us = ms * 1e3
            row.gbps = p.kv_bytes / (ms * 1e-3) / 1e9
            row.copy_fraction = row.gbps / copy
            row.host_us = None if host_ms is None else host_ms * 1e3
    return rows


def run_decode_bench(problems: list[DecodeProblem], backends: list[str], repeats: int,
                     on_problem: Callable[[DecodeProblem], None] | None = None,
                     checkpoint: Callable[[DecodeBenchResult], None] | None = None) -> DecodeBenchResult:
    """Every problem's rows; `checkpoint` gets the result so far after each problem. flashtune's
    block tables are trusted, as an engine (or a CUDA graph) calls it: the check of index values
    a caller passes is a device sync per call, which would time the host instead of the kernels
    (the header says so)."""
    import torch

    from flashtune.runtime import checks

    header = {**environment(), "index_check": "off: block tables trusted, as an engine or a CUDA graph calls it"}
    result = DecodeBenchResult(header, copy_gbps(), [])
    trusted, checks.TRUST_CU_SEQLENS = checks.TRUST_CU_SEQLENS, True
    try:
        for p in problems:
            result.rows += measure_problem(p, backends, repeats, result.copy_gbps)
            torch.cuda.empty_cache()  # this problem's caches (and SDPA's copies of them) are gone now
            if on_problem:
                on_problem(p)
            if checkpoint:
                checkpoint(result)
    finally:
        checks.TRUST_CU_SEQLENS = trusted
    return result


# ---------------------------------------------------------------------------- how it is shown

def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _splits(r: DecodeRow) -> str:
    if r.splits is None:
        return ""
    return str(r.splits) + {"cluster": " (cluster)", "combine kernel": " (combine)"}.get(r.merge, "")


def render(result: DecodeBenchResult, console: Console) -> None:
    table = Table()
    for col in ("hdim", "heads", "batch x cache", "q", "pages", "backend", "us", "GB/s", "% copy", "host us",
                "rel err", "flashtune x", "splits", "kernel / status"):
        table.add_column(col, justify="left" if col in ("backend", "kernel / status") else "right", overflow="fold")
    ours = {r.problem_key: r.us for r in result.rows if r.backend == "flashtune" and r.us}
    for r in result.rows:
        mine = ours.get(r.problem_key)
        table.add_row(
            str(r.hdim), f"{r.heads}/{r.heads_kv}", f"{r.batch} x {_tokens(r.cache)}", str(r.seqlen_q),
            str(r.page_size) if r.page_size else "-", r.backend,
            f"{r.us:.1f}" if r.us else "-", f"{r.gbps:.0f}" if r.gbps else "-",
            f"{r.copy_fraction:.0%}" if r.copy_fraction else "-",
            f"{r.host_us:.0f}" if r.host_us is not None else "-",
            f"{r.rel_err:.1e}" if r.rel_err is not None else "-",
            f"{r.us / mine:.2f}" if (r.us and mine and r.backend != "flashtune") else "",
            _splits(r), (r.kernel or "")[:70] if r.status == "ok" else f"[yellow]{r.status}[/]")
    console.print(table)
    h = result.header
    console.print(f"{h['gpu']} (cc {h['compute_capability']}), torch {h['torch']}, CUDA {h['cuda']}, cuDNN "
                  f"{h['cudnn']}; device-to-device copy {result.copy_gbps:.0f} GB/s")
    parts = [f"{b}: {g:.2f}x" for b, g in result.speedup_geomean.items() if g]
    if parts:
        console.print("flashtune speed-up, geomean over problems (backend us / flashtune us): " + ", ".join(parts))


def plot(result: DecodeBenchResult, path: str) -> None:
    """GB/s against the K/V bytes read, one panel per (hdim, KV heads, query tokens), one line per
    backend (and per page size for flashtune's paged rows); the copy bandwidth as a dashed line."""
    plt = pyplot()
    panels: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in result.rows:
        if r.gbps:
            label = r.backend + (f" pages {r.page_size}" if r.page_size else "")
            panels[(r.dtype, r.hdim, r.heads, r.heads_kv, r.seqlen_q)][label].append((r.kv_bytes / 1e9, r.gbps))
    keys = sorted(panels)
    if not keys:
        raise ValueError("nothing to plot: no backend produced a timing")
    cols = min(3, len(keys))
    nrows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 3.6 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        for label, points in sorted(panels[key].items()):
            points.sort()
            style = dict(linewidth=2.5, marker="o") if label == "flashtune" else dict(marker=".")
            ax.plot([x for x, _ in points], [y for _, y in points], label=label, **style)
        ax.axhline(result.copy_gbps, linestyle="--", color="gray", linewidth=1)
        ax.set_xscale("log")
        ax.set_title(f"{key[0]}, hdim {key[1]}, {key[2]}/{key[3]} heads, {key[4]} query token(s)", fontsize=9)
        ax.set_xlabel("K/V read per call (GB)")
        ax.set_ylabel("GB/s")
        ax.grid(alpha=0.3)
    finish_figure(fig, axes, len(keys), f"flashtune bench --decode on {result.header['gpu']} (dashed: "
                  "device-to-device copy)", path, columns=6)
