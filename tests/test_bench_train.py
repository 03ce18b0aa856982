"""`flashtune bench --train` off the GPU: a tiny recipe trained on the CPU with SDPA and eager
attention (the same math), the first backend twice; rows, the noise, the JSON and the table."""
from __future__ import annotations

import json

from rich.console import Console

from flashtune.commands import bench_train
from flashtune.measure import recall_model


def tiny_recipe() -> recall_model.Recipe:
    return recall_model.Recipe(task=recall_model.RecallTask(keys=16, values=16), layers=1, hidden=64, heads=2,
                               kv_heads=1, head_dim=32, intermediate=64,
                               stages=(recall_model.Stage(64, 2, 12),), warmup=2)


def test_each_backend_trains_from_one_seed_and_is_compared_with_the_first():
    seen = []
    result = bench_train.run_train_bench(["sdpa", "eager"], device="cpu", recipe=tiny_recipe(),
                                         checkpoint=lambda r: seen.append(len(r.rows)))
    assert [(r.backend, r.run) for r in result.rows] == [("sdpa", 1), ("sdpa", 2), ("eager", 1)]
    assert seen == [1, 2, 3]
    first, second, eager = result.rows
    assert all(r.status == "ok" and r.steps == 12 and r.ms_per_step > 0 for r in result.rows)
    assert first.final_loss > 0 and first.vs is None and first.loss_curve[-1][0] == 12
    assert second.vs == "sdpa run 1" and result.noise == second.final_loss_rel_diff < 1e-3
    assert eager.final_loss_rel_diff < 1e-2  # the same attention in other ops
    data = json.loads(json.dumps(result.to_json()))
    assert data["noise"] == result.noise and data["bar"] == 0.01 and len(data["rows"]) == 3
    console = Console(record=True, width=200)
    bench_train.render(result, console)
    text = console.export_text()
    assert "final loss" in text and "eager" in text and "its own two runs differ" in text


def test_the_default_recipe_is_the_recall_model_at_1k_then_4k_tokens():
    recipe = bench_train.recipe_for(300)
    assert [(s.length, s.batch, s.steps) for s in recipe.stages] == [(1024, 16, 200), (4096, 4, 100)]
    assert (recipe.heads, recipe.kv_heads, recipe.head_dim) == (8, 2, 64)
