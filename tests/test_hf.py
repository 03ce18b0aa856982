"""The transformers integration, on the CPU: flashtune's functions are replaced by the fp32
reference with the same semantics, so what is tested is the glue - layouts, GQA, scaling,
causal alignment and padded batches through varlen - in real Llama/Qwen2/Mistral models."""
from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from flashtune import hf  # noqa: E402
from flashtune.runtime import kvcache, ops  # noqa: E402
from flashtune.measure.reference import attention_reference, varlen_reference  # noqa: E402

CALLS = []
VARIANTS = []  # the variant arguments each call passed


@pytest.fixture(autouse=True)
def reference_kernels(monkeypatch):
    CALLS.clear()
    VARIANTS.clear()

    def variants(kw):  # flash_attn's variant arguments, as the reference takes them
        VARIANTS.append(dict(kw))
        return kw.get("window_size", (-1, -1)), kw.get("softcap", 0.0), kw.get("sinks")

    def dense(q, k, v, softmax_scale=None, causal=False, **kw):
        CALLS.append(("dense", q.shape, k.shape, causal))
        return attention_reference(q, k, v, causal, softmax_scale, *variants(kw))[0].to(q.dtype)

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=None, causal=False, **kw):
        CALLS.append(("varlen", cu_q.tolist(), cu_k.tolist(), causal))
        return varlen_reference(q, k, v, cu_q, cu_k, causal, softmax_scale, *variants(kw))[0].to(q.dtype)

    def padded_cache(q, k, v, first, end, scale, causal, **kw):
        if first is None:  # every key: a decode step without a mask
            assert end is None
            CALLS.append(("cache", tuple(q.shape), tuple(k.shape), causal))
            first, end = torch.zeros(q.shape[0], dtype=torch.int32), torch.full((q.shape[0],), k.shape[1])
        else:
            CALLS.append(("leftpad", first.tolist(), tuple(q.shape), causal, end.tolist(), k.shape[1]))
        extra = variants(kw)
        rows = [attention_reference(q[b:b + 1], k[b:b + 1, f:e], v[b:b + 1, f:e], causal, scale, *extra)[0]
                for b, (f, e) in enumerate(zip(first.tolist(), end.tolist()))]
        return torch.cat(rows).to(q.dtype)

    monkeypatch.setattr(ops, "flash_attn_func", dense)
    monkeypatch.setattr(ops, "flash_attn_varlen_func", varlen)
    monkeypatch.setattr(kvcache, "padded_cache_decode", padded_cache)


MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
}


def _pair(kind: str):
    config_cls, model_cls = (getattr(transformers, n) for n in MODELS[kind])
    config = config_cls(vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    if kind == "mistral":
        config.sliding_window = None  # loading with a window fails (test_models_flashtune_cannot_serve_fail_at_load)
    torch.manual_seed(0)
    # each model its own config: _from_config sets the implementation on the config it is given
    eager = model_cls._from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    ours = model_cls._from_config(copy.deepcopy(config), attn_implementation=hf.NAME).eval()
    assert eager.config._attn_implementation == "eager" and ours.config._attn_implementation == hf.NAME
    ours.load_state_dict(eager.state_dict())
    return eager, ours


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_unpadded_batch_matches_eager(kind):
    eager, ours = _pair(kind)
    ids = torch.randint(0, 128, (2, 37))
    with torch.no_grad():
        ref, got = eager(ids).logits, ours(ids).logits
    torch.testing.assert_close(got, ref, atol=2e-4, rtol=2e-4)
    assert CALLS and all(c[0] == "dense" and c[3] for c in CALLS)  # causal, GQA 4:2 passed as is
    assert CALLS[0][1] == (2, 37, 4, 64) and CALLS[0][2] == (2, 37, 2, 64)


def test_padded_batch_goes_through_varlen_and_matches_eager_on_real_tokens():
    eager, ours = _pair("llama")
    ids = torch.randint(0, 128, (3, 20))
    mask = torch.ones(3, 20, dtype=torch.long)
    mask[1, :5] = 0  # left padding
    mask[2, :11] = 0
    with torch.no_grad():
        ref, got = eager(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], ref[real], atol=2e-4, rtol=2e-4)
    assert CALLS[0][0] == "varlen" and CALLS[0][1] == [0, 20, 35, 44]


def test_decode_with_a_kv_cache_matches_eager():
    eager, ours = _pair("qwen2")
    ids = torch.randint(0, 128, (2, 16))
    with torch.no_grad():
        ref = eager.generate(ids, max_new_tokens=6, do_sample=False)
        got = ours.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(got, ref)
    assert any(c[0] == "dense" and c[1][1] == 1 for c in CALLS)  # one query against the cache


