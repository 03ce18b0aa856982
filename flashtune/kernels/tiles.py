"""Tile configs and the resource model: the one place that knows each family's limits.

Profile validation and (later) the tuner's search space both ask `check_tile`, so a
config that passes here is one the kernels are written to accept.
"""
from __future__ import annotations

from dataclasses import dataclass

from flashtune.kernels.arch import KERNEL_FAMILIES, ArchFacts, family_runs_on
from flashtune.kernels.schedule import Overrides, Schedule, overrides_label, resolve, rule_problems

# The head dims kernels are built for. Every kernel (both prefill families, decode, the backward,
# FP8 Q/K) has 64, 128 and 256; the sm90 prefill kernel has 192 too (DeepSeek's MLA prefill: Q/K
# 192, V 128), where the sm80 kernel's loads do not split 192's rows of 24 16-byte chunks over its
# threads and FP8 Q/K rows (192 bytes) are not whole 128-byte swizzle panels. A profile lists the
# ones it builds (head_dims); the others are computed at the next of them.
BASE_HEAD_DIMS = (64, 128, 256)
FAMILY_HEAD_DIMS = {"sm80": BASE_HEAD_DIMS, "sm90": (64, 128, 192, 256)}
HEAD_DIMS = FAMILY_HEAD_DIMS["sm90"]  # every prefill head dim of some family
FP8_HEAD_DIMS = BASE_HEAD_DIMS
# V head dims below Q/K's that the sm90 prefill kernel is built for (KernelSpec.hdim_v): DeepSeek's
# MLA prefill (192/128) and 128/64. Other pairs take the narrow kernel at Q/K's head dim.
SM90_V_HEAD_DIMS = {192: (128,), 128: (64,)}
MIN_HEAD_DIM, MAX_HEAD_DIM = 32, 256  # served: every multiple of 8 between, computed at a built size


def prefill_head_dims(head_dims: tuple[int, ...], fp8: bool = False) -> tuple[int, ...]:
    """Of a profile's head dims, those with prefill kernels for this Q/K precision (FP8 Q/K: not 192)."""
    return tuple(d for d in head_dims if not fp8 or d in FP8_HEAD_DIMS)


def computed_head_dim(hdim: int, built: tuple[int, ...] = BASE_HEAD_DIMS) -> int | None:
    """The built head dim a head dim is computed at (the next of `built`: a profile's head_dims for
    its prefill kernels, else the sizes every kernel has; its extra columns zero), or None when it
    is not served (not a multiple of 8 from 32 to 256, or above every built one)."""
    if not isinstance(hdim, int) or hdim % 8 or not MIN_HEAD_DIM <= hdim <= MAX_HEAD_DIM:
        return None
    return next((d for d in sorted(built) if d >= hdim), None)

SM80_NUM_WARPS = (1, 2, 4, 8)
SM80_ROWS_PER_WARP = (16, 32)
SM80_STAGES = (1, 2, 3)
SM80_REGISTER_BUDGET = 192  # accumulator+fragment registers per thread (rough model)

SM90_WARPGROUPS = (1, 2, 3)  # consumer warpgroups = block_m / 64
# K and V have a ring each. One slot each frees shared memory, but every block then waits for its K
# (hdim 256 on the H200: -31 to -39%); valid, and left out of the tuner's search (tune_space.py).
SM90_STAGES = (1, 2, 3, 4)
SM90_MAX_BLOCK_N = 256  # wgmma N limit
SM90_BARRIER_BYTES = 1024  # kernel_traits.cuh's kRingBytes slack: the 1024-byte alignment of the tiles
SM90_SMEM_LIMIT = 227 * 1024  # kernel_traits.cuh's kSmemLimit: what the kernel sizes itself against

