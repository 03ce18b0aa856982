"""KernelSpec: the single description of one kernel specialisation.

Everything about a built kernel derives from its spec: the exact symbol name that the
profiler, nsys and cuobjdump show, the generated translation unit, and the cache key.
Nothing else in flashtune re-derives these.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path

from flashtune.kernels.arch import ArchFacts, get_arch
from flashtune.paths import csrc_dir
from flashtune.kernels.schedule import FIELD_NAMES, Schedule
from flashtune.kernels.variants import NO_VARIANTS, Variants
from flashtune.kernels.tiles import (FP8_HEAD_DIMS, SM90_V_HEAD_DIMS, TileConfig, shared_memory_bytes,
                                     sm90_default_schedule, sm90_schedule, threads_per_cta, tile_problems)

DTYPES = {"float16": ("f16", "__half"), "bfloat16": ("bf16", "__nv_bfloat16")}
FP8_OUT_DTYPE = "bfloat16"  # an all-FP8 call's output (FlashAttention-3's: e4m3 q, k and v give bf16)

# Kernel families that have a kernel written, and the csrc/ folders their sources live in.
IMPLEMENTED_FAMILIES = {"sm80": ("common", "sm80"), "sm90": ("common", "sm90")}

# nvcc flags every kernel gets. torch defines the __CUDA_NO_HALF*__ macros for extensions;
# undo them so cuda_fp16/bf16 keep their conversions. -DNDEBUG: no asserts in kernels. The C++
# standard is ours, not torch's default (2.11 builds C++17, 2.14 C++20): one source, every install.
BASE_NVCC_FLAGS = (
    "-std=c++17",
    "-O3",
    "-DNDEBUG",
    "-Xptxas=-v",
    "-lineinfo",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
)


class SpecError(ValueError):
    """A spec that flashtune cannot build (unknown dtype, family without a kernel, bad tile)."""


@dataclass(frozen=True)
class KernelSpec:
    family: str  # "sm80" (mma.sync) or "sm90" (wgmma)
    arch: str  # nvcc target, e.g. "sm_89", "sm_90", "sm_90a", "sm_120"
    dtype: str  # "float16" or "bfloat16"
    hdim: int
    tile: TileConfig
    causal: bool
    fp8: bool = False
    nvcc_flags: tuple[str, ...] = ()  # the profile's extra flags
    variants: Variants = NO_VARIANTS  # built in: softcap, window, sinks, alibi (kernels/variants.py)
    # sm90, 16-bit: q/k and v/o narrower than hdim (a head dim between the built ones, or V's unlike
    # Q/K's), read and written at their own head dims: the TMA zero-fills the columns past them in
    # shared memory and clips the output's, so the op copies nothing to pad them
    narrow: bool = False
    # sm90, with fp8: O += P V on FP8 tensor cores too (P and V in e4m3, V read as V^T that the
    # launcher lays out first: sm90/v_transpose.cuh); O stays 16-bit
    fp8_pv: bool = False
    # sm90, 16-bit: V's and O's head dim where it is below hdim (DeepSeek's MLA prefill: 192/128), a
    # multiple of 64: P V multiplies only its columns and O holds only its own; 0: hdim
    hdim_v: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise SpecError(f"dtype {self.dtype!r} is not supported; allowed: {', '.join(DTYPES)}")
        if self.family not in IMPLEMENTED_FAMILIES:
            raise SpecError(
                f"kernel family {self.family!r} has no kernel in this flashtune version "
                f"(written: {', '.join(IMPLEMENTED_FAMILIES)}); use a profile of family sm80, "
                "e.g. --profile h200-sm80 on an H100/H200 (in Python: flashtune.use_profile('h200-sm80') "
                "or FLASHTUNE_PROFILE=h200-sm80)")
        if self.narrow and (self.family != "sm90" or self.fp8):
            raise SpecError("a narrow kernel (inputs narrower than its head dim, zero-filled by the TMA) is the sm90 "
                            "family's, 16-bit; elsewhere the op zero-pads the inputs")
        if self.hdim_v and (self.family != "sm90" or self.fp8 or self.hdim_v % 64 or not 0 < self.hdim_v < self.hdim):
            raise SpecError(f"a V head dim of its own ({self.hdim_v} beside {self.hdim}) is the sm90 family's, "
                            "16-bit, a multiple of 64 below Q/K's; elsewhere the op zero-pads v")
        # the tile's rules at Q/K's head dim: V's smaller tiles and O's registers only make room
        problems = tile_problems(self.family, self.hdim, self.tile, self.arch_facts, self.fp8, self.causal,
                                 self.fp8_pv)
        if problems:
            raise SpecError(f"tile {self.tile.label} for hdim {self.hdim} on {self.arch}: "
                            + "; ".join(problems))
        if self.family == "sm90":  # the tile's keys as the fields that differ from the default, so that
            # equal kernels are equal specs (one source, one cache entry), whatever keys said so
            schedule, default = self.schedule, self.default_schedule
            keys = tuple((name, getattr(schedule, name)) for name in FIELD_NAMES
                         if getattr(schedule, name) != getattr(default, name))
            object.__setattr__(self, "tile", replace(self.tile, schedule=keys))

    @property
    def arch_facts(self) -> ArchFacts:
        return get_arch(self.arch)


    @property
    def schedule(self) -> Schedule | None:
        """The sm90 kernel's schedule (the tile's keys over the family's defaults); None for sm80."""
        if self.family != "sm90":
            return None
        return sm90_schedule(self.hdim, self.tile, self.causal, self.fp8, self.fp8_pv, self.hdim_v)

    @property
    def default_schedule(self) -> Schedule:
        """The sm90 schedule this tile runs without keys: the base of the name's schedule codes."""
        return sm90_default_schedule(self.hdim, self.tile, self.causal, self.fp8, self.fp8_pv, self.hdim_v)

    @property
    def schedule_suffix(self) -> str:
        """The name's codes of the schedule fields off the family's default for this tile ("_np": no
        pingpong); "" for the default schedule and for sm80."""
        if self.family != "sm90":
            return ""
        return self.schedule.suffix(self.default_schedule)

    @property
    def name(self) -> str:
        """The exact extern "C" kernel symbol, e.g. flashtune_fwd_sm80_bf16_h128_128x64_w4_s2_sm89; an sm90
        kernel's tile is followed by a code for each schedule field off its default (`_np`: no pingpong)."""
        parts = ["flashtune_fwd", self.family, DTYPES[self.dtype][0],
                 f"h{self.hdim}" + (f"v{self.hdim_v}" if self.hdim_v else ""), self.tile.shape_label + self.schedule_suffix]
        if self.causal:
            parts.append("c")
        if self.fp8:
            parts.append("fp8all" if self.fp8_pv else "fp8qk")
        parts += self.variants.names
        if self.narrow:
            parts.append("narrow")
        parts.append(self.arch.replace("_", ""))
        return "_".join(parts)

    @property
    def launcher_symbol(self) -> str:
        return f"{self.name}_launch"

    @property
    def threads(self) -> int:
        return threads_per_cta(self.family, self.tile)

    @property
    def smem_bytes(self) -> int:
        return shared_memory_bytes(self.family, self.hdim, self.tile, self.fp8, self.causal, self.fp8_pv,
                                   self.hdim_v)

    def source(self) -> str:
        """The generated translation unit: one extern "C" kernel with this spec's name."""
        elem = DTYPES[self.dtype][1]
        t = self.tile
        if self.family == "sm90":
            fp8 = "true" if self.fp8 else "false"
            causal = "true" if self.causal else "false"
            variants = (f", {self.variants.cpp()}" if any(self.variants) or self.narrow or self.fp8_pv or self.hdim_v
                        else "")
            if self.narrow or self.fp8_pv or self.hdim_v:  # after the KvCache argument (kernel_traits.cuh)
                variants += f", flashtune::sm90::KvCache::kNone, {'true' if self.narrow else 'false'}"
            if self.fp8_pv or self.hdim_v:  # then FP8 P V, then V's head dim
                variants += f", {'true' if self.fp8_pv else 'false'}"
            if self.hdim_v:
                variants += f", {self.hdim_v}"
            return f"""// Generated by flashtune for {self!r}. Do not edit: edit csrc/ and rebuild.
#include "sm90/launch.cuh"

namespace {{
{self.schedule.cpp()}
using Cfg = flashtune::sm90::Traits<{elem}, {self.hdim}, {t.block_m}, {t.block_n}, {t.stages}, {causal}, {fp8}, KernelSchedule{variants}>;
}}

extern "C" __global__ void __launch_bounds__(Cfg::kThreads, 1)
{self.name}(const __grid_constant__ flashtune::FwdParams params,
{" " * len(self.name)} const __grid_constant__ flashtune::sm90::TmaMaps maps) {{
  flashtune::sm90::fwd_body<Cfg>(params, maps);
}}

extern "C" int {self.launcher_symbol}(const flashtune::FwdParams* params, void* stream) {{
  return flashtune::sm90::launch<Cfg>({self.name}, *params, stream);
}}
"""
        # The traits' last bool arguments: causal, then the defaulted FP8 Q/K (e4m3, S on FP8
        # tensor cores), written up to the last one off its default.
        bool_args = "true" if self.causal else "false"
        if self.fp8 or any(self.variants):
            bool_args += ", true" if self.fp8 else ", false"
        if any(self.variants):
            bool_args += f", {self.variants.cpp()}"
        return f"""// Generated by flashtune for {self!r}. Do not edit: edit csrc/ and rebuild.
#include "sm80/launch.cuh"

namespace {{
using Cfg = flashtune::sm80::Traits<{elem}, {self.hdim}, {t.block_m}, {t.block_n}, {t.num_warps}, {t.stages}, {bool_args}>;
}}

extern "C" __global__ void __launch_bounds__(Cfg::kThreads, 1)
{self.name}(const flashtune::FwdParams params) {{
  flashtune::sm80::fwd_body<Cfg>(params);
}}

extern "C" int {self.launcher_symbol}(const flashtune::FwdParams* params, void* stream) {{
  return flashtune::sm80::launch<Cfg>({self.name}, *params, stream);
}}
"""

    def nvcc_flags_all(self) -> list[str]:
        return [*BASE_NVCC_FLAGS, *self.nvcc_flags]

    def source_hash(self) -> str:
        """Hash of everything the build reads: generated source, kernel headers, flags."""
        return build_inputs_hash(self, family_source_files(self.family))


