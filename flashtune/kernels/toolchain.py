"""The build toolchain: torch and its CUDA, nvcc, CUDA_HOME, ninja, cuobjdump.

`detect_toolchain` never raises (it reports None / "unknown"); `check_build_toolchain`
raises `ToolchainError` saying what to do when a build for an arch cannot work.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from flashtune.kernels.arch import ArchFacts

_DEFAULT_CUDA = Path("/usr/local/cuda")


class ToolchainError(RuntimeError):
    """The toolchain cannot build what was asked; the message says how to fix it."""


@dataclass
class Toolchain:
    torch_version: str  # "unknown" when torch cannot be imported
    torch_cuda: str | None  # None for a CPU-only torch build
    nvcc_path: str | None
    nvcc_version: tuple[int, int] | None
    cuda_home: str | None  # the toolkit that builds will use
    ninja_version: str | None
    cuobjdump_path: str | None
    # whether cuda_home holds bin/nvcc (None: not looked at). A $CUDA_HOME naming no toolkit is
    # still the one builds use, while nvcc above may be one found on PATH.
    cuda_home_has_nvcc: bool | None = None

    @property
    def torch_cuda_major(self) -> int | None:
        return int(self.torch_cuda.split(".")[0]) if self.torch_cuda else None

    @property
    def nvcc_version_str(self) -> str | None:
        return "{}.{}".format(*self.nvcc_version) if self.nvcc_version else None


def _run(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def real_nvcc(path: str | Path) -> Path:
    """Follow symlinks and `exec /path/nvcc` shell wrappers to the real nvcc binary."""
    resolved = Path(path).resolve()
    try:
        if resolved.stat().st_size < 64 * 1024:  # a binary is megabytes; a wrapper is tiny
            text = resolved.read_text(errors="ignore")
            m = re.search(r"""exec\s+["']?(/\S+?/nvcc)\b""", text)
            if m and Path(m.group(1)).resolve() != resolved:
                return Path(m.group(1)).resolve()
    except OSError:
        pass
    return resolved


