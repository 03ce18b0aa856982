"""Decode's split-count cost model (runtime/decode_splits.py), no GPU: its choices against the times
every split count took on an H100 (lab/decode_splits.py, 2026-12-05), and its rules."""
import dataclasses
import types

import pytest
import torch

from flashtune.kernels.decode_spec import DecodeSplitPolicy
from flashtune.kernels.profiles import find_profile
from flashtune.runtime import decode_splits
from flashtune.runtime.decode import cluster_slots, decode_spec
from flashtune.runtime.decode_splits import FALLBACK_MEMORY_GBPS, choose_splits, device_facts

H200 = find_profile("h200")
H100_SMS, H100_GBPS = 132, 3352  # the H100 SXM: 2 x 2,619 MHz x 5,120 bits

# (hdim, heads_kv, batch, cache keys) with 32 query heads and one query token -> {splits: microseconds},
# measured on an H100 (bf16, cold L2, bench's timer): the cells where the count matters most. Every
# split merged by the combine kernel then, which COMBINE_KERNEL's policy prices.
MEASURED = {
    (64, 1, 128, 1024): {1: 18.6, 2: 26.6, 3: 27.0, 4: 29.3, 8: 31.7},
    (64, 8, 8, 1024): {1: 12.0, 2: 18.2},
    (128, 8, 1, 1024): {1: 14.5, 2: 13.0, 3: 11.7, 4: 11.5},
    (64, 1, 8, 16384): {1: 128.4, 4: 40.5, 8: 26.6, 12: 23.5, 16: 23.6, 24: 24.0, 32: 24.5, 48: 29.7, 64: 30.0,
                        128: 35.6},
    (64, 1, 32, 16384): {1: 129.7, 2: 72.8, 3: 59.4, 4: 55.5, 6: 60.4, 8: 57.2, 12: 64.4, 16: 66.3, 32: 68.4},
    (128, 1, 1, 16384): {1: 194.8, 8: 35.5, 16: 24.7, 32: 19.5, 48: 18.2, 64: 17.4, 96: 17.0, 128: 18.2},
    (128, 8, 8, 16384): {1: 214.8, 2: 182.3, 3: 191.1, 4: 183.9, 8: 187.1, 16: 191.6, 64: 198.4},
    (128, 32, 8, 16384): {1: 697.2, 2: 706.8, 4: 709.6, 8: 704.9},
}


COMBINE_KERNEL = DecodeSplitPolicy(cluster_splits=0)
LONG_CALLS = DecodeSplitPolicy(cluster_splits=0, short_call_us=0)  # two key blocks a warp at least, always