def build_inputs_hash(spec, headers: list[Path]) -> str:
    """A spec's cache key: its generated source, its flags, its arch and every header it includes."""
    h = hashlib.sha256(spec.source().encode())
    h.update("\0".join(spec.nvcc_flags_all()).encode())
    h.update(spec.arch_facts.torch_arch_list.encode())
    for path in headers:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def family_source_files(family: str) -> list[Path]:
    """Every header a family's kernels include (they are part of each spec's cache key)."""
    return source_files(IMPLEMENTED_FAMILIES[family])


def source_files(folders) -> list[Path]:
    """The headers under these csrc/ folders (the folders' .cu probes are not part of a spec)."""
    root = csrc_dir()
    return [p for folder in folders for p in sorted((root / folder).rglob("*")) if p.suffix in (".h", ".cuh")]


def spec_for(profile, tile: TileConfig, dtype: str, hdim: int, causal: bool, fp8: bool = False,
             arch: str | None = None, variants: Variants = NO_VARIANTS, narrow: bool = False,
             fp8_pv: bool = False, hdim_v: int = 0) -> KernelSpec:
    """The kernel a profile's config row (its tile and schedule keys) gives for one dtype, head dim,
    causal value, Q/K (and, fp8_pv, P V) precision, variants, narrow inputs and V head dim, on the
    profile's arch or `arch`: the one place a profile row becomes a KernelSpec (build, the op, tune and
    `profiles show` all ask here)."""
    return KernelSpec(profile.family, arch or profile.arch.name, dtype, hdim, tile, bool(causal), bool(fp8),
                      profile.nvcc_flags, Variants(*variants), narrow, bool(fp8_pv), hdim_v)


