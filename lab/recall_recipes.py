"""Recall-model recipes side by side on the GPU (issue 34: the shipped recipe plateaus at the key
prior, 38% held-out accuracy on an H100; lab/results/2026-12-07_recall-cpu-study/ says why). Each
variant trains from the same seed through recall_model.train with SDPA (about a minute each on an
H100), then is scored on the plain task (keys drawn from the prior, none following another) at 4k
and 16k tokens, as the bench scores the shipped recipe. The JSON is rewritten after each variant.

Variants (VARIANTS below): the shipped recipe; "longer": 3,000 steps at 512 tokens instead of 1,200
(the shipped recipe uses 49 of its 120 s on an H100, and on the CPU recall accuracy was still
climbing after 1,700 steps); "follow": in training a key is the previous key + 1 with probability
0.5, which rewards the previous-token head the recall circuit is built on (the CPU study: with 16
keys it learned with it and not without; with 512 it did not help); "longer-follow": both;
"longer-lr1e-3": "longer" at a third of the learning rate (on the CPU, 16 keys at 32 tokens: 1e-3
left the prior's loss within 900 steps, 3e-3 and 1e-2 did not; with 512 keys it climbed sooner and
then slower); "repeat": in training a key is the previous key again with probability 0.3, which
rewards the previous-token head through the identity (on the CPU, 512 keys at 128 tokens: 69%
held-out accuracy at 590-660 steps on two seeds, where the shipped task had 17-29%); "longer-repeat": both.
The next visit's order (visit step `recall-recipes`): longer-repeat, repeat, longer.

Usage: PYTHONPATH=. python3 lab/recall_recipes.py OUT.json [VARIANT ...]   (default: all; a table last)
"""
import dataclasses
import json
import sys
import time

import torch

from flashtune.measure import recall_model
from flashtune.measure.recall_model import HELD_OUT_SEED, Recipe, RecallTask, Stage, recall_accuracy


@dataclasses.dataclass(frozen=True)
class FollowTask(RecallTask):
    """RecallTask whose training prompts chain keys: each key is the previous one + `step` (mod
    keys) with probability `follow`, else drawn from the prior; values stay bound to their keys.
    step 1 ("follow") rewards a previous-token head through a successor map of `keys` entries;
    step 0 ("repeat": the key again) through the identity, which a previous-token head copies."""
    follow: float = 0.5
    step: int = 1

    def sample(self, batch, length, generator):
        ids, _ = super().sample(batch, length, generator)
        keys = ids[:, 1::2] - 1
        chained = torch.rand(keys.shape, generator=generator) < self.follow
        chained[:, 0] = False
        index = torch.arange(keys.shape[1]).expand_as(keys)
        start = torch.where(chained, 0, index).cummax(1).values  # each key's chain starts at the last drawn one
        keys = (keys.gather(1, start) + self.step * (index - start)) % self.keys
        binding = torch.multinomial(self._prior(self.values).expand(batch, -1), self.keys, replacement=True,
                                    generator=generator)
        ids[:, 1::2] = 1 + keys
        ids[:, 2::2] = 1 + self.keys + binding.gather(1, keys[:, :ids[:, 2::2].shape[1]])
        return ids, recall_model.recall_positions(ids, self)


SHIPPED = Recipe()
REPEAT = FollowTask(follow=0.3, step=0)
LONGER = (Stage(512, 64, 3000), *SHIPPED.stages[1:])
VARIANTS = {
    "shipped": SHIPPED,
    "longer": dataclasses.replace(SHIPPED, stages=LONGER),
    "follow": dataclasses.replace(SHIPPED, task=FollowTask()),
    "longer-follow": dataclasses.replace(SHIPPED, task=FollowTask(), stages=LONGER),
    "longer-lr1e-3": dataclasses.replace(SHIPPED, stages=LONGER, lr=1e-3),
    "repeat": dataclasses.replace(SHIPPED, task=REPEAT),
    "longer-repeat": dataclasses.replace(SHIPPED, task=REPEAT, stages=LONGER),
}


def run(name: str, recipe: Recipe) -> dict:
    torch.cuda.empty_cache()
    model, record = recall_model.train(recipe, "cuda")
    plain = RecallTask(recipe.task.keys, recipe.task.values, recipe.task.zipf)  # scored without chains
    accuracy = {length: round(recall_accuracy(model, plain, length, prompts=4, seed=HELD_OUT_SEED + length,
                                              device="cuda"), 4) for length in (4096, 16384)}
    curve = record.loss_curve
    return {"variant": name, "seconds": record.seconds, "final_loss": record.final_loss, "accuracy": accuracy,
            "loss_at": {step: loss for step, loss in curve if step % 200 == 0}, "recipe": dataclasses.asdict(recipe)}


def main() -> None:
    out, names = sys.argv[1], sys.argv[2:] or list(VARIANTS)
    results = []
    for name in names:
        start = time.perf_counter()
        results.append(run(name, VARIANTS[name]))
        results[-1]["wall_seconds"] = round(time.perf_counter() - start, 1)
        with open(out, "w") as f:  # rewritten after each variant: a cut-short visit keeps what ran
            json.dump({"gpu": torch.cuda.get_device_name(), "results": results}, f, indent=1)
    print(f"{'variant':14} {'train s':>8} {'final loss':>10} {'acc 4k':>7} {'acc 16k':>7}")
    for r in results:
        print(f"{r['variant']:14} {r['seconds']:8.1f} {r['final_loss']:10.4f} {r['accuracy'][4096]:7.1%} "
              f"{r['accuracy'][16384]:7.1%}")


if __name__ == "__main__":
    main()
