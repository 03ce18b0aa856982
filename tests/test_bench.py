"""bench's CPU parts: FLOPs, the FA grid, ratios, the JSON/CSV schema, tables, backend refusals."""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import math

import pytest
import torch
from rich.console import Console

from flashtune.commands import bench
from flashtune.measure import problem, timing
from flashtune.measure.backends import BACKENDS, Inputs, Unavailable

DESIGN_ROW_KEYS = {"backend", "dtype", "hdim", "causal", "seqlen_q", "seqlen_k", "batch", "heads",
                   "heads_kv", "ms", "tflops", "peak_mem_mb", "rel_err", "kernel"}


def test_flops_follow_the_fa_convention():
    assert problem.attention_flops(2, 16, 1024, 1024, 128, False) == 4 * 2 * 16 * 1024 * 1024 * 128
    assert problem.attention_flops(2, 16, 1024, 1024, 128, True) == 2 * 2 * 16 * 1024 * 1024 * 128
    shape = problem.Problem("bfloat16", 64, False, 512, 512, 32, 32, 32)
    assert shape.flops == 4 * 32 * 32 * 512 * 512 * 64


def test_a_windowed_cell_counts_only_the_pairs_inside_its_window():
    """Issue 38's bar compares a 4k window on 32k tokens with plain causal 4k: the window's FLOPs are
    its pairs' (w·s - w²/2 + w/2 a head), a window holding every key is plain causal (the FA count)."""
    w, s = 4096, 32768
    assert problem.window_pairs(s, s, w) == w * s - w * w // 2 + w // 2
    assert problem.attention_flops(1, 2, s, s, 128, True, w) == 4 * 2 * 128 * problem.window_pairs(s, s, w)
    assert problem.attention_flops(1, 2, w, w, 128, True, w) == problem.attention_flops(1, 2, w, w, 128, True)
    # bottom-right aligned: 3 queries over 10 keys, a window of 4 sees 4 keys each; one over none sees none
    assert problem.window_pairs(3, 10, 4) == 12 and problem.window_pairs(5, 3, 2) == 1 + 2 + 2
    assert problem.window_pairs(40, 40, 7) == sum(min(7, i + 1) for i in range(40))


def test_a_window_grid_is_causal_and_windows_only_the_longer_sequences():
    grid = problem.fa_grid([2048, 4096, 32768], [128], (False, True), batch=1, window=4096)
    assert [(p.causal, p.seqlen_q, p.window) for p in grid] == [(True, 2048, 0), (True, 4096, 0), (True, 32768, 4096)]


def test_a_v_head_dim_of_its_own_counts_in_the_flops_and_the_inputs():
    """bench --hdim-v (DeepSeek's MLA prefill, 192/128): S = Q K^T at 192, O = P V at 128."""
    grid = problem.fa_grid([4096], [192, 128], (True,), batch=1, hdim_v=128)
    mla, same = grid
    assert (mla.hdim, mla.v_dim, same.hdim_v) == (192, 128, 0)  # a V head dim equal to Q/K's is no V head dim
    assert mla.flops == 2 * 1 * mla.heads * 4096 * 4096 * (192 + 128) / 2
    assert same.flops == problem.attention_flops(1, same.heads, 4096, 4096, 128, True)
    assert mla.input_bytes == 2 * 4096 * mla.heads * (192 + 192 + 128)


def test_sdpas_window_mask_is_the_references_window():
    from flashtune.measure.backends import window_mask
    from flashtune.measure.reference import attention_reference

    q, k, v = (torch.randn(1, n, 2, 32, dtype=torch.float64) for n in (9, 20, 20))
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in (q, k, v)), attn_mask=window_mask(9, 20, 5, "cpu")).transpose(1, 2)
    ref, _ = attention_reference(q, k, v, True, None, (4, 0))
    assert torch.allclose(sdpa, ref, atol=1e-12)
    assert Inputs(q, k, v, True, 1.0, window=5).window_size == (4, 0)
    assert Inputs(q, k, v, True, 1.0).window_size == (-1, -1)


