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


@pytest.mark.parametrize("overrides,message", [
    (dict(num_splits=300), "num_splits must be an int in 0..256"),
    (dict(num_splits=True), "num_splits must be an int"),
    (dict(scheduler_metadata=torch.zeros(4, dtype=torch.int32)), "scheduler_metadata .* is not read"),
    (dict(fa_version=4), "fa_version=4: vLLM's FlashAttention versions are 2 and 3"),
    (dict(sinks=torch.zeros(32), s_aux=torch.zeros(32)), "sinks and s_aux are the same argument"),
    (dict(max_seqlen_q=None), "max_seqlen_q is required"),
    (dict(seqused_k=None, cu_seqlens_k=torch.tensor([0, 3, 64], dtype=torch.int32), max_seqlen_k=None),
     "cu_seqlens_k needs max_seqlen_k"),
    (dict(q_descale=torch.ones(2, 8, dtype=torch.int32)), "q_descale must be a float tensor"),
    (dict(q_descale=torch.ones(1).expand(2, 8), k_descale=torch.ones(1).expand(2, 8),
          v_descale=torch.ones(1).expand(2, 8)), "on cpu"),  # vLLM's ones: taken; the device last
])
def test_vllms_keywords_are_checked(overrides, message):
    with pytest.raises(flashtune.FlashtuneInputError, match=message):
        paged_varlen_call(**overrides)


def test_descales_beside_16_bit_operands_must_be_1():
    """Read on the host: with packed keys before anything else (the paged call reads them with its
    index values, after the device check: tests/test_kvcache_gpu.py)."""
    q, k = torch.zeros(5, 4, 64, dtype=BF16), torch.zeros(7, 4, 64, dtype=BF16)
    cu_q, cu_k = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 3, 7], dtype=torch.int32)
    with pytest.raises(flashtune.FlashtuneInputError, match="k_descale scales FP8 operands; with 16-bit ones, as "
                                                            "here, it must be 1"):
        flashtune.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 3, 4, k_descale=torch.full((2, 4), 2.0))
    with pytest.raises(flashtune.FlashtuneInputError, match="on cpu"):  # ones: taken
        flashtune.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 3, 4, q_descale=torch.ones(2, 4),
                                         k_descale=torch.ones(2, 4), v_descale=torch.ones(2, 4))


def test_packed_keys_name_what_they_need():
    q, k = torch.zeros(5, 4, 64, dtype=BF16), torch.zeros(7, 4, 64, dtype=BF16)
    cu_q, cu_k = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 3, 7], dtype=torch.int32)
    with pytest.raises(flashtune.FlashtuneInputError, match="packed keys need cu_seqlens_k and max_seqlen_k"):
        flashtune.flash_attn_varlen_func(q, k, k, cu_q, max_seqlen_q=3)
    with pytest.raises(flashtune.FlashtuneInputError, match="num_splits=2 splits a KV-cache call's keys"):
        flashtune.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 3, 4, num_splits=2)


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, *args):
        self.calls.append(args)
        return "out", "lse"


PAGED_VARLEN_ARGS = ("q", "k_cache", "v_cache", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k",
                     "seqused_k", "block_table", "scale", "causal", "out", "with_lse", "k_descale", "v_descale",
                     "window_size", "softcap", "sinks", "alibi_slopes", "num_splits")


def test_vllms_call_as_vllm_writes_it_reaches_the_paged_kernels_with_every_argument(monkeypatch):
    """vLLM's keywords (no cu_seqlens_k; num_splits, s_aux, fa_version, window_size None, descales of
    1) reach paged_varlen, which tests/test_kvcache_gpu.py runs on the GPU."""
    from flashtune.runtime import kvcache
    record = Recorder()
    monkeypatch.setattr(kvcache, "paged_varlen", record)
    q, out, cache = torch.zeros(5, 32, 128, dtype=BF16), torch.zeros(5, 32, 128, dtype=BF16), torch.zeros(
        8, 16, 8, 128, dtype=BF16)
    cu_q, used = torch.tensor([0, 1, 5], dtype=torch.int32), torch.tensor([3, 64], dtype=torch.int32)
    pages, sinks = torch.zeros(2, 4, dtype=torch.int32), torch.zeros(32)
    ones = torch.ones(1).expand(2, 8)  # vLLM's descales: the layer's scale (1) expanded to (seqs, kv heads)
    flashtune.flash_attn_varlen_func(q=q, k=cache, v=cache, out=out, cu_seqlens_q=cu_q, max_seqlen_q=4, seqused_k=used,
                                     max_seqlen_k=64, softmax_scale=0.1, causal=True, alibi_slopes=None,
                                     window_size=None, block_table=pages, softcap=0.0, scheduler_metadata=None,
                                     fa_version=2, q_descale=ones, k_descale=ones, v_descale=ones, num_splits=3,
                                     s_aux=sinks)
    got = dict(zip(PAGED_VARLEN_ARGS, record.calls[-1]))
    assert got["k_descale"] is None and got["v_descale"] is None  # ones on a 16-bit cache: nothing to scale
    assert got["q"] is q and got["out"] is out and got["cu_seqlens_q"] is cu_q and got["seqused_k"] is used
    assert got["block_table"] is pages and got["sinks"] is sinks and got["num_splits"] == 3
    assert got["scale"] == 0.1 and got["causal"] is True and got["window_size"] is None and got["max_seqlen_q"] == 4


