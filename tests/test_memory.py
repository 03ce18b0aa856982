"""`flashtune memory` against hand-computed numbers for public model shapes."""
from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from flashtune.commands import memory
from flashtune.cli import cli


def test_llama3_8b_accounts_by_hand():
    m = memory.MODELS["llama3-8b-like"]
    # embeddings 128256 x 4096, untied (x2); per layer q,o 4096x4096, k,v 4096x1024, MLP 3 x 4096 x 14336, 2 norms
    per_layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert m.params == 32 * per_layer + 2 * 128256 * 4096 + 4096 == 8_030_261_248  # Meta-Llama-3-8B's count
    acc = memory.accounts(m, batch=1, seqlen=8192)
    assert acc.weights == 8_030_261_248 * 2
    assert acc.kv_cache == 2 * 32 * 8 * 128 * 8192 * 2 == 2**30  # 128 KiB per token
    assert acc.score_matrix == 32 * 8192 * 8192 * 9
    # the gated MLP's multiply: act(gate), up and their product, beside the embeddings, the layer's input,
    # the residual and the normed input; and the rotary tables (cos, sin: head_dim each per position)
    assert acc.activations == 8192 * (3 * 14336 + 4 * 4096 + 2 * 128) * 2
    assert acc.total(flash=True) == acc.weights + acc.kv_cache + acc.activations + 32 * 2**20  # + cuBLAS's workspace
    assert memory.accounts(m, 1, 8192, kv_dtype="fp8").kv_cache == 2**29


def test_qwen2_7b_accounts_by_hand():
    m = memory.MODELS["qwen2-7b-like"]
    # the official 7,615,616,512 less the q/k/v biases (28 x (3584 + 512 + 512)), which this model leaves out
    assert m.params == 7_615_616_512 - 28 * (3584 + 512 + 512)
    acc = memory.accounts(m, batch=2, seqlen=4096)
    assert acc.kv_cache == 2 * 28 * 4 * 128 * (2 * 4096) * 2  # 56 KiB per token: 7:1 GQA
    assert acc.score_matrix == 2 * 28 * 4096 ** 2 * 9


def test_verdicts():
    m = memory.MODELS["llama3-8b-like"]
    rep = memory.report(m, 4, 32768, gpu_bytes=141 * 2**30)
    assert "only with a flash kernel" in rep.verdict[0]
    rep = memory.report(m, 1, 131072, gpu_bytes=24 * 2**30)
    assert "does not fit" in rep.verdict[0] and "KV cache" in rep.verdict[0]
    rep = memory.report(m, 1, 512, gpu_bytes=80 * 2**30)
    assert "fits in 80 GiB with any attention kernel" in rep.verdict[0]
    assert any("GQA: 32 query heads share 8 KV heads" in a for a in rep.advice)
    assert "unknown" in memory.report(m, 1, 512, gpu_bytes=None).verdict[0]