RESERVED_SMEM_PER_CTA = 1024  # the driver keeps 1 KB of each CTA's shared memory


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int  # total warps of the CTA (sm90: consumers + the producer warpgroup)
    stages: int
    num_warpgroups: int | None = None  # sm90 only: consumer warpgroups
    # sm90 only: the row's own schedule keys (flashtune/kernels/schedule.py), over the family's defaults
    # for the tile; e.g. (("pingpong", False),) where tiles are a few blocks long and the
    # hand-overs cost more than they hide (hdim 64 causal below 2k on the H200, +1-4%).
    schedule: Overrides = ()

    @property
    def shape_label(self) -> str:
        """The tile without its schedule keys: 128x176_wg2_s2 (sm90), 128x64_w4_s2 (sm80)."""
        shape = f"{self.block_m}x{self.block_n}"
        if self.num_warpgroups is not None:
            return f"{shape}_wg{self.num_warpgroups}_s{self.stages}"
        return f"{shape}_w{self.num_warps}_s{self.stages}"

    @property
    def label(self) -> str:
        """The shape and the row's schedule keys (128x128_wg2_s3_np): one label per config."""
        return self.shape_label + overrides_label(self.schedule)


def sm90_tile(block_m: int, block_n: int, stages: int, schedule: Overrides = ()) -> TileConfig:
    """An sm90 config with the warp counts derived from block_m (64 rows per warpgroup)."""
    warpgroups = block_m // 64
    return TileConfig(block_m, block_n, 4 * (warpgroups + 1), stages, warpgroups, schedule)


@dataclass(frozen=True)
class TileProblem:
    key: str  # the config field at fault, e.g. "block_m"
    problem: str
    allowed: str

    def __str__(self) -> str:
        return f"{self.key}: {self.problem}; allowed: {self.allowed}"


def _check_family(family: str) -> None:
    if family not in KERNEL_FAMILIES:
        raise ValueError(f"unknown kernel family {family!r}; known: {', '.join(KERNEL_FAMILIES)}")


