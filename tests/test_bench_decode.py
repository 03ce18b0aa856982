"""bench --decode without a GPU: its grid, its result's speed-ups, how it is shown."""
import json

import click
import pytest
from rich.console import Console

from flashtune.commands import bench_decode
from flashtune.commands.bench import to_csv
from flashtune.commands.bench_decode import DecodeBenchResult, DecodeRow
from flashtune.measure.decode_problem import DecodeProblem, decode_grid


def test_the_grid_crosses_every_option_and_leaves_out_what_does_not_fit():
    problems, too_big = decode_grid(hdims=[128], heads_kv=[8, 32], batches=[1, 128], caches=[1024, 131072],
                                    seqlens_q=[1, 4], pages=[0, 64])
    assert len(problems) + too_big == 1 * 2 * 2 * 2 * 2 * 2
    # 128 sequences x 128k keys: 64 / 256 GiB of K/V (8 / 32 KV heads), each with 2 query lengths, 2 layouts
    assert too_big == 8
    assert all(p.kv_bytes <= 32 * 2**30 for p in problems)
    p = DecodeProblem("bfloat16", 128, 32, 8, 1, 16384, 4, 64)
    assert p.causal and p.kv_bytes == 2 * 16384 * 8 * 128 * 2 and "pages 64" in p.label
    with pytest.raises(ValueError, match="must divide"):
        decode_grid(heads_kv=[5])
    with pytest.raises(ValueError, match="not a multiple of page size"):
        decode_grid(caches=[1000], pages=[16])


def rows():
    made = []
    for batch, times in ((1, {"flashtune": 10.0, "sdpa-cudnn": 12.0, "sdpa-flash": 20.0}),
                         (8, {"flashtune": 40.0, "sdpa-cudnn": 36.0})):
        p = DecodeProblem("bfloat16", 128, 32, 8, batch, 16384, 1)
        for backend, us in times.items():
            r = DecodeRow.empty(backend, p)
            r.us, r.gbps, r.copy_fraction, r.host_us, r.rel_err = us, p.kv_bytes / us / 1e3, 0.5, 20.0, 1e-3
            r.kernel = "k"
            if backend == "flashtune":
                r.splits, r.merge = (12, "combine kernel") if batch == 1 else (4, "cluster")
            made.append(r)
        missing = DecodeRow.empty("flash-attn3", p)
        missing.status = "unavailable: flash_attn_interface is not importable (ImportError)"
        made.append(missing)
    return made


def test_speedups_per_backend_and_against_the_fastest_other():
    result = DecodeBenchResult({}, 4000.0, rows())
    speed = result.speedup_geomean
    assert speed["sdpa-cudnn"] == pytest.approx((1.2 * 0.9) ** 0.5)
    assert speed["sdpa-flash"] == pytest.approx(2.0)
    assert speed["fastest other"] == pytest.approx((1.2 * 0.9) ** 0.5)
    assert speed["flash-attn3"] is None
    assert json.loads(json.dumps(result.to_json()))["copy_GBps"] == 4000.0


def test_render_and_csv_show_every_row_and_the_reason_a_backend_is_missing():
    header = {"gpu": "NVIDIA H200", "compute_capability": "9.0", "torch": "2.11", "cuda": "13.0", "cudnn": 91900}
    console = Console(record=True, width=250)
    bench_decode.render(DecodeBenchResult(header, 4000.0, rows()), console)
    text = console.export_text()
    assert "not importable" in text and "copy 4000 GB/s" in text and "fastest other" in text
    assert "12 (combine)" in text and "4 (cluster)" in text  # flashtune's split count and merge
    csv_text = to_csv(rows())
    assert csv_text.splitlines()[0].startswith("backend,dtype,hdim") and len(csv_text.splitlines()) == 8


def test_unknown_backend_names_the_known_ones():
    with pytest.raises(click.BadParameter, match="known with --decode: flashtune, sdpa-default"):
        bench_decode.backend_names(["sdpa-math"])


def test_plot_draws_a_panel_per_head_layout(tmp_path):
    pytest.importorskip("matplotlib")
    header = {"gpu": "NVIDIA H200"}
    path = tmp_path / "decode.png"
    bench_decode.plot(DecodeBenchResult(header, 4000.0, rows()), str(path))
    assert path.stat().st_size > 10_000


def test_a_paged_cache_gathers_back_to_the_contiguous_one():
    import torch

    from flashtune.measure.decode_problem import contiguous_kv

    k = torch.arange(2 * 8 * 1 * 2, dtype=torch.float32).view(2, 8, 1, 2)  # 2 sequences x 8 keys
    pages = k.reshape(8, 2, 1, 2)  # pages of 2 keys, in order
    order = torch.tensor([5, 2, 7, 0, 3, 1, 6, 4])  # where each page is stored
    shuffled = torch.empty_like(pages)
    shuffled[order] = pages
    table = order.view(2, 4).to(torch.int32)
    got_k, got_v = contiguous_kv({"k": shuffled, "v": shuffled, "block_table": table})
    assert torch.equal(got_k, k) and torch.equal(got_v, k)
    first, _ = contiguous_kv({"k": shuffled, "v": shuffled, "block_table": table}, 1)
    assert torch.equal(first, k[:1])
