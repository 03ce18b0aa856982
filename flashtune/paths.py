"""Where flashtune finds its data (profiles, CUDA sources) and keeps its cache."""
from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
_SOURCE_ROOT = _PACKAGE_DIR.parent
# A non-editable install carries profiles/ and csrc/ here (see pyproject.toml).
_INSTALLED_DATA = _PACKAGE_DIR / "_data"


def _data_dir(name: str) -> Path:
    # Prefer the source tree so edits in a checkout take effect without reinstalling;
    # pyproject.toml marks it as *our* checkout, not some other site-packages/<name>.
    source = _SOURCE_ROOT / name
    if source.is_dir() and (_SOURCE_ROOT / "pyproject.toml").is_file():
        return source
    return _INSTALLED_DATA / name


def profiles_dir() -> Path:
    """The directory of shipped profile YAML files."""
    return _data_dir("profiles")


def csrc_dir() -> Path:
    """The directory of the CUDA/C++ kernel sources."""
    return _data_dir("csrc")


def cache_dir() -> Path:
    """Build cache root: $FLASHTUNE_CACHE_DIR, else ~/.cache/flashtune."""
    override = os.environ.get("FLASHTUNE_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "flashtune"
