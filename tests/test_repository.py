"""The repository's own rules (issue 32): the docs cite files that exist and nothing outside the
repository, `benchmarks/` holds only cited results, the package never imports the lab, and a test
file's name says whether it needs a GPU."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[1]
DOCS = [ROOT / "README.md", ROOT / "lab" / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "benchmarks").rglob("README.md"))]
# A path in backticks that starts at one of the repository's folders, up to a space or backtick.
CITED_PATH = re.compile(r"`((?:benchmarks|lab|tools|docs|flashtune|csrc|profiles|tests)/[^`\s]*)")


def _cited_paths(text: str):
    """(path, commit): each path the text cites, with the commit it is cited at (None: today's tree)."""
    for match in CITED_PATH.finditer(text):
        path = match.group(1).split("::")[0].rstrip(".,:;)")
        if any(c in path for c in "<*{"):
            continue  # a family of files or a pattern
        at = re.match(r"[`)]*\s+at\s+(?:(?:that|the)\s+commit|commit\s+([0-9a-f]{7,40})|([0-9a-f]{7,40}))",
                      text[match.end():match.end() + 60])
        if at and not (at[1] or at[2]):
            continue  # "at that commit": the one its row names
        yield path, (at[1] or at[2]) if at else None


def _exists_at(commit: str, path: str) -> bool | None:
    """Whether git has the path at that commit (None when this clone lacks the commit)."""
    if subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                      capture_output=True).returncode:
        return None
    kind = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-t", f"{commit}:{path.rstrip('/')}"],
                          capture_output=True, text=True)
    return kind.returncode == 0


def _generated(path: str) -> bool:
    """A path git ignores: what a tool writes (lab/make_release.sh's lab/release-src/), never committed."""
    return subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", path]).returncode == 0


def test_docs_cite_only_files_that_exist():
    """Today's tree has each cited file (or ignores it: a tool writes it), or the commit it is cited
    at ("... at commit 0b6a67e") does."""
    missing = []
    for doc in DOCS:
        for path, commit in _cited_paths(doc.read_text()):
            there = ((ROOT / path).exists() or _generated(path)) if commit is None else _exists_at(commit, path)
            if there is False:
                missing.append((doc.relative_to(ROOT).as_posix(), path, commit))
    assert not missing, missing


def test_nothing_refers_outside_the_repository():
    outside = re.compile(r"\.\./shared|/work/|DESIGN\.md|HOPPER(_NOTES)?\.md|H200\.md|METHOD\.md")
    files = [*DOCS, *(ROOT / "flashtune").rglob("*.py"), *(ROOT / "csrc").rglob("*.cu*"),
             *(ROOT / "csrc").rglob("*.h"), *(ROOT / "csrc").rglob("*.cpp"), *(ROOT / "profiles").glob("*.yaml"),
             *(ROOT / "tests").glob("*.py")]
    hits = [f.relative_to(ROOT).as_posix() for f in files
            if f != Path(__file__) and outside.search(f.read_text())]
    assert not hits, hits


def _expand(name: str) -> list[str]:
    """A cited family of files, `x_<bf16, fp16>_<1-3>.json`, as the names it stands for."""
    match = re.search(r"<([^>]+)>", name)
    if match is None:
        return [name]
    inner = match.group(1)
    span = re.fullmatch(r"(\d+)-(\d+)", inner)
    options = ([str(i) for i in range(int(span[1]), int(span[2]) + 1)] if span
               else [o.strip() for o in inner.split(",")])
    return [full for o in options for full in _expand(name[:match.start()] + o + name[match.end():])]


def test_benchmarks_hold_only_cited_results_under_one_and_a_quarter_megabytes():
    results = [f for f in (ROOT / "benchmarks").rglob("*") if f.is_file() and f.name != "README.md"]
    assert sum(f.stat().st_size for f in results) < 5 * 2**18
    for f in results:  # each named, alone or in a family, in its folder's README
        cited = {Path(name).name for quoted in re.findall(r"`([^`]+)`", (f.parent / "README.md").read_text())
                 for name in _expand(quoted)}
        assert f.name in cited, f.relative_to(ROOT)


def test_the_package_never_imports_the_lab():
    importing = [f.relative_to(ROOT).as_posix() for f in (ROOT / "flashtune").rglob("*.py")
                 if re.search(r"^\s*(from|import)\s+lab\b", f.read_text(), re.MULTILINE)]
    assert not importing


def test_a_test_files_name_says_whether_it_needs_a_gpu():
    """`*_gpu.py` files hold only GPU tests (the whole module marked `gpu`, alone or first beside the
    conftest fixtures it uses); every other file runs on the CPU and marks none."""
    module_mark = re.compile(r"^pytestmark = (pytest\.mark\.gpu|\[pytest\.mark\.gpu, pytest\.mark\.usefixtures\(.*\)\])$",
                             re.MULTILINE)
    for f in sorted((ROOT / "tests").glob("test_*.py")):
        text = f.read_text()
        if f.stem.endswith("_gpu"):
            assert module_mark.search(text), f.name
        else:
            assert "mark.gpu" not in text or f == Path(__file__), f.name
