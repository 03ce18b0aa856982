"""flash_attn_with_kvcache's bad inputs, each one clear FlashtuneInputError raised before anything
runs (CPU tensors: devices are checked last)."""
import pytest
import torch

import flashtune

BF16 = torch.bfloat16
E4M3 = torch.float8_e4m3fn


def call(**overrides):
    args = dict(q=torch.zeros(2, 1, 32, 128, dtype=BF16), k_cache=torch.zeros(2, 64, 8, 128, dtype=BF16),
                v_cache=torch.zeros(2, 64, 8, 128, dtype=BF16))
    args.update(overrides)
    flashtune.flash_attn_with_kvcache(**args)


@pytest.mark.parametrize("overrides,message", [
    (dict(k_cache=torch.zeros(6, 24, 8, 128, dtype=BF16), v_cache=torch.zeros(6, 24, 8, 128, dtype=BF16),
          block_table=torch.zeros(2, 3, dtype=torch.int32)), "page size 24"),
    (dict(k_cache=torch.zeros(6, 1024, 8, 128, dtype=BF16), v_cache=torch.zeros(6, 1024, 8, 128, dtype=BF16),
          block_table=torch.zeros(2, 3, dtype=torch.int32)), "up to 512"),
    (dict(block_table=torch.zeros(3, 3, dtype=torch.int32)), "block_table must be"),
    (dict(block_table=torch.zeros(2, 3, dtype=torch.int64)), "block_table must be"),
    (dict(cache_seqlens=torch.zeros(2, dtype=torch.int64)), "cache_seqlens must be an int32"),
    (dict(cache_seqlens=torch.zeros(3, dtype=torch.int32)), "shape \\(batch,\\) = \\(2,\\)"),
    (dict(cache_seqlens=65), "within the capacity 64"),
    (dict(k=torch.zeros(2, 1, 8, 128, dtype=BF16)), "k and v .* go together"),
    (dict(k=torch.zeros(2, 1, 4, 128, dtype=BF16), v=torch.zeros(2, 1, 4, 128, dtype=BF16)), "k \\(new\\) must be"),
    (dict(rotary_cos=torch.zeros(64, 32), rotary_sin=torch.zeros(64, 32)), "only when appending"),
    (dict(k=torch.zeros(2, 1, 8, 128, dtype=BF16), v=torch.zeros(2, 1, 8, 128, dtype=BF16),
          rotary_cos=torch.zeros(64, 80), rotary_sin=torch.zeros(64, 80)), "rotary_dim 160"),
    (dict(window_size=(-3, 0)), "window_size=\\(-3, 0\\): each side"),
    (dict(k_cache=torch.zeros(2 * 64 * 8 * 128 + 4, dtype=BF16)[4:].view(2, 64, 8, 128)), "k_cache starts at storage offset 4"),
    (dict(v_cache=torch.zeros(2, 64, 8, 132, dtype=BF16)[..., :128]), "v_cache's strides"),
    (dict(softcap=float("nan")), "softcap must be a finite number"),
    (dict(num_splits=-1), "num_splits"),
    (dict(q=torch.zeros(2, 1, 32, 96, dtype=BF16)), "head dim 96 \\(k_cache: 128\\) is not served"),
    (dict(q=torch.zeros(2, 1, 32, 24, dtype=BF16), k_cache=torch.zeros(2, 64, 8, 24, dtype=BF16),
          v_cache=torch.zeros(2, 64, 8, 24, dtype=BF16)), "multiples of 8 from 32 to 256"),
    (dict(q=torch.zeros(2, 1, 12, 128, dtype=BF16)), "multiple of the cache's 8 KV heads"),
    (dict(v_cache=torch.zeros(2, 64, 8, 64, dtype=BF16)), "a V head dim \\(64\\) unlike K's \\(128\\) is served by "
                                                          "flash_attn_func and flash_attn_varlen_func"),
    (dict(v_cache=torch.zeros(2, 64, 8, 128, dtype=torch.float16)), "in q's dtype or both in torch.float8_e4m3fn"),
    (dict(v_cache=torch.zeros(2, 64, 8, 128, dtype=E4M3)), "in q's dtype or both in torch.float8_e4m3fn"),
    (dict(q=torch.zeros(2, 1, 32, 128, dtype=E4M3)), "q has dtype torch.float8_e4m3fn; allowed: torch.float16"),
    (dict(k_descale=torch.ones(2, 8)), "apply to an e4m3 cache; k_cache is torch.bfloat16"),
    (dict(q_descale=torch.ones(2, 8)), "q stays 16-bit in decode"),
    (dict(k_cache=torch.zeros(2, 64, 8, 128, dtype=E4M3), v_cache=torch.zeros(2, 64, 8, 128, dtype=E4M3),
          k_descale=torch.ones(3, 8)), "k_descale of shape \\(3, 8\\) does not broadcast to \\(batch, heads_kv\\) = \\(2, 8\\)"),
    (dict(k_cache=torch.zeros(2, 64, 8, 128, dtype=E4M3), v_cache=torch.zeros(2, 64, 8, 128, dtype=E4M3),
          v_descale=torch.ones(2, 8, dtype=torch.int32)), "v_descale must be a float tensor"),
    (dict(k_cache=torch.zeros(2, 64, 8, 128, dtype=E4M3), v_cache=torch.zeros(2, 64, 8, 128, dtype=E4M3),
          k_descale=torch.ones(8), v_descale=torch.ones(2, 1)), "on cpu"),  # per head and per sequence broadcast
    (dict(cache_batch_idx=torch.zeros(2, dtype=torch.int32), block_table=torch.zeros(2, 1, dtype=torch.int32),
          k_cache=torch.zeros(4, 64, 8, 128, dtype=BF16), v_cache=torch.zeros(4, 64, 8, 128, dtype=BF16)),
     "cache_batch_idx cannot be combined"),
    (dict(q=torch.zeros(2, 1, 32, 128, dtype=BF16)), "on cpu"),  # everything else right: the device
])
def test_bad_input_is_one_clear_error(overrides, message):
    with pytest.raises(flashtune.FlashtuneInputError, match=message):
        call(**overrides)


