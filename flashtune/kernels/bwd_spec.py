"""BwdSpec: one specialisation of a backward kernel. Two kernels, FlashAttention-2's algorithm in
both:
* mma.sync (csrc/backward/), for every arch from sm_80: the sm80 family's profiles (the A100, the
  RTX cards, and the H100/H200 under h200-sm80), and deterministic=True on every profile;
* wgmma and TMA (csrc/sm90_bwd/), sm_90a: the sm90 family's profiles.

Like KernelSpec it is the single source of its kernels' names, generated source and cache key:
`flashtune_bwd_bf16_h128_64x64_w4_c_sm90a` (dtype, head dim, keys x queries per step, warps,
causal, arch) names an mma.sync dK/dV kernel, which adds dQ by atomics (`_q1` or `_q2` before the
arch: its query-block stages pinned off the arch's choice; `_k16`: 8 warps in the 16-key layout
where the arch would take the tiled one); with `_det`
(deterministic=True, FlashAttention's name) it leaves dQ to `<name>_dq`, a kernel that sums it in a
fixed order. `flashtune_bwd_bf16_h128_128x64_wg2_c_sm90a` (keys x queries, two consumer warpgroups)
names a wgmma kernel, which adds dQ by TMA reduce-adds. Each library also holds `<name>_prep`,
`<name>_finish` and `<name>_group` (csrc/backward/passes.cuh: rowsum(dO O) and dQ's zeros before
the kernel, dQ scaled and converted after it, with GQA each KV head's dK and dV summed), which its
launcher runs around it.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from flashtune.kernels.arch import ArchFacts, get_arch
from flashtune.kernels.spec import BASE_NVCC_FLAGS, DTYPES, SpecError, build_inputs_hash, source_files
from flashtune.kernels.tiles import REGISTERS_PER_SM, RESERVED_SMEM_PER_CTA

BWD_SOURCES = ("common", "sm80", "backward")  # csrc/ folders the mma.sync kernel includes
WGMMA_BWD_SOURCES = ("common", "sm90", "sm90_bwd", "backward")  # and the wgmma kernel
BWD_HEAD_DIMS = (64, 128, 256)
WGMMA_BWD_HEAD_DIMS = (64, 128)  # hdim 256 takes the mma.sync kernel on every arch
BWD_WARPS = (4, 2, 8)  # 64 keys x 64 queries, 32 x 32, 128 x 64 (hdim 256: 32 x 32, -, 64 x 64)
# The first that fits the arch's shared memory: on an H100 (lab/bwd_ab.py) 8 warps took 0.74-0.93x
# 4 warps' time at hdim 64/128 and 0.55-0.62x at 256 (half the dQ adds per key; FlashAttention-2's tile)
DEFAULT_BWD_WARPS = (8, 4, 2)
DETERMINISTIC_BWD_WARPS = (4, 2)  # the dQ kernel's warp per 16 queries
KV_SPLIT_HEAD_DIM = 256  # the 16-key layout's two warps sharing 16 keys' dK and dV (kernel_traits.cuh kKvSplit)
WGMMA_BWD_KEYS = 128  # the wgmma kernel's keys per CTA (two consumer warpgroups of 64)
WGMMA_BWD_STAGES = 2
MMA_SYNC_BWD_REGISTERS = 255  # what ptxas gives the mma.sync kernels a thread (219-255 at every tile)


def wgmma_bwd_queries(hdim: int) -> int:
    """csrc/sm90_bwd/kernel_traits.cuh's kBlockM: queries per step."""
    return 128 if hdim == 64 else 64


def mma_sync_bwd_keys(hdim: int, warps: int, tiled: bool = False) -> int:
    """csrc/backward/kernel_traits.cuh's kBlockN: keys per CTA (16 a warp; at hdim 256 16 a pair;
    tiled, FlashAttention-2's tiles: 128, 64 at hdim 256)."""
    if tiled:
        return 64 if hdim == 256 else 128
    return 16 * warps // (2 if hdim == KV_SPLIT_HEAD_DIM else 1)


