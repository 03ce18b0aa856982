"""Head dims between the built ones (any multiple of 8 from 32 to 256) on the GPU, against fp32:
prefill through the next built kernel on zero-padded inputs, decode through the decode kernels
computing at the next built size while reading and writing the head dim's bytes only, and a
Phi-3-like model (head dim 96) through transformers. Outputs start as NaN."""
from __future__ import annotations

import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("poisoned")]

import flashtune  # noqa: E402
from flashtune.measure.reference import attention_reference, rel_l2  # noqa: E402
from flashtune.runtime import ops  # noqa: E402

DEV = "cuda"
ODD_DIMS = (32, 40, 80, 96, 112, 136, 192)


def close_to(out, ref, dtype):
    """Within 3x the rounding of the fp32 reference to the output dtype."""
    assert not torch.isnan(out).any(), "an output element was never written"
    assert rel_l2(out, ref) <= 3 * rel_l2(ref.to(dtype).float(), ref) + 1e-6


def randn(*shape, dtype=torch.bfloat16, seed=0):
    return torch.randn(*shape, device=DEV, dtype=dtype, generator=torch.Generator(device=DEV).manual_seed(seed))


@pytest.mark.parametrize("hdim", ODD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_prefill_at_a_head_dim_between_the_built_ones(hdim, causal):
    q, k, v = randn(2, 333, 8, hdim, seed=1), randn(2, 500, 2, hdim, seed=2), randn(2, 500, 2, hdim, seed=3)
    out, lse = flashtune.flash_attn_func(q, k, v, causal=causal, return_lse=True)
    ref, ref_lse = attention_reference(q, k, v, causal)
    assert out.shape == q.shape and out.is_contiguous()
    close_to(out, ref, q.dtype)
    finite = torch.isfinite(ref_lse)
    assert (lse[finite] - ref_lse[finite]).abs().max() < 2e-3  # the scale is the head dim's own
    # an sm90 profile reads the tensors in place (its narrow kernel); the sm80 family pads copies
    from flashtune.measure.timing import kernel_names

    profile = ops.active_profile(q.device)
    spec = ops.kernel_for(profile, q.dtype, hdim, causal, 333, 500, 4)
    assert spec.narrow == (profile.family == "sm90" and hdim not in profile.head_dims)
    ours = [n for n in kernel_names(lambda: flashtune.flash_attn_func(q, k, v, causal=causal))
            if n.startswith("flashtune_")]
    assert ours == [spec.name]


@pytest.mark.parametrize("hdim", ODD_DIMS)
@pytest.mark.parametrize("splits", [1, 3, 0])
@pytest.mark.parametrize("page_size", [None, 16])
def test_decode_at_a_head_dim_between_the_built_ones(hdim, splits, page_size):
    batch, capacity = 3, 640
    q = randn(batch, 1, 32, hdim, seed=4)
    k, v = randn(batch, capacity, 8, hdim, seed=5), randn(batch, capacity, 8, hdim, seed=6)
    seqlens = torch.tensor([0, 1, 600], dtype=torch.int32, device=DEV)
    table = None
    k_cache, v_cache = k, v
    if page_size:
        table = torch.arange(batch * capacity // page_size, device=DEV, dtype=torch.int32).flip(0).view(batch, -1)
        k_cache = torch.empty(batch * capacity // page_size, page_size, 8, hdim, device=DEV, dtype=k.dtype)
        v_cache = torch.empty_like(k_cache)
        k_cache[table.flatten().long()] = k.reshape(-1, page_size, 8, hdim)
        v_cache[table.flatten().long()] = v.reshape(-1, page_size, 8, hdim)
    out = flashtune.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table,
                                            num_splits=splits)
    for b, n in enumerate(seqlens.tolist()):
        if n == 0:
            assert (out[b] == 0).all()
            continue
        ref, _ = attention_reference(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], False)
        close_to(out[b:b + 1], ref, q.dtype)


def test_a_phi3_like_model_with_head_dim_96_generates_as_close_to_fp32_as_sdpa():
    transformers = pytest.importorskip("transformers")
    from fp32_agreement import GREEDY_SLACK, TOP1_SLACK, assert_as_close_as, greedy, three_models, top1

    ops.use_profile(os.environ.get("FLASHTUNE_PROFILE"))
    config = transformers.Phi3Config(vocab_size=1000, hidden_size=768, intermediate_size=1536, num_hidden_layers=4,
                                     num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=4096,
                                     pad_token_id=None, bos_token_id=None, eos_token_id=None)

    def build(config, attention, dtype):
        return transformers.Phi3ForCausalLM._from_config(config, attn_implementation=attention, torch_dtype=dtype)

    exact, sdpa, ours = three_models(build, config)
    ids = torch.randint(0, 1000, (2, 300), device=DEV)
    assert_as_close_as(top1(ours, exact, ids), top1(sdpa, exact, ids), TOP1_SLACK, "prefill top-1")
    assert_as_close_as(greedy(ours, exact, ids, 32), greedy(sdpa, exact, ids, 32), GREEDY_SLACK, "greedy tokens")
