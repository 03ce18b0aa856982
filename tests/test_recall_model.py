"""The trained model of `bench --model recall`, on the CPU at tiny size: the task's data, the
training (deterministic, learning), the cache that keeps weights, seed and loss curve."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from flashtune.measure import recall_model as rm  # noqa: E402

TINY = rm.Recipe(task=rm.RecallTask(keys=16, values=16), layers=2, hidden=64, heads=1, kv_heads=1, intermediate=128,
                 stages=(rm.Stage(64, 32, 40), rm.Stage(128, 8, 10)), lr=3e-3, warmup=10)


@pytest.mark.parametrize("repeat", [0.0, 0.3], ids=["plain", "repeat"])
def test_recall_positions_are_the_values_of_keys_seen_before(repeat):
    task = rm.RecallTask(keys=8, values=8)
    ids, recall = task.sample(16, 101, torch.Generator().manual_seed(3), repeat=repeat)
    assert ids.shape == recall.shape == (16, 101) and (ids[:, 0] == rm.BOS).all()
    keys, values = ids[:, 1::2], ids[:, 2::2]
    assert ((keys >= 1) & (keys <= 8)).all() and ((values > 8) & (values <= 16)).all()
    for row in range(16):
        bound = {}
        for j in range(values.shape[1]):
            key, value = keys[row, j].item(), values[row, j].item()
            assert recall[row, 2 + 2 * j].item() == (key in bound)  # recall: the key came before
            assert bound.setdefault(key, value) == value  # one value per key in a prompt
        assert not recall[row, 1::2].any()  # keys are never recall positions


def test_training_prompts_repeat_the_previous_key_as_often_as_asked():
    """Recipe.repeat: the share of keys equal to the one before grows by about `repeat` over the
    plain prompts' (where the prior alone repeats a key now and then), on the same seed."""
    task = rm.RecallTask(keys=512, values=512)

    def share(repeat: float) -> float:
        keys = task.sample(64, 2001, torch.Generator().manual_seed(0), repeat=repeat)[0][:, 1::2]
        return (keys[:, 1:] == keys[:, :-1]).float().mean().item()

    plain, repeated = share(0.0), share(0.3)
    assert plain < 0.1 and repeated - plain == pytest.approx(0.3 * (1 - plain), abs=0.02), (plain, repeated)


def test_priors_give_every_position_a_clear_most_likely_token():
    """Zipf priors: the most frequent key and value are twice as likely as the next, so even a
    position the task leaves open has a top-1 that bf16 rounding cannot flip."""
    task = rm.RecallTask(keys=512, values=512)
    prior = task._prior(512)
    assert prior[0] / prior[1] == pytest.approx(2.0) and rm.expected_prior_accuracy(task) == pytest.approx(
        float(prior[0]))
    ids, _ = task.sample(64, 2001, torch.Generator().manual_seed(0))
    assert torch.bincount(ids[:, 1::2].flatten()).argmax().item() == 1  # key rank 1 the most frequent


def test_training_is_deterministic_and_learns_and_the_cache_keeps_it(tmp_path):
    progress = []
    model, record = rm.load_or_train(TINY, "cpu", tmp_path, eval_lengths=(128,),
                                     progress=lambda step, total, loss: progress.append((step, total)))
    assert progress[-1] == (50, 50) and [s for s, _ in record.loss_curve] == list(range(10, 51, 10))
    losses = [loss for _, loss in record.loss_curve]
    assert losses[-1] < losses[0] - 0.5, losses  # from ~log(vocab 33) = 3.5 towards the priors' entropy
    assert 0 <= record.accuracy[128] <= 1
    files = sorted(p.name for p in (tmp_path / "models").iterdir())
    assert files == [f"recall-{TINY.key()}.json", f"recall-{TINY.key()}.pt"]

    again, record_again = rm.load_or_train(TINY, "cpu", tmp_path, eval_lengths=(128,),
                                           progress=lambda *a: pytest.fail("trained twice"))
    assert record_again == record
    ids, _ = TINY.task.sample(2, 96, torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)

    retrained, record_retrained = rm.train(TINY, "cpu")  # same seed: the same curve
    assert record_retrained.loss_curve == record.loss_curve


def test_recipe_key_changes_with_anything_that_shapes_the_weights():
    assert TINY.key() == rm.Recipe(**{**TINY.__dict__}).key()
    assert len({TINY.key(), rm.Recipe(**{**TINY.__dict__, "seed": 1}).key(),
                rm.Recipe(**{**TINY.__dict__, "task": rm.RecallTask(16, 17)}).key(),
                rm.Recipe(**{**TINY.__dict__, "stages": TINY.stages[:1]}).key(),
                rm.Recipe(**{**TINY.__dict__, "repeat": 0.0}).key()}) == 5


def test_recall_accuracy_counts_only_recall_positions():
    """A model that copies the right answer everywhere scores 1; one that never does, 0."""
    task = rm.RecallTask(keys=8, values=8)

    class Oracle(torch.nn.Module):
        def __init__(self, wrong: bool):
            super().__init__()
            self.wrong = wrong

        def forward(self, ids):
            nxt = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)  # the true next token
            if self.wrong:
                nxt = torch.where(nxt > 8, 9 + (nxt - 8) % 8, nxt)  # another value
            return type("Out", (), {"logits": torch.nn.functional.one_hot(nxt, task.vocab).float()})

    assert rm.recall_accuracy(Oracle(False), task, 200, prompts=3, seed=5, device="cpu") == 1.0
    assert rm.recall_accuracy(Oracle(True), task, 200, prompts=3, seed=5, device="cpu") == 0.0