def test_decode_steps_go_to_the_decode_kernels_over_the_cache_as_it_is():
    """A 16-bit model's decode steps without a mask (a dynamic cache, no padding) go straight to the
    decode kernels (kvcache.padded_cache_decode, every key), not through flash_attn_func's checks,
    and generate what eager does; a step that needs gradients does not (the decode kernels have no
    backward), with or without a padding mask."""
    eager, ours = _pair("llama")
    eager, ours = eager.to(torch.bfloat16), ours.to(torch.bfloat16)
    ids = torch.randint(0, 128, (2, 20))  # a prefill longer than the decode kernels take
    with torch.no_grad():
        ref = eager.generate(ids, max_new_tokens=6, do_sample=False)
        got = ours.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(got, ref)
    steps = [c for c in CALLS if c[0] == "cache"]
    # 5 decode steps x 2 layers, one query over 21..25 keys, GQA 4:2 as it is
    assert [c[2][1] for c in steps] == [n for n in range(21, 26) for _ in range(2)]
    assert all(c[1] == (2, 1, 4, 64) and c[2][2] == 2 and c[3] for c in steps)
    assert all(c[0] == "dense" and c[1][1] == 20 for c in CALLS if c[0] != "cache")  # the prefill
    CALLS.clear()
    q = torch.randn(2, 4, 1, 64, dtype=torch.bfloat16, requires_grad=True)
    k = v = torch.randn(2, 2, 9, 64, dtype=torch.bfloat16)
    module = torch.nn.Module()
    hf.attention_forward(module, q, k, v, None)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :3] = False  # left padding: a backward goes through the varlen call, not the decode kernels
    hf.attention_forward(module, q, k, v, mask)
    assert [c[0] for c in CALLS] == ["dense", "varlen"]


def test_left_padded_generation_decodes_over_the_cache_in_place():
    """Batched generation pads on the left: its decode steps go to the decode kernels with each
    row's padding as its first valid key (no copy of the cache), and generate what eager does."""
    eager, ours = _pair("llama")
    eager, ours = eager.to(torch.bfloat16), ours.to(torch.bfloat16)
    ids = torch.randint(0, 128, (3, 16))
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[1, :6] = 0
    mask[2, :3] = 0
    with torch.no_grad():
        ref = eager.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
        got = ours.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    assert torch.equal(got, ref)
    decode = [c for c in CALLS if c[0] == "leftpad"]
    assert decode and all(c[1] == [0, 6, 3] and c[2][1] == 1 and c[4] == [c[5]] * 3 for c in decode)
    assert all(c[0] == "varlen" for c in CALLS if c[0] != "leftpad")  # the prefill: 10 real keys < 16 queries


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_static_cache_generation_attends_only_to_written_keys(padded):
    """A static cache hands every layer its whole preallocated buffer: the positions not written
    yet must not be attended (an unpadded batch has no padding mask to say so). The prefill reads
    the written keys only; each decode step goes to the decode kernels with its rows' ends on the
    device (no host read: a CUDA graph can capture the step)."""
    eager, ours = _pair("llama")
    eager, ours = eager.to(torch.bfloat16), ours.to(torch.bfloat16)
    ids = torch.randint(0, 128, (3, 24))  # a prefill longer than the decode kernels take
    mask = torch.ones(3, 24, dtype=torch.long)
    if padded:
        mask[1, :6] = 0
        mask[2, :3] = 0
    with torch.no_grad():
        ref = eager.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, cache_implementation="static")
        got = ours.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, cache_implementation="static")
    assert torch.equal(got, ref)
    decode = [c for c in CALLS if c[0] == "leftpad"]
    firsts = [0, 6, 3] if padded else [0, 0, 0]
    # 5 decode steps x 2 layers, the keys ending at 25..29 of the 29-position buffer (24 + 6 - 1)
    assert [c[4][0] for c in decode] == [n for n in range(25, 30) for _ in range(2)]
    assert all(c[1] == firsts and len(set(c[4])) == 1 and c[5] == 29 for c in decode)
    prefill = [c for c in CALLS if c[0] != "leftpad"]
    assert prefill and all(c[0] == "varlen" and c[2][-1] == sum(24 - f for f in firsts) for c in prefill)