def resolve_cuda_home() -> str | None:
    """The CUDA toolkit builds use: $CUDA_HOME / $CUDA_PATH, /usr/local/cuda, the real nvcc's parent.

    torch's own guess takes the directory above the nvcc on PATH, which for a
    /usr/local/bin/nvcc wrapper is /usr/local: wrong, so we never return that.
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var]
    if (_DEFAULT_CUDA / "bin" / "nvcc").exists():
        return str(_DEFAULT_CUDA)
    on_path = shutil.which("nvcc")
    if on_path:
        home = real_nvcc(on_path).parent.parent
        if home != Path("/usr/local"):
            return str(home)
    return None


def _find_nvcc(cuda_home: str | None) -> str | None:
    if cuda_home and (Path(cuda_home) / "bin" / "nvcc").exists():
        return str(Path(cuda_home) / "bin" / "nvcc")
    on_path = shutil.which("nvcc")
    return str(real_nvcc(on_path)) if on_path else None


def nvcc_version(nvcc_path: str | None) -> tuple[int, int] | None:
    if not nvcc_path:
        return None
    out = _run([nvcc_path, "--version"]) or ""
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _ninja_version() -> str | None:
    exe = shutil.which("ninja")
    if exe:
        out = _run([exe, "--version"])
        if out:
            return out.strip()
    try:
        from importlib.metadata import version

        return version("ninja")
    except Exception:
        return None


def find_cuobjdump(cuda_home: str | None) -> str | None:
    """PATH, then $CUDA_HOME/bin, then the `nvidia-cuda-cuobjdump` wheel.

    The wheel puts it at site-packages/nvidia/cu13/bin/cuobjdump (CUDA 13) or
    nvidia/cuda_cuobjdump/bin/cuobjdump (CUDA 12).
    """
    on_path = shutil.which("cuobjdump")
    if on_path:
        return on_path
    if cuda_home and (Path(cuda_home) / "bin" / "cuobjdump").exists():
        return str(Path(cuda_home) / "bin" / "cuobjdump")
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        hits = sorted(glob.glob(os.path.join(root, "*", "bin", "cuobjdump")))
        if hits:
            return hits[0]
    return None


def torch_versions(import_torch: bool = True) -> tuple[str, str | None]:
    """torch's version and CUDA ("unknown", None when torch is missing or broken). Without
    import_torch, read from torch/version.py (a second or more of import saved: a build whose
    kernels are all cached should not pay it), importing only if that file cannot be read."""
    if not import_torch:
        namespace: dict = {}
        try:
            spec = importlib.util.find_spec("torch")
            exec((Path(spec.origin).parent / "version.py").read_text(), namespace)  # noqa: S102
            return namespace["__version__"], namespace.get("cuda")
        except (OSError, KeyError, TypeError, AttributeError, SyntaxError, ImportError, ValueError):
            pass
    try:
        import torch

        return torch.__version__, torch.version.cuda
    except Exception:
        return "unknown", None


def detect_toolchain(import_torch: bool = True) -> Toolchain:
    """What this machine would build with. Never raises. `import_torch=False`: torch's versions
    read without importing it (torch_versions)."""
    torch_version, torch_cuda = torch_versions(import_torch)
    cuda_home = resolve_cuda_home()
    nvcc = _find_nvcc(cuda_home)
    return Toolchain(
        torch_version=torch_version,
        torch_cuda=torch_cuda,
        nvcc_path=nvcc,
        nvcc_version=nvcc_version(nvcc),
        cuda_home=cuda_home,
        ninja_version=_ninja_version(),
        cuobjdump_path=find_cuobjdump(cuda_home),
        cuda_home_has_nvcc=None if cuda_home is None else (Path(cuda_home) / "bin" / "nvcc").exists(),
    )


def cuda_home_problem(tc: Toolchain) -> str | None:
    """Why the toolkit that builds would use is none: $CUDA_HOME (or $CUDA_PATH) naming a directory
    without nvcc. The nvcc on PATH may still answer --version, so without this check the toolchain
    looked fine and every compile failed later on the missing headers."""
    if tc.cuda_home is None or tc.cuda_home_has_nvcc is not False:
        return None
    var = next((v for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v) == tc.cuda_home), "CUDA_HOME")
    what = "does not exist" if not Path(tc.cuda_home).exists() else "has no bin/nvcc"
    return (f"{var}={tc.cuda_home} {what}, and builds would use it: set {var} to the CUDA toolkit (the "
            "directory holding bin/nvcc, e.g. /usr/local/cuda) or unset it")


def toolchain_problems(arch: ArchFacts, tc: Toolchain) -> list[str]:
    """Why a build for `arch` would fail with this toolchain (empty when it can work)."""
    if (problem := cuda_home_problem(tc)) is not None:
        return [problem]  # the rest would be judged on an nvcc that builds do not use
    problems = []
    min_nvcc = "{}.{}".format(*arch.min_nvcc)
    if tc.torch_cuda is None:
        problems.append(
            f"torch {tc.torch_version} is a CPU-only build; install a CUDA build of torch "
            "(see https://pytorch.org/get-started/locally/)")
    if tc.nvcc_path is None or tc.nvcc_version is None:
        problems.append(
            f"no working nvcc found (CUDA_HOME={tc.cuda_home}); install the CUDA toolkit "
            f">= {min_nvcc} for {arch.name} or set CUDA_HOME to it")
        return problems
    if tc.nvcc_version < arch.min_nvcc:
        problems.append(
            f"nvcc {tc.nvcc_version_str} ({tc.nvcc_path}) cannot target {arch.name}; it needs "
            f"nvcc >= {min_nvcc}: install a newer CUDA toolkit or set CUDA_HOME to one")
    if tc.torch_cuda_major is not None and tc.nvcc_version[0] != tc.torch_cuda_major:
        problems.append(
            f"nvcc is CUDA {tc.nvcc_version_str} but torch {tc.torch_version} was built with "
            f"CUDA {tc.torch_cuda}; use a toolkit with the same major version (set CUDA_HOME) "
            "or a torch built for your toolkit")
    return problems


def check_build_toolchain(arch: ArchFacts, tc: Toolchain | None = None) -> Toolchain:
    """Raise ToolchainError when a build for `arch` cannot work; return the toolchain."""
    tc = tc or detect_toolchain(import_torch=False)
    problems = toolchain_problems(arch, tc)
    if problems:
        raise ToolchainError(problems[0] if len(problems) == 1 else "; ".join(problems))
    return tc
