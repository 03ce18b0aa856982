"""`bench --model`'s harness, run for real on the CPU with backends that run there
(eager and SDPA's math path) on a tiny model: the same prompts, only attention switched."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

pytest.importorskip("transformers")

from flashtune.commands import bench_model as model_bench  # noqa: E402


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 128,
                                "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 256,
                                "vocab_size": 300}))
    return str(path)


def test_model_bench_rows_and_consistency(tiny_config):
    result = model_bench.run_model_bench(tiny_config, ["eager", "sdpa-math"], prefill=[24, 40], batch=2,
                                         decode_steps=5, dtype="float32", repeats=2, device="cpu")
    rows = result.rows
    assert [(r.prefill, r.backend) for r in rows] == [(24, "eager"), (24, "sdpa-math"),
                                                            (40, "eager"), (40, "sdpa-math")]
    for r in rows:
        # "ok": the static-cache loop and generate chose the same greedy tokens
        assert r.status == "ok" and r.ttft_ms > 0 and r.decode_tok_s > 0 and r.generate_tok_s > 0
        assert r.recall_accuracy is r.fp32_top1_agreement is None  # random weights: no task, no fp32 copy
        assert 0 < r.attention_host_us < 1e6  # one layer's attention call in a decode step, on the host
        assert r.vs == "eager" and r.top1_agreement == 1.0 and r.greedy_identical == [True, True]
        assert r.max_abs_logit_diff < 1e-3
    assert rows[0].max_abs_logit_diff == 0.0  # the first backend against itself


def test_several_batch_sizes_in_one_run_each_compared_at_its_own_batch(tiny_config, tmp_path):
    """Issue 34's batch 1 and 16 in one run: each prefill length at each batch size, each compared
    with the first backend at the same batch; the table and the plot tell the batches apart."""
    result = model_bench.run_model_bench(tiny_config, ["eager", "sdpa-math"], prefill=[24, 40], batch=[1, 3],
                                         decode_steps=4, dtype="float32", repeats=1, device="cpu")
    assert [(r.prefill, r.batch, r.backend) for r in result.rows] == [
        (24, 1, "eager"), (24, 1, "sdpa-math"), (24, 3, "eager"), (24, 3, "sdpa-math"),
        (40, 1, "eager"), (40, 1, "sdpa-math"), (40, 3, "eager"), (40, 3, "sdpa-math")]
    for r in result.rows:
        assert r.status == "ok" and len(r.greedy_identical) == r.batch and r.decode_tok_s > 0, r
        assert r.vs == "eager" and r.top1_agreement == 1.0
    from rich.console import Console

    console = Console(record=True, width=400)
    model_bench.render(result, console)
    assert "batch" in console.export_text()
    model_bench.plot(result, str(tmp_path / "batches.png"))
    assert (tmp_path / "batches.png").stat().st_size > 10_000


def test_a_backend_that_cannot_run_is_reported_not_fatal(tiny_config):
    # flashtune needs a CUDA GPU; on the CPU its row says why and the others still run.
    result = model_bench.run_model_bench(tiny_config, ["eager", "flashtune"], prefill=[16], batch=1,
                                         decode_steps=3, dtype="bfloat16", repeats=1, device="cpu")
    eager, ours = result.rows
    assert eager.status == "ok"
    assert ours.status.startswith("unavailable:") and "cuda" in ours.status.lower()


def test_a_decode_step_the_harness_cannot_run_is_the_row_status_and_the_row_goes_on(monkeypatch, tiny_config):
    """On an H100 eager's static-cache step could not be captured in a CUDA graph (a host-to-device
    copy in it); its row keeps its prefill, consistency and generate columns and says why it has no
    static-cache decode, as a forced SDPA backend without a mask path does."""
    def decode(*args, **kwargs):
        raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture\nsecond line")

    monkeypatch.setattr(model_bench, "static_decode", decode)
    result = model_bench.run_model_bench(tiny_config, ["eager", "sdpa-math"], prefill=[24], batch=2,
                                         decode_steps=4, dtype="float32", repeats=1, device="cpu")
    for r in result.rows:
        assert r.status == ("ok; no static-cache decode: Cannot copy between CPU and CUDA tensors during CUDA "
                            "graph capture"), r
        assert r.decode_tok_s is None and r.ttft_ms > 0 and r.generate_tok_s > 0
        assert r.top1_agreement == 1.0 and r.greedy_identical == [True, True]


def test_generate_is_timed_before_a_capture_can_fail(monkeypatch, tiny_config):
    """On an H100 the generate after eager's failed capture failed with the capture's own message, and
    the row lost its generate columns too: generate now runs before the static-cache loop."""
    import transformers

    spoiled = []
    real_generate = transformers.GenerationMixin.generate

    def decode(*args, **kwargs):
        spoiled.append(True)
        raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture")

    def generate(self, *args, **kwargs):
        if spoiled and spoiled.pop():
            raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture")
        return real_generate(self, *args, **kwargs)

    monkeypatch.setattr(model_bench, "static_decode", decode)
    monkeypatch.setattr(transformers.GenerationMixin, "generate", generate)
    result = model_bench.run_model_bench(tiny_config, ["eager"], prefill=[24], batch=1, decode_steps=4,
                                         dtype="float32", repeats=1, device="cpu")
    (row,) = result.rows
    assert row.status.startswith("ok; no static-cache decode:") and row.generate_tok_s > 0, row


def test_busy_time_counts_overlapping_kernels_once():
    # a combine kernel launched as the split kernel's programmatic dependent runs inside its interval
    assert model_bench.busy_time([(0.0, 10.0), (2.0, 11.0), (11.0, 12.0), (20.0, 25.0), (21.0, 22.0)]) == 17.0
    assert model_bench.busy_time([]) == 0.0


def test_flash_attn2_is_a_row_where_it_imports_and_says_why_where_it_does_not(tiny_config):
    import importlib.util

    if importlib.util.find_spec("flash_attn") is not None:
        pytest.skip("flash_attn is installed here: its row runs (on a GPU)")
    result = model_bench.run_model_bench(tiny_config, ["eager", "flash-attn2"], prefill=[16], batch=1,
                                         decode_steps=3, dtype="bfloat16", repeats=1, device="cpu")
    eager, fa2 = result.rows
    assert eager.status == "ok" and fa2.backend == "flash-attn2"
    assert fa2.status.startswith("unavailable:") and "FlashAttention2" in fa2.status


def test_builtin_shapes_know_their_architecture():
    from flashtune.commands.memory import MODELS

    assert {m.family for m in MODELS.values()} == {"llama", "qwen2", "mistral"}


def test_model_bench_plot_and_memory_prediction(tiny_config, tmp_path):
    result = model_bench.run_model_bench(tiny_config, ["eager", "sdpa-math", "sdpa-flash"], prefill=[256, 512],
                                         batch=1, decode_steps=3, dtype="float32", repeats=1, device="cpu")
    # eager and math materialise the score matrix (flashtune memory's quadratic account), flash does not
    eager, math_, flash = result.rows[:3]
    assert flash.status == "ok", flash
    assert eager.predicted_peak_mb == math_.predicted_peak_mb > flash.predicted_peak_mb > 0
    model_bench.plot(result, str(tmp_path / "model.png"))
    assert (tmp_path / "model.png").stat().st_size > 10_000


def test_a_long_run_keeps_its_rows_and_an_out_of_memory_row_is_a_status(tiny_config, monkeypatch):
    # the checkpoint sees every finished row as it comes; a backend out of memory at a length is
    # that row's status and the run goes on to the next
    import torch

    real_model = model_bench.build_model

    def build_model(*args, **kwargs):
        model = real_model(*args, **kwargs)
        forward = model.forward

        def forward_out_of_memory_at_40(input_ids=None, **kw):
            if model.config._attn_implementation == "sdpa" and input_ids.shape[1] == 40:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 31.00 GiB")
            return forward(input_ids=input_ids, **kw)
        model.forward = forward_out_of_memory_at_40
        return model

    monkeypatch.setattr(model_bench, "build_model", build_model)
    seen = []
    result = model_bench.run_model_bench(tiny_config, ["eager", "sdpa-math"], prefill=[24, 40], batch=1,
                                         decode_steps=3, dtype="float32", repeats=1, device="cpu",
                                         checkpoint=lambda r: seen.append([(x.prefill, x.backend, x.status) for x in r.rows]))
    assert [len(s) for s in seen] == [1, 2, 3, 4]
    assert seen[-1][3] == (40, "sdpa-math", "out of memory: CUDA out of memory. Tried to allocate 31.00 GiB")
    assert [r.status for r in result.rows[:3]] == ["ok"] * 3


def test_bench_out_is_written_after_each_row_marked_incomplete(tmp_path):
    from flashtune.cli import _checkpoint
    from flashtune.commands.bench_model import ModelBenchResult, ModelRow

    path = tmp_path / "run.json"
    result = ModelBenchResult(None, "m", 2, "bfloat16", 3, [ModelRow("eager", 16, 1)])
    _checkpoint(str(path))(result)
    data = json.loads(path.read_text())
    assert data["complete"] is False and [r["backend"] for r in data["rows"]] == ["eager"]
    assert _checkpoint(None) is None and _checkpoint("-") is None


def test_the_decode_host_timing_leaves_the_attention_registry_as_it_was(tiny_config):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    before = {name: ALL_ATTENTION_FUNCTIONS.get(name) for name in ("sdpa", "eager")}
    model_bench.run_model_bench(tiny_config, ["eager", "sdpa-math"], prefill=[16], batch=1, decode_steps=3,
                                dtype="float32", repeats=1, device="cpu")
    assert {name: ALL_ATTENTION_FUNCTIONS.get(name) for name in ("sdpa", "eager")} == before


def test_static_decode_is_greedy_generation_on_a_static_cache(tiny_config):
    """The decode harness of every backend (without a GPU, not captured): the tokens generate gives."""
    import torch

    from flashtune.commands.memory import find_model

    model = model_bench.build_model(find_model(tiny_config), None, torch.float32, "cpu")
    ids = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(0))
    tokens, seconds = model_bench.static_decode(model, ids, 6, graph=False)
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False)[:, 20:]
    assert torch.equal(tokens, expected) and seconds > 0


def test_every_clock_runs_before_the_first_profiler_session(tiny_config, monkeypatch):
    """A profiler session leaves CUPTI's launch callbacks attached to the process, so the shares
    come last: no TTFT, decode or generate clock of any row after the first profiled call; the
    profiled decode step is a real step after the prompts on a static cache."""
    from flashtune.commands.memory import find_model

    events, real_timed = [], model_bench._timed

    def timed(fn, device):
        events.append("clock")
        return real_timed(fn, device)

    def kernel_times(fn, backend):
        events.append("profiler")
        out = fn()
        assert out.logits.shape[1] == 1  # the prefill TTFT times (the last logits only), or one decode step
        return (1.0, 4.0)

    monkeypatch.setattr(model_bench, "_timed", timed)
    monkeypatch.setattr(model_bench, "_kernel_times", kernel_times)
    real_decode = model_bench.static_decode

    def decode(*args, **kwargs):
        events.append("clock")
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(model_bench, "static_decode", decode)
    result = model_bench.run_model_bench(tiny_config, ["eager", "sdpa-math"], prefill=[24], batch=[1, 2],
                                         decode_steps=4, dtype="float32", repeats=2, device="cpu", shares=True)
    first = events.index("profiler")
    assert "clock" not in events[first:] and events[first:].count("profiler") == 2 * len(result.rows)
    kv_bytes = model_bench.accounts(find_model(tiny_config), 2, 24, "float32").kv_cache
    for r in result.rows:
        assert r.attention_share == r.decode_attention_share == 0.25
    assert result.rows[-1].decode_attention_gbps == pytest.approx(kv_bytes / 1.0 / 1e9)


def test_the_trained_model_rows_add_task_accuracy_and_fp32_agreement(monkeypatch, tmp_path):
    """--model recall at tiny size: trained once (cached in FLASHTUNE_CACHE_DIR), its prompts from
    the task, every position compared, the recall accuracy and fp32 math agreement in each row."""
    from flashtune.measure import recall_model

    monkeypatch.setenv("FLASHTUNE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(model_bench, "RECALL_RECIPE", recall_model.Recipe(
        task=recall_model.RecallTask(keys=16, values=16), layers=2, hidden=64, heads=1, kv_heads=1,
        intermediate=128, stages=(recall_model.Stage(64, 32, 30),), warmup=10))
    result = model_bench.run_model_bench("recall", ["eager", "sdpa-math"], prefill=[48, 96], batch=2,
                                         decode_steps=4, dtype="float32", repeats=1, device="cpu")
    assert result.training["loss_curve"][-1][0] == 30 and len(result.training["recipe_key"]) == 16
    assert result.layers == 2 and len(list((tmp_path / "models").iterdir())) == 2
    for r in result.rows:
        assert r.status == "ok", r
        assert 0 <= r.recall_accuracy <= 1
        assert r.fp32_top1_agreement == 1.0 and r.fp32_max_abs_logit_diff < 1e-3  # fp32 kernels against fp32 math
        assert r.top1_agreement == 1.0
    from rich.console import Console

    console = Console(record=True, width=400)
    model_bench.render(result, console)
    shown = console.export_text()
    assert "held-out recall accuracy" in shown and "recall acc" in shown and "top-1 vs fp32" in shown
    # 30 steps do not solve the task: the run says so
    assert result.training["solves_task"] is False and "below 95% held-out recall accuracy" in shown
    assert result.training["within_training_budget"] and "budget" not in shown  # a tiny recipe, seconds on a CPU
    over = {**result.training, "seconds": 150.0, "within_training_budget": False}
    console = Console(record=True, width=400)
    model_bench.render(replace(result, training=over), console)
    assert "training took 150 s on cpu, over its 120 s budget" in console.export_text()
    with pytest.raises(ValueError, match="--layers does not apply"):
        model_bench.run_model_bench("recall", ["eager"], prefill=[48], layers=1, device="cpu")


def test_fp32_math_out_of_memory_leaves_the_rows_and_says_so(monkeypatch, tmp_path):
    """The trained model's fp32 comparison runs beside every row; out of memory there (the longest
    prompts) is each row's status, not the run's end."""
    import torch

    from flashtune.measure import recall_model

    monkeypatch.setenv("FLASHTUNE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(model_bench, "RECALL_RECIPE", recall_model.Recipe(
        task=recall_model.RecallTask(keys=16, values=16), layers=2, hidden=64, heads=1, kv_heads=1,
        intermediate=128, stages=(recall_model.Stage(64, 32, 30),), warmup=10))
    real = model_bench._fp32_logits

    def fp32_logits_out_of_memory_at_96(subject, ids, keep):
        if ids.shape[1] == 96:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return real(subject, ids, keep)

    monkeypatch.setattr(model_bench, "_fp32_logits", fp32_logits_out_of_memory_at_96)
    result = model_bench.run_model_bench("recall", ["eager", "sdpa-math"], prefill=[48, 96], batch=1,
                                         decode_steps=3, dtype="float32", repeats=1, device="cpu")
    assert [(r.prefill, r.status) for r in result.rows] == [
        (48, "ok"), (48, "ok"),
        (96, "ok; no fp32 comparison: fp32 math out of memory at 96 tokens"),
        (96, "ok; no fp32 comparison: fp32 math out of memory at 96 tokens")]
    assert all(r.fp32_top1_agreement is None for r in result.rows[2:]) and result.rows[2].ttft_ms > 0


def test_a_row_predicted_not_to_fit_is_left_out_and_says_so(tiny_config, monkeypatch):
    """The default lengths reach 128k: a row whose `flashtune memory` prediction is over the GPU's memory
    (eager's score matrix at the longer prompt here) is not run, and its status says why; the rows
    that fit run, and the first of them is the one the others are compared with."""
    from flashtune.commands.memory import accounts

    shape = model_bench.find_model(tiny_config)
    eager_40 = accounts(shape, 1, 40, "float32").total(flash=False)
    assert accounts(shape, 1, 40, "float32").total(flash=True) < eager_40
    monkeypatch.setattr(model_bench, "device_memory", lambda device: eager_40 - 1)
    result = model_bench.run_model_bench(tiny_config, ["eager", "sdpa"], prefill=[24, 40], batch=1,
                                         decode_steps=3, dtype="float32", repeats=1, device="cpu")
    (e24, s24, e40, s40) = result.rows
    assert e24.status == s24.status == s40.status == "ok", result.rows
    assert e40.status.startswith("not run: `flashtune memory` predicts") and e40.ttft_ms is None
    assert e40.predicted_peak_mb == round(eager_40 / 2**20, 1)
    assert s40.vs == "sdpa" and s24.vs == "eager"


def test_the_warm_up_makes_its_calls_then_runs_on_for_its_time(monkeypatch):
    """timing.warm_up, before every row's clocks (a second of prefills on a GPU, one on the CPU) and
    every timed kernel: at least `calls` calls, and on until `seconds` have passed (a launch-bound
    first row took 18% longer after one untimed prefill)."""
    import time

    import torch

    from flashtune.measure import timing

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)  # no GPU here to wait for
    calls = []
    timing.warm_up([lambda: calls.append(0)], calls=1, seconds=0.0)
    assert len(calls) == 1
    calls.clear()
    start = time.perf_counter()
    timing.warm_up([lambda: (calls.append(0), time.sleep(0.01))], calls=1, seconds=0.05)
    assert len(calls) >= 2 and time.perf_counter() - start >= 0.05
