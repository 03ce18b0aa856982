"""A long command's progress where rich draws no bar (a log, a pipe): plain lines, at most every
PLAIN_PROGRESS_SECONDS and when it ends, so that a build or verify in a log is not silent for
minutes; none with --json (no console)."""
import io

from rich.console import Console

from flashtune.commands import common


def log_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=200), out


def test_a_log_gets_the_last_step_and_one_line_every_so_often(monkeypatch):
    console, out = log_console()
    with common.progress_bar("building", console, 3) as bar:
        for name in ("a", "b", "c"):
            bar.advance(name)
    assert out.getvalue().split("\n")[0] == "building 3/3 c"  # quick steps: the last alone
    monkeypatch.setattr(common, "PLAIN_PROGRESS_SECONDS", 0.0)
    console, out = log_console()
    with common.progress_bar("verify", console, 2) as bar:
        bar.advance("case one")
        bar.update(2, 2, "case two")
    assert [line for line in out.getvalue().split("\n") if line] == ["verify 1/2 case one", "verify 2/2 case two"]


def test_no_console_no_lines(capsys):
    with common.progress_bar("building", None, 2) as bar:
        bar.advance("a")
        bar.advance("b")
    assert capsys.readouterr().out == ""
