"""A Qwen2-style transformers model generates through attn_implementation="ftune" on the GPU,
with flashtune's real kernels, as close to fp32 math as SDPA in the same dtype (tests/fp32_agreement.py)."""
from __future__ import annotations

import os

import pytest
import torch

from fp32_agreement import GREEDY_SLACK, TOP1_SLACK, assert_as_close_as, fp32_picks, greedy, three_models, top1

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")


def _build(config, attention, dtype):
    return transformers.Qwen2ForCausalLM._from_config(config, attn_implementation=attention, torch_dtype=dtype)


def _qwen2_models():
    """A small random Qwen2 three times, with the same weights: fp32 math, SDPA in bf16, flashtune in bf16."""
    from flashtune.runtime import ops

    ops.use_profile(os.environ.get("FLASHTUNE_PROFILE"))  # None: the GPU's matched profile
    config = transformers.Qwen2Config(vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096)
    return three_models(_build, config)


def test_qwen2_prefills_and_generates_as_close_to_fp32_as_sdpa():
    exact, sdpa, ours = _qwen2_models()
    ids = torch.randint(0, 1000, (2, 300), device="cuda")
    assert_as_close_as(top1(ours, exact, ids), top1(sdpa, exact, ids), TOP1_SLACK, "prefill top-1")
    assert_as_close_as(greedy(ours, exact, ids, 32), greedy(sdpa, exact, ids, 32), GREEDY_SLACK, "greedy tokens")


def test_model_bench_on_the_gpu(tmp_path):
    """`bench --model`'s GPU-only columns: peak memory and attention's share of the prefill."""
    import json

    from flashtune.commands import bench_model as model_bench

    config = tmp_path / "small.json"
    config.write_text(json.dumps({"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 512,
                                  "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 1024,
                                  "vocab_size": 1000}))
    result = model_bench.run_model_bench(str(config), ["sdpa-flash", "sdpa-cudnn", "flashtune"], prefill=[512],
                                         batch=2, decode_steps=8, dtype="bfloat16", repeats=2, device="cuda")
    flash, cudnn, ours = result.rows
    assert cudnn.status == ours.status == "ok", result.rows
    # SDPA's flash kernel takes no mask, which a static cache's decode needs: the row says so
    assert flash.status.startswith("ok; no static-cache decode") and flash.decode_tok_s is None, flash
    assert 0 < ours.attention_share <= 1 and ours.peak_mem_mb > 0
    # Random weights give near-flat logits, where bf16 rounding alone flips some argmaxes: the
    # bar is 99%, or what another exact kernel (cuDNN) achieves against SDPA flash, less a point.
    assert ours.top1_agreement >= max(0.9, min(0.99, cudnn.top1_agreement - 0.01)), (ours, cudnn)


@pytest.mark.parametrize("cache", [None, "static"], ids=["dynamic-cache", "static-cache"])
def test_left_padded_batch_generates_through_the_decode_kernels(cache):
    """Left-padded prompts of different lengths; a static cache hands flashtune the whole
    preallocated buffer, of which only the written keys count (and transformers compiles its step)."""
    from flashtune.measure.timing import kernel_names

    exact, sdpa, ours = _qwen2_models()
    ids = torch.randint(0, 1000, (3, 300), device="cuda")
    mask = torch.ones(3, 300, dtype=torch.long, device="cuda")
    mask[1, :40] = 0
    mask[2, :170] = 0
    assert_as_close_as(greedy(ours, exact, ids, 24, mask, cache_implementation=cache),
                       greedy(sdpa, exact, ids, 24, mask, cache_implementation=cache), GREEDY_SLACK, "greedy tokens")
    with torch.no_grad():
        names = kernel_names(lambda: ours.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False,
                                                   cache_implementation=cache))
    assert any(n.startswith("flashtune_decode_") for n in names), names  # the decode step's kernel


def test_generation_under_inference_mode_gives_the_tokens_it_gives_under_no_grad():
    """Pipelines run generate under torch.inference_mode, whose tensors carry no version counter, so
    the memo of index values read on the host (checks.read_values) reads them on every call there:
    a left-padded batch generates the same tokens as under no_grad, through the decode kernels, and
    a batch-1 forward given position_ids (the packed-sequence check) the same logits."""
    from flashtune.measure.timing import kernel_names

    _, _, ours = _qwen2_models()
    ids = torch.randint(0, 1000, (3, 300), device="cuda")
    mask = torch.ones(3, 300, dtype=torch.long, device="cuda")
    mask[1, :40] = 0

    def generate(context):
        with context():
            return ours.generate(ids, attention_mask=mask, max_new_tokens=16, min_new_tokens=16, do_sample=False)

    assert torch.equal(generate(torch.inference_mode), generate(torch.no_grad))
    with torch.inference_mode():
        names = kernel_names(lambda: ours.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False))
    assert any(n.startswith("flashtune_decode_") for n in names), names
    positions = torch.arange(300, device="cuda")[None]
    with torch.inference_mode():
        inferred = ours(ids[:1], position_ids=positions).logits
    with torch.no_grad():
        assert torch.equal(inferred, ours(ids[:1], position_ids=positions).logits)


