"""JIT build of kernel specs and of the torch binding, with a per-spec cache and lock.

Cache layout (docs/design.md, "The build cache"):
    $FLASHTUNE_CACHE_DIR/<flashtune version>/<torch>-cu<cuda>/<arch>/<spec name>/
holding the generated source, ninja's files, the library, build.log and manifest.json.
The manifest is written last, atomically, after a successful build; an entry without a
manifest, or whose library or sources no longer match it, is rebuilt and never loaded.
A file lock per entry makes N processes asking at once produce one build and N loads.
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

from flashtune import __version__
from flashtune.kernels.arch import ArchFacts, get_arch
from flashtune.paths import cache_dir, csrc_dir
from flashtune.kernels.spec import KernelSpec
from flashtune.kernels.toolchain import Toolchain, check_build_toolchain, torch_versions

BINDING_NAME = "flashtune_C"
# ptxas messages meaning wgmma was serialised (C7511, C7515, C7518, C7519, or any other code with
# that text; C7518 comes as "info", not "warning"), a wait injected before a read of a wgmma's
# registers (C7517, also "info") or setmaxnreg ignored (C7508). Checked in every build: only a kernel
# with wgmma or setmaxnreg (the sm90 family, the KV-cache kernels, the Hopper backward) can print them.
SERIALISING_WARNINGS = re.compile(r"\bC75(?:08|11|15|17|18|19)\b|wgmma\.mma_async instructions are serialized")
MANIFEST = "manifest.json"


class BuildError(RuntimeError):
    """A compile or link failed: `cause` is the first error line of its log (one line, what a
    person needs to see), `log` the full log's path in the kernel's cache entry."""

    def __init__(self, cause: str, kernel: str | None = None, log: str | Path | None = None):
        self.cause, self.kernel, self.log = cause, kernel, None if log is None else str(log)
        super().__init__((f"{kernel}: " if kernel else "") + cause + (f" (full log: {log})" if log else ""))


# A log line that names why a build failed: nvcc's and ptxas' fatal errors, a compiler diagnostic
# (`file.cu(12): error: ...`, `file.cpp:3:1: error: ...`, `fatal error: x.h: No such file`), a link
# error. The Python tracebacks that follow in the log (torch's cpp_extension re-raising ninja's
# failure) are not it.
_ERROR_LINE = re.compile(r"\bnvcc fatal\b|\bptxas (?:fatal|error)\b|(?<![A-Za-z])error\s*:|undefined reference|"
                         r"\bcannot find -l", re.IGNORECASE)
_TRACEBACK_LINE = re.compile(r"^(Traceback|File \"|[A-Za-z_.]*(Error|Exception)\b|The above exception|\s*\^)")


def first_compiler_error(log: str) -> str | None:
    """The first line of a build log that says what went wrong (None if none does)."""
    for line in log.splitlines():
        line = line.strip()
        if line and _ERROR_LINE.search(line) and not _TRACEBACK_LINE.match(line):
            return line
    return None


@dataclass
class BuildResult:
    name: str
    arch: str
    library: str
    cache_hit: bool
    seconds: float
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    stack_bytes: int | None = None
    smem_bytes: int | None = None
    log: str | None = None

    @property
    def spills(self) -> bool:
        return bool(self.spill_stores or self.spill_loads)


# ---------------------------------------------------------------------------- cache paths

def _torch_tag() -> str:
    version, cuda = torch_versions(import_torch=False)
    return f"torch{version.split('+')[0]}-cu{cuda or 'none'}"


def cache_root() -> Path:
    return cache_dir() / __version__ / _torch_tag()


def spec_dir(spec: KernelSpec) -> Path:
    """One directory per spec; extra nvcc flags (not in the kernel's name) get their own."""
    if not spec.nvcc_flags:
        return cache_root() / spec.arch / spec.name
    flags = hashlib.sha256("\0".join(spec.nvcc_flags).encode()).hexdigest()[:8]
    return cache_root() / spec.arch / f"{spec.name}-flags{flags}"


def binding_dir() -> Path:
    return cache_root() / "binding"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextmanager
def _locked(directory: Path):
    """An exclusive lock beside `directory`, held across check-build-publish."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f"{directory.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_manifest(directory: Path, source_hash: str) -> dict | None:
    """The manifest if the entry is complete and current, else None (rebuild)."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        library = Path(manifest["library"])
        if manifest["source_hash"] != source_hash or not library.is_file():
            return None
        if _sha256(library) != manifest["library_sha256"]:
            return None  # truncated or overwritten library: never load it
        return manifest
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_if_changed(path: Path, text: str) -> None:
    """Rewrite a generated source only when it differs, so ninja does not rebuild."""
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def _write_manifest(directory: Path, manifest: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".manifest")
    with os.fdopen(fd, "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(tmp, directory / MANIFEST)


# ---------------------------------------------------------------------------- ptxas report

_FUNC_RE = re.compile(r"Function properties for (\S+)")
_FRAME_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS_RE = re.compile(r"ptxas info\s*: Used (\d+) registers")


def parse_ptxas(log: str, kernel: str) -> dict:
    """Registers, stack and spills that `ptxas -v` reported for `kernel` (None if absent)."""
    stats = {"registers": None, "spill_stores": None, "spill_loads": None, "stack_bytes": None}
    lines = log.splitlines()
    for i, line in enumerate(lines):
        m = _FUNC_RE.search(line)
        if not m or m.group(1) != kernel:
            continue
        for follow in lines[i + 1:i + 4]:
            if (f := _FRAME_RE.search(follow)):
                stats["stack_bytes"], stats["spill_stores"], stats["spill_loads"] = map(int, f.groups())
            if (r := _REGS_RE.search(follow)):
                stats["registers"] = int(r.group(1))
                break
    return stats


# ---------------------------------------------------------------------------- one build

def _run_worker(name: str, sources: list[str], directory: Path, torch_arch_list: str,
                cuda_flags: list[str], cuda_home: str) -> str:
    """Compile in a child process; return the log. Raise BuildError on failure."""
    request = {
        "name": name,
        "sources": sources,
        "build_dir": str(directory),
        "include_paths": [str(csrc_dir())],
        "torch_arch_list": torch_arch_list,
        "cuda_flags": cuda_flags,
        "cuda_home": cuda_home,
    }
    request_path = directory / "build_request.json"
    request_path.write_text(json.dumps(request, indent=1))
    log_path = directory / "build.log"
    with open(log_path, "w") as log:
        proc = subprocess.run([sys.executable, "-m", "flashtune.kernels.build_worker", str(request_path)],
                              stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    text = log_path.read_text(errors="replace")
    if proc.returncode != 0:
        last = next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")
        cause = first_compiler_error(text) or (
            f"the build exited with {proc.returncode} and no compiler error in its log; its last line: {last[:200]}")
        raise BuildError(cause, name, log_path)
    return text


def _library_path(directory: Path, name: str) -> Path:
    return directory / f"{name}.so"


def _unpublish(directory: Path, name: str) -> None:
    """Mark the entry incomplete and drop a library that failed its check, so ninja relinks
    it instead of calling a truncated file up to date."""
    (directory / MANIFEST).unlink(missing_ok=True)
    _library_path(directory, name).unlink(missing_ok=True)


def _build_entry(directory: Path, name: str, source_hash: str, force: bool, arch: ArchFacts,
                 compile_fn: Callable[[Toolchain], dict]) -> BuildResult:
    """The cache protocol shared by kernels and the binding: lock, reuse a valid entry, or
    compile (compile_fn returns the result's extra fields) and publish the manifest last."""
    start = time.perf_counter()
    with _locked(directory):
        manifest = None if force else _read_manifest(directory, source_hash)
        if manifest is not None:
            return BuildResult(**{**manifest["result"], "cache_hit": True,
                                  "seconds": time.perf_counter() - start})
        toolchain = check_build_toolchain(arch)
        if force and directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True, exist_ok=True)
        _unpublish(directory, name)
        extra = compile_fn(toolchain)
        library = _library_path(directory, name)
        if not library.is_file():
            raise BuildError("the build produced no library", name, directory / "build.log")
        result = BuildResult(name=name, library=str(library), cache_hit=False,
                             seconds=time.perf_counter() - start, log=str(directory / "build.log"), **extra)
        _write_manifest(directory, {"name": name, "source_hash": source_hash, "library": str(library),
                                    "library_sha256": _sha256(library), "result": asdict(result)})
        return result


def build_spec(spec: KernelSpec, force: bool = False) -> BuildResult:
    """Build (or find in the cache) the library of one spec."""
    directory = spec_dir(spec)

    def compile_kernel(toolchain: Toolchain) -> dict:
        source = directory / f"{spec.name}.cu"
        _write_if_changed(source, spec.source())
        log = _run_worker(spec.name, [str(source)], directory, spec.arch_facts.torch_arch_list,
                          spec.nvcc_flags_all(), toolchain.cuda_home)
        if found := sorted(set(SERIALISING_WARNINGS.findall(log))):
            _library_path(directory, spec.name).unlink(missing_ok=True)
            raise BuildError(f"ptxas warned {', '.join(found)}: wgmma was serialised or setmaxnreg ignored, "
                             "which makes the kernel slow", spec.name, directory / "build.log")
        return {"arch": spec.arch, **parse_ptxas(log, spec.name),
                "smem_bytes": spec.smem_bytes}

    return _build_entry(directory, spec.name, spec.source_hash(), force, spec.arch_facts, compile_kernel)


def default_jobs() -> int:
    """Parallel compiles: one per core, at most one per 2 GB of memory (nvcc's peak)."""
    cores = os.cpu_count() or 1
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gb = 2 * cores
    return max(1, min(cores, int(mem_gb // 2)))


def build_specs(specs: Iterable[KernelSpec], jobs: int | None = None, force: bool = False,
                on_done: Callable[[KernelSpec, BuildResult | None], None] | None = None,
                ) -> tuple[list[BuildResult], list[tuple[KernelSpec, Exception]]]:
    """Build many specs at once; each compile is its own process, so threads suffice.

    Returns (results, failures): one failed spec never stops the others. A toolchain that
    cannot build at all (ToolchainError) is raised, not recorded per spec. jobs: parallel
    compiles (default: default_jobs()).
    """
    specs = list(dict.fromkeys(specs))  # same spec twice: build once
    jobs = max(1, jobs or default_jobs())
    results: list[BuildResult] = []
    failures: list[tuple[KernelSpec, Exception]] = []

    def one(spec: KernelSpec) -> None:
        try:
            result = build_spec(spec, force=force)
            results.append(result)
        except (BuildError, OSError) as err:
            result = None
            failures.append((spec, err))
        if on_done:
            on_done(spec, result)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, specs))
    order = {s.name: i for i, s in enumerate(specs)}
    results.sort(key=lambda r: order.get(r.name, 0))
    return results, failures


# ---------------------------------------------------------------------------- the binding

def _binding_hash() -> str:
    h = hashlib.sha256()
    for path in [csrc_dir() / "binding.cpp", csrc_dir() / "common" / "params.h", csrc_dir() / "decode" / "params.h",
                 csrc_dir() / "backward" / "params.h"]:
        h.update(path.read_bytes())
    return h.hexdigest()


def build_binding(force: bool = False) -> BuildResult:
    """The torch ops flashtune_C::fwd and flashtune_C::decode (binding.cpp): built once per torch version."""
    directory = binding_dir()

    def compile_binding(toolchain: Toolchain) -> dict:
        _run_worker(BINDING_NAME, [str(csrc_dir() / "binding.cpp")], directory, "8.0", [],
                    toolchain.cuda_home)
        return {"arch": "host"}

    # The binding has no device code: any arch the toolchain supports will do.
    return _build_entry(directory, BINDING_NAME, _binding_hash(), force, get_arch("sm_80"), compile_binding)


# ---------------------------------------------------------------------------- loading

@dataclass(frozen=True)
class LoadedKernel:
    spec: KernelSpec
    launcher: int  # address of `<name>_launch`, passed to flashtune_C::fwd
    library: str


_loaded: dict[KernelSpec, LoadedKernel] = {}
_handles: list[ctypes.CDLL] = []  # keep libraries mapped for the life of the process
_load_lock = threading.Lock()
_binding_loaded = False


def load_binding() -> None:
    """Build if needed and load the flashtune_C torch op library (once per process)."""
    global _binding_loaded
    if _binding_loaded:  # the per-call fast path: no lock
        return
    with _load_lock:
        if _binding_loaded:
            return
        import torch

        result = build_binding()
        with _locked(binding_dir()):
            torch.ops.load_library(result.library)
        _binding_loaded = True


def load_kernel(spec: KernelSpec) -> LoadedKernel:
    """Build if needed and load one spec's library; memoised per process."""
    kernel = _loaded.get(spec)
    if kernel is not None:
        return kernel
    result = build_spec(spec)
    with _load_lock, _locked(spec_dir(spec)):  # no other process relinks it while it is mapped in
        if spec not in _loaded:
            handle = ctypes.CDLL(result.library)  # RTLD_LOCAL: same-named symbols never clash
            _handles.append(handle)
            address = ctypes.cast(getattr(handle, spec.launcher_symbol), ctypes.c_void_p).value
            _loaded[spec] = LoadedKernel(spec, address, result.library)
    return _loaded[spec]