def specs_for_profile(profile, arch: str | None = None, dtypes=None, hdims=None,
                      causal: bool | None = None, narrow: bool = False) -> list[KernelSpec]:
    """Every distinct spec a profile can launch (optionally narrowed), for `flashtune build`:
    the 16-bit kernels, and with `fp8: {qk: e4m3}` also their FP8 Q/K twins (`pv: e4m3`: and all-FP8
    ones, sm90; bfloat16 only, the dtype of their output); with `narrow`, an sm90
    profile's 16-bit kernels' narrow twins too (head dims between the built ones, read in place) and
    their twins with V's own head dim (SM90_V_HEAD_DIMS: 192/128, 128/64).

    `arch` retargets the profile's tiles (they are re-validated for that arch).
    """
    arch = get_arch(arch).name if arch else profile.arch.name
    for value, allowed, what in ((dtypes, profile.dtypes, "dtype"), (hdims, profile.head_dims, "hdim")):
        unknown = set(value or ()) - set(allowed)
        if unknown:
            raise SpecError(f"{what} {', '.join(map(str, sorted(unknown)))} is not in profile "
                            f"{profile.name}; allowed: {', '.join(map(str, allowed))}")
    # FP8 twins only where the target has FP8 tensor cores (a retarget to sm_80/86 has none). Each
    # table serves the kernels of the kinds beside it: 16-bit ones, FP8 Q/K twins ("qk") and all-FP8
    # twins ("pv"), the FP8 kinds on their own tables (fp8.configs, fp8.pv_configs) where the profile
    # has them, else on the table before.
    fp8 = profile.fp8_qk and get_arch(arch).fp8
    pv = fp8 and profile.fp8_pv
    kinds_of = {"16": ["16"], "qk": [], "pv": []}
    qk_table = "qk" if profile.fp8_configs else "16"
    if fp8:
        kinds_of[qk_table].append("qk")
    if pv:
        kinds_of["pv" if profile.fp8_pv_configs else qk_table].append("pv")
    tables = ((profile.configs, kinds_of["16"]), (profile.fp8_configs, kinds_of["qk"]),
              (profile.fp8_pv_configs, kinds_of["pv"]))
    specs: dict[KernelSpec, None] = {}
    for dtype in dtypes or profile.dtypes:
        for table, kinds in tables:
            for entry in table if kinds else ():
                if hdims and entry.hdim not in hdims:
                    continue
                for is_causal in ((False, True) if entry.causal is None else (entry.causal,)):
                    if causal is not None and is_causal != causal:
                        continue

                    def add(fp8_flag: bool = False, **kw):
                        specs[spec_for(profile, entry.tile, dtype, entry.hdim, is_causal, fp8_flag, arch, **kw)] = None
                    for kind in kinds:
                        if kind == "16":
                            add()
                        elif entry.hdim not in FP8_HEAD_DIMS:  # no FP8 twin at hdim 192
                            continue
                        elif kind == "qk":
                            add(True)
                        elif dtype == FP8_OUT_DTYPE:  # all-FP8: the output's dtype only
                            add(True, fp8_pv=True)
                    if narrow and profile.family == "sm90" and "16" in kinds:
                        add(narrow=True)
                        for hdim_v in SM90_V_HEAD_DIMS.get(entry.hdim, ()):  # V's own head dim (MLA's 192/128)
                            add(hdim_v=hdim_v)
    return list(specs)
