"""CacheSpec: one of the sm90 family's KV-cache kernels, a DecodeSpec whose split kernel is the
wgmma prefill kernel (csrc/sm90/, kernel_traits.cuh: KvCache) reading a KV cache: the query rows of
one KV head packed as position x head in group into 128-row tiles, keys up to each sequence's
cache_seqlens, split across CTAs and merged by decode's combine kernel. It serves the calls whose
packed rows are too many for the mma.sync decode kernels' 16-32-row tiles, which read each K/V byte
once per 32 rows and run out of tensor-core throughput (MQA with 4 query tokens: 128 rows; chunked
prefill against a cache). The launcher takes DecodeParams, as the decode kernels' does, so
runtime/decode.py launches either the same way.

Name: `flashtune_decode_bf16_h128_m128x128_w12_s2_wgmma_c_paged_sm90a` (the decode kernels' name
with the tile of the sm90 kernel: rows x keys, 12 warps = 3 warpgroups, stages, and `wgmma`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from flashtune.kernels.arch import get_arch
from flashtune.kernels.decode_spec import DecodeSpec, DecodeTile
from flashtune.kernels.schedule import Schedule, overrides_of
from flashtune.kernels.spec import DTYPES, SpecError, build_inputs_hash, source_files
from flashtune.kernels.tiles import TileConfig, shared_memory_bytes, sm90_tile, threads_per_cta

CACHE_SOURCES = ("common", "sm90", "decode")  # csrc/ folders the kernels include
CACHE_ROWS = 128  # packed query rows per tile: two consumer warpgroups of 64
CACHE_PAGINGS = ("contiguous", "paged")  # pages of whole key blocks only (TMA boxes)
# Per head dim: (keys per block, stages), the h200 prefill tiles' shapes at 128 rows.
CACHE_TILES = {64: (128, 4), 128: (128, 2), 256: (64, 2)}
# The schedule of every KV-cache kernel: the prefill default's steps that a one-tile CTA with
# direct stores can take (kernel_traits.cuh's static_asserts). Speculative maxima stay on at hdim
# 256 too, where the prefill default turns them off: the KV-cache kernel does not spill with them
# (ptxas: 0 bytes, every head dim).
CACHE_SCHEDULE = Schedule(persistent=False, tma_store=False, defer=False, flat=False)


def cache_tile(hdim: int) -> DecodeTile:
    block_n, stages = CACHE_TILES[hdim]
    return DecodeTile(CACHE_ROWS, block_n, 12, stages)


def cache_kernel_serves(arch_wgmma: bool, hdim: int, seqlen_q: int, head_ratio: int, page_size: int | None,
                        kv_fp8: bool, any_variant: bool, varlen_q: bool) -> bool:
    """Whether a decode call goes to a KV-cache kernel: an sm90 profile, a 16-bit cache, no variant,
    fixed-length queries whose packed rows (seqlen_q x head_ratio) fill a 128-row tile, head_ratio
    dividing 128 (a tile holds whole positions), a built head dim, and a contiguous cache or pages
    of whole key blocks."""
    if not arch_wgmma or kv_fp8 or any_variant or varlen_q or hdim not in CACHE_TILES:
        return False
    if seqlen_q * head_ratio < CACHE_ROWS or CACHE_ROWS % head_ratio:
        return False
    return page_size is None or page_size % CACHE_TILES[hdim][0] == 0


@dataclass(frozen=True)
class CacheSpec(DecodeSpec):
    family = "sm90"  # wgmma in its SASS (verify), ptxas's serialisation warnings refused (build)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise SpecError(f"dtype {self.dtype!r} is not supported; allowed: {', '.join(DTYPES)}")
        if not self.arch_facts.wgmma:
            raise SpecError(f"the KV-cache kernels use wgmma, which {self.arch} lacks")
        if self.hdim not in CACHE_TILES or self.tile != cache_tile(self.hdim):
            raise SpecError(f"KV-cache kernel tile {self.tile.label} for hdim {self.hdim}; "
                            f"the built ones: {', '.join(f'{h}: {cache_tile(h).label}' for h in CACHE_TILES)}")
        if self.paging not in CACHE_PAGINGS or self.kv_fp8 or any(self.variants):
            raise SpecError("a KV-cache kernel reads a 16-bit contiguous or paged cache, without variants")

    @property
    def name(self) -> str:
        parts = ["flashtune_decode", DTYPES[self.dtype][0], f"h{self.hdim}", self.tile.label, "wgmma"]
        if self.causal:
            parts.append("c")
        if self.paging != "contiguous":
            parts.append(self.paging)
        parts.append(self.arch.replace("_", ""))
        return "_".join(parts)

    @property
    def sm90_config(self) -> TileConfig:
        """The tile as an sm90 config with its whole schedule given, which tiles.py sizes as it sizes
        the prefill kernels'."""
        return sm90_tile(self.tile.rows, self.tile.block_n, self.tile.stages, overrides_of(asdict(CACHE_SCHEDULE)))

    @property
    def threads(self) -> int:
        return threads_per_cta("sm90", self.sm90_config)

    @property
    def min_blocks_per_split(self) -> int:
        return 2

    def fewest_blocks_per_split(self, short: bool = False) -> int:
        return self.min_blocks_per_split  # short or not: its consumer warpgroups share every block

    @property
    def cluster_merge(self) -> bool:
        """Its splits always merge in the combine kernel (sm90/launch_kvcache.cuh)."""
        return False

    @property
    def ring_bytes(self) -> int:
        """The K and V stages the producer keeps in flight."""
        return self.tile.stages * 2 * self.tile.block_n * self.hdim * self.kv_element_bytes

    @property
    def smem_bytes(self) -> int:
        return shared_memory_bytes("sm90", self.hdim, self.sm90_config, causal=self.causal)

    def source(self) -> str:
        elem = DTYPES[self.dtype][1]
        t = self.tile
        causal = "true" if self.causal else "false"
        kv = "kPages" if self.paging == "paged" else "kContiguous"
        return f"""// Generated by flashtune for {self!r}. Do not edit: edit csrc/ and rebuild.
#include "sm90/launch_kvcache.cuh"

namespace {{
{CACHE_SCHEDULE.cpp()}
using Cfg = flashtune::sm90::Traits<{elem}, {self.hdim}, {t.rows}, {t.block_n}, {t.stages}, {causal}, false, KernelSchedule,
                                    flashtune::Variants<>, flashtune::sm90::KvCache::{kv}>;
}}

extern "C" __global__ void __launch_bounds__(Cfg::kThreads, 1)
{self.name}(const __grid_constant__ flashtune::FwdParams params,
{" " * len(self.name)} const __grid_constant__ flashtune::sm90::TmaMaps maps) {{
  flashtune::sm90::fwd_body<Cfg>(params, maps);
}}

extern "C" __global__ void __launch_bounds__(flashtune::decode::kCombineWarps * 32)
{self.combine_name}(const __grid_constant__ flashtune::DecodeParams params) {{
  flashtune::decode::combine_body<{elem}, {self.hdim}>(params);
}}

extern "C" int {self.launcher_symbol}(const flashtune::DecodeParams* params, void* stream) {{
  return flashtune::sm90::launch_kvcache<Cfg>({self.name}, {self.combine_name}, *params, stream);
}}
"""

    def source_hash(self) -> str:
        return build_inputs_hash(self, source_files(CACHE_SOURCES))


def cache_specs_for_profile(profile, arch: str | None = None, dtypes=None, hdims=None) -> list[CacheSpec]:
    """Every KV-cache kernel a profile can launch (optionally narrowed), for `flashtune build`: on a
    target with wgmma, each dtype and built head dim, causal and not, contiguous and paged."""
    target = arch or profile.arch.name
    if not get_arch(target).wgmma:
        return []
    return [CacheSpec(target, dtype, hdim, cache_tile(hdim), causal, paging, profile.nvcc_flags)
            for dtype in dtypes or profile.dtypes for hdim in hdims or profile.head_dims if hdim in CACHE_TILES
            for causal in (False, True) for paging in CACHE_PAGINGS]
