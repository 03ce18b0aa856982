"""Decode launches: which DecodeSpec serves a call under a profile (packed rows, the profile's tile,
how keys are addressed), how many CTAs share a sequence's keys (num_splits=0: decode_splits.py's cost
model, with the profile's split policy) and how they merge (in a thread block cluster, or through
split buffers and the combine kernel), and the launch through the torch op
flashtune_C::decode. Nothing here reads device memory on the host, so a call can be captured in a
CUDA graph.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from flashtune.kernels.build import load_binding, load_kernel
from flashtune.kernels.cache_spec import CACHE_ROWS, CacheSpec, cache_kernel_serves, cache_tile
from flashtune.kernels.decode_spec import (CLUSTER_SPLITS, DecodeSpec, DecodeSplitPolicy, decode_rows,
                                           decode_spec_for)
from flashtune.kernels.profiles import Profile
from flashtune.kernels.tiles import computed_head_dim
from flashtune.kernels.variants import NO_VARIANTS, Variants
from flashtune.runtime import checks
from flashtune.runtime.checks import DTYPE_NAMES, NO_VARIANT_ARGS, VariantArgs
from flashtune.runtime.decode_splits import call_ctas, choose_splits, device_facts, in_cluster, kv_bytes, short_call


@dataclass(frozen=True)
class DecodeLaunch:
    """What run_decode launched last: its split count and how the splits merged (`flashtune bench
    --decode` shows it beside the kernel names the profiler saw)."""
    splits: int
    cluster_merge: bool

    @property
    def merge(self) -> str:
        return "none" if self.splits == 1 else "cluster" if self.cluster_merge else "combine kernel"


last_launch: DecodeLaunch | None = None  # set by every run_decode, on the host, before the launch


def paging_for(page_size: int | None, block_n: int) -> str:
    """Contiguous caches; pages holding whole key tiles (one lookup per tile); else row gathers."""
    if page_size is None:
        return "contiguous"
    return "paged" if page_size % block_n == 0 else "gather"


# decode_spec's, keyed by what of a profile a decode spec depends on: hashing a whole Profile (its
# tile tables) per call cost 4 us, on the path of every decode step.
_decode_specs: dict[tuple, DecodeSpec] = {}


def decode_spec(profile: Profile, dtype: torch.dtype, hdim: int, causal: bool, seqlen_q: int, head_ratio: int,
                page_size: int | None, kv_fp8: bool = False, variants: Variants = NO_VARIANTS,
                varlen_q: bool = False, key_rows: int = 0, device_index: int = 0) -> DecodeSpec:
    """The decode kernel for a call under `profile`: on an sm90 profile, a KV-cache kernel (wgmma,
    kernels/cache_spec.py) where the packed rows fill its 128-row tiles; else the mma.sync decode
    kernel with its tile for the head dim and packed rows (the profile's `decode:` tiles, else the
    family's default for its arch), the cache's paging, and whether the cache is e4m3 (`dtype` is
    q's). varlen_q: queries of several lengths (cu_seqlens_q), which only the decode kernels take.
    key_rows: the key rows the call reads (sequences x KV heads x keys) on device `device_index`:
    their bytes tell a short call's packed rows (decode_rows); 0: not known, rows by shape alone."""
    cache = cache_kernel_serves(profile.arch.wgmma, hdim, seqlen_q, head_ratio, page_size, kv_fp8, any(variants),
                                varlen_q)
    short = not cache and key_rows > 0 and short_call(profile.decode_split,
                                                      kv_bytes(1, 1, key_rows, hdim, 1 if kv_fp8 else 2), device_index)
    rows = CACHE_ROWS if cache else decode_rows(seqlen_q, head_ratio, hdim, short, kv_fp8)
    key = (profile.arch.name, profile.nvcc_flags, profile.decode_tiles, dtype, hdim, bool(causal), rows, page_size,
           kv_fp8, variants, cache)
    spec = _decode_specs.get(key)
    if spec is None:
        if cache:
            spec = CacheSpec(profile.arch.name, DTYPE_NAMES[dtype], hdim, cache_tile(hdim), bool(causal),
                             "contiguous" if page_size is None else "paged", profile.nvcc_flags)
        else:
            paging = paging_for(page_size, profile.decode_tile(computed_head_dim(hdim) or hdim, rows).block_n)
            spec = decode_spec_for(profile, DTYPE_NAMES[dtype], hdim, rows, bool(causal), paging, kv_fp8=kv_fp8,
                                   variants=variants)
        _decode_specs[key] = spec
    return spec


@functools.lru_cache(maxsize=256)
def cluster_slots(spec: DecodeSpec, device_index: int) -> tuple[int, ...]:
    """slots[s]: the CTAs of spec's split kernel the device runs at once in clusters of s splits
    (csrc/decode/launch.cuh's cluster_slots, the CUDA occupancy query), s up to CLUSTER_SPLITS; ()
    for a kernel without cluster merges. Asked once per kernel and device, on the host only."""
    if not spec.cluster_merge:
        return ()
    query = getattr(ctypes.CDLL(load_kernel(spec).library), spec.cluster_slots_symbol)
    query.restype, query.argtypes = ctypes.c_int, [ctypes.c_int]
    with torch.cuda.device(device_index):
        return tuple(query(s) if s > 1 else 0 for s in range(CLUSTER_SPLITS + 1))


def run_decode(spec: DecodeSpec, q, k_cache, v_cache, *, cu_seqlens_q=None, seqused_k=None, cache_batch_idx=None,
               leftpad_k=None, block_table=None, max_seqlen_q: int, seqlen_k: int, softmax_scale: float,
               num_splits: int, with_lse: bool, out=None, poison: bool = False,
               policy: DecodeSplitPolicy = DecodeSplitPolicy(), k_descale=None, v_descale=None,
               variant_args: VariantArgs | None = None):
    """Launch `spec` on validated inputs; returns (out, lse or None). num_splits=0: the split cost model.
    An e4m3 cache (spec.kv_fp8) takes its descales, contiguous float32 (batch, heads_kv); the
    variants built into spec take their values from variant_args (checks.check_variants)."""
    v = variant_args or NO_VARIANT_ARGS
    if spec.family == "sm90":  # a KV-cache kernel: TMA loads
        checks.refuse_broadcast(q=q, k_cache=k_cache, v_cache=v_cache)
    window = v.window
    varlen = cu_seqlens_q is not None
    heads_q, hdim = q.shape[-2], q.shape[-1]
    heads_kv = k_cache.shape[2]
    batch = cu_seqlens_q.numel() - 1 if varlen else q.shape[0]
    total_q = q.shape[0] if varlen else q.shape[0] * q.shape[1]
    head_ratio = heads_q // heads_kv
    slots = cluster_slots(spec, q.device.index)
    if num_splits <= 0:  # a window: the keys a row block reads, not the cache's
        keys = seqlen_k if window[0] < 0 else min(seqlen_k, window[0] + max_seqlen_q + max(window[1], 0))
        num_splits = choose_splits(spec, batch, heads_kv, max_seqlen_q, head_ratio, keys,
                                   *device_facts(q.device.index), policy, slots)
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = None
    if with_lse:
        shape = (heads_q, total_q) if varlen else (q.shape[0], heads_q, q.shape[1])
        lse = torch.empty(shape, dtype=torch.float32, device=q.device)
    # A few splits merge in thread block clusters (no partials, no combine kernel) where the grid's
    # clusters all run at once; else through fp32 partials and the combine kernel.
    cluster = in_cluster(num_splits, call_ctas(spec, batch, heads_kv, max_seqlen_q, head_ratio), slots, policy)
    o_partial = lse_partial = None
    if num_splits > 1 and not cluster:  # from the caching allocator: no host sync, and graph capture keeps it
        o_partial = torch.empty((num_splits, total_q, heads_q, hdim), dtype=torch.float32, device=q.device)
        lse_partial = torch.empty((num_splits, total_q, heads_q), dtype=torch.float32, device=q.device)
    if poison:
        for t in (out, lse, o_partial, lse_partial):
            if t is not None:
                t.fill_(float("nan"))
    kernel = load_kernel(spec)
    load_binding()
    global last_launch
    last_launch = DecodeLaunch(num_splits, cluster)
    torch.ops.flashtune_C.decode(kernel.launcher, q, k_cache, v_cache, out, lse, cu_seqlens_q, seqused_k,
                                 cache_batch_idx, leftpad_k, block_table, max_seqlen_q, seqlen_k, softmax_scale,
                                 num_splits, o_partial, lse_partial, k_descale, v_descale, v.softcap, window[0],
                                 window[1], v.sinks, v.alibi, cluster)
    return out, lse
