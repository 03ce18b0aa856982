"""How `flashtune verify` results are shown to people."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table


def _status(ok) -> str:
    return "[green]pass[/]" if ok else ("[yellow]skip[/]" if ok is None else "[red]FAIL[/]")


def render(report: dict, console: Console) -> None:
    table = Table(title=f"flashtune verify: profile {report['profile']} ({report['family']} family, "
                        f"{report['arch']})")
    for col in ("check", "case", "kernel", "result", "detail"):
        table.add_column(col, overflow="fold")
    for r in report["rows"]:
        table.add_row(r["check"], r.get("case", ""), r["kernel"], _status(r["ok"]), r["detail"])
    console.print(table)
    counts = {c: sum(r["check"] == c for r in report["rows"]) for c in ("correctness", "identity", "sass")}
    verdict = "[green]all checks passed[/]" if report["ok"] else f"[red]{report['failed']} checks failed[/]"
    console.print(f"{verdict} ({counts['correctness']} correctness, {counts['identity']} kernel identity, "
                  f"{counts['sass']} SASS)")


def render_sdpa(report: dict, console: Console) -> None:
    s = report["shape"]
    table = Table(title=f"PyTorch SDPA for {s['dtype']} b{s['batch']} h{s['heads']} s{s['seqlen']} "
                        f"d{s['hdim']} {'causal' if s['causal'] else 'non-causal'}")
    table.add_column("backend")
    table.add_column("usable")
    table.add_column("why not", overflow="fold")
    for r in report["backends"]:
        table.add_row(r["backend"], "yes" if r["usable"] else "[red]no[/]", r["why"])
    console.print(table)
    console.print(f"SDPA's own choice: [bold]{report['picked']}[/] (kernels: {'; '.join(report['default_kernels'])})")