def mma_sync_bwd_queries(hdim: int, warps: int, tiled: bool = False) -> int:
    """csrc/backward/kernel_traits.cuh's kBlockM: queries per step (the 16-key layouts 16 per warp,
    at most 64; at hdim 256 as many as the keys; tiled, FlashAttention-2's tiles: 8192 / hdim, 64 at
    hdim 256)."""
    if tiled:
        return 64 if hdim == 256 else 8192 // hdim
    if hdim == KV_SPLIT_HEAD_DIM:
        return mma_sync_bwd_keys(hdim, warps)
    return min(64, 16 * warps)


def bwd_smem_bytes(hdim: int, warps: int, wgmma: bool = False, q_stages: int = 1, tiled: bool = False) -> int:
    """The kernel traits' kSmemBytes. mma.sync (csrc/backward/): K, V, q_stages of a query block's
    Q, dO and two rows of statistics, dS^T (at hdim 256 and in the tiled layout P^T too); wgmma
    (csrc/sm90_bwd/): K, V, a ring of Q, dO and statistics, two dS^T, the two consumer warpgroups'
    64 x 64 fp32 dQ staging tiles and the 1024-byte alignment's slack."""
    if wgmma:
        keys, queries, stages = WGMMA_BWD_KEYS, wgmma_bwd_queries(hdim), WGMMA_BWD_STAGES
        dq_staging = 2 * 64 * 64 * 4
        return (2 * keys * hdim * 2 + stages * (2 * queries * hdim * 2 + 2 * queries * 4) + 2 * keys * queries * 2
                + dq_staging + 1024)
    keys, queries = mma_sync_bwd_keys(hdim, warps, tiled), mma_sync_bwd_queries(hdim, warps, tiled)
    score_tiles = 2 if hdim == KV_SPLIT_HEAD_DIM or tiled else 1
    stage = 2 * queries * 2 * hdim + 2 * queries * 4  # Q, dO, the LSE and rowsum(dO O)
    return 2 * keys * 2 * hdim + q_stages * stage + score_tiles * keys * queries * 2


def tiled_layout_takes(hdim: int, warps: int) -> bool:
    """kernel_traits.cuh's rule for kTiled: the layout is 8 warps' at every head dim (and not the
    deterministic build's, whose dQ kernel takes 2 or 4 warps)."""
    return warps == 8


@functools.cache  # asked on every read of a spec's name, like bwd_q_stages
def mma_sync_bwd_tiled(arch: ArchFacts, hdim: int, warps: int) -> bool:
    """The arch's choice of kernel_traits.cuh's kTiled: 8 warps take tiled_kernel.cuh's layout
    (FlashAttention-2's warp grids, P^T and dS^T through shared memory) where its one stage fits the
    arch's shared memory. On the RTX cards' 99 KB it does not (129 KB at hdim 64, 145 KB at 256), and
    hdim 64 keeps the 16-key layout's 8 warps (81 KB) rather than fall to 4."""
    return tiled_layout_takes(hdim, warps) and bwd_smem_bytes(hdim, warps, tiled=True) <= arch.max_smem_per_block


@functools.cache  # a BwdSpec asks at construction and on every read of its name; fixed per arch and tile
def bwd_q_stages(arch: ArchFacts, hdim: int, warps: int, tiled: bool | None = None) -> int:
    """The mma.sync kernel's query-block stages (kernel_traits.cuh's kQStages): 2, the next block's
    loads under this one's math, where the second stage fits the arch without costing CTAs an SM;
    with about 255 registers a thread 8 warps have an SM to themselves, 4 warps two and 2 warps four,
    and an RTX card's 100 KB of shared memory would lose one of the two CTAs of 4 warps at hdim 64
    (and cannot hold two stages at hdim 128). tiled: the layout (None: the arch's, mma_sync_bwd_tiled)."""
    by_registers = max(1, REGISTERS_PER_SM // (MMA_SYNC_BWD_REGISTERS * 32 * warps))
    if tiled is None:
        tiled = mma_sync_bwd_tiled(arch, hdim, warps)

    def ctas(stages: int) -> int:
        return min(by_registers, arch.smem_per_sm // (bwd_smem_bytes(hdim, warps, q_stages=stages, tiled=tiled)
                                                      + RESERVED_SMEM_PER_CTA))

    two = bwd_smem_bytes(hdim, warps, q_stages=2, tiled=tiled)
    return 2 if two <= arch.max_smem_per_block and ctas(2) >= ctas(1) else 1


