"""`flashtune detect`: what GPU, arch, features, toolchain and profile, and what to watch out for.

`collect_report` gathers a DetectReport (its to_json() is what --json prints); `render` draws it
for people. Exit codes: 0 when a GPU was detected or a target described, 3 when no
GPU is visible.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flashtune import __version__
from flashtune.kernels.arch import KERNEL_FAMILIES, default_family
from flashtune.commands.common import EXIT_NO_GPU, EXIT_OK, human_bytes, yes_no
from flashtune.kernels.gpu import GpuInfo, describe_target, detect_gpus
from flashtune.kernels.profiles import ProfileError, list_profiles, select_profile_with_reason
from flashtune.kernels.toolchain import Toolchain, cuda_home_problem, detect_toolchain

SM120_MIN_NVCC = (12, 8)
NO_GPU_MESSAGE = ("No NVIDIA GPU is visible to torch (torch.cuda.is_available() is False). "
                  "Builds can still cross-compile: describe a target with --arch sm_XX or --gpu NAME.")


def toolchain_warnings(tc: Toolchain) -> list[str]:
    """Warnings about the toolchain that hold whatever the GPU."""
    warnings = []
    if (problem := cuda_home_problem(tc)) is not None:
        warnings.append(problem)
    if tc.torch_version == "unknown":
        warnings.append("torch cannot be imported: install torch (a CUDA build)")
    elif tc.torch_cuda is None:
        warnings.append(f"torch {tc.torch_version} is CPU-only: it cannot build or run CUDA kernels; "
                        "install a CUDA build of torch")
    if tc.nvcc_version is None:
        warnings.append(f"no working nvcc found (CUDA_HOME={tc.cuda_home}): builds need the CUDA toolkit; "
                        "install it or set CUDA_HOME")
    else:
        if tc.nvcc_version < SM120_MIN_NVCC:
            warnings.append(f"nvcc {tc.nvcc_version_str} is older than 12.8 and cannot target sm_120 "
                            "(RTX 50xx, RTX PRO 6000)")
        if tc.torch_cuda_major is not None and tc.nvcc_version[0] != tc.torch_cuda_major:
            warnings.append(f"nvcc is CUDA {tc.nvcc_version_str} but torch was built with CUDA {tc.torch_cuda}: "
                            "the major versions must match for extension builds (set CUDA_HOME)")
    if tc.ninja_version is None:
        warnings.append("ninja not found: torch's JIT builds need it (pip install ninja)")
    return warnings


def gpu_warnings(gpu: GpuInfo, tc: Toolchain) -> list[str]:
    """Warnings that matter for this GPU (or target)."""
    cc = "{}.{}".format(*gpu.compute_capability)
    arch = gpu.arch
    if arch is None:
        return [f"compute capability {cc} is not in flashtune's arch table: no kernel family or "
                "profile is known for it (pass --arch to build for a known one)"]
    warnings = []
    if not arch.fp8:
        warnings.append(f"{arch.name} has no FP8 tensor cores: FP8 profiles (fp8: {{qk: e4m3}}) are "
                        "refused here; use float16/bfloat16")
    if arch.name == "sm_90":
        warnings.append("plain sm_90 has no wgmma: FA3-style kernels need the sm_90a target; "
                        "this target uses the sm80 (mma.sync) family")
    elif arch.name == "sm_100a":
        warnings.append("sm_100a has tcgen05 instead of wgmma and flashtune's tcgen05 kernels are not "
                        "written yet: the sm80 (mma.sync) family runs here")
    elif not arch.wgmma:
        warnings.append(f"FA3-style (wgmma) kernels need sm_90a: {gpu.name} ({arch.name}) cannot run "
                        "them whatever the build flags; flashtune uses the sm80 (mma.sync) family here")
    if tc.nvcc_version is not None and tc.nvcc_version < arch.min_nvcc:
        need = "{}.{}".format(*arch.min_nvcc)
        warnings.append(f"nvcc {tc.nvcc_version_str} is too old for {arch.name}: it needs nvcc >= {need}")
    return warnings


@dataclass
class GpuEntry:
    """One GPU (or described target): its facts, the profile that matches it, what to watch."""
    index: int
    name: str
    described_target: bool
    compute_capability: str
    arch: str | None
    sm_count: int | None
    smem_per_sm: int | None
    smem_per_block_optin: int | None
    l2_bytes: int | None
    memory_bytes: int | None
    memory_gbps: float | None  # peak, from the card's memory clock and bus width (decode's split model reads it)
    # where SMs, L2 and memory come from: the card ("device"), flashtune's table of datasheet
    # figures for a named target ("datasheet"), or nowhere (an --arch target: "unknown")
    figures_from: str
    figures_vary: str | None
    driver: str | None
    capabilities: dict | None  # mma_sync, fp8, tma, wgmma
    kernel_family: str | None
    profile: dict | None = None  # name, path, reason
    profile_error: str | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass
class DetectReport:
    flashtune_version: str
    gpu_visible: bool
    described_target: bool
    message: str | None  # why there is no GPU entry
    gpus: list[GpuEntry]
    toolchain: dict  # torch_version, torch_cuda, nvcc_path, nvcc_version, cuda_home, ninja_version, cuobjdump_path
    warnings: list[str]

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.gpus else EXIT_NO_GPU

    def to_json(self) -> dict:
        return asdict(self)


def _gpu_entry(gpu: GpuInfo, tc: Toolchain, profiles: list) -> GpuEntry:
    arch = gpu.arch
    entry = GpuEntry(
        index=gpu.index, name=gpu.name, described_target=gpu.is_target,
        compute_capability="{}.{}".format(*gpu.compute_capability), arch=arch.name if arch else None,
        sm_count=gpu.sm_count, smem_per_sm=gpu.smem_per_sm, smem_per_block_optin=gpu.smem_per_block_optin,
        l2_bytes=gpu.l2_bytes, memory_bytes=gpu.memory_bytes, memory_gbps=gpu.memory_gbps,
        figures_from="device" if not gpu.is_target else ("datasheet" if gpu.datasheet else "unknown"),
        figures_vary=gpu.varies, driver=gpu.driver,
        capabilities=({"mma_sync": arch.mma_sync, "fp8": arch.fp8, "tma": arch.tma, "wgmma": arch.wgmma}
                      if arch else None),
        kernel_family=default_family(arch) if arch else None, warnings=gpu_warnings(gpu, tc))
    try:
        selection = select_profile_with_reason(gpu=gpu, profiles=profiles)
        entry.profile = {"name": selection.profile.name, "path": str(selection.profile.path),
                         "reason": selection.reason}
    except ProfileError as err:
        entry.profile_error = str(err)
    return entry


def collect_report(arch: str | None = None, gpu_name: str | None = None,
                   gpus_provider: Callable[[], list[GpuInfo]] | None = None,
                   toolchain: Toolchain | None = None) -> DetectReport:
    """Everything `detect` knows. --arch/--gpu describe a target instead."""
    tc = toolchain or detect_toolchain()
    is_target = arch is not None or gpu_name is not None
    gpus = [describe_target(arch, gpu_name)] if is_target else (gpus_provider or detect_gpus)()
    profiles = list_profiles()
    toolchain_facts = {"torch_version": tc.torch_version, "torch_cuda": tc.torch_cuda, "nvcc_path": tc.nvcc_path,
                       "nvcc_version": tc.nvcc_version_str, "cuda_home": tc.cuda_home,
                       "ninja_version": tc.ninja_version, "cuobjdump_path": tc.cuobjdump_path}
    return DetectReport(__version__, bool(gpus) and not is_target, is_target, None if gpus else NO_GPU_MESSAGE,
                        [_gpu_entry(g, tc, profiles) for g in gpus], toolchain_facts, toolchain_warnings(tc))


def _kv_table(title: str) -> Table:
    table = Table(title=title, show_header=False, title_justify="left", title_style="bold")
    table.add_column("key", style="cyan", no_wrap=True)
    table.add_column("value", overflow="fold")
    return table


def render(report: DetectReport, console: Console) -> None:
    for gpu in report.gpus:
        title = (f"Target: {gpu.name} (described, not detected)" if gpu.described_target
                 else f"GPU {gpu.index}: {gpu.name}")
        table = _kv_table(escape(title))
        caps = gpu.capabilities or {}

        def card(value):  # a described target's SMs, L2 and memory: say where they come from
            if gpu.figures_from != "datasheet":
                return value
            if value is not None:
                return f"{value} (datasheet)"
            return f"unknown (varies: {gpu.figures_vary})" if gpu.figures_vary else None
        rows = [
            ("compute capability", gpu.compute_capability),
            ("arch", gpu.arch or "unknown"),
            ("SMs", card(gpu.sm_count)),
            ("shared memory / SM", human_bytes(gpu.smem_per_sm)),
            ("shared memory / block (opt-in)", human_bytes(gpu.smem_per_block_optin)),
            ("L2", card(human_bytes(gpu.l2_bytes))),
            ("memory", card(human_bytes(gpu.memory_bytes))),
            ("memory bandwidth (peak)", f"{gpu.memory_gbps:,.0f} GB/s" if gpu.memory_gbps else None),
            ("driver", gpu.driver),
            ("mma.sync (f16/bf16)", yes_no(caps.get("mma_sync"))),
            ("FP8 tensor cores", yes_no(caps.get("fp8"))),
            ("TMA", yes_no(caps.get("tma"))),
            ("wgmma", yes_no(caps.get("wgmma"))),
        ]
        family = gpu.kernel_family
        rows.append(("kernel family", f"{family}: {KERNEL_FAMILIES[family].description}" if family else "none"))
        for key, value in rows:
            table.add_row(key, escape("unknown" if value is None else str(value)))
        profile = gpu.profile
        table.add_row("profile", escape(f"{profile['name']} ({profile['reason']})") if profile
                      else f"[red]none[/]: {escape(gpu.profile_error or '')}")
        console.print(table)
        for warning in gpu.warnings:
            console.print(f"[yellow]warning:[/] {escape(warning)}")
        console.print()

    if report.message:
        console.print(f"[bold red]{escape(report.message)}[/]")
        console.print()

    tc = report.toolchain
    table = _kv_table("Toolchain")
    for key, value in (("torch", tc["torch_version"]), ("torch CUDA", tc["torch_cuda"] or "none (CPU-only build)"),
                       ("nvcc", tc["nvcc_path"]), ("nvcc version", tc["nvcc_version"]),
                       ("CUDA_HOME for builds", tc["cuda_home"]), ("ninja", tc["ninja_version"]),
                       ("cuobjdump", tc["cuobjdump_path"] or "not found (pip install nvidia-cuda-cuobjdump)")):
        table.add_row(key, escape(str(value) if value is not None else "not found"))
    console.print(table)
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}")
