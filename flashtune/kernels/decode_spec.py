"""DecodeSpec: one specialisation of the decode kernels (csrc/decode/), the split kernel and its
combine kernel in one library, for few query rows against a KV cache.

Like KernelSpec it is the single source of its kernels' names, generated source and cache key:
`flashtune_decode_bf16_h128_m16x32_w4_s3_c_paged_sm90a` (dtype, head dim, packed query rows x keys
per warp step, warps, stages per warp, causal, how keys are addressed, arch; `e4m3kv` for an e4m3
KV cache, `softcap`, `swa` and `sinks` for the variants built in) names the split kernel; `<name>_combine` is the combine kernel the profiler shows beside it. The kernels use
mma.sync and cp.async, so one source serves the sm80 and sm90 families (decode is bound by the
cache read, which cp.async rings per warp keep in flight without TMA).
"""
from __future__ import annotations

from dataclasses import dataclass

from flashtune.kernels.arch import ArchFacts, get_arch
from flashtune.kernels.spec import BASE_NVCC_FLAGS, DTYPES, SpecError, build_inputs_hash, source_files
from flashtune.kernels.tiles import RESERVED_SMEM_PER_CTA, computed_head_dim
from flashtune.kernels.variants import NO_VARIANTS, Variants

DECODE_SOURCES = ("common", "sm80", "decode")  # csrc/ folders the kernels include
PAGINGS = ("contiguous", "paged", "gather")  # csrc/decode/kernel_traits.cuh's Paging, in order
DECODE_ROWS = (16, 32)
DECODE_BLOCK_N = (16, 32, 48, 64)
DECODE_WARPS = (2, 4, 8)
DECODE_STAGES = (2, 3, 4, 6, 8)  # deep rings for the tiles whose accumulators keep block_n small
REGISTER_BUDGET = 192  # O and S accumulators per thread (kernel_traits.cuh's static_assert)

# The family's default tiles, per (head dim, packed rows): the (keys per warp step, warps, stages)
# to try in order, the first that fits the arch's shared memory. Decode is bound by the cache
# read, so the ring is sized to keep 100-200 KB in flight per SM where the arch has the memory
# (sm_90, sm_80), about half that on the 99 KB RTX parts; 32 packed rows double the O
# accumulators, so they take 16 keys a step. At hdim 256, 32 rows are two row groups of 16
# (decode_row_groups): 8 warps keep as many keys in flight as 16 rows' 4. A profile's
# `decode: {tiles: ...}` overrides them.
DEFAULT_TILE_ORDER = {
    (64, 16): ((64, 4, 3), (32, 4, 3), (32, 4, 2), (16, 4, 2)),
    (128, 16): ((32, 4, 3), (32, 4, 2), (16, 4, 2), (16, 2, 2)),
    (256, 16): ((16, 4, 3), (16, 4, 2), (16, 2, 2)),
    (64, 32): ((16, 4, 4), (16, 4, 3), (16, 4, 2)),
    (128, 32): ((16, 4, 4), (16, 4, 3), (16, 4, 2), (16, 2, 2)),
    (256, 32): ((16, 8, 3), (16, 8, 2), (16, 4, 2)),
}


def decode_tile_keys(hdims) -> list[tuple[int, int]]:
    """The (head dim, packed rows) pairs a decode tile is chosen for: 16 and 32 rows at each built
    head dim (at hdim 256, 32 rows are two row groups)."""
    return [(hdim, rows) for hdim in hdims for rows in DECODE_ROWS if (hdim, rows) in DEFAULT_TILE_ORDER]


@dataclass(frozen=True)
class DecodeTile:
    rows: int      # packed query rows per CTA (heads of a KV group x positions): 16 or 32
    block_n: int   # keys per warp step
    warps: int
    stages: int    # K/V tiles in each warp's cp.async ring

    @property
    def label(self) -> str:
        return f"m{self.rows}x{self.block_n}_w{self.warps}_s{self.stages}"