def dq_kernel_smem_bytes(hdim: int, warps: int) -> int:
    """The deterministic dQ kernel's kDqSmemBytes: K and V of a key block, Q and dO of 16 queries a warp."""
    return 2 * (mma_sync_bwd_keys(hdim, warps) + 16 * warps) * 2 * hdim


@dataclass(frozen=True)
class BwdSpec:
    arch: str   # nvcc target, e.g. "sm_80", "sm_89", "sm_90a", "sm_120"
    dtype: str  # "float16" or "bfloat16"
    hdim: int
    warps: int
    causal: bool
    deterministic: bool = False  # dQ bit-reproducible: a dQ kernel of its own, no atomics
    nvcc_flags: tuple[str, ...] = ()  # the profile's extra flags
    wgmma: bool = False  # the Hopper kernel (csrc/sm90_bwd/); `warps` is then 8 (two warpgroups)
    # mma.sync: query-block stages in shared memory, 0 for the arch's choice (bwd_q_stages; the spec
    # then holds it); pinned to the other count, the name says so (`_q1`): what the GPU tests use to
    # run the RTX cards' one-stage kernels on an H100/H200
    q_stages: int = 0
    # mma.sync: tiled_kernel.cuh's layout (8 warps), None for the arch's choice
    # (mma_sync_bwd_tiled; the spec then holds it); pinned off it, the name says so (`_k16`): what
    # the GPU tests use to run the RTX cards' 16-key 8-warp kernel at hdim 64 on an H100/H200
    tiled: bool | None = None

    fp8 = False  # no FP8 backward (verify's SASS check asks)

    @property
    def family(self) -> str:
        """What verify's SASS check knows the kernel by (commands/verify.py FAMILY_SASS)."""
        return "backward-wgmma" if self.wgmma else "backward"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise SpecError(f"dtype {self.dtype!r} is not supported; allowed: {', '.join(DTYPES)}")
        if self.hdim not in BWD_HEAD_DIMS:
            raise SpecError(f"the backward kernel takes head dims {', '.join(map(str, BWD_HEAD_DIMS))}, "
                            f"not {self.hdim}")
        if self.wgmma:
            if self.arch != "sm_90a":
                raise SpecError(f"the wgmma backward kernel needs sm_90a, not {self.arch}")
            if self.deterministic:
                raise SpecError("the wgmma backward kernel adds dQ by TMA reduce-adds in no fixed order; "
                                "deterministic=True is the mma.sync kernel's")
            if self.warps != 8:
                raise SpecError(f"the wgmma backward kernel has 8 consumer warps, not {self.warps}")
            if self.hdim not in WGMMA_BWD_HEAD_DIMS:
                raise SpecError(f"the wgmma backward kernel takes head dims "
                                f"{', '.join(map(str, WGMMA_BWD_HEAD_DIMS))}, not {self.hdim}")
        elif self.warps not in BWD_WARPS:
            raise SpecError(f"warps {self.warps}; allowed: {', '.join(map(str, BWD_WARPS))}")
        elif self.hdim == KV_SPLIT_HEAD_DIM and self.warps < 4:
            raise SpecError(f"the backward kernel at hdim {self.hdim} takes 4 or 8 warps, not {self.warps}")
        elif self.deterministic and self.warps not in DETERMINISTIC_BWD_WARPS:
            raise SpecError(f"deterministic=True: the dQ kernel takes warps "
                            f"{' or '.join(map(str, DETERMINISTIC_BWD_WARPS))}, not {self.warps}")
        if self.q_stages not in (0, 1, 2) or (self.wgmma and self.q_stages):
            raise SpecError(f"q_stages {self.q_stages}: the mma.sync kernel takes 1 or 2 (0: the arch's "
                            f"choice); the wgmma kernel has a ring of its own (0)")
        if self.tiled is None:
            object.__setattr__(self, "tiled", self.default_tiled)
        elif self.tiled and (self.wgmma or self.deterministic or not tiled_layout_takes(self.hdim, self.warps)):
            raise SpecError("the tiled layout is the mma.sync kernel's at 8 warps, "
                            "without deterministic=True")
        if not self.wgmma and not self.q_stages:
            object.__setattr__(self, "q_stages", self.default_q_stages)
        limit = self.arch_facts.max_smem_per_block
        if self.smem_bytes > limit:
            raise SpecError(f"the backward kernel at hdim {self.hdim} with {self.warps} warps needs "
                            f"{self.smem_bytes} bytes of shared memory; {self.arch} has {limit}")
        if self.deterministic and dq_kernel_smem_bytes(self.hdim, self.warps) > limit:
            raise SpecError(f"the deterministic dQ kernel at hdim {self.hdim} with {self.warps} warps needs "
                            f"{dq_kernel_smem_bytes(self.hdim, self.warps)} bytes of shared memory; "
                            f"{self.arch} has {limit}")

    @property
    def arch_facts(self) -> ArchFacts:
        return get_arch(self.arch)

    @property
    def block(self) -> int:
        """Keys per CTA."""
        return WGMMA_BWD_KEYS if self.wgmma else mma_sync_bwd_keys(self.hdim, self.warps, self.tiled)

    @property
    def block_m(self) -> int:
        """Queries per step of a CTA's loop."""
        return wgmma_bwd_queries(self.hdim) if self.wgmma else mma_sync_bwd_queries(self.hdim, self.warps, self.tiled)

    @property
    def name(self) -> str:
        workers = f"wg{self.warps // 4}" if self.wgmma else f"w{self.warps}"
        parts = ["flashtune_bwd", DTYPES[self.dtype][0], f"h{self.hdim}", f"{self.block}x{self.block_m}", workers]
        if self.causal:
            parts.append("c")
        if self.deterministic:
            parts.append("det")
        if self.tiled != self.default_tiled:
            parts.append("tiled" if self.tiled else "k16")
        if not self.wgmma and self.q_stages != self.default_q_stages:
            parts.append(f"q{self.q_stages}")
        parts.append(self.arch.replace("_", ""))
        return "_".join(parts)

    @property
    def launcher_symbol(self) -> str:
        return f"{self.name}_launch"

    @property
    def threads(self) -> int:
        return 32 * self.warps + (128 if self.wgmma else 0)  # + the wgmma kernel's producer warpgroup

    @property
    def default_tiled(self) -> bool:
        """The arch's layout for the mma.sync kernel (mma_sync_bwd_tiled); not with deterministic=True."""
        return not self.wgmma and not self.deterministic and mma_sync_bwd_tiled(self.arch_facts, self.hdim, self.warps)

    @property
    def default_q_stages(self) -> int:
        """The arch's query-block stages for the mma.sync kernel in the spec's layout (bwd_q_stages)."""
        return bwd_q_stages(self.arch_facts, self.hdim, self.warps, self.tiled)

    @property
    def smem_bytes(self) -> int:
        return bwd_smem_bytes(self.hdim, self.warps, self.wgmma, self.q_stages, self.tiled)

    @property
    def companion_names(self) -> tuple[str, ...]:
        """The other kernels one backward launches (csrc/backward/passes.cuh): the prep pass before
        it, the finish pass after it, the group pass with GQA, and the deterministic build's dQ kernel."""
        return (f"{self.name}_prep", f"{self.name}_finish", f"{self.name}_group",
                *((f"{self.name}_dq",) if self.deterministic else ()))

    def launch_order(self, gqa: bool) -> list[str]:
        """The kernels one backward call launches, in order (with GQA: the group pass last)."""
        prep, finish, group, *dq = self.companion_names
        return [prep, self.name, *dq, finish, *([group] if gqa else [])]

    def source(self) -> str:
        elem = DTYPES[self.dtype][1]
        if self.wgmma:
            causal = "true" if self.causal else "false"
            kernels = f"""#include "sm90_bwd/launch.cuh"

namespace {{
using Cfg = flashtune::sm90_bwd::Traits<{elem}, {self.hdim}, {causal}>;
}}

extern "C" __global__ void __launch_bounds__(Cfg::kThreads, 1)
{self.name}(const __grid_constant__ flashtune::BwdParams params,
{" " * len(self.name)} const __grid_constant__ flashtune::sm90_bwd::BwdTmaMaps maps) {{
  flashtune::sm90_bwd::bwd_body<Cfg>(params, maps);
}}
"""
            main_launch = f"flashtune::sm90_bwd::launch<Cfg>({self.name}, *params, stream)"
        else:
            flags = ", ".join("true" if on else "false" for on in (self.causal, self.deterministic))
            tiled = "true" if self.tiled else "false"
            dq = f"{self.name}_dq" if self.deterministic else None
            dq_kernel = f"""
extern "C" __global__ void __launch_bounds__(Cfg::kThreads)
{dq}(const flashtune::BwdParams params) {{
  flashtune::bwd::dq_body<Cfg>(params);
}}
""" if dq else ""
            kernels = f"""#include "backward/launch.cuh"

namespace {{
using Cfg = flashtune::bwd::Traits<{elem}, {self.hdim}, {self.warps}, {flags}, {self.q_stages}, {tiled}>;
}}

extern "C" __global__ void __launch_bounds__(Cfg::kThreads)
{self.name}(const flashtune::BwdParams params) {{
  flashtune::bwd::dkdv_body<Cfg>(params);
}}
{dq_kernel}"""
            main_launch = f"flashtune::bwd::launch<Cfg>({self.name}, {dq or 'nullptr'}, *params, stream)"
        prep, finish, group = self.companion_names[:3]
        # dq_accum's layout for the finish pass's reads (csrc/backward/dq_layout.cuh): the tiled
        # kernel's strips, else q's rows
        dq_layout = f"flashtune::bwd::DqStrips<{self.hdim}>" if self.tiled else "flashtune::bwd::DqRows"
        return f"""// Generated by flashtune for {self!r}. Do not edit: edit csrc/ and rebuild.
#include "backward/passes.cuh"
{kernels}
extern "C" __global__ void __launch_bounds__(flashtune::bwd::kPassThreads)
{prep}(const flashtune::BwdParams params) {{
  flashtune::bwd::prep_body<{elem}, {self.hdim}>(params);
}}

extern "C" __global__ void __launch_bounds__(flashtune::bwd::kPassThreads)
{finish}(const flashtune::BwdParams params) {{
  flashtune::bwd::finish_body<{elem}, {self.hdim}, {dq_layout}>(params);
}}

extern "C" __global__ void __launch_bounds__(flashtune::bwd::kPassThreads)
{group}(const flashtune::BwdParams params) {{
  flashtune::bwd::group_body<{elem}, {self.hdim}>(params);
}}

extern "C" int {self.launcher_symbol}(const flashtune::BwdParams* params, void* stream) {{
  return flashtune::bwd::launch_with_passes<{self.hdim}>(
      {prep}, {finish}, {group}, *params, stream,
      [&] {{ return {main_launch}; }});
}}
"""

    def nvcc_flags_all(self) -> list[str]:
        return [*BASE_NVCC_FLAGS, *self.nvcc_flags]

    def source_hash(self) -> str:
        return build_inputs_hash(self, source_files(WGMMA_BWD_SOURCES if self.wgmma else BWD_SOURCES))


