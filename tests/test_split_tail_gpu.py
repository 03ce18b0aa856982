"""GPU correctness of the sm90 split tail (SPLIT_TAIL): a non-causal call whose last wave of tiles
is shared out over every CTA by K/V blocks, the tiles cut between CTAs merged by their last piece.

Shapes are chosen per GPU and profile so that the launcher splits (flashtune.tiles mirrors its
rule), at three tail sizes: a third of the SMs (tiles cut in up to three pieces), half, and a
single partial wave. Each call's outputs are poisoned first and compared with the fp32
reference; the split is seen in the allocator: it takes its partial results' scratch from
PyTorch's caching allocator, one allocation more than a call that does not split. Runs with the
profile in $FLASHTUNE_PROFILE (default: the GPU's), and skips where it has no split tail.
"""
from __future__ import annotations

import math
import os

import pytest
import torch

from test_ops_gpu import _check

pytestmark = pytest.mark.gpu

SEQLEN = 1500  # not a multiple of any block_n: the last piece masks the tail block
TAILS = {"third": (1, 0.33), "half": (1, 0.5), "one-wave": (0, 0.6)}  # whole waves, last wave / SMs


@pytest.fixture(scope="module")
def profile():
    import flashtune.ops as ops
    from flashtune.tiles import sm90_flag_value

    prof = ops.use_profile(os.environ.get("FLASHTUNE_PROFILE")) or ops.active_profile()
    if prof.family != "sm90" or not sm90_flag_value("SPLIT_TAIL", prof.nvcc_flags):
        pytest.skip(f"profile {prof.name} has no split tail (sm90 with FLASHTUNE_SM90_SPLIT_TAIL=1)")
    ops.poison_outputs = True
    yield prof
    ops.poison_outputs = False
    ops.use_profile(None)


def _split_shape(profile, dtype, hdim, tail, heads_ratio=1):
    """Heads (batch 1, SEQLEN-long sequences, a multiple of heads_ratio) whose tiles the launcher
    splits: `tail` picks the number of whole waves and the last wave's share of the SMs."""
    from flashtune.ops import select_spec
    from flashtune.tiles import sm90_split_tail_tiles

    spec = select_spec(profile, dtype, hdim, False, SEQLEN, SEQLEN)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    m_blocks = math.ceil(SEQLEN / spec.tile.block_m)
    waves, share = TAILS[tail]
    heads = max(1, round((waves + share) * sms / m_blocks))
    heads = -(-heads // heads_ratio) * heads_ratio  # whole kv groups
    tiles = m_blocks * heads
    split = sm90_split_tail_tiles(tiles, sms, math.ceil(SEQLEN / spec.tile.block_n), spec.tile.block_m // 64)
    assert split > 0, f"{tiles} tiles of {spec.tile.label} on {sms} SMs: no split, pick another shape"
    return heads


def _allocations() -> int:
    return torch.cuda.memory_stats()["allocation.all.allocated"]


def _call_counting_allocations(q, k, v, causal=False):
    from flashtune import flash_attn_func

    before = _allocations()
    out, lse = flash_attn_func(q, k, v, causal=causal, return_lse=True)
    return out, lse, _allocations() - before


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("hdim", [64, 128, 256])
@pytest.mark.parametrize("tail", list(TAILS))
def test_split_tail_matches_reference(profile, dtype, hdim, tail):
    heads = _split_shape(profile, dtype, hdim, tail)
    q, k, v = (torch.randn(1, SEQLEN, heads, hdim, device="cuda", dtype=dtype) for _ in range(3))
    for causal in (False, True):  # the modules load on their first calls
        _call_counting_allocations(q, k, v, causal)
    out, lse, split_allocs = _call_counting_allocations(q, k, v)
    _check(out, lse, q, k, v, causal=False)
    # A causal call of the same shape never splits: one allocation fewer (no scratch).
    *_, causal_allocs = _call_counting_allocations(q, k, v, causal=True)
    assert split_allocs == causal_allocs + 1, (
        f"{split_allocs} allocations against a causal call's {causal_allocs}: the split's scratch is missing")


def test_split_tail_with_gqa_back_to_back(profile):
    """Three calls in a row (the counters must be 0 again after each) with 2 q heads per kv head,
    and the first repeated: bit for bit the same."""
    from flashtune import flash_attn_func

    heads = _split_shape(profile, torch.bfloat16, 128, "third", heads_ratio=2)
    inputs = [(torch.randn(1, SEQLEN, heads, 128, device="cuda", dtype=torch.bfloat16),
               *(torch.randn(1, SEQLEN, heads // 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2)))
              for _ in range(3)]
    results = [flash_attn_func(q, k, v, return_lse=True) for q, k, v in inputs]
    for (out, lse), (q, k, v) in zip(results, inputs):
        _check(out, lse, q, k, v, causal=False)
    # The last piece merges every piece in the tile's order: the same bits whichever finished last.
    for _ in range(3):
        again, again_lse = flash_attn_func(*inputs[0], return_lse=True)
        assert torch.equal(again, results[0][0]) and torch.equal(again_lse, results[0][1])


def test_split_tail_replayed_from_a_cuda_graph(profile):
    """A captured call gets fresh counters (zeroed in the graph) and its scratch from the graph's pool."""
    from flashtune import flash_attn_func

    heads = _split_shape(profile, torch.bfloat16, 128, "half")
    q, k, v = (torch.randn(1, SEQLEN, heads, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        flash_attn_func(q, k, v)  # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out, lse = flash_attn_func(q, k, v, return_lse=True)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        for x in (q, k, v):
            x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, lse, q, k, v, causal=False)
