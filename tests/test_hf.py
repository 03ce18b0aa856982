"""The transformers integration, on the CPU: flashtune's functions are replaced by the fp32
reference with the same semantics, so what is tested is the glue - layouts, GQA, scaling,
causal alignment and padded batches through varlen - in real Llama/Qwen2/Mistral models."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from flashtune import hf  # noqa: E402
from flashtune.runtime import kvcache, ops  # noqa: E402
from flashtune.measure.reference import attention_reference, varlen_reference  # noqa: E402

CALLS = []


@pytest.fixture(autouse=True)
def reference_kernels(monkeypatch):
    CALLS.clear()

    def dense(q, k, v, softmax_scale=None, causal=False):
        CALLS.append(("dense", q.shape, k.shape, causal))
        return attention_reference(q, k, v, causal, softmax_scale)[0].to(q.dtype)

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=None, causal=False):
        CALLS.append(("varlen", cu_q.tolist(), cu_k.tolist(), causal))
        return varlen_reference(q, k, v, cu_q, cu_k, causal, softmax_scale)[0].to(q.dtype)

    def left_padded(q, k, v, pads, scale, causal):
        CALLS.append(("leftpad", pads.tolist(), tuple(q.shape), causal))
        rows = [attention_reference(q[b:b + 1], k[b:b + 1, p:], v[b:b + 1, p:], causal, scale)[0]
                for b, p in enumerate(pads.tolist())]
        return torch.cat(rows).to(q.dtype)

    monkeypatch.setattr(ops, "flash_attn_func", dense)
    monkeypatch.setattr(ops, "flash_attn_varlen_func", varlen)
    monkeypatch.setattr(kvcache, "left_padded_decode", left_padded)


MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
}


def _pair(kind: str):
    config_cls, model_cls = (getattr(transformers, n) for n in MODELS[kind])
    config = config_cls(vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    eager = model_cls._from_config(config, attn_implementation="eager").eval()
    ours = model_cls._from_config(config, attn_implementation=hf.NAME).eval()
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


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_decode_route_sdpa_sends_only_single_query_steps_to_sdpa(padded):
    eager, ours = _pair("llama")
    ids = torch.randint(0, 128, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    if padded:
        mask[1, :6] = 0
    hf.set_decode_route("sdpa")
    try:
        with torch.no_grad():
            ref = eager.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
            got = ours.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    finally:
        hf.set_decode_route("flashtune")
    assert torch.equal(got, ref)
    # only the prefill (16 queries; cu_seqlens [0, 16, 26] when padded) went through flashtune;
    # a decode step there would show 1 query per sequence
    assert CALLS and all(c[1] == [0, 16, 26] if padded else c[1][1] == 16 for c in CALLS)
    with pytest.raises(ValueError, match="allowed: flashtune, sdpa"):
        hf.set_decode_route("cudnn")


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
    assert decode and all(c[1] == [0, 6, 3] and c[2][1] == 1 for c in decode)
    assert all(c[0] == "varlen" for c in CALLS if c[0] != "leftpad")  # the prefill: 10 real keys < 16 queries


def test_unsupported_features_are_refused():
    module = torch.nn.Module()
    q = torch.zeros(1, 4, 8, 64)
    with pytest.raises(ValueError, match="softcap"):
        hf.attention_forward(module, q, q, q, None, softcap=30.0)
    with pytest.raises(ValueError, match="no sliding window"):
        hf.attention_forward(module, q, q, q, None, sliding_window=4)
    module.train()
    with pytest.raises(ValueError, match="forward-only"):
        hf.attention_forward(module, q, q, q, None, dropout=0.1)
    module.eval()
    with pytest.raises(ValueError, match="4-D attention mask"):
        hf.attention_forward(module, q, q, q, torch.zeros(1, 1, 8, 8))