def test_key_mask_marks_padding_and_unwritten_positions():
    """The mask function alone: None when every key is valid; the written prefix when the host
    knows it; the whole buffer when the written count is a tensor (a static cache's decode step)."""
    pad = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    assert hf.key_mask(2, 4, 4, attention_mask=torch.ones(2, 4)) is None
    assert hf.key_mask(2, 1, 4, q_offset=3) is None
    assert hf.key_mask(2, 4, 4, attention_mask=pad).tolist() == pad.bool().tolist()
    assert hf.key_mask(2, 4, 8, attention_mask=pad).tolist() == pad.bool().tolist()  # static: written prefix
    assert hf.key_mask(1, 1, 6, q_offset=2).tolist() == [[True, True, True]]
    step = hf.key_mask(2, 1, 6, q_offset=torch.tensor(4), attention_mask=torch.tensor([[1] * 5, [0, 0, 1, 1, 1]]))
    assert step.tolist() == [[True] * 5 + [False], [False, False, True, True, True, False]]
    assert hf.key_mask(1, 1, 6, q_offset=torch.tensor(5)).tolist() == [[True] * 6]


def test_packed_sequences_attend_only_within_themselves():
    """One row of several sequences end to end (padding-free batches): told by position_ids that
    restart, or by FlashAttention's cu_seq_lens kwargs; each sequence as if run alone. Before,
    the row was one causal sequence: its later sequences attended to the earlier ones."""
    eager, ours = _pair("llama")
    lengths = [7, 12, 5]
    parts = [torch.randint(0, 128, (1, n)) for n in lengths]
    ids = torch.cat(parts, dim=1)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    cu = torch.tensor([0, 7, 19, 24], dtype=torch.int32)
    with torch.no_grad():
        alone = torch.cat([eager(p).logits for p in parts], dim=1)
        by_positions = ours(ids, position_ids=positions, use_cache=False).logits
        CALLS.clear()
        by_kwargs = ours(ids, position_ids=positions, use_cache=False, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                         max_length_q=12, max_length_k=12).logits
    torch.testing.assert_close(by_positions, alone, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(by_kwargs, alone, atol=2e-4, rtol=2e-4)
    assert CALLS and all(c[0] == "varlen" and c[1] == [0, 7, 19, 24] for c in CALLS)
    CALLS.clear()
    with torch.no_grad():  # one sequence: positions 0..n-1 are an ordinary batch (the dense call)
        ours(ids, position_ids=torch.arange(24)[None], use_cache=False)
    assert all(c[0] == "dense" for c in CALLS)


def test_sequences_of_reads_each_position_tensor_once():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0]])
    first = hf._sequences_of(positions)
    assert first[0].tolist() == [0, 3, 5, 6] and first[2] == 3
    assert hf._sequences_of(positions) is first  # the next layer: no second read
    positions[0, 4] = 7  # changed in place: read again
    assert hf._sequences_of(positions)[0].tolist() == [0, 3, 4, 5, 6]
    assert hf._sequences_of(torch.arange(6)[None]) is None
    with torch.inference_mode():  # no version counter (it raised here): read on every call instead
        inference = torch.tensor([[0, 1, 0]])
    assert hf._sequences_of(inference)[0].tolist() == [0, 2, 3] == hf._sequences_of(inference)[0].tolist()


def test_continuous_batching_with_a_block_table_is_refused():
    q = torch.zeros(1, 4, 8, 64)
    with pytest.raises(ValueError, match="continuous batching with a paged cache"):
        hf.attention_forward(torch.nn.Module(), q, q, q, None, block_table=torch.zeros(2, 3, dtype=torch.int32))


def test_unsupported_features_are_refused():
    module = torch.nn.Module()
    q = torch.zeros(1, 4, 8, 64)
    module.train()
    with pytest.raises(ValueError, match="has no dropout"):
        hf.attention_forward(module, q, q, q, None, dropout=0.1)
    module.eval()
    with pytest.raises(ValueError, match="4-D attention mask"):
        hf.attention_forward(module, q, q, q, torch.zeros(1, 1, 8, 8))


def _tiny(config_name: str, **fields):
    sizes = dict(vocab_size=64, hidden_size=256, intermediate_size=64, num_hidden_layers=2, pad_token_id=None,
                 bos_token_id=None, eos_token_id=None,
                 num_attention_heads=4, num_key_value_heads=2)
    return getattr(transformers, config_name)(**{**sizes, **fields})