def test_a_decode_step_captured_in_a_cuda_graph_replays_like_the_uncaptured_loop():
    """bench --model's decode harness: the step captured once, its token and position fed through
    the graph's input buffers; flashtune's decode kernels read the cache's ends from the device."""
    from flashtune.commands.bench_model import decode_step_kernel_times, static_decode

    exact, sdpa, ours = _qwen2_models()
    ids = torch.randint(0, 1000, (2, 700), device="cuda")
    eager_tokens, _ = static_decode(ours, ids, 24, graph=False)
    graph_tokens, _ = static_decode(ours, ids, 24, graph=True)
    sdpa_tokens, _ = static_decode(sdpa, ids, 24, graph=True)
    assert torch.equal(graph_tokens, eager_tokens)
    assert_as_close_as(fp32_picks(exact, ids, graph_tokens), fp32_picks(exact, ids, sdpa_tokens), GREEDY_SLACK,
                       "greedy tokens")
    attention, total = decode_step_kernel_times(ours, ids, "flashtune")
    assert 0 < attention < total  # the profiled step ran flashtune's kernels


def test_packed_sequences_match_each_sequence_run_alone():
    """A padding-free row (position_ids restarting) through the varlen kernels, against fp32 math on each
    sequence alone, as close as SDPA in bf16 on each alone."""
    exact, sdpa, ours = _qwen2_models()
    lengths = [300, 17, 555]
    parts = [torch.randint(0, 1000, (1, n), device="cuda") for n in lengths]
    positions = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None]
    with torch.no_grad():
        fp32_alone, sdpa_alone = (torch.cat([m(p).logits.argmax(-1) for p in parts], dim=1) for m in (exact, sdpa))
        packed = ours(torch.cat(parts, dim=1), position_ids=positions, use_cache=False).logits.argmax(-1)
    assert_as_close_as((packed == fp32_alone).float().mean().item(), (sdpa_alone == fp32_alone).float().mean().item(),
                       TOP1_SLACK, "top-1, packed")


@pytest.mark.parametrize("config_name, fields", [
    ("MistralConfig", dict(sliding_window=128)),
    ("Gemma2Config", dict(head_dim=128, sliding_window=128, attn_logit_softcapping=50.0)),
    ("GptOssConfig", dict(head_dim=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=128)),
    # MLA: Q/K 192 (128 + 64 rotary), V 128, zero-padded to the profile's built size (192 on sm90 profiles, else
    # 256) in prefill and decode; K/V come out of the
    # latent per query head (transformers' eager and SDPA paths repeat them again below 8 KV heads)
    ("DeepseekV3Config", dict(num_key_value_heads=8, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                              kv_lora_rank=128,
                              q_lora_rank=192, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1,
                              n_group=1, topk_group=1)),
])
def test_models_with_windows_softcap_and_sinks_generate_as_close_to_fp32_as_eager(config_name, fields):
    """Prefill through the profile's prefill kernels with the variants, each decode step through
    the decode kernels' own (MLA's V head dim: through the padded path); eager attention is the
    reference, in fp32 and in bf16."""
    from flashtune.runtime import ops

    ops.use_profile(os.environ.get("FLASHTUNE_PROFILE"))
    fields = {"num_key_value_heads": 2, **fields}
    config = getattr(transformers, config_name)(vocab_size=1000, hidden_size=512, intermediate_size=1024,
                                                num_hidden_layers=4, num_attention_heads=8, pad_token_id=None,
                                                bos_token_id=None, eos_token_id=None, **fields)

    def build(config, attention, dtype):
        return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention, torch_dtype=dtype)

    exact, eager, ours = three_models(build, config, reference="eager")
    ids = torch.randint(0, 1000, (2, 500), device="cuda")
    assert_as_close_as(top1(ours, exact, ids), top1(eager, exact, ids), TOP1_SLACK, "prefill top-1")
    assert_as_close_as(greedy(ours, exact, ids, 32), greedy(eager, exact, ids, 32), GREEDY_SLACK, "greedy tokens")
