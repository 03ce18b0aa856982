"""Small formatting helpers shared by the command reports."""
from __future__ import annotations


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