def sglang_call(**overrides):
    """SGLang's flash_attn_with_kvcache call: packed queries, a cache of pages of 1 it has written itself."""
    args = dict(q=torch.zeros(5, 32, 128, dtype=BF16), k_cache=torch.zeros(64, 1, 8, 128, dtype=BF16),
                v_cache=torch.zeros(64, 1, 8, 128, dtype=BF16), page_table=torch.zeros(2, 32, dtype=torch.int32),
                cache_seqlens=torch.tensor([3, 32], dtype=torch.int32),
                cu_seqlens_q=torch.tensor([0, 1, 5], dtype=torch.int32),
                cu_seqlens_k_new=torch.tensor([0, 3, 35], dtype=torch.int32), max_seqlen_q=4, softmax_scale=0.1,
                causal=True, return_softmax_lse=True)
    args.update(overrides)
    return flashtune.flash_attn_with_kvcache(**args), args


def test_sglangs_call_reaches_the_paged_kernels_with_every_argument(monkeypatch):
    from flashtune.runtime import kvcache
    record = Recorder()
    monkeypatch.setattr(kvcache, "paged_varlen", record)
    result, args = sglang_call(num_splits=2, window_size=(7, 0))
    assert result == ("out", "lse")
    got = dict(zip(PAGED_VARLEN_ARGS, record.calls[-1]))
    assert got["q"] is args["q"] and got["block_table"] is args["page_table"]
    assert got["seqused_k"] is args["cache_seqlens"] and got["cu_seqlens_q"] is args["cu_seqlens_q"]
    assert got["cu_seqlens_k"] is None and got["max_seqlen_q"] == 4 and got["with_lse"] is True
    assert got["num_splits"] == 2 and got["window_size"] == (7, 0) and got["scale"] == 0.1
    sglang_call(cache_seqlens=32, return_softmax_lse=False)  # an int: every sequence's count
    assert torch.equal(dict(zip(PAGED_VARLEN_ARGS, record.calls[-1]))["seqused_k"],
                       torch.tensor([32, 32], dtype=torch.int32))


@pytest.mark.parametrize("overrides,message", [
    (dict(qv=torch.zeros(5, 32, 128, dtype=BF16)), "qv .* is not served"),
    (dict(rotary_seqlens=torch.zeros(2, dtype=torch.int32)), "rotary_seqlens is not served"),
    (dict(attention_chunk=1024), "attention_chunk=1024 .* is not served"),
    (dict(pack_gqa=False), "pack_gqa=False"),
    (dict(sm_margin=4), "sm_margin=4"),
    (dict(scheduler_metadata=torch.zeros(4, dtype=torch.int32)), "scheduler_metadata"),
    (dict(block_table=torch.zeros(2, 32, dtype=torch.int32)), "page_table and block_table are the same argument"),
    (dict(page_table=None), "served with a paged cache: pass page_table"),
    (dict(max_seqlen_q=None), "cu_seqlens_q needs max_seqlen_q"),
    (dict(k=torch.zeros(5, 8, 128, dtype=BF16), v=torch.zeros(5, 8, 128, dtype=BF16)), "write them into the cache"),
    (dict(cache_leftpad=torch.zeros(2, dtype=torch.int32)), "cache_leftpad are not served with cu_seqlens_q"),
    (dict(q=torch.zeros(2, 1, 32, 128, dtype=BF16)), "with cu_seqlens_q, q is \\(total_q, heads, head_dim\\)"),
    (dict(cache_seqlens=40), "cache_seqlens 40 must be within the capacity 32"),
    (dict(q=torch.zeros(5, 32, 128, dtype=BF16, requires_grad=True)), "forward-only"),  # no silent missing grad
    (dict(q_descale=torch.ones(2, 8)), "q_descale: q stays 16-bit"),
    (dict(cache_seqlens=torch.tensor([3, 32, 1], dtype=torch.int32)), "seqused_k must be an int32 tensor of shape"),
    (dict(), "on cpu"),  # everything else right: the device
])
def test_sglangs_call_checks_its_inputs(overrides, message):
    with pytest.raises(flashtune.FlashtuneInputError, match=message):
        sglang_call(**overrides)


def test_max_seqlen_q_goes_with_cu_seqlens_q():
    with pytest.raises(flashtune.FlashtuneInputError, match="max_seqlen_q goes with cu_seqlens_q"):
        call(max_seqlen_q=1)