def chosen(hdim, heads_kv, batch, keys, seqlen_q=1, policy=COMBINE_KERNEL, sms=H100_SMS, gbps=H100_GBPS, slots=()):
    spec = decode_spec(H200, torch.bfloat16, hdim, seqlen_q > 1, seqlen_q, 32 // heads_kv, None)
    return choose_splits(spec, batch, heads_kv, seqlen_q, 32 // heads_kv, keys, sms, gbps, policy, slots)


@pytest.mark.parametrize("cell", list(MEASURED))
def test_the_chosen_count_is_within_7_percent_of_the_fastest_measured(cell):
    times = MEASURED[cell]
    splits = chosen(*cell)
    nearest = min(times, key=lambda n: abs(n - splits))  # the measured count closest to the choice
    assert times[nearest] <= 1.07 * min(times.values()), (splits, nearest, times)


def test_a_split_must_save_more_than_the_combine_costs():
    assert chosen(64, 1, 128, 1024) == 1  # 128 CTAs already stream at the memory's rate
    assert chosen(64, 8, 8, 1024) == 1  # 64 CTAs of 1k keys: half the keys saves less than a combine
    assert chosen(64, 8, 8, 16384) == 2  # of 16k keys it saves more
    assert chosen(128, 8, 64, 32768) == 1  # 512 CTAs


def test_splits_keep_the_kernels_fewest_blocks_and_the_policys_most():
    assert chosen(128, 8, 1, 128) == 1  # 4 blocks of 32 keys: nothing to share
    mqa = decode_spec(H200, torch.bfloat16, 64, False, 1, 32, None)
    assert 1 < chosen(64, 1, 1, 2048, policy=LONG_CALLS) <= 2048 // mqa.tile.block_n // mqa.min_blocks_per_split
    # a short call (0.5 MB): one block per warp
    assert 2048 // mqa.tile.block_n // mqa.min_blocks_per_split < chosen(64, 1, 1, 2048) <= 2048 // 16 // 4
    assert 100 <= chosen(128, 1, 1, 1 << 20) <= 128  # one CTA over a million keys: the SMs, at most the default 128
    assert chosen(128, 1, 1, 16384, policy=DecodeSplitPolicy(max_splits=1)) == 1
    assert chosen(128, 1, 1, 16384, policy=DecodeSplitPolicy(max_splits=16)) == 16


# slots[s]: CTAs an H100 runs at once in clusters of s, one CTA an SM (whole clusters per GPC)
H100_SLOTS = (0, 0, 132, 126, 120, 120, 108, 112, 112)


def test_a_merge_in_a_cluster_makes_a_few_splits_cheap_where_the_arch_has_clusters():
    clusters = DecodeSplitPolicy(cluster_splits=8, cluster_us=0.5)
    def with_clusters(*cell, slots=H100_SLOTS):
        return chosen(*cell, policy=clusters, slots=slots)
    assert with_clusters(64, 8, 8, 1024) == 2  # the combine kernel's cost kept it at 1
    assert with_clusters(128, 1, 8, 1024) == 8 > chosen(128, 1, 8, 1024, policy=LONG_CALLS)
    assert with_clusters(128, 8, 1, 4096) == 8 < chosen(128, 8, 1, 4096)  # 8 in a cluster beat 15
    assert with_clusters(128, 1, 1, 16384) == chosen(128, 1, 1, 16384)  # 88 splits: the combine kernel
    assert with_clusters(128, 8, 1, 4096, slots=()) == chosen(128, 8, 1, 4096)  # no slots: no clusters
    ampere = decode_spec(find_profile("a100"), torch.bfloat16, 128, False, 1, 4, None)
    assert not ampere.cluster_merge and cluster_slots(ampere, 0) == ()  # asked of no GPU: sm_80 has none
    assert decode_spec(H200, torch.bfloat16, 128, False, 1, 4, None).cluster_merge


def test_splits_merge_in_clusters_only_where_all_of_the_grids_clusters_run_at_once():
    policy = DecodeSplitPolicy()
    assert decode_splits.in_cluster(4, 30, H100_SLOTS, policy)  # 120 CTAs in 30 clusters: one wave
    assert not decode_splits.in_cluster(4, 32, H100_SLOTS, policy)  # 128: two waves, as measured
    assert decode_splits.in_cluster(2, 64, H100_SLOTS, policy) and not decode_splits.in_cluster(2, 67, H100_SLOTS,
                                                                                               policy)
    assert not decode_splits.in_cluster(1, 1, H100_SLOTS, policy)  # one split: nothing to merge
    assert not decode_splits.in_cluster(4, 1, H100_SLOTS, DecodeSplitPolicy(cluster_splits=3))  # over the policy's
    assert not decode_splits.in_cluster(2, 1, H100_SLOTS, DecodeSplitPolicy(cluster_splits=0))
    assert not decode_splits.in_cluster(4, 1, (), policy)  # no cluster merges in the kernel


def test_faster_memory_takes_more_ctas_and_a_costlier_combine_fewer_splits():
    assert chosen(128, 8, 8, 16384, gbps=4800) >= chosen(128, 8, 8, 16384, gbps=1000)
    assert chosen(128, 8, 1, 16384, policy=DecodeSplitPolicy(combine_us=50)) < chosen(128, 8, 1, 16384)
    # a profile's memory_gbps stands in for the device's
    assert chosen(128, 8, 8, 16384, policy=DecodeSplitPolicy(memory_gbps=1000), gbps=4800) == \
        chosen(128, 8, 8, 16384, gbps=1000)


def test_a_growing_cache_reuses_the_search_within_a_6_percent_step():
    decode_splits._fastest_split.cache_clear()
    counts = {chosen(128, 8, 1, keys) for keys in range(16384, 17408)}  # 1024 decode steps
    assert len(counts) <= 2 and decode_splits._fastest_split.cache_info().misses <= 2


def test_the_devices_peak_bandwidth_from_its_memory_clock_and_bus(monkeypatch):
    def props(**fields):
        return lambda index: types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0,
                                                   multi_processor_count=132, **fields)

    monkeypatch.setattr(torch.cuda, "get_device_properties", props(memory_clock_rate=2_619_000, memory_bus_width=5120))
    device_facts.cache_clear()
    sms, gbps = device_facts(0)
    assert sms == 132 and round(gbps) == 3352
    monkeypatch.setattr(torch.cuda, "get_device_properties", props())  # a torch that does not report them
    device_facts.cache_clear()
    assert device_facts(0) == (132, FALLBACK_MEMORY_GBPS)
    device_facts.cache_clear()


# MQA with one query token on the 16-row tile (two row blocks a KV head: what a short call takes),
# every count measured on an H100 (lab/decode_mqa_rows.py, 2026-12-05; up to 8 splits in clusters where
# they fit): the cells whose chosen count was among those measured. The model's other picks there (55
# splits of 16k keys at hdim 64, 59 at 128, 7 of 8 x 1k at 128) ran 13.4, 16.2 and 10.9 us in
# bench --decode, beside 12.9-15.8, 15.5-15.7 and 10.7-12.8 for the counts around them.
MEASURED_16_ROWS = {
    (64, 1, 1, 1024): {1: 10.2, 2: 8.9, 4: 7.9, 8: 7.9, 16: 10.6},
    (64, 1, 8, 1024): {1: 10.3, 2: 9.0, 4: 8.8, 8: 14.2, 16: 17.7},
    (64, 1, 32, 1024): {1: 10.6, 2: 10.8, 4: 19.3, 8: 25.2, 16: 37.8},
    (128, 1, 1, 1024): {1: 15.1, 2: 12.5, 4: 9.8, 8: 9.2, 16: 11.5, 32: 11.8},
    (128, 1, 32, 1024): {1: 15.3, 2: 15.0, 4: 21.6, 8: 29.4, 16: 46.1, 32: 81.3},
}
H100_POLICY = DecodeSplitPolicy(memory_gbps=H100_GBPS)  # the device's peak without a device


@pytest.mark.parametrize("cell", list(MEASURED_16_ROWS))
def test_a_short_calls_16_row_count_is_within_7_percent_of_the_fastest_measured(cell):
    hdim, heads_kv, batch, keys = cell
    profile = dataclasses.replace(H200, decode_split=H100_POLICY)
    spec = decode_spec(profile, torch.bfloat16, hdim, False, 1, 32 // heads_kv, None,
                       key_rows=batch * heads_kv * keys)
    assert spec.tile.rows == 16
    splits = choose_splits(spec, batch, heads_kv, 1, 32 // heads_kv, keys, H100_SMS, H100_GBPS, H100_POLICY,
                           H100_SLOTS)
    times = MEASURED_16_ROWS[cell]
    assert splits in times and times[splits] <= 1.07 * min(times.values()), (splits, times)


def test_a_call_is_short_where_its_read_takes_at_most_short_call_us_at_the_memorys_peak():
    mb = 2 ** 20
    assert decode_splits.short_call(H100_POLICY, 16 * mb, 0)  # 5.0 us at 3,352 GB/s
    assert not decode_splits.short_call(H100_POLICY, 32 * mb, 0)  # 10.0 us
    assert not decode_splits.short_call(dataclasses.replace(H100_POLICY, short_call_us=0), 1, 0)
    assert not decode_splits.short_call(H100_POLICY, 0, 0)


def test_the_per_cta_read_counts_every_row_block():
    """Two 16-row blocks of a KV head each read all its keys: at one split a CTA reads the whole
    cache, and the model prices it so (it chose one split for MQA 1 x 1k at hdim 64, 10.2 us,
    where four took 7.9)."""
    profile = dataclasses.replace(H200, decode_split=H100_POLICY)
    m16 = decode_spec(profile, torch.bfloat16, 64, False, 1, 32, None, key_rows=1024)
    terms = decode_splits.call_terms(m16, 1, 1, 1, 32, 1024, H100_POLICY)
    assert terms.ctas == 2 and terms.read_bytes == 2 * terms.kv_bytes
    m32 = decode_spec(H200, torch.bfloat16, 64, False, 1, 32, None)
    assert decode_splits.call_terms(m32, 1, 1, 1, 32, 1024, H100_POLICY).read_bytes == terms.kv_bytes
