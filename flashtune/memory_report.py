"""How `flashtune memory` is shown to people."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


def render(rep: dict, console: Console) -> None:
    m, acc = rep["model"], rep["accounts"]
    console.print(f"[bold]{m['name']}[/]: {rep['params'] / 1e9:.2f} B parameters, {m['layers']} layers, "
                  f"{m['heads']} heads / {m['kv_heads']} KV heads x {m['head_dim']}; batch {rep['batch']}, "
                  f"seqlen {rep['seqlen']}, {rep['dtype']} (KV cache {rep['kv_dtype']})")
    table = Table(title="memory accounts")
    for col in ("account", "grows with", "size", "with a flash kernel"):
        table.add_column(col, justify="right" if col in ("size", "with a flash kernel") else "left")
    table.add_row("weights", "fixed", _gib(acc["weights"]), _gib(acc["weights"]))
    table.add_row("KV cache", "batch x seqlen (linear)", _gib(acc["kv_cache"]), _gib(acc["kv_cache"]))
    table.add_row("attention scores (one layer)", "batch x heads x seqlen^2 (quadratic)",
                  _gib(acc["score_matrix"]), _gib(0))
    table.add_row("activations (one layer, estimate)", "batch x seqlen", _gib(acc["activations"]),
                  _gib(acc["activations"]))
    table.add_row("[bold]total[/]", "", f"[bold]{_gib(rep['total_without_flash'])}[/]",
                  f"[bold]{_gib(rep['total_with_flash'])}[/]")
    console.print(table)
    if rep["gpu_bytes"]:
        console.print(f"GPU memory: {_gib(rep['gpu_bytes'])}")
    for line in rep.get("assumed", []):
        console.print(f"[dim]assumed: {line}[/]")
    for line in rep["verdict"]:
        console.print(f"[bold]verdict:[/] {line}")
    for line in rep["advice"]:
        console.print(f"  - {line}")