def test_config_json_and_custom_shapes(tmp_path):
    cfg = {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
           "intermediate_size": 512, "vocab_size": 1000, "tie_word_embeddings": True}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = memory.find_model(str(path))
    assert (m.head_dim, m.kv_heads, m.tied_embeddings) == (64, 2, True)
    assert m.params == 2 * (256 * 64 * (8 + 4) + 3 * 256 * 512 + 512) + 1000 * 256 + 256
    assert memory.find_model(str(tmp_path)) == m  # a model's folder (a Hugging Face snapshot) holds its config
    assert m.name == tmp_path.name
    bad = tmp_path / "bad.json"
    for broken, message in [({k: v for k, v in cfg.items() if k != "vocab_size"}, "missing vocab_size"),
                            ([cfg], "a JSON object, got a list"),
                            ({**cfg, "num_attention_heads": 0}, "num_attention_heads = 0"),
                            ({**cfg, "num_hidden_layers": "32"}, "num_hidden_layers = '32'"),
                            ({**cfg, "hidden_size": "256"}, "hidden_size = '256'"),
                            ({**cfg, "num_hidden_layers": -1}, "num_hidden_layers = -1"),
                            ({**cfg, "num_key_value_heads": 3}, "num_key_value_heads (3) must divide")]:
        bad.write_text(json.dumps(broken))
        with pytest.raises(ValueError, match=re.escape(message)):
            memory.find_model(str(bad))
    with pytest.raises(ValueError, match="no such file"):
        memory.find_model(str(tmp_path / "missing" / "config.json"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="a folder without a config.json"):
        memory.find_model(str(tmp_path / "empty"))
    custom, assumed = memory.custom_model(32, 32, 8, 128)
    assert custom.intermediate == 11008 and len(assumed) == 3
    with pytest.raises(ValueError, match="unknown model"):
        memory.find_model("gpt-9")


def test_cli_memory():
    result = CliRunner().invoke(cli, ["memory", "--model", "mistral-7b-like", "--seqlen", "16384",
                                      "--gpu-memory", "24", "--json"])
    assert result.exit_code == 0, result.output
    rep = json.loads(result.output)
    assert rep["accounts"]["kv_cache"] == 2 * 32 * 8 * 128 * 16384 * 2
    assert rep["total_with_flash"] < rep["total_without_flash"]
    result = CliRunner().invoke(cli, ["memory", "--heads", "8"])
    assert result.exit_code == 2 and "--layers" in result.output
    result = CliRunner().invoke(cli, ["memory", "--layers", "2", "--heads", "6", "--kv-heads", "4", "--hdim", "64"])
    assert result.exit_code == 2 and "must divide" in result.output


def test_score_account_matches_the_peak_measured_on_the_h200():
    """SDPA's math backend materialises the scores: its measured peak memory (committed bench,
    H200) is within 10% of the account wherever the quadratic term dominates (seqlen >= 8k)."""
    from pathlib import Path

    bench = Path(__file__).parent / "data" / "h200_sdpa-math_peak-memory.json"
    rows = [r for r in json.loads(bench.read_text())["rows"]
            if r["backend"] == "sdpa-math" and r["peak_mem_mb"] and r["seqlen_q"] >= 8192]
    assert len(rows) >= 5
    for r in rows:
        account = r["batch"] * r["heads"] * r["seqlen_q"] * r["seqlen_k"] * memory.SCORE_BYTES_PER_ELEMENT
        measured = r["peak_mem_mb"] * 2**20
        assert abs(measured - account) / measured < 0.10, r


def test_whole_model_peaks_measured_on_the_h200_are_within_10_percent():
    """`bench --model llama3-8b-like --layers 4 --batch 3` on the H200 (committed): the peak of a
    serving-style prefill (weights, growing KV cache, one layer's transients, and the scores for
    SDPA math), 1k to 16k tokens, against the accounts for that shape."""
    from dataclasses import replace
    from pathlib import Path

    bench = Path(__file__).parent / "data" / "h200_model_llama3-8b-like_4-layers.json"
    result = json.loads(bench.read_text())
    shape = replace(memory.MODELS["llama3-8b-like"], layers=result["layers"])
    rows = [r for r in result["rows"] if r.get("peak_mem_mb")]
    assert len(rows) >= 10
    for r in rows:
        acc = memory.accounts(shape, r["batch"], r["prefill"], result["dtype"])
        predicted = acc.total(flash=r["backend"] not in ("sdpa-math", "eager"))
        measured = r["peak_mem_mb"] * 2**20
        assert abs(measured - predicted) / measured < 0.10, (r["backend"], r["prefill"], predicted / measured)


@pytest.mark.parametrize("hidden, intermediate, heads, kv_heads, head_dim, batch", [
    (128, 352, 4, 2, 32, 2),   # GQA, batch 2
    (256, 704, 4, 4, 64, 1),   # no GQA, batch 1 (the rotary tables count fully)
])
def test_activations_match_the_tensors_a_llama_prefill_holds(hidden, intermediate, heads, kv_heads, head_dim, batch):
    """The accounts' KV cache and activations against the peak of live tensor bytes that torch's
    profiler records through transformers' Llama prefill on the CPU (the same tensors a GPU holds,
    less library workspaces): within 1%, which the rotary tables' share (1.5-3%) exceeds. Llama's MLP ratio (intermediate 2.75 x hidden), where the
    MLP is the peak; a model with an MLP under about twice its hidden size peaks in attention."""
    transformers = pytest.importorskip("transformers")
    import torch
    from torch.profiler import ProfilerActivity, profile

    shape = memory.ModelShape("tiny", 3, hidden, heads, kv_heads, head_dim, intermediate, 97)
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=hidden, intermediate_size=intermediate,
                                      num_hidden_layers=3, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                      head_dim=head_dim, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa",
                                                       torch_dtype=torch.bfloat16).eval()
    ids = torch.randint(0, 97, (batch, 768))
    positions = torch.arange(768).expand(batch, -1)  # as generate passes them: rotary tables per sequence
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model(ids, position_ids=positions, use_cache=True, logits_to_keep=1)
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    acc = memory.accounts(shape, batch, 768)
    assert peak == pytest.approx(acc.kv_cache + acc.activations, rel=0.01)