def test_fa_grid_keeps_tokens_and_hidden_constant():
    grid = problem.fa_grid()
    assert len(grid) == 6 * 3 * 2
    for s in grid:
        assert s.batch * s.seqlen_q == 16384 and s.heads * s.hdim == 2048 and s.heads_kv == s.heads
    gqa = problem.fa_grid([1024], [128], [True], heads=32, heads_kv=8, batch=3)
    assert gqa == [problem.Problem("bfloat16", 128, True, 1024, 1024, 3, 32, 8)]
    with pytest.raises(ValueError, match="must divide"):
        problem.fa_grid([1024], [128], heads=32, heads_kv=5)


def _row(backend, ms, seqlen=1024, **kw):
    shape = problem.Problem("bfloat16", 128, False, seqlen, seqlen, 16, 16, 16)
    return dataclasses.replace(bench.BenchRow.empty(backend, shape), ms=ms,
                               tflops=shape.flops / (ms * 1e-3) / 1e12 if ms else None, **kw)


def test_speedups_are_geomeans_of_time_ratios():
    rows = [_row("flashtune", 1.0), _row("sdpa-flash", 2.0), _row("sdpa-cudnn", 0.5),
            _row("flashtune", 2.0, seqlen=2048), _row("sdpa-flash", 8.0, seqlen=2048),
            _row("sdpa-cudnn", None, seqlen=2048, status="unavailable: x")]
    got = bench.speedups(rows)
    assert got["sdpa-flash"] == pytest.approx(math.sqrt(2 * 4))
    assert got["sdpa-cudnn"] == pytest.approx(0.5)
    assert timing.geomean([]) is None


def test_rows_follow_the_design_schema_and_serialise():
    row = _row("flashtune", 1.0, kernel="flashtune_fwd_x", rel_err=2e-3, peak_mem_mb=64.0)
    result = bench.BenchResult({"gpu": "NVIDIA H200", "compute_capability": "9.0", "driver": "580", "torch": "2.11",
                                "cuda": "13.0", "cudnn": 91900, "flashtune": "0.1.0", "command": "flashtune bench"},
                               [row])
    written = json.loads(json.dumps(result.to_json()))["rows"][0]
    assert DESIGN_ROW_KEYS <= set(written) and tuple(written) == bench.ROW_KEYS
    assert written == dataclasses.asdict(row)
    parsed = list(csv.DictReader(io.StringIO(bench.to_csv([row]))))
    assert parsed[0]["backend"] == "flashtune" and parsed[0]["kernel"] == "flashtune_fwd_x"


def test_table_shows_ratios_and_reasons():
    rows = [_row("flashtune", 1.0, kernel="flashtune_fwd_x", host_ms=0.0123),
            _row("sdpa-flash", 1.5, kernel="flash_fwd", host_ms=0.0456),
            _row("flash-attn3", None, status="unavailable: flash_attn_interface is not importable")]
    result = bench.BenchResult({"gpu": "G", "compute_capability": "9.0", "driver": "d", "torch": "t", "cuda": "c",
                                "cudnn": 1}, rows)
    console = Console(record=True, width=250)
    bench.render(result, console)
    text = console.export_text()
    assert "1.50" in text and "not importable" in text and "sdpa-flash: 1.50x" in text
    assert "host ms" in text and "0.012" in text and "0.046" in text


def _cpu_case(sq=8, sk=8, causal=False):
    q = torch.zeros(1, sq, 2, 64)
    k = torch.zeros(1, sk, 2, 64)
    return Inputs(q, k, k, causal, 0.125)


def test_absent_flash_attn_packages_are_reported_not_fatal():
    for name in ("flash-attn2", "flash-attn3", "flash-attn4"):
        with pytest.raises(Unavailable, match="not importable|refused"):
            BACKENDS[name](_cpu_case())  # absent here; or present but unable to run on CPU


def test_sdpa_refuses_bottom_right_causal_with_a_reason():
    with pytest.raises(Unavailable, match="top-left aligned"):
        BACKENDS["sdpa-flash"](_cpu_case(sq=4, sk=8, causal=True))