def decode_row_groups(hdim: int, rows: int) -> int:
    """kernel_traits.cuh's kRowGroups: the warps that share a key group's ring, each computing 16
    of the rows, where a warp cannot hold all the rows' O (32 rows at hdim 256); else 1."""
    return rows // 16 if (computed_head_dim(hdim) or hdim) > 128 else 1


def decode_ring_bytes(hdim: int, tile: DecodeTile, kv_fp8: bool = False) -> int:
    """The K and V tiles every key group's cp.async ring holds (an FP8 cache's at 1 byte an
    element): the bytes a CTA keeps in flight; rows at the built head dim the head dim is computed at."""
    rings = tile.warps // decode_row_groups(hdim, tile.rows)
    return rings * tile.stages * 2 * tile.block_n * (computed_head_dim(hdim) or hdim) * (1 if kv_fp8 else 2)


def decode_smem_bytes(hdim: int, tile: DecodeTile, kv_fp8: bool = False) -> int:
    """kernel_traits.cuh's kSmemBytes: Q, the rings, or the merge's fp32 O of each warp's rows
    over them, the merge's maxima and sums; rows at the built head dim the head dim is computed at."""
    hdim = computed_head_dim(hdim) or hdim
    row_bytes = 2 * hdim
    warp_rows = tile.rows // decode_row_groups(hdim, tile.rows)
    ring = decode_ring_bytes(hdim, tile, kv_fp8)
    merge_o = tile.warps * warp_rows * (hdim + (4 if kv_fp8 else 8)) * 4  # rows padded as kMergeRowFloats
    return tile.rows * row_bytes + max(ring, merge_o) + 2 * tile.warps * warp_rows * 4