def threads_per_cta(family: str, cfg: TileConfig) -> int:
    _check_family(family)
    if family == "sm90":
        return 128 * (cfg.block_m // 64 + 1)  # consumers + one producer warpgroup
    return 32 * cfg.num_warps


def _sm90_parts(hdim: int, cfg: TileConfig, fp8: bool, fp8_pv: bool = False, hdim_v: int = 0) -> tuple[int, int, int]:
    """Bytes of one Q tile, of the K/V rings with their alignment slack, and of the O tile (V in
    e4m3 with fp8_pv; V and O at hdim_v where the kernel has a V head dim of its own)."""
    qk_elem, v_elem, v = (1 if fp8 else 2), (1 if fp8_pv else 2), hdim_v or hdim
    return (qk_elem * cfg.block_m * hdim, cfg.stages * cfg.block_n * (hdim * qk_elem + v_elem * v) + SM90_BARRIER_BYTES,
            2 * cfg.block_m * v)


def sm90_schedule(hdim: int, cfg: TileConfig, causal: bool = False, fp8: bool = False,
                  fp8_pv: bool = False, hdim_v: int = 0) -> Schedule:
    """The schedule an sm90 kernel of this tile runs: the family's defaults, where the O tile and a
    second Q tile fit in shared memory, with the config's own keys over them (schedule.resolve)."""
    q, ring, o = _sm90_parts(hdim, cfg, fp8, fp8_pv, hdim_v)
    return resolve(cfg.schedule, hdim, causal, cfg.block_m // 64, q + ring + o <= SM90_SMEM_LIMIT,
                   lambda tma_store: 2 * q + ring + (o if tma_store else 0) <= SM90_SMEM_LIMIT)


def sm90_default_schedule(hdim: int, cfg: TileConfig, causal: bool = False, fp8: bool = False,
                          fp8_pv: bool = False, hdim_v: int = 0) -> Schedule:
    """What the tile's kernel runs without schedule keys: the base its name's suffix is against."""
    return sm90_schedule(hdim, TileConfig(cfg.block_m, cfg.block_n, cfg.num_warps, cfg.stages, cfg.num_warpgroups),
                         causal, fp8, fp8_pv, hdim_v)


def shared_memory_bytes(family: str, hdim: int, cfg: TileConfig, fp8: bool = False, causal: bool = False,
                        fp8_pv: bool = False, hdim_v: int = 0) -> int:
    """Shared memory one CTA needs: Q once, K and V per pipeline stage; on sm90 also the O tile of
    the TMA-store epilogue and a second Q tile for the deferred one, where its schedule has them
    (kernel_traits.cuh's kSmemBytes).

    With FP8 QK, Q and K are 1-byte e4m3; V stays 16-bit, except with fp8_pv (sm90's all-FP8 kernels).
    hdim_v: an sm90 kernel's V head dim of its own (KernelSpec.hdim_v).
    """
    _check_family(family)
    if family == "sm90":
        q, ring, o = _sm90_parts(hdim, cfg, fp8, fp8_pv, hdim_v)
        schedule = sm90_schedule(hdim, cfg, causal, fp8, fp8_pv, hdim_v)
        return q * (2 if schedule.defer else 1) + ring + (o if schedule.tma_store else 0)
    qk_elem = 1 if fp8 else 2
    total = qk_elem * cfg.block_m * hdim + cfg.stages * cfg.block_n * hdim * (qk_elem + 2)
    # the epilogue stages the 16-bit O over Q (and, with FP8 Q, on into the idle ring)
    return max(total, 2 * cfg.block_m * hdim)


REGISTERS_PER_SM = 65536


def ctas_per_sm(family: str, hdim: int, cfg: TileConfig, arch: ArchFacts, fp8: bool = False,
                registers: int | None = None, fp8_pv: bool = False) -> int:
    """How many CTAs fit on one SM, by shared memory, threads (capped at 32) and, when the
    per-thread register count is known (ptxas reports it at build time), registers."""
    smem = shared_memory_bytes(family, hdim, cfg, fp8, fp8_pv=fp8_pv) + RESERVED_SMEM_PER_CTA
    threads = threads_per_cta(family, cfg)
    limits = [arch.smem_per_sm // smem, arch.max_threads_per_sm // threads, 32]
    if registers:
        limits.append(REGISTERS_PER_SM // (-(-registers // 8) * 8 * threads))  # allocated in units of 8
    return min(limits)


def check_tile(family: str, hdim: int, cfg: TileConfig, arch: ArchFacts,
               fp8: bool = False, causal: bool = False, fp8_pv: bool = False) -> list[TileProblem]:
    """Everything wrong with this config on this arch (empty when it is valid): its shape, and on
    sm90 its schedule (whose rules and whose fit in shared memory; without the overlap P takes no
    registers of its own)."""
    _check_family(family)
    problems: list[TileProblem] = []

    def add(key: str, problem: str, allowed: str) -> None:
        problems.append(TileProblem(key, problem, allowed))

    if not family_runs_on(family, arch):
        needs = KERNEL_FAMILIES[family].needs
        hint = " (an H100's or H200's wgmma target is sm_90a: --arch sm_90a)" if arch.name == "sm_90" else ""
        add("family", f"family {family} needs {needs}, which {arch.name} lacks{hint}",
            "sm80 on every arch; sm90 only on sm_90a")
    if fp8 and not arch.fp8:
        add("fp8", f"{arch.name} has no FP8 tensor cores",
            "fp8 on sm_89, sm_90/sm_90a, sm_100a, sm_120; null elsewhere")
    if hdim not in FAMILY_HEAD_DIMS[family]:
        add("hdim", f"head dim {hdim} is not built by family {family}", ", ".join(map(str, FAMILY_HEAD_DIMS[family])))
    elif fp8 and hdim not in FP8_HEAD_DIMS:
        add("hdim", f"head dim {hdim} has no FP8 Q/K kernel", ", ".join(map(str, FP8_HEAD_DIMS)))
    if fp8_pv and (family != "sm90" or not fp8):
        add("fp8", "FP8 P V is the sm90 family's, with FP8 Q/K", "fp8: {qk: e4m3, pv: e4m3} on an sm90 profile")
    elif fp8_pv and cfg.block_n % 64:
        add("block_n", f"{cfg.block_n}: FP8 P V reads V^T in panels of 64 or 128 keys",
            "a multiple of 64 (64, 128, 192, 256)")
    for key in ("block_m", "block_n"):
        value = getattr(cfg, key)
        if value <= 0 or value % 16:
            add(key, f"{value} is not a positive multiple of 16", "16, 32, 48, ...")

    if family == "sm80":
        problems += _sm80_problems(hdim, cfg)
    else:
        problems += _sm90_problems(hdim, cfg, fp8, causal, fp8_pv)

    if not problems:  # the size model assumes the shape rules above hold
        smem = shared_memory_bytes(family, hdim, cfg, fp8, causal, fp8_pv)
        if smem > arch.max_smem_per_block:
            add("shared_memory", f"needs {smem} bytes, over {arch.name}'s per-block limit",
                f"at most {arch.max_smem_per_block} bytes (smaller blocks or fewer stages)")
    return problems


def tile_problems(family: str, hdim: int, cfg: TileConfig, arch: ArchFacts,
                  fp8: bool = False, causal: bool = False, fp8_pv: bool = False) -> list[str]:
    """`check_tile` as readable strings: "key: what is wrong; allowed: ..."."""
    return [str(p) for p in check_tile(family, hdim, cfg, arch, fp8, causal, fp8_pv)]


def _sm80_problems(hdim: int, cfg: TileConfig) -> list[TileProblem]:
    problems: list[TileProblem] = []

    def add(key: str, problem: str, allowed: str) -> None:
        problems.append(TileProblem(key, problem, allowed))

    if cfg.num_warpgroups is not None:
        add("num_warpgroups", "not used by family sm80", "omit it; set num_warps")
    for key, _ in cfg.schedule:
        add(key, "is an sm90 schedule key; the sm80 family has no such step", "omit it for sm80")
    if cfg.num_warps not in SM80_NUM_WARPS:
        add("num_warps", f"{cfg.num_warps} warps", ", ".join(map(str, SM80_NUM_WARPS)))
        return problems  # the rules below divide by num_warps
    if cfg.stages not in SM80_STAGES:
        add("stages", f"{cfg.stages} stages", ", ".join(map(str, SM80_STAGES)))

    # Each warp owns whole m16 MMA row tiles of Q (one or two).
    rows_per_warp = cfg.block_m / cfg.num_warps
    if rows_per_warp not in SM80_ROWS_PER_WARP:
        add("block_m", f"block_m/num_warps = {cfg.block_m}/{cfg.num_warps} = {rows_per_warp:g} rows per warp",
            "16 or 32 rows per warp")
        return problems

    # Accumulators for S (block_n wide) and O (hdim wide), per m16 row tile.
    registers = (rows_per_warp / 16) * (hdim + cfg.block_n) / 2
    if registers > SM80_REGISTER_BUDGET:
        add("block_n", f"needs about {registers:g} accumulator registers per thread",
            f"(block_m/num_warps/16) * (hdim + block_n) / 2 <= {SM80_REGISTER_BUDGET}")

    # cp.async moves 16 B (8 elements) per thread per step: tiles must split evenly.
    threads = 32 * cfg.num_warps
    for key, rows in (("block_n", cfg.block_n), ("block_m", cfg.block_m)):
        chunks = rows * hdim // 8
        if chunks % threads:
            add(key, f"{key}*hdim/8 = {chunks} 16-byte loads do not split evenly over {threads} threads",
                f"{key}*hdim/8 a multiple of 32*num_warps")
    return problems


# Registers a consumer thread gets from setmaxnreg (kernel_traits.cuh's kConsumerRegs): 160 with 3
# consumer warpgroups, 232 with 2 (the producer keeps 40 for its tile loop), 240 with 1. With the
# softmax/GEMM overlap a thread holds S (block_n/2 fp32), O (hdim/2) and the previous block's P
# (block_n/4 packed pairs) at once, plus about 32 for addresses and softmax state. Measured on
# 2026-12-02 (H200 tiles, ptxas): 128x176 at hdim 128 (228 needed) and 128x80 at hdim 256 (220)
# build without consumer spills (hdim 256 causal: 16 bytes), 192x128 at hdim 64 (160) too (its
# producer, at 32 registers, spills 60 bytes in the persistent loop); 192x128 at hdim 128 (192)
# spills 272 bytes and 192x192 at hdim 64 (208) 400. An estimate: ptxas has the last word
# (`flashtune tune` rejects spills over --max-spill-bytes).
SM90_CONSUMER_REGISTERS = {1: 240, 2: 232, 3: 160}
SM90_REGISTER_OVERHEAD = 32


def _sm90_problems(hdim: int, cfg: TileConfig, fp8: bool, causal: bool, fp8_pv: bool = False) -> list[TileProblem]:
    problems: list[TileProblem] = []

    def add(key: str, problem: str, allowed: str) -> None:
        problems.append(TileProblem(key, problem, allowed))

    warpgroups, rest = divmod(cfg.block_m, 64)
    if rest or warpgroups not in SM90_WARPGROUPS:
        add("block_m", f"{cfg.block_m} is not 64 rows per consumer warpgroup x 1-3 warpgroups",
            "64, 128, 192")
        return problems  # the rules below count consumer warpgroups
    if cfg.num_warpgroups is not None and cfg.num_warpgroups != warpgroups:
        add("num_warpgroups", f"{cfg.num_warpgroups} does not match block_m/64 = {warpgroups}",
            f"{warpgroups} for block_m {cfg.block_m}")
    elif cfg.num_warps != 4 * (warpgroups + 1):
        add("num_warps", f"{cfg.num_warps} total warps; {warpgroups} consumer warpgroups + 1 producer "
            f"need {4 * (warpgroups + 1)}", "4 * (block_m/64 + 1), or omit it")
    if cfg.block_n > SM90_MAX_BLOCK_N:
        add("block_n", f"{cfg.block_n} is over the wgmma N limit", f"at most {SM90_MAX_BLOCK_N}")
    if cfg.stages not in SM90_STAGES:
        add("stages", f"{cfg.stages} stages", ", ".join(map(str, SM90_STAGES)))
    schedule = sm90_schedule(hdim, cfg, causal, fp8, fp8_pv)
    q, ring, o = _sm90_parts(hdim, cfg, fp8, fp8_pv)
    second_q = 2 * q + ring + (o if schedule.tma_store else 0) <= SM90_SMEM_LIMIT
    problems += [TileProblem(*p) for p in rule_problems(schedule, warpgroups, q + ring + o <= SM90_SMEM_LIMIT, second_q)]
    budget = SM90_CONSUMER_REGISTERS[warpgroups]
    # registers per key column of the tile: S (fp32, 1/2) and, under the overlap, P_(j-1) (1/4; e4m3: 1/8)
    per_column = (5 / 8 if fp8_pv else 3 / 4) if schedule.overlap else 1 / 2
    needed = int(cfg.block_n * per_column) + hdim // 2 + SM90_REGISTER_OVERHEAD
    if needed > budget:
        max_n = int((budget - hdim // 2 - SM90_REGISTER_OVERHEAD) / per_column) // 16 * 16
        held = "S, O and P" if schedule.overlap else "S and O"
        add("registers", f"{held} need about {needed} registers per consumer thread, over the "
            f"{budget} that {warpgroups} consumer warpgroups get",
            f"block_n <= {max_n} at hdim {hdim} with block_m {cfg.block_m}" if max_n >= 16 else
            f"block_m <= 128 (2 consumer warpgroups, {SM90_CONSUMER_REGISTERS[2]} registers each) at hdim {hdim}")
    return problems