def test_bench_without_gpu_exits_3(monkeypatch):
    from click.testing import CliRunner

    from flashtune.cli import cli

    monkeypatch.setattr("flashtune.commands.common.detect_gpus", lambda: [])
    result = CliRunner().invoke(cli, ["bench"])
    assert result.exit_code == 3 and "no GPU" in result.output


def test_bench_rejects_unknown_backends(monkeypatch):
    from click.testing import CliRunner

    from flashtune.cli import cli

    monkeypatch.setattr("flashtune.commands.common.detect_gpus", lambda: [object()])
    result = CliRunner().invoke(cli, ["bench", "--backends", "flashtune,nope"])
    assert result.exit_code == 2 and "nope" in result.output


def test_plot_draws_one_panel_per_hdim_and_causal(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [_row(b, ms, seqlen=s) for b, ms in (("flashtune", 1.0), ("sdpa-flash", 1.2)) for s in (512, 1024)]
    result = bench.BenchResult({"gpu": "G", "torch": "t", "cuda": "c"}, rows)
    path = tmp_path / "plot.png"
    bench.plot(result, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(path) as image:
        assert image.mode == "P" and len(image.getcolors()) <= 64  # the palette PNG
    with pytest.raises(ValueError, match="nothing to plot"):
        bench.plot(bench.BenchResult(result.header, [_row("flashtune", None)]), str(path))


def test_backends_are_timed_in_interleaved_rounds_after_a_timed_warm_up():
    """Every backend gets its repeats in rounds A B, A B, A B, the first after the full warm-up,
    so a clock drift cannot favour the backend timed first."""
    calls = []

    def fake_timer(runners, warmup, repeats, warmup_seconds):
        calls.append((runners[0], warmup, repeats, warmup_seconds))
        return [float(len(calls))] * repeats

    times, failed = timing.time_interleaved({"a": ["A"], "b": ["B"]}, warmup=5, repeats=30, timer=fake_timer)
    assert failed == {}
    assert [c[0] for c in calls] == ["A", "B", "B", "A", "A", "B"][:2 * timing.ROUNDS]  # the order rotates
    assert sum(c[2] for c in calls if c[0] == "A") >= 30 and len(times["a"]) == len(times["b"]) >= 30
    assert [c[3] for c in calls[:2]] == [timing.WARMUP_SECONDS] * 2
    assert all(0 < c[3] < timing.WARMUP_SECONDS for c in calls[2:]) and all(c[1] == 5 for c in calls)
    assert times["a"][0] == 1.0 and times["b"][-1] == float(2 * timing.ROUNDS)


def test_with_as_many_rounds_as_backends_each_takes_each_place_once():
    """Position in a round is a bias of its own (the first after a cell's input generation runs
    on a cool GPU): the rounds rotate, so each backend runs first, second and third once."""
    order = []

    def fake_timer(runners, warmup, repeats, warmup_seconds):
        order.append(runners[0])
        return [1.0] * repeats

    backends = {name: [name] for name in "ABC"[:timing.ROUNDS]}
    timing.time_interleaved(backends, 1, 9, timer=fake_timer)
    rounds = [order[i:i + len(backends)] for i in range(0, len(order), len(backends))]
    assert len(rounds) == timing.ROUNDS and all(sorted(r) == sorted(backends) for r in rounds)
    for place in range(len(backends)):
        assert sorted(r[place] for r in rounds) == sorted(backends)


def test_a_backend_that_fails_while_timed_leaves_the_rounds_with_its_error():
    calls = []

    def fake_timer(runners, warmup, repeats, warmup_seconds):
        calls.append(runners[0])
        if runners[0] == "B" and calls.count("B") == 2:
            raise MemoryError("out of memory")
        return [1.0] * repeats

    times, failed = timing.time_interleaved({"a": ["A"], "b": ["B"]}, 5, 30, timer=fake_timer, catch=(MemoryError,))
    assert list(times) == ["a"] and len(times["a"]) >= 30 and isinstance(failed["b"], MemoryError)
    assert calls.count("B") == 2 and calls.count("A") == timing.ROUNDS


def test_calls_the_host_could_not_queue_ahead_are_timed_again_behind_a_longer_spin(monkeypatch):
    """If the host took longer to launch the timed calls than the spin kernel ran, their event
    times include launch waits: time_ms retimes them behind a 4x longer spin."""
    pytest.importorskip("torch")
    spins = []

    def fake_queued_calls(runners, repeats, spin_cycles):
        spins.append(spin_cycles)
        return [float(len(spins))] * repeats, len(spins) == 3

    monkeypatch.setattr(timing, "_queued_calls", fake_queued_calls)
    assert timing.time_ms([lambda: None], warmup=0, repeats=4, warmup_seconds=0.0) == [3.0] * 4
    assert spins == [timing.QUEUE_AHEAD_CYCLES * 4 ** i for i in range(3)]


def test_time_backends_fills_statuses_and_returns_the_timed(monkeypatch):
    """The measuring both benches share, with the GPU parts stood in: an unavailable backend and one
    that runs out of memory while timed keep their reasons; the others come back with times."""
    import torch

    from flashtune.commands import bench
    from flashtune.measure.backends import Unavailable

    def make(name):
        if name == "absent":
            raise Unavailable("absent is not importable")
        return [lambda: name]

    def interleaved(timed, warmup, repeats, catch=()):
        assert set(timed) == {"fast", "oom"} and catch == (torch.cuda.OutOfMemoryError,)
        return {"fast": [1.0, 2.0, 3.0]}, {"oom": torch.cuda.OutOfMemoryError()}

    monkeypatch.setattr(bench, "kernel_names", lambda run: [f"kernel_{run()}"])
    monkeypatch.setattr(bench, "time_interleaved", interleaved)
    monkeypatch.setattr(bench, "host_ms_per_call", lambda runners: 0.5)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    rows = [bench.BenchRow.empty(name, problem.Problem("bfloat16", 64, False, 512, 512, 1, 8, 8))
            for name in ("fast", "absent", "oom")]
    checked = []
    timed = bench.time_backends(rows, make, lambda row, run: checked.append((row.backend, run())), 5, 30)
    assert timed == {"fast": ([1.0, 2.0, 3.0], 0.5)}
    assert checked == [("fast", "fast"), ("oom", "oom")]
    assert [r.status for r in rows] == ["ok", "unavailable: absent is not importable",
                                        "unavailable: out of memory while timing"]
    assert rows[0].kernel == "kernel_fast"


def test_a_result_file_has_one_line_per_row_and_names_an_absent_backend_once():
    from flashtune.commands.common import results_json

    data = {"header": {"gpu": "G", "copy": 4253.123456789},
            "rows": [{"backend": "flashtune", "us": 12.3456789, "status": "ok"},
                     {"backend": "flash-attn4", "us": None, "status": "unavailable: not importable"},
                     {"backend": "sdpa-efficient", "us": 3.0, "status": "ok"},
                     {"backend": "sdpa-efficient", "us": None, "status": "unavailable: out of memory"},
                     {"backend": "flash-attn4", "us": None, "status": "unavailable: not importable"}],
            "speedup_geomean": {"sdpa": 1.23456789}}
    text = results_json(data)
    back = json.loads(text)
    assert back["header"] == {"gpu": "G", "copy": 4253.1} and back["speedup_geomean"] == {"sdpa": 1.2346}
    # absent throughout, for one reason: named once; absent only sometimes: its rows stay
    assert back["absent_backends"] == {"flash-attn4": "unavailable: not importable"}
    assert [r["backend"] for r in back["rows"]] == ["flashtune", "sdpa-efficient", "sdpa-efficient"]
    assert back["rows"][0]["us"] == 12.346
    lines = text.splitlines()
    assert sum(line.startswith('  {"backend"') for line in lines) == 3  # a row a line
    assert json.loads(results_json({"rows": []})) == {"rows": []}
    # only unavailability collapses: rows with another status keep their data
    model_rows = [{"backend": "eager", "ttft_ms": 3.0, "status": "ok; consistency not computed"}] * 2
    assert json.loads(results_json({"rows": model_rows}))["rows"] == model_rows


def test_kernel_names_in_results_drop_their_parameter_lists():
    cut = timing.without_parameters
    assert cut("flashtune_decode_bf16_h128_m16x32_w4_s3_sm90a") == "flashtune_decode_bf16_h128_m16x32_w4_s3_sm90a"
    assert cut("void cudnn::fusion::lean_reduction_kernel<false, false>(void*, float*, bool)") == \
        "void cudnn::fusion::lean_reduction_kernel<false, false>"
    # parentheses inside template arguments (lambdas) stay; only the last, outermost list goes
    assert cut("void k<f(at::T&)::{lambda(float)#1}, 4>(int, f(at::T&)::{lambda(float)#1})") == \
        "void k<f(at::T&)::{lambda(float)#1}, 4>"


def test_each_backends_backward_gets_do_in_flash_attns_layout():
    """A model's output projection hands attention's gradient back in flash_attn's (batch, seqlen,
    heads, hdim) layout, whatever layout the backend made its output in: each pass hands dO so,
    with its values, to a backend whose output is a transposed view, and the gradients stay right."""
    seen = []

    class Recorded(torch.autograd.Function):  # the backend's kernel: records the dO it is given
        @staticmethod
        def forward(ctx, x):
            return 2 * x

        @staticmethod
        def backward(ctx, grad):
            seen.append(grad)
            return 2 * grad

    def transposed_backend(case):  # a layout of its own made once, a transposed view returned
        q, kv = (t.transpose(1, 2).contiguous() for t in (case.q, case.k + case.v))

        def run():
            return (Recorded.apply(q) + 0 * kv).transpose(1, 2)
        return run

    q, k, v = (torch.randn(2, 5, 3, 8, requires_grad=True) for _ in range(3))
    case = Inputs(q, k, v, False, 0.35)
    dout = torch.randn(2, 5, 3, 8)
    for pass_name in ("bwd", "fwd+bwd"):
        seen.clear()
        run = bench.with_gradients(transposed_backend, pass_name, dout)(case)
        dq = run()
        assert seen and all(g.transpose(1, 2).is_contiguous() for g in seen), pass_name  # flash_attn's layout
        assert torch.equal(seen[-1].transpose(1, 2), dout) and torch.equal(dq, 2 * dout), pass_name


@pytest.mark.parametrize("heads_kv", [4, 2])
def test_sdpa_gets_inputs_that_require_grad_as_a_model_hands_them(monkeypatch, heads_kv):
    """A timed backward hands SDPA transposed views of flash_attn's layout, as a model's projections
    do: copies into SDPA's contiguous layout would charge their backward to SDPA's rows, and SDPA
    flash's backward copied O and dO whose layout was not its own (the kernel lists of the
    2026-12-06l runs). The forward alone keeps SDPA's contiguous layout, made outside the timing.
    With GQA the KV heads are repeated (SDPA's flash and cuDNN backends take equal head counts)."""
    seen = []

    def recorded_sdpa(q, k, v, **kwargs):
        seen.append((q, k, v))
        return q * 1.0

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recorded_sdpa)
    q = torch.randn(2, 5, 4, 8)
    k, v = (torch.randn(2, 5, heads_kv, 8) for _ in range(2))
    for grad in (True, False):
        leaves = [t.clone().requires_grad_(grad) for t in (q, k, v)]
        BACKENDS["sdpa-flash"](Inputs(*leaves, False, 0.35))()
        got = seen[-1]
        assert torch.equal(got[0], q.transpose(1, 2))
        for t, want in zip(got[1:], (k, v)):
            assert torch.equal(t, want.transpose(1, 2).repeat_interleave(4 // heads_kv, dim=1))
        if grad:
            assert got[0].data_ptr() == leaves[0].data_ptr() and not got[0].is_contiguous()
            if heads_kv == 4:  # no repeat: views too
                assert [t.data_ptr() for t in got[1:]] == [t.data_ptr() for t in leaves[1:]]
        else:
            assert all(t.is_contiguous() for t in got)