def decode_tile_problems(hdim: int, tile: DecodeTile, arch: ArchFacts, kv_fp8: bool = False) -> list[str]:
    """Why the kernel cannot be built with this tile (empty: it can); kernel_traits.cuh's rules."""
    problems = []
    if computed_head_dim(hdim) is None:
        problems.append(f"hdim {hdim}: the decode kernels take multiples of 8 from 32 to 256")
        return problems
    if kv_fp8 and hdim % 16:
        problems.append(f"hdim {hdim}: an e4m3 cache's rows are whole 16-byte chunks, so its head dim is a "
                        "multiple of 16")
    hdim = computed_head_dim(hdim)  # what the tile holds
    for value, allowed, what in ((tile.rows, DECODE_ROWS, "rows"), (tile.block_n, DECODE_BLOCK_N, "block_n"),
                                 (tile.warps, DECODE_WARPS, "warps"), (tile.stages, DECODE_STAGES, "stages")):
        if value not in allowed:
            problems.append(f"{what} {value}; allowed: {', '.join(map(str, allowed))}")
    groups = decode_row_groups(hdim, tile.rows)
    if (tile.rows // groups // 16) * (hdim + tile.block_n) // 2 > REGISTER_BUDGET:
        problems.append(f"rows {tile.rows} x (hdim {hdim} + block_n {tile.block_n}) accumulators do not fit "
                        "in registers; use 16 rows")
    if groups > 1:  # kernel_traits.cuh's and kv_loader.cuh's rules for a shared ring
        if tile.warps % groups:
            problems.append(f"{tile.rows} rows at hdim {hdim} are {groups} row groups sharing each ring: "
                            f"warps must be a multiple of {groups}")
        if kv_fp8:
            problems.append(f"{tile.rows} rows at hdim {hdim} share rings between warps, which reads 16-bit caches "
                            "only; an e4m3 cache takes 16 rows")
        if (tile.block_n // max(1, 32 // (2 * hdim // 16))) % groups:
            problems.append(f"block_n {tile.block_n}: {groups} warps copy equal runs of a tile's rows")
    smem = decode_smem_bytes(hdim, tile, kv_fp8)
    if smem + RESERVED_SMEM_PER_CTA > arch.max_smem_per_block:
        problems.append(f"{smem} bytes of shared memory; {arch.name} allows {arch.max_smem_per_block}")
    if not arch.mma_sync:
        problems.append(f"{arch.name} has no mma.sync")
    if kv_fp8 and not arch.fp8:
        problems.append(f"an e4m3 KV cache needs FP8 conversions in hardware, which {arch.name} lacks "
                        "(sm_89, sm_90 and sm_120 have them)")
    return problems


def decode_rows(seqlen_q: int, head_ratio: int, hdim: int, short: bool = False, kv_fp8: bool = False) -> int:
    """Packed query rows per CTA: 32 when more than 16 rows share a KV head (at hdim 256 as two
    row groups, which an e4m3 cache lacks), else 16. A short call (runtime/decode_splits.py's short_call)
    whose 17-32 rows would fill one 32-row block takes two 16-row blocks instead: each CTA does half
    the math per key, the second read of a key mostly from L2 (MQA with one token on an H100: 9.2
    against 11.6 us at 1 x 1k keys, hdim 128; lab/results/2026-12-05_short-calls/mqa-rows.json)."""
    rows = seqlen_q * head_ratio
    if rows <= 16 or (kv_fp8 and decode_row_groups(hdim, 32) > 1) or (short and rows <= 32):
        return 16
    return 32


def e4m3_cache_tile(tile: DecodeTile) -> DecodeTile:
    """An e4m3 cache's tile for a 16-bit cache's: twice the stages (8 at most), so its ring holds
    the same bytes, twice the keys, in flight (decode is bound by the bytes in flight per SM: with
    the 16-bit tile's ring an e4m3 cache read at the same keys a second, 1.01-1.08x slower)."""
    stages = min(DECODE_STAGES[-1], 2 * tile.stages)
    stages = max(s for s in DECODE_STAGES if s <= stages)
    return DecodeTile(tile.rows, tile.block_n, tile.warps, stages)


def default_decode_tile(arch: ArchFacts, hdim: int, rows: int) -> DecodeTile:
    """The family's first tile for the built head dim `hdim` is computed at that fits the arch
    (with a 16-bit cache; an e4m3 cache takes e4m3_cache_tile of it, whose ring is the same size)."""
    hdim = computed_head_dim(hdim) or hdim
    for block_n, warps, stages in DEFAULT_TILE_ORDER[hdim, rows]:
        tile = DecodeTile(rows, block_n, warps, stages)
        if not decode_tile_problems(hdim, tile, arch):
            return tile
    raise ValueError(f"no decode tile fits hdim {hdim} on {arch.name}")


CLUSTER_SPLITS = 8  # csrc/decode/cluster_merge.cuh's kMaxClusterSplits: the portable cluster size


@dataclass(frozen=True)
class DecodeSplitPolicy:
    """The constants of decode's split-count cost model (runtime/decode_splits.py): a CTA streams
    the bytes its ring keeps in flight once per ring_turnaround_us; a combine kernel costs combine_us
    plus its fp32 partials (written and read) at combine_gbps; up to cluster_splits splits (0: none;
    at most CLUSTER_SPLITS) merge in a thread block cluster instead, where the arch has clusters, for
    cluster_us; the memory reads at memory_gbps (None: the device's own peak, from its memory clock
    and bus width). At most max_splits. Fitted to every split count on 44 cells of an H100, in two
    runs (lab/decode_splits.py, lab/fit_split_model.py): the count it picks is 0.4% slower than the
    fastest in geomean, 4% at most, where the wave rule it replaced lost 5% and 52%. cluster_us from
    the same split counts merged both ways on 22 short calls of an H100 (lab/cluster_ab.py): 2.2-2.8
    us where the combine kernel is modelled at 4 us plus its partials. A call that reads its K/V in
    at most short_call_us at the memory's peak is short: 17-32 packed rows take two 16-row blocks
    (decode_rows; 0: never). 6 us: on an H100 (3.35 TB/s) the 16-row tile won every MQA one-token
    call of 16 MB or less (8-26%) and lost 4 of the 5 of 32 MB or more (2-5%)."""
    ring_turnaround_us: float = 4.0
    combine_us: float = 4.0
    combine_gbps: float = 2400.0
    memory_gbps: float | None = None
    max_splits: int = 128
    cluster_splits: int = CLUSTER_SPLITS
    cluster_us: float = 2.5
    short_call_us: float = 6.0


@dataclass(frozen=True)
class DecodeSpec:
    arch: str
    dtype: str
    hdim: int
    tile: DecodeTile
    causal: bool
    paging: str = "contiguous"
    nvcc_flags: tuple[str, ...] = ()
    kv_fp8: bool = False  # an e4m3 KV cache (descales per sequence and KV head); q and o in `dtype`
    variants: Variants = NO_VARIANTS  # built in: softcap, window, sinks, alibi (kernels/variants.py)

    family = "decode"
    fp8 = False  # FP8 Q/K (the prefill kernels' twins): never in decode

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise SpecError(f"dtype {self.dtype!r} is not supported; allowed: {', '.join(DTYPES)}")
        if self.paging not in PAGINGS:
            raise SpecError(f"paging {self.paging!r}; allowed: {', '.join(PAGINGS)}")
        problems = decode_tile_problems(self.hdim, self.tile, self.arch_facts, self.kv_fp8)
        if problems:
            raise SpecError(f"decode tile {self.tile.label} for hdim {self.hdim} on {self.arch}: "
                            + "; ".join(problems))

    @property
    def arch_facts(self) -> ArchFacts:
        return get_arch(self.arch)

    @property
    def name(self) -> str:
        parts = ["flashtune_decode", DTYPES[self.dtype][0], f"h{self.hdim}", self.tile.label]
        if self.causal:
            parts.append("c")
        if self.paging != "contiguous":
            parts.append(self.paging)
        if self.kv_fp8:
            parts.append("e4m3kv")
        parts += self.variants.names
        parts.append(self.arch.replace("_", ""))
        return "_".join(parts)

    @property
    def combine_name(self) -> str:
        return f"{self.name}_combine"

    @property
    def launcher_symbol(self) -> str:
        return f"{self.name}_launch"

    @property
    def cluster_slots_symbol(self) -> str:
        """`int <name>_cluster_slots(int splits)`: CTAs that run at once in clusters of `splits`."""
        return f"{self.name}_cluster_slots"

    @property
    def threads(self) -> int:
        return 32 * self.tile.warps

    @property
    def key_groups(self) -> int:
        """Warps (or groups of row-group warps sharing a ring) that walk keys of their own."""
        return self.tile.warps // decode_row_groups(self.hdim, self.tile.rows)

    @property
    def min_blocks_per_split(self) -> int:
        """A split's fewest key blocks (runtime/decode_splits.py's most_splits): two per key group."""
        return 2 * self.key_groups

    def fewest_blocks_per_split(self, short: bool = False) -> int:
        """... and in a short call (decode_splits.short_call), one per key group: there a CTA's
        latency, not the memory, bounds the call."""
        return self.key_groups if short else self.min_blocks_per_split

    @property
    def smem_bytes(self) -> int:
        return decode_smem_bytes(self.hdim, self.tile, self.kv_fp8)

    @property
    def ring_bytes(self) -> int:
        """K and V bytes a CTA keeps in flight (the split cost model's stream rate)."""
        return decode_ring_bytes(self.hdim, self.tile, self.kv_fp8)

    @property
    def kv_element_bytes(self) -> int:
        return 1 if self.kv_fp8 else 2

    @property
    def cluster_merge(self) -> bool:
        """Whether up to CLUSTER_SPLITS splits can merge in a thread block cluster instead of the
        combine kernel (csrc/decode/cluster_merge.cuh): an arch with clusters."""
        return self.arch_facts.clusters

    def source(self) -> str:
        elem = DTYPES[self.dtype][1]
        t = self.tile
        paging = f"flashtune::decode::Paging({PAGINGS.index(self.paging)})"
        causal = "true" if self.causal else "false"
        kv_fp8 = "true" if self.kv_fp8 else "false"
        sinks = "true" if self.variants.sinks else "false"
        pdl = "true" if self.arch_facts.dependent_launch else "false"
        cluster = "true" if self.cluster_merge else "false"
        return f"""// Generated by flashtune for {self!r}. Do not edit: edit csrc/ and rebuild.
#include "decode/launch.cuh"

namespace {{
using Cfg = flashtune::decode::Traits<{elem}, {self.hdim}, {t.rows}, {t.block_n}, {t.warps}, {t.stages}, {paging}, {causal}, {kv_fp8},
                                      {self.variants.cpp()}>;
constexpr bool kPdl = {pdl};  // the combine as the split kernel's programmatic dependent
constexpr bool kCluster = {cluster};  // a row block's splits may merge in a thread block cluster
}}

extern "C" __global__ void __launch_bounds__(Cfg::kThreads)
{self.name}(const __grid_constant__ flashtune::DecodeParams params) {{
  flashtune::decode::split_body<Cfg, kPdl, kCluster>(params);
}}

extern "C" __global__ void __launch_bounds__(flashtune::decode::kCombineWarps * 32, 2)  // <= 128 registers
{self.combine_name}(const __grid_constant__ flashtune::DecodeParams params) {{
  flashtune::decode::combine_body<{elem}, {self.hdim}, {sinks}, kPdl>(params);
}}

extern "C" int {self.launcher_symbol}(const flashtune::DecodeParams* params, void* stream) {{
  return flashtune::decode::launch<Cfg, kPdl, kCluster>({self.name}, {self.combine_name}, *params, stream);
}}

extern "C" int {self.cluster_slots_symbol}(int splits) {{
  return flashtune::decode::cluster_slots<Cfg, kCluster>({self.name}, splits);
}}
"""

    def nvcc_flags_all(self) -> list[str]:
        return [*BASE_NVCC_FLAGS, *self.nvcc_flags]

    def source_hash(self) -> str:
        return build_inputs_hash(self, source_files(DECODE_SOURCES))


def decode_spec_for(profile, dtype: str, hdim: int, rows: int, causal: bool, paging: str,
                    arch: str | None = None, kv_fp8: bool = False, variants: Variants = NO_VARIANTS) -> DecodeSpec:
    """The decode kernel a profile launches for these settings, on its arch or `arch` (a retarget
    takes the family's default tile for that arch): the one place a profile becomes a DecodeSpec
    (the runtime and `flashtune build` both ask here)."""
    if arch is None or arch == profile.arch.name:  # tiles are the built head dim's, e.g. 128's for 96
        arch, tile = profile.arch.name, profile.decode_tile(computed_head_dim(hdim) or hdim, rows)
    else:
        tile = default_decode_tile(get_arch(arch), hdim, rows)
    return DecodeSpec(arch, dtype, hdim, e4m3_cache_tile(tile) if kv_fp8 else tile, causal, paging,
                      profile.nvcc_flags, kv_fp8, Variants(*variants))


def decode_specs_for_profile(profile, arch: str | None = None, dtypes=None, hdims=None) -> list[DecodeSpec]:
    """Every decode kernel a profile can launch (optionally narrowed), for `flashtune build`: each
    dtype and head dim, 16 and 32 packed rows (where they fit), causal and not, contiguous, paged
    and gathered caches; with `fp8: {kv: e4m3}` each again for an e4m3 cache."""
    specs = []
    for kv_fp8 in (False, True) if profile.fp8_kv else (False,):
        for dtype in dtypes or profile.dtypes:
            for hdim in hdims or profile.head_dims:
                for rows in DECODE_ROWS:  # a head dim the decode kernels compute at the next size (192) has its own
                    if ((computed_head_dim(hdim) or hdim, rows) not in DEFAULT_TILE_ORDER
                            or (kv_fp8 and decode_row_groups(hdim, rows) > 1)):
                        continue
                    for causal in (False, True):
                        for paging in PAGINGS:
                            specs.append(decode_spec_for(profile, dtype, hdim, rows, causal, paging, arch, kv_fp8))
    return specs
