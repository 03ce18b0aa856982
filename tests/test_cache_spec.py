"""CacheSpec (the sm90 family's KV-cache kernels, wgmma) and which decode calls go to them; no GPU
(one slow test compiles a kernel for sm_90a and reads its SASS)."""
import subprocess

import pytest
import torch

from flashtune.kernels.arch import get_arch
from flashtune.kernels.cache_spec import CacheSpec, cache_specs_for_profile, cache_tile
from flashtune.kernels.decode_spec import DecodeTile
from flashtune.kernels.profiles import find_profile
from flashtune.kernels.spec import SpecError
from flashtune.runtime.decode import decode_spec
from flashtune.runtime.decode_splits import choose_splits

H200 = find_profile("h200")
BF16 = torch.bfloat16


def test_packed_rows_that_fill_a_tile_go_to_the_kv_cache_kernel_on_sm90():
    mqa_spec = decode_spec(H200, BF16, 128, True, 4, 32, None)  # 4 tokens x 32 heads: 128 rows
    assert isinstance(mqa_spec, CacheSpec)
    assert mqa_spec.name == "flashtune_decode_bf16_h128_m128x128_w12_s2_wgmma_c_sm90a"
    chunk = decode_spec(H200, BF16, 64, False, 300, 4, 256)  # chunked prefill on pages of 256
    assert isinstance(chunk, CacheSpec) and chunk.name.endswith("_wgmma_paged_sm90a")


@pytest.mark.parametrize("why,args,kwargs", [
    ("32 packed rows: the decode kernel's tile", (128, False, 1, 32, None), {}),
    ("pages of 16 hold no whole key block", (128, True, 4, 32, 16), {}),
    ("head dim 96 is not a built one", (96, True, 4, 32, None), {}),
    ("a head ratio of 3 does not divide 128 rows", (128, True, 64, 3, None), {}),
    ("varlen queries", (128, True, 8, 32, None), {"varlen_q": True}),
    ("an e4m3 cache", (128, True, 4, 32, None), {"kv_fp8": True}),
])
def test_other_calls_stay_on_the_decode_kernels(why, args, kwargs):
    spec = decode_spec(H200, BF16, *args, **kwargs)
    assert not isinstance(spec, CacheSpec) and "_wgmma" not in spec.name, why


def test_an_sm80_profile_has_no_kv_cache_kernel():
    assert not isinstance(decode_spec(find_profile("h200-sm80"), BF16, 128, True, 4, 32, None), CacheSpec)
    assert cache_specs_for_profile(find_profile("rtx5090")) == []
    assert len(cache_specs_for_profile(H200)) == 2 * 3 * 2 * 2  # dtypes x head dims x causal x paging


def test_a_kv_cache_spec_refuses_what_its_kernel_cannot_build():
    with pytest.raises(SpecError, match="wgmma"):
        CacheSpec("sm_89", "bfloat16", 128, cache_tile(128), False)
    with pytest.raises(SpecError, match="tile"):
        CacheSpec("sm_90a", "bfloat16", 128, DecodeTile(128, 64, 12, 2), False)
    with pytest.raises(SpecError, match="contiguous or paged"):
        CacheSpec("sm_90a", "bfloat16", 128, cache_tile(128), False, "gather")


def test_the_generated_source_spells_the_tile_and_the_cache_layout():
    spec = CacheSpec("sm_90a", "float16", 256, cache_tile(256), True, "paged")
    source = spec.source()
    assert "Traits<__half, 256, 128, 64, 2, true, false, KernelSchedule" in source
    assert "KvCache::kPages" in source and "persistent = false" in source and "tma_store = false" in source
    assert f"{spec.combine_name}(" in source and f"{spec.launcher_symbol}(" in source
    assert spec.smem_bytes < get_arch("sm_90a").max_smem_per_block
    assert not spec.cluster_merge  # its splits always merge in the combine kernel (launch_kvcache.cuh refuses)


def test_splits_keep_two_blocks_each_and_fill_the_gpu():
    spec = decode_spec(H200, BF16, 128, True, 4, 32, None)
    # 1 sequence x 1 KV head x 1 row block over 16k keys (128 blocks of 128): split to fill 132 SMs
    assert 32 <= choose_splits(spec, 1, 1, 4, 32, 16384, 132, 4800) <= 64
    assert choose_splits(spec, 1, 1, 4, 32, 256, 132, 4800) == 1  # two blocks: no split
    assert choose_splits(spec, 128, 1, 4, 32, 16384, 132, 4800) == 1  # 128 CTAs fill the GPU


@pytest.mark.slow
def test_a_kv_cache_kernel_compiles_without_spills_and_runs_on_wgmma():
    from flashtune.kernels.build import build_specs
    from flashtune.kernels.toolchain import detect_toolchain

    cuobjdump = detect_toolchain().cuobjdump_path
    if cuobjdump is None:
        pytest.skip("cuobjdump not installed (pip install '.[test]' brings it)")
    spec = decode_spec(H200, BF16, 128, True, 4, 32, 256)
    results, failures = build_specs([spec], jobs=1)
    assert not failures, failures
    assert results[0].spill_stores == 0 and results[0].spill_loads == 0
    sass = subprocess.run([cuobjdump, "-sass", results[0].library], capture_output=True, text=True).stdout
    assert "HGMMA" in sass and "UTMALDG" in sass and spec.name in sass


def test_a_broadcast_input_is_refused_before_a_tma_kernel_sees_it():
    from flashtune.runtime.checks import FlashtuneInputError, refuse_broadcast

    k = torch.zeros(2, 1, 1, 128).expand(2, 300, 1, 128)  # one key repeated: a stride of 0 over 300 rows
    with pytest.raises(FlashtuneInputError, match="k_cache is broadcast.*call .contiguous"):
        refuse_broadcast(q=torch.zeros(2, 4, 32, 128), k_cache=k)
    refuse_broadcast(q=torch.zeros(1, 4, 32, 128).expand(1, 4, 32, 128), k_cache=torch.zeros(2, 300, 1, 128))
