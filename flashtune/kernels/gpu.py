"""The GPUs this machine has (through torch.cuda), or a described target it does not have."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from flashtune.kernels.arch import ArchFacts, KNOWN_GPUS, arch_for_compute_capability, get_arch, lookup_gpu


@dataclass(frozen=True)
class GpuInfo:
    index: int | None  # None for a described target
    name: str
    compute_capability: tuple[int, int]
    arch: ArchFacts | None  # None when the compute capability is not in the arch table
    sm_count: int | None
    smem_per_sm: int | None
    smem_per_block_optin: int | None
    l2_bytes: int | None
    memory_bytes: int | None
    driver: str | None
    # A described target's SMs, L2 and memory come from flashtune's table of datasheet figures
    # (arch.KNOWN_GPUS), not from a card; `varies` says why one is unknown (its versions differ).
    datasheet: bool = False
    varies: str | None = None
    # peak memory bandwidth: double data rate x memory clock x bus width (a card's, where torch reports them)
    memory_gbps: float | None = None

    @property
    def is_target(self) -> bool:
        """True when this describes a GPU we do not have (--arch / --gpu)."""
        return self.index is None


PropsProvider = Callable[[], Sequence[Any]]


def _torch_device_properties() -> list[Any]:
    try:
        import torch

        if not torch.cuda.is_available():
            return []
        return [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    except Exception:
        return []


def nvidia_smi_driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return lines[0] if lines else None


def _gpu_from_props(index: int, props: Any, driver: str | None) -> GpuInfo:
    cc = (int(props.major), int(props.minor))
    try:
        arch = arch_for_compute_capability(*cc)
    except ValueError:
        arch = None
    # Older torch builds lack some attributes: report None rather than fail.
    clock_khz, bus_bits = getattr(props, "memory_clock_rate", 0) or 0, getattr(props, "memory_bus_width", 0) or 0
    return GpuInfo(
        index=index,
        name=str(props.name),
        compute_capability=cc,
        arch=arch,
        sm_count=getattr(props, "multi_processor_count", None),
        smem_per_sm=getattr(props, "shared_memory_per_multiprocessor", None),
        smem_per_block_optin=getattr(props, "shared_memory_per_block_optin", None),
        l2_bytes=getattr(props, "L2_cache_size", None),
        memory_bytes=getattr(props, "total_memory", None),
        driver=driver,
        memory_gbps=2 * clock_khz * 1e3 * bus_bits / 8 / 1e9 if clock_khz and bus_bits else None,
    )


def device_gpu(index: int) -> GpuInfo:
    """The GpuInfo of one visible device, without the driver (no nvidia-smi on a call's path)."""
    import torch

    return _gpu_from_props(index, torch.cuda.get_device_properties(index), None)


def detect_gpus(props_provider: PropsProvider | None = None,
                driver_provider: Callable[[], str | None] | None = None) -> list[GpuInfo]:
    """One GpuInfo per visible GPU (empty list when none is visible).

    The providers exist so tests can fake a device; by default they ask torch.cuda
    and nvidia-smi.
    """
    all_props = list((props_provider or _torch_device_properties)())
    if not all_props:
        return []
    driver = (driver_provider or nvidia_smi_driver_version)()
    return [_gpu_from_props(i, p, driver) for i, p in enumerate(all_props)]


def describe_target(arch: str | None = None, gpu_name: str | None = None) -> GpuInfo:
    """A GpuInfo for a GPU we do not have, from --arch and/or --gpu.

    Limits come from the arch table; a named GPU's SM count, L2 and memory from its datasheet
    figures where every version of it shares them; the rest (and the driver) is None.
    """
    if arch is None and gpu_name is None:
        raise ValueError("describe a target with an arch (e.g. sm_89) or a GPU name (e.g. 'RTX 4090')")
    facts = get_arch(arch) if arch is not None else None
    known = None
    if gpu_name is not None:
        hit = lookup_gpu(gpu_name)
        if hit is None:
            raise ValueError(f"unknown GPU {gpu_name!r}; known: {', '.join(KNOWN_GPUS)} "
                             "(or pass --arch sm_XX)")
        known = hit[1]
        gpu_facts = arch_for_compute_capability(*known.compute_capability)
        if facts is not None and facts.compute_capability != gpu_facts.compute_capability:
            raise ValueError(f"--gpu {gpu_name!r} is {gpu_facts.name} "
                             f"(compute capability {gpu_facts.compute_capability_str}), "
                             f"not {facts.name}; pass one of them")
        facts = facts or gpu_facts
    assert facts is not None
    return GpuInfo(
        index=None,
        name=gpu_name or f"{facts.name} target",
        compute_capability=facts.compute_capability,
        arch=facts,
        sm_count=known.sm_count if known else None,
        smem_per_sm=facts.smem_per_sm,
        smem_per_block_optin=facts.max_smem_per_block,
        l2_bytes=known.l2_mb * 2**20 if known and known.l2_mb else None,
        memory_bytes=known.memory_gb * 2**30 if known and known.memory_gb else None,
        driver=None,
        datasheet=known is not None,
        varies=known.varies if known else None,
    )
