"""Where flashtune finds its data (profiles, CUDA sources) and keeps its cache."""
from __future__ import annotations

import os
import tempfile
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


def profiles_doc() -> Path:
    """docs/profiles.md, the profile format that error messages point to (shipped in the wheel)."""
    return _data_dir("docs") / "profiles.md"


class CacheDirError(RuntimeError):
    """The cache cannot live where it is asked to; the message says which path, why and what to set."""


_usable: set[Path] = set()  # cache directories already created and written to by this process


def cache_dir() -> Path:
    """Build (and tune) cache root: $FLASHTUNE_CACHE_DIR, else ~/.cache/flashtune; created if
    missing, and checked to take a file (once per process) so that a bad one is one clear error
    before any work, not an OSError from the middle of a build."""
    override = os.environ.get("FLASHTUNE_CACHE_DIR")
    path = Path(override).expanduser() if override else Path.home() / ".cache" / "flashtune"
    if path in _usable:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except (FileExistsError, NotADirectoryError):
        reason = "it is a file, or under one, not a directory"
    except PermissionError:
        reason = "no permission to write there"
    except OSError as err:
        reason = err.strerror or str(err)
    else:
        _usable.add(path)
        return path
    told = "FLASHTUNE_CACHE_DIR" if override else "the default cache directory (FLASHTUNE_CACHE_DIR is not set)"
    raise CacheDirError(f"cannot keep the cache in {path}, {told}: {reason}; set FLASHTUNE_CACHE_DIR to a "
                        "writable directory")
