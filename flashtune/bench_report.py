"""How a `flashtune bench` result is shown: rich table, CSV, and the TFLOPS plot."""
from __future__ import annotations

import csv
import io
from collections import defaultdict

from rich.console import Console
from rich.table import Table

from flashtune.bench import ROW_KEYS, shape_key



def shape_table(rows: list[dict], ours: str = "flashtune") -> Table:
    """One line per (shape, backend), with flashtune's speed-up over that backend."""
    table = Table(show_lines=False)
    for col in ("hdim", "causal", "seqlen", "b x h", "backend", "ms", "host ms", "TFLOPS", "peak MB",
                "rel err", "flashtune x", "kernel / status"):
        table.add_column(col, justify="left" if col in ("backend", "kernel / status") else "right",
                         overflow="fold")
    ours_ms = {shape_key(r): r["ms"] for r in rows if r["backend"] == ours and r["ms"]}
    for r in rows:
        mine = ours_ms.get(shape_key(r))
        ratio = f"{r['ms'] / mine:.2f}" if (r["ms"] and mine and r["backend"] != ours) else ""
        table.add_row(
            str(r["hdim"]), "yes" if r["causal"] else "no",
            str(r["seqlen_q"]) if r["seqlen_q"] == r["seqlen_k"] else f"{r['seqlen_q']}/{r['seqlen_k']}",
            f"{r['batch']}x{r['heads']}" + (f"/{r['heads_kv']}" if r["heads_kv"] != r["heads"] else ""),
            r["backend"],
            f"{r['ms']:.3f}" if r["ms"] else "-",
            f"{r['host_ms']:.3f}" if r["host_ms"] is not None else "-",
            f"{r['tflops']:.0f}" if r["tflops"] else "-",
            f"{r['peak_mem_mb']:.0f}" if r["peak_mem_mb"] is not None else "-",
            f"{r['rel_err']:.1e}" if r["rel_err"] is not None else "-",
            ratio,
            (r["kernel"] or "")[:70] if r["status"] == "ok" else f"[yellow]{r['status']}[/]")
    return table


def render(result: dict, console: Console) -> None:
    console.print(shape_table(result["rows"]))
    h = result["header"]
    console.print(f"{h['gpu']} (cc {h['compute_capability']}), driver {h['driver']}, torch {h['torch']}, "
                  f"CUDA {h['cuda']}, cuDNN {h['cudnn']}")
    parts = [f"{b}: {g:.2f}x" for b, g in result["speedup_geomean"].items() if g]
    if parts:
        console.print("flashtune speed-up, geomean over shapes (backend ms / flashtune ms): " + ", ".join(parts))


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=ROW_KEYS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ValueError("--plot needs matplotlib: pip install 'flashtune[plot]'") from e
    return plt


def plot_model(result: dict, path: str) -> None:
    """`bench --model`: TTFT, decode tokens/s and peak memory against prefill length per backend."""
    plt = _pyplot()
    panels = (("ttft_ms", "time to first token (ms)"), ("decode_tok_s", "decode tokens/s"),
              ("peak_mem_mb", "prefill peak memory (MB)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    backends = list(dict.fromkeys(r["backend"] for r in result["rows"]))
    for ax, (key, label) in zip(axes.flat, panels):
        for backend in backends:
            points = sorted((r["prefill"], r[key]) for r in result["rows"]
                            if r["backend"] == backend and r.get(key) is not None)
            style = dict(linewidth=2.5, marker="o") if backend == "flashtune" else dict(marker=".")
            ax.plot([p[0] for p in points], [p[1] for p in points], label=backend, **style)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prefill length")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"flashtune bench --model {result['model']} ({result['layers']} layers, {result['dtype']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot(result: dict, path: str) -> None:
    """TFLOPS against seqlen per backend, one panel per (hdim, causal). Needs the `plot` extra."""
    plt = _pyplot()
    panels: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in result["rows"]:
        if r["tflops"]:
            panels[(r["hdim"], r["causal"])][r["backend"]].append((r["seqlen_q"], r["tflops"]))
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
        ax.set_title(f"hdim {key[0]}, {'causal' if key[1] else 'non-causal'}")
        ax.set_xlabel("seqlen")
        ax.set_ylabel("TFLOPS")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    # One legend for the figure, below the panels, so no curve is hidden behind it.
    handles: dict = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=len(handles), fontsize=9)
    h = result["header"]
    fig.suptitle(f"flashtune bench on {h['gpu']} ({h['torch']}, CUDA {h['cuda']})")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)


def render_model(result: dict, console: Console) -> None:
    """`bench --model`: one line per (prefill length, backend)."""
    table = Table(title=f"flashtune bench --model {result['model']} ({result['layers']} layers, {result['dtype']}, "
                        f"{result['decode_steps']} decode steps)")
    for col in ("prefill", "backend", "TTFT ms", "decode tok/s", "peak MB", "predicted MB", "attention share", "vs",
                "max |dlogit|", "top-1 agree", "greedy same", "status"):
        table.add_column(col, justify="left" if col in ("backend", "vs", "status") else "right", overflow="fold")

    def num(row, key, fmt):
        return format(row[key], fmt) if row.get(key) is not None else "-"

    for r in result["rows"]:
        greedy = r.get("greedy_identical")
        table.add_row(str(r["prefill"]), r["backend"], num(r, "ttft_ms", ".1f"), num(r, "decode_tok_s", ".0f"),
                      num(r, "peak_mem_mb", ".0f"), num(r, "predicted_peak_mb", ".0f"),
                      num(r, "attention_share", ".0%"), r.get("vs", "-"),
                      num(r, "max_abs_logit_diff", ".3g"), num(r, "top1_agreement", ".1%"),
                      f"{sum(greedy)}/{len(greedy)}" if greedy else "-",
                      r["status"] if r["status"] == "ok" else f"[yellow]{r['status']}[/]")
    console.print(table)