@dataclass(frozen=True)
class BwdTile:
    """A profile's backward kernel for one head dim (`backward: {tiles: [...]}`): the wgmma kernel
    (sm_90a; dQ by TMA reduce-adds) or the mma.sync kernel with 4, 2 or 8 warps (64, 32 or 128 keys
    a CTA; dQ by atomics)."""
    kernel: str  # "wgmma" or "mma_sync"
    warps: int = 4  # mma_sync: 4, 2 or 8; wgmma: 8 (two consumer warpgroups)

    def label(self) -> str:
        return "wgmma" if self.kernel == "wgmma" else f"mma.sync, {self.warps} warps"


WGMMA_TILES = (BwdTile("wgmma", 8),)
MMA_SYNC_TILES = tuple(BwdTile("mma_sync", w) for w in BWD_WARPS)


def bwd_spec_of_tile(arch: str, dtype: str, hdim: int, causal: bool, tile: BwdTile, deterministic: bool = False,
                     nvcc_flags: tuple[str, ...] = ()) -> BwdSpec:
    """The spec of a tile. deterministic=True takes the mma.sync kernel (its fixed-order dQ kernel):
    with the tile's warps where the dQ kernel takes them, else the first of them that fits the arch
    (for the wgmma kernel's tiles and 8 warps)."""
    if deterministic and (tile.kernel == "wgmma" or tile.warps not in DETERMINISTIC_BWD_WARPS):
        tile = default_deterministic_tile(get_arch(arch), hdim)
    if tile.kernel == "wgmma":
        return BwdSpec(arch, dtype, hdim, 8, causal, False, nvcc_flags, wgmma=True)
    return BwdSpec(arch, dtype, hdim, tile.warps, causal, deterministic, nvcc_flags)