@pytest.mark.parametrize("config_name, fields, missing", [
    ("Phi3Config", dict(hidden_size=200, num_attention_heads=2), r"head dim 100 \(served: multiples of 8 from 32 to 256\)"),
    ("Llama4TextConfig", dict(head_dim=64, num_local_experts=2), "chunked attention"),
    ("DeepseekV3Config", dict(qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=100, n_routed_experts=2,
                              kv_lora_rank=32, q_lora_rank=32), r"head dim 100 \(served: multiples of 8 from 32 to 256\)"),
])
def test_models_flashtune_cannot_serve_fail_at_load(config_name, fields, missing):
    """One line naming every missing feature, raised when the model is built (not at its first
    token), and again when an existing model is switched to flashtune."""
    config = _tiny(config_name, **fields)
    with pytest.raises(hf.UnsupportedModelError, match=missing) as failure:
        transformers.AutoModelForCausalLM.from_config(config, attn_implementation=hf.NAME)
    assert "\n" not in str(failure.value) and str(failure.value).endswith("attn_implementation='sdpa'")
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with pytest.raises(hf.UnsupportedModelError, match=missing):
        model.set_attn_implementation(hf.NAME)
    assert model.config._attn_implementation == "eager"  # unchanged by the refusal


@pytest.mark.parametrize("config_name, fields", [
    ("LlamaConfig", {}), ("Qwen2Config", {}), ("Qwen3Config", dict(head_dim=128)),
    ("Phi3Config", dict(hidden_size=192, num_attention_heads=2)),  # head dim 96: computed at 128
    ("MistralConfig", dict(sliding_window=None)), ("Gemma3TextConfig", dict(head_dim=64, layer_types=["full_attention"] * 2)),
    # the variants: every kernel family has sliding windows, softcap and sinks
    ("MistralConfig", {}), ("Gemma2Config", dict(head_dim=64)),
    ("GptOssConfig", dict(head_dim=64, num_local_experts=2, num_experts_per_tok=2)),
])
def test_models_flashtune_serves_load(config_name, fields):
    model = transformers.AutoModelForCausalLM.from_config(_tiny(config_name, **fields), attn_implementation=hf.NAME)
    assert model.config._attn_implementation == hf.NAME
    assert hf.unsupported_features(model.config) == []


def _variant_pair(config_name: str, **fields):
    config = _tiny(config_name, vocab_size=128, **fields)
    torch.manual_seed(0)
    eager = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    ours = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=hf.NAME).eval()
    ours.load_state_dict(eager.state_dict())
    return eager, ours


@pytest.mark.parametrize("config_name, fields, wanted", [
    ("MistralConfig", dict(sliding_window=8), {"window_size": (7, 7)}),
    ("Gemma2Config", dict(head_dim=64, sliding_window=8, attn_logit_softcapping=20.0), {"softcap": 20.0}),
    ("GptOssConfig", dict(head_dim=64, num_local_experts=2, num_experts_per_tok=2, sliding_window=8), {"sinks": None}),
])
def test_models_with_variants_match_eager_in_prefill_and_decode(config_name, fields, wanted):
    """Mistral's window, Gemma 2's softcap and alternating windows, gpt-oss's sinks and windows:
    transformers' arguments reach the kernels as flash_attn's (here the fp32 reference), in the
    prefill and every decode step, and the model generates what eager does."""
    eager, ours = _variant_pair(config_name, **fields)
    ids = torch.randint(0, 128, (2, 20))
    with torch.no_grad():
        ref, got = eager(ids).logits, ours(ids).logits
        torch.testing.assert_close(got, ref, atol=3e-4, rtol=3e-4)
        assert torch.equal(ours.generate(ids, max_new_tokens=5, do_sample=False),
                           eager.generate(ids, max_new_tokens=5, do_sample=False))
    for key, value in wanted.items():
        assert any(key in kw and (value is None or kw[key] == value) for kw in VARIANTS), VARIANTS


def test_under_autocast_an_fp32_model_attends_in_the_autocast_dtype(monkeypatch):
    """Under autocast an fp32 model's q and k leave its fp32 rotary embedding in fp32; SDPA casts its
    inputs to the autocast dtype, and so does flashtune (whose kernels take 16-bit inputs), with
    gradients flowing back through the cast (`flashtune bench --train` trains so)."""
    _, ours = _pair("llama")
    ours.train()
    dtypes, dense = [], ops.flash_attn_func

    def recording(q, k, v, **kw):
        dtypes.append((q.dtype, k.dtype, v.dtype))
        with torch.autocast("cpu", enabled=False):  # as a kernel: autocast does not reach inside
            return dense(q, k, v, **kw)

    monkeypatch.setattr(ops, "flash_attn_func", recording)
    ids = torch.randint(0, 128, (2, 24))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = ours(ids, labels=ids).loss
    loss.backward()
    assert dtypes and all(d == (torch.bfloat16,) * 3 for d in dtypes)
    assert ours.model.layers[0].self_attn.q_proj.weight.grad is not None
    dtypes.clear()
    with torch.no_grad():
        ours(ids)  # no autocast: the model's own dtype reaches the kernel (which refuses fp32 clearly)
    assert dtypes and all(d == (torch.float32,) * 3 for d in dtypes)
