"""Architecture facts as data: the one table every other module asks.

Popular articles get several of these wrong (the RTX 5090 is sm_120, not sm_89; the
4090 does have FP8 tensor cores; wgmma exists only on sm_90a), so they live here once.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ArchFacts:
    name: str  # nvcc target, e.g. "sm_89", "sm_90a"
    compute_capability: tuple[int, int]
    mma_sync: bool  # f16/bf16 mma.sync (the sm80 kernel family)
    fp8: bool  # FP8 (e4m3/e5m2) tensor cores
    tma: bool  # Tensor Memory Accelerator
    wgmma: bool  # warpgroup MMA (the sm90 kernel family); needs the "a" target
    max_smem_per_block: int  # bytes, opt-in maximum for one CTA
    smem_per_sm: int  # bytes
    max_threads_per_sm: int
    min_nvcc: tuple[int, int]  # oldest nvcc that can target this arch
    torch_arch_list: str  # TORCH_CUDA_ARCH_LIST entry for builds
    example_gpus: tuple[str, ...]

    @property
    def dependent_launch(self) -> bool:
        """Programmatic dependent launch (griddepcontrol; common/pdl.cuh): sm_90 and newer."""
        return self.compute_capability >= (9, 0)

    @property
    def clusters(self) -> bool:
        """Thread block clusters and distributed shared memory (common/cluster.cuh): sm_90 and newer."""
        return self.compute_capability >= (9, 0)

    @property
    def compute_capability_str(self) -> str:
        return "{}.{}".format(*self.compute_capability)


_KB = 1024

ARCHS: dict[str, ArchFacts] = {
    a.name: a
    for a in (
        ArchFacts("sm_80", (8, 0), True, False, False, False, 163 * _KB, 164 * _KB, 2048,
                  (11, 0), "8.0", ("A100", "A30", "A800")),
        ArchFacts("sm_86", (8, 6), True, False, False, False, 99 * _KB, 100 * _KB, 1536,
                  (11, 1), "8.6", ("RTX 3090", "RTX A6000", "A10", "A40")),
        ArchFacts("sm_89", (8, 9), True, True, False, False, 99 * _KB, 100 * _KB, 1536,
                  (11, 8), "8.9", ("RTX 4090", "L40S", "L4")),
        # Plain sm_90: what the sm80 family compiles to on an H100/H200. TMA and FP8
        # mma.sync compile here; wgmma and setmaxnreg need sm_90a.
        ArchFacts("sm_90", (9, 0), True, True, True, False, 227 * _KB, 228 * _KB, 2048,
                  (12, 0), "9.0", ("H100", "H200", "H800")),
        ArchFacts("sm_90a", (9, 0), True, True, True, True, 227 * _KB, 228 * _KB, 2048,
                  (12, 0), "9.0a", ("H100", "H200", "H800")),
        # Blackwell datacenter: tcgen05 replaces wgmma.
        ArchFacts("sm_100a", (10, 0), True, True, True, False, 227 * _KB, 228 * _KB, 2048,
                  (12, 8), "10.0a", ("B200", "GB200")),
        ArchFacts("sm_120", (12, 0), True, True, True, False, 99 * _KB, 100 * _KB, 1536,
                  (12, 8), "12.0", ("RTX 5090", "RTX PRO 6000")),
    )
}

# Compute capability -> the arch flashtune builds for. 9.0 maps to sm_90a because the
# Hopper kernels need it; plain sm_90 is only reachable by asking for it by name.
_ARCH_FOR_CC: dict[tuple[int, int], str] = {
    (8, 0): "sm_80",
    (8, 6): "sm_86",
    (8, 9): "sm_89",
    (9, 0): "sm_90a",
    (10, 0): "sm_100a",
    (12, 0): "sm_120",
}

@dataclass(frozen=True)
class KnownGpu:
    """A GPU `--gpu NAME` can describe: its compute capability and the figures every version of it
    shares, as the vendor's datasheets give them and torch reports them on the card (SMs, L2,
    memory as sold); None where its versions differ (`varies` says how) or no source was found."""
    compute_capability: tuple[int, int]
    sm_count: int | None = None
    l2_mb: int | None = None
    memory_gb: int | None = None
    varies: str | None = None


# GPU name pattern -> what is known of it. Matching picks the longest pattern contained in the
# name, so "A100" beats "A10" and "L40S" beats "L4".
KNOWN_GPUS: dict[str, KnownGpu] = {
    "A100": KnownGpu((8, 0), 108, 40, None, "40 GB or 80 GB of memory"),
    "A800": KnownGpu((8, 0)),
    "A30": KnownGpu((8, 0), 56, 24, 24),
    "RTX 3090": KnownGpu((8, 6), 82, 6, 24),
    "RTX 3080": KnownGpu((8, 6), None, None, None, "10 GB with 68 SMs or 12 GB with 70 SMs"),
    "RTX A6000": KnownGpu((8, 6), 84, 6, 48),
    "A40": KnownGpu((8, 6), 84, 6, 48),
    "A10": KnownGpu((8, 6), 72, 6, 24),
    "RTX 4090": KnownGpu((8, 9), 128, 72, 24),
    "RTX 4090 D": KnownGpu((8, 9), 114, 72, 24),
    "RTX 4080": KnownGpu((8, 9), 76, 64, 16),
    "RTX 6000 Ada": KnownGpu((8, 9), 142, 96, 48),
    "L40S": KnownGpu((8, 9), 142, 96, 48),
    "L40": KnownGpu((8, 9), 142, 96, 48),
    "L4": KnownGpu((8, 9), 58, 48, 24),
    "H100": KnownGpu((9, 0), None, 50, None, "SXM 132 SMs and 80 GB, PCIe 114 SMs and 80 GB, NVL 94 GB"),
    "H100 SXM": KnownGpu((9, 0), 132, 50, 80),
    "H100 80GB HBM3": KnownGpu((9, 0), 132, 50, 80),  # the SXM card's name as torch reports it
    "H100 PCIe": KnownGpu((9, 0), 114, 50, 80),
    "H100 NVL": KnownGpu((9, 0), 132, 50, 94),
    "H200": KnownGpu((9, 0), 132, 60, 141),
    "H800": KnownGpu((9, 0)),
    "GH200": KnownGpu((9, 0), 132, 60, None, "96 GB or 144 GB of memory"),
    "GH200 480GB": KnownGpu((9, 0), 132, 60, 96),  # 480 GB is the whole superchip's, the GPU has 96
    "GH200 144G": KnownGpu((9, 0), 132, 60, 144),
    "B200": KnownGpu((10, 0), 148, 126, None, "180 GB or 192 GB of memory"),
    "GB200": KnownGpu((10, 0)),
    "RTX 5090": KnownGpu((12, 0), 170, 96, 32),
    "RTX 5080": KnownGpu((12, 0), 84, 64, 16),
    "RTX PRO 6000": KnownGpu((12, 0), 188, 128, 96),
}


@dataclass(frozen=True)
class KernelFamily:
    name: str
    needs: str  # the ArchFacts capability the family cannot run without
    description: str


KERNEL_FAMILIES: dict[str, KernelFamily] = {
    "sm80": KernelFamily("sm80", "mma_sync",
                         "FlashAttention-2 style: mma.sync + ldmatrix + cp.async (sm_80 and newer)"),
    "sm90": KernelFamily("sm90", "wgmma",
                         "FlashAttention-3 style: wgmma + TMA + warp specialisation (sm_90a only)"),
}


def known_arch_names() -> list[str]:
    return list(ARCHS)


def get_arch(name: str) -> ArchFacts:
    """Look up an arch by "sm_89", "sm89", "89", "8.9", "sm_90a", "9.0a", "120"..."""
    text = str(name).strip().lower()
    m = re.fullmatch(r"(?:sm_?|compute_?)?(\d+)(?:\.(\d+))?(a?)", text)
    if m:
        major_or_digits, minor, suffix = m.groups()
        digits = major_or_digits + minor if minor is not None else major_or_digits
        key = f"sm_{digits}{suffix}"
        if key in ARCHS:
            return ARCHS[key]
        # "sm_100" has no plain entry: the only sm_100 target we know is sm_100a.
        if not suffix and f"{key}a" in ARCHS and key not in ARCHS:
            return ARCHS[f"{key}a"]
    raise ValueError(
        f"unknown arch {name!r}; known archs: {', '.join(ARCHS)} "
        "(also written as sm89, 89 or 8.9)"
    )


def arch_for_compute_capability(major: int, minor: int) -> ArchFacts:
    """The arch flashtune targets for a device of this compute capability."""
    key = _ARCH_FOR_CC.get((int(major), int(minor)))
    if key is None:
        # e.g. 8.7 (Jetson Orin) or 12.1: shared-memory limits differ, so guessing a
        # neighbour would give wrong numbers.
        known = ", ".join(f"{a}.{b} ({n})" for (a, b), n in _ARCH_FOR_CC.items())
        raise ValueError(
            f"compute capability {major}.{minor} is not in flashtune's arch table; "
            f"known: {known}"
        )
    return ARCHS[key]


# Words after a card's name that make it another version, with figures of its own.
VERSION_WORDS = {"ti": "Ti", "super": "SUPER", "laptop": "laptop", "mobile": "mobile"}


def lookup_gpu(name: str) -> tuple[str, KnownGpu] | None:
    """(pattern, facts) of the longest KNOWN_GPUS pattern in `name`, matched as whole words
    (spaces, hyphens and case do not count: "rtx4090" is the RTX 4090; "RTX A4000" is not an
    A40). A version the table lacks ("RTX 3090 Ti", a laptop's) keeps the compute capability
    only, and memory a datacenter name states ("A100-SXM4-80GB") is taken."""
    lowered = name.lower()
    hits = []
    for pattern in KNOWN_GPUS:
        found = re.search(r"[\s_-]*".join(map(re.escape, _squeeze(pattern))) + r"(?![0-9a-z])", lowered)
        if found:
            hits.append((pattern, lowered[found.end():]))
    if not hits:
        return None
    best, rest = max(hits, key=lambda hit: len(hit[0]))
    known = KNOWN_GPUS[best]
    version = next((word for word in re.findall(r"[0-9a-z]+", rest) if word in VERSION_WORDS), None)
    if version:
        own = f"a {VERSION_WORDS[version]} version of the {best}: its SMs, L2 and memory are its own"
        return best, KnownGpu(known.compute_capability, varies=own)
    stated = re.search(r"(\d+)\s*gb", rest)
    if known.memory_gb is None and stated:
        known = dataclasses.replace(known, memory_gb=int(stated.group(1)),
                                    varies=known.varies if known.sm_count is None else None)
    return best, known


def _squeeze(name: str) -> str:
    return re.sub(r"[\s_-]", "", name.lower())


def family_runs_on(family: str, arch: ArchFacts) -> bool:
    return getattr(arch, KERNEL_FAMILIES[family].needs)


def default_family(arch: ArchFacts) -> str:
    """sm90 where wgmma exists, else the portable sm80 family.

    sm_100a gets sm80 too: its native tcgen05 kernels are not written yet.
    """
    return "sm90" if arch.wgmma else "sm80"