def bwd_tile_problems(hdim: int, tile: BwdTile, arch: ArchFacts, deterministic: bool = False) -> list[str]:
    """Why a backward tile cannot run at this head dim on this arch (empty: it can); deterministic:
    as the fixed-order build (its dQ kernel's shared memory too; an mma.sync tile of
    DETERMINISTIC_BWD_WARPS)."""
    if hdim not in BWD_HEAD_DIMS:
        return [f"the backward kernels take head dims {', '.join(map(str, BWD_HEAD_DIMS))}, not {hdim}"]
    if tile not in (*WGMMA_TILES, *MMA_SYNC_TILES):
        return [f"{tile}: not a backward tile; allowed: kernel wgmma, or kernel mma_sync "
                f"with warps {' or '.join(map(str, BWD_WARPS))}"]
    try:
        bwd_spec_of_tile(arch.name, "bfloat16", hdim, False, tile, deterministic)
    except SpecError as err:
        return [str(err)]
    return []


def _first_that_fits(tiles: list[BwdTile], arch: ArchFacts, hdim: int, deterministic: bool = False) -> BwdTile:
    for tile in tiles:
        if not bwd_tile_problems(hdim, tile, arch, deterministic):
            return tile
    return tiles[-1]  # its spec says why it does not fit


@functools.cache  # Profile.backward_tile asks on every backward call; the answer is fixed per arch
def default_bwd_tile(family: str, arch: ArchFacts, hdim: int) -> BwdTile:
    """The sm90 family's: the wgmma kernel (below hdim 256); every other: the mma.sync kernel with 8
    warps where its shared memory fits the arch, else 4, else 2."""
    if family == "sm90" and not bwd_tile_problems(hdim, WGMMA_TILES[0], arch):
        return WGMMA_TILES[0]
    return _first_that_fits([BwdTile("mma_sync", w) for w in DEFAULT_BWD_WARPS], arch, hdim)