def paged_varlen_call(**overrides):
    args = dict(q=torch.zeros(5, 32, 128, dtype=BF16), k=torch.zeros(8, 16, 8, 128, dtype=BF16),
                v=torch.zeros(8, 16, 8, 128, dtype=BF16), cu_seqlens_q=torch.tensor([0, 1, 5], dtype=torch.int32),
                cu_seqlens_k=None, max_seqlen_q=4, max_seqlen_k=64,
                block_table=torch.zeros(2, 4, dtype=torch.int32), seqused_k=torch.tensor([3, 64], dtype=torch.int32))
    args.update(overrides)
    flashtune.flash_attn_varlen_func(**args)


@pytest.mark.parametrize("overrides,message", [
    (dict(block_table=None), "seqused_k is served with a paged cache"),
    (dict(seqused_k=None), "seqused_k, or cu_seqlens_k"),
    (dict(seqused_k=torch.tensor([3, 64, 1], dtype=torch.int32)), "seqused_k must be an int32 tensor of shape"),
    (dict(block_table=torch.zeros(3, 4, dtype=torch.int32)), "batch = 2"),
    (dict(k=torch.zeros(8, 24, 8, 128, dtype=BF16), v=torch.zeros(8, 24, 8, 128, dtype=BF16)), "page size 24"),
    (dict(out=torch.zeros(5, 32, 64, dtype=BF16)), "out must be a tensor like q"),
    (dict(q=torch.zeros(1, 5, 32, 128, dtype=BF16)), "q must be \\(total_q, heads, head_dim\\)"),
    (dict(), "on cpu"),
])
def test_vllms_paged_varlen_call_checks_its_inputs(overrides, message):
    with pytest.raises(flashtune.FlashtuneInputError, match=message):
        paged_varlen_call(**overrides)
