"""How many CTAs share a sequence's keys when a decode call leaves the split count to flashtune
(num_splits=0): the count a cost model of the call predicts fastest.

A decode call streams its K and V once; s splits give each of the call's CTAs (batch x KV heads x
row blocks) 1/s of the keys, then merge the s partial outputs (in a combine kernel, or in a thread
block cluster of the s CTAs). Its time, for
s = 1 .. the most the keys allow:

    stream(s)  = ((bytes / memory) ** P + (bytes per SM / rate of one CTA) ** P) ** (1 / P)
    combine(s) = 0 for one split; cluster_us where s splits merge in thread block clusters (at most
                 cluster_splits, on an arch with clusters, all of the grid's clusters at once);
                 else combine_us + s x the fp32 partials (written, read) / combine_gbps

where bytes per SM is the heaviest SM's share (ceil(CTAs / SMs) CTAs of bytes / CTAs) and a CTA
streams the bytes its ring keeps in flight once per turnaround (4 us). The two stream terms are the
memory's ceiling and the CTAs' own latency-bound rate; P = 1.5 blends them, because a read 10% short
of the memory's limit is not yet at it. Fitted to lab/decode_splits.py's sweep (every split count on
44 cells of an H100, lab/fit_split_model.py), with the policy's constants (kernels/decode_spec.py's
DecodeSplitPolicy).

FlashAttention-3's rule (split while the CTAs fill under 80% of the SMs, to the best wave
efficiency) ignores both costs this model prices: it split 128 CTAs of a 1k cache three ways (1.46x
the time of one split) and 64 CTAs two ways (1.52x), where the combine costs more than the split saves.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from flashtune.kernels.decode_spec import DecodeSpec, DecodeSplitPolicy
from flashtune.kernels.gpu import device_gpu

BLEND = 1.5  # P above
WORTH = 0.02  # more splits are taken only if predicted this much faster: the model's own error is larger
FALLBACK_MEMORY_GBPS = 1000.0  # a device that does not report its memory clock: the slower GPUs' order


@dataclass(frozen=True)
class CallTerms:
    """What the model reads of a call: its CTAs at one split, the K/V bytes, the fp32 partial bytes
    each split adds (written and read), one CTA's stream rate (GB/s) and the bytes its CTAs read
    (K/V once per row block, the second and later from L2)."""
    ctas: int
    kv_bytes: int
    partial_bytes: int
    rate_gbps: float
    read_bytes: int


def most_splits(spec: DecodeSpec, keys: int, max_splits: int, short: bool = False) -> int:
    """The most splits of `keys` keys: each keeps spec.fewest_blocks_per_split(short) key blocks; in a
    short call (short_call) the decode kernels' one a warp, where two would leave the 16-row tile's
    64-key blocks at hdim 64 two splits of 1k keys (8.9 us on an H100, where four took 7.9)."""
    return max(1, min(max_splits, math.ceil(keys / spec.tile.block_n) // spec.fewest_blocks_per_split(short)))


def row_blocks(spec: DecodeSpec, seqlen_q: int, head_ratio: int) -> int:
    """The blocks of spec.tile.rows packed query rows one KV head's queries fill."""
    return -(-seqlen_q * head_ratio // spec.tile.rows)


def call_ctas(spec: DecodeSpec, batch: int, heads_kv: int, seqlen_q: int, head_ratio: int) -> int:
    """A call's CTAs at one split: a row block of packed query rows per sequence and KV head."""
    return batch * heads_kv * row_blocks(spec, seqlen_q, head_ratio)


def kv_bytes(batch: int, heads_kv: int, keys: int, hdim: int, element_bytes: int = 2) -> int:
    """The K and V bytes a call reads."""
    return batch * heads_kv * keys * 2 * hdim * element_bytes


def short_call(policy: DecodeSplitPolicy, nbytes: int, device_index: int) -> bool:
    """Whether a call reading nbytes of K/V is short (kernels/decode_spec.py's decode_rows): read in
    at most policy.short_call_us at the memory's peak, where a CTA's latency, not the memory, bounds it."""
    return _short(policy, nbytes, policy.memory_gbps or device_facts(device_index)[1])


def _short(policy: DecodeSplitPolicy, nbytes: int, memory_gbps: float) -> bool:
    return nbytes > 0 and nbytes / memory_gbps / 1e3 <= policy.short_call_us


def call_terms(spec: DecodeSpec, batch: int, heads_kv: int, seqlen_q: int, head_ratio: int, keys: int,
               policy: DecodeSplitPolicy) -> CallTerms:
    kv = kv_bytes(batch, heads_kv, keys, spec.hdim, spec.kv_element_bytes)
    return CallTerms(ctas=call_ctas(spec, batch, heads_kv, seqlen_q, head_ratio), kv_bytes=kv,
                     partial_bytes=2 * batch * seqlen_q * heads_kv * head_ratio * spec.hdim * 4,
                     rate_gbps=spec.ring_bytes / policy.ring_turnaround_us / 1e3,  # bytes per us -> GB/s
                     read_bytes=kv * row_blocks(spec, seqlen_q, head_ratio))


def in_cluster(splits: int, ctas: int, slots: tuple[int, ...], policy: DecodeSplitPolicy) -> bool:
    """Whether `splits` splits of a call of `ctas` CTAs (at one split) merge in clusters: at most the
    policy's cluster_splits, and every cluster of the grid running at once. slots[s]: the CTAs the
    device runs at once in clusters of s, s up to CLUSTER_SPLITS (runtime/decode.py's cluster_slots;
    () for a kernel without cluster merges). A grid over them ran its last clusters in a second
    wave: 1.13-1.33x the combine kernel's time on an H100 (32 CTAs split 4 ways, 140-200 KB of
    shared memory a CTA)."""
    return 1 < splits <= policy.cluster_splits and splits < len(slots) and ctas * splits <= slots[splits]


def choose_splits(spec: DecodeSpec, batch: int, heads_kv: int, seqlen_q: int, head_ratio: int, seqlen_k: int,
                  sm_count: int, memory_gbps: float, policy: DecodeSplitPolicy = DecodeSplitPolicy(),
                  slots: tuple[int, ...] = ()) -> int:
    """The fewest splits the model predicts within 2% of its fastest for a call, each split keeping
    spec.min_blocks_per_split key blocks. Keys are rounded up to 4 significant bits (steps of at most
    6%), so that a generation, whose cache grows a key a step, reuses the cached search (up to 128
    predictions, about 100 us of Python; a cached call takes about 1 us). slots: as in_cluster takes
    them (() : no split merges in a cluster)."""
    if batch * heads_kv * seqlen_q == 0 or seqlen_k <= 0:
        return 1
    best = _fastest_split(spec, batch, heads_kv, seqlen_q, head_ratio, _round_up_4_bits(seqlen_k), sm_count,
                          memory_gbps, policy, slots)
    short = _short(policy, kv_bytes(batch, heads_kv, seqlen_k, spec.hdim, spec.kv_element_bytes),
                   policy.memory_gbps or memory_gbps)
    return min(best, most_splits(spec, seqlen_k, policy.max_splits, short))  # the rounding may allow one too many


def call_time_us(splits: int, ctas: int, kv_bytes: float, partial_bytes: float, rate_gbps: float, sm_count: int,
                 memory_gbps: float, combine_us: float, combine_gbps: float, merge_in_cluster: bool = False,
                 cluster_us: float = 0.0, read_bytes: float | None = None) -> float:
    """The model's time of a call in microseconds, less what every split count pays alike (launch,
    Q, epilogue): bytes / (GB/s) is nanoseconds. read_bytes: what the CTAs read in all (CallTerms;
    default kv_bytes, one row block a KV head)."""
    n = ctas * splits
    per_sm = math.ceil(n / sm_count) * (read_bytes or kv_bytes) / n
    stream = ((kv_bytes / memory_gbps) ** BLEND + (per_sm / rate_gbps) ** BLEND) ** (1 / BLEND) / 1e3
    if splits == 1:
        return stream
    if merge_in_cluster:
        return stream + cluster_us
    return stream + combine_us + splits * partial_bytes / combine_gbps / 1e3


@functools.lru_cache(maxsize=4096)
def _fastest_split(spec: DecodeSpec, batch: int, heads_kv: int, seqlen_q: int, head_ratio: int, keys: int,
                   sm_count: int, memory_gbps: float, policy: DecodeSplitPolicy, slots: tuple[int, ...]) -> int:
    t = call_terms(spec, batch, heads_kv, seqlen_q, head_ratio, keys, policy)
    memory = policy.memory_gbps or memory_gbps
    most = most_splits(spec, keys, policy.max_splits, _short(policy, t.kv_bytes, memory))
    times = [call_time_us(s, t.ctas, t.kv_bytes, t.partial_bytes, t.rate_gbps, sm_count, memory, policy.combine_us,
                          policy.combine_gbps, in_cluster(s, t.ctas, slots, policy), policy.cluster_us, t.read_bytes)
             for s in range(1, most + 1)]
    fastest = min(times)
    return next(s for s, t in enumerate(times, 1) if t <= (1 + WORTH) * fastest)


def _round_up_4_bits(n: int) -> int:
    shift = max(0, n.bit_length() - 4)
    return -(-n >> shift) << shift


@functools.lru_cache(maxsize=16)
def device_facts(device_index: int) -> tuple[int, float]:
    """(SMs, peak memory GB/s) of a CUDA device (kernels/gpu.py's GpuInfo); FALLBACK_MEMORY_GBPS where
    torch does not report the memory clock (a profile's decode.split.memory_gbps overrides)."""
    gpu = device_gpu(device_index)
    return gpu.sm_count, gpu.memory_gbps or FALLBACK_MEMORY_GBPS