@functools.cache
def default_deterministic_tile(arch: ArchFacts, hdim: int) -> BwdTile:
    """deterministic=True's mma.sync tile where the profile's cannot be: the first of
    DETERMINISTIC_BWD_WARPS whose kernels (the dQ kernel's shared memory included) fit the arch."""
    return _first_that_fits([BwdTile("mma_sync", w) for w in DETERMINISTIC_BWD_WARPS], arch, hdim, True)


def default_bwd_spec(arch: str, dtype: str, hdim: int, causal: bool, deterministic: bool = False,
                     nvcc_flags: tuple[str, ...] = (), family: str = "sm80") -> BwdSpec:
    """The family's default tile's spec (default_bwd_tile)."""
    tile = default_bwd_tile(family, get_arch(arch), hdim) if hdim in BWD_HEAD_DIMS else MMA_SYNC_TILES[0]
    return bwd_spec_of_tile(arch, dtype, hdim, causal, tile, deterministic, nvcc_flags)


def bwd_spec_for_profile(profile, dtype: str, hdim: int, causal: bool, deterministic: bool = False) -> BwdSpec:
    """The backward kernel a profile's calls launch (its tile for the head dim: profile.backward_tile):
    the one place a profile becomes a BwdSpec, for the runtime, `flashtune verify` and `flashtune build`."""
    return bwd_spec_of_tile(profile.arch.name, dtype, hdim, causal, profile.backward_tile(hdim), deterministic,
                            profile.nvcc_flags)


def bwd_specs_for_profile(profile, arch: str | None = None, dtypes=None, hdims=None) -> list[BwdSpec]:
    """The backward kernels a profile's calls can launch (optionally narrowed), for `flashtune build`:
    each dtype and head dim the kernel takes, causal and not (the deterministic ones are built on
    first use)."""
    target = arch or profile.arch.name
    return [bwd_spec_of_tile(target, dtype, hdim, causal, profile.backward_tile(hdim), nvcc_flags=profile.nvcc_flags)
            for dtype in dtypes or profile.dtypes for hdim in hdims or profile.head_dims if hdim in BWD_HEAD_DIMS
            for causal in (False, True)]
