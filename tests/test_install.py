"""A non-editable install must still find profiles/, csrc/ and docs/profiles.md (shipped as
flashtune/_data), and carries its licence and every dependency its commands import."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CUDA_SOURCES = ("*.cu", "*.cuh", "*.cpp", "*.h")

pytest.importorskip("hatchling", reason="the install test builds without isolation: pip install '.[test]'")


def _cuda_sources(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for pattern in CUDA_SOURCES for p in root.rglob(pattern)}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(REPO)], check=True, cwd=target)
    return target


def test_installed_package_finds_profiles_and_csrc(installed, tmp_path):
    probe = ("import json, flashtune, flashtune.paths as p, flashtune.kernels.profiles as pr; "
             "print(json.dumps({'pkg': flashtune.__file__, 'profiles': str(p.profiles_dir()), "
             "'csrc': str(p.csrc_dir()), 'doc': str(p.profiles_doc()), "
             "'names': [x.name for x in pr.list_profiles()]}))")
    # Run from an unrelated directory so the checkout is not on sys.path.
    env = {**os.environ, "PYTHONPATH": str(installed)}
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True,
                         cwd=tmp_path, env=env).stdout
    found = json.loads(out)
    assert found["pkg"].startswith(str(installed))
    assert Path(found["profiles"]) == installed / "flashtune" / "_data" / "profiles"
    assert sorted(found["names"]) == sorted(
        load.stem for load in (REPO / "profiles").glob("*.yaml"))
    assert Path(found["csrc"]) == installed / "flashtune" / "_data" / "csrc"
    assert _cuda_sources(Path(found["csrc"])) == _cuda_sources(REPO / "csrc")
    # the profile format that every profile error points to is there to read
    assert Path(found["doc"]) == installed / "flashtune" / "_data" / "docs" / "profiles.md"
    assert Path(found["doc"]).read_text() == (REPO / "docs" / "profiles.md").read_text()


def test_licence_and_dependencies(installed):
    (info,) = installed.glob("flashtune-*.dist-info")
    assert (info / "licenses" / "LICENSE").read_text() == (REPO / "LICENSE").read_text()
    metadata = (info / "METADATA").read_text()
    assert "License-Expression: BSD-3-Clause" in metadata
    # torch imports numpy when it can and warns on every command when it cannot
    requires = {line.split(":", 1)[1].split(";")[0].strip() for line in metadata.splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line}
    assert {"click>=8", "torch", "ninja", "numpy", "pyyaml>=6", "rich>=13"} <= requires


def test_console_script_installed(installed):
    assert (installed / "bin" / "flashtune").is_file()
