"""Small CPU experiments on the recall task (lab/results/2026-12-07_recall-cpu-study/ and
lab/results/2026-12-07b_recall-cpu/). Usage, from the results folder, with the repository on PYTHONPATH:
python3 ../../recall_exp.py NAME key=val ... (the keys of `args` below; `markov` is that study's "follow";
`NT=1` for one core); writes NAME.json in the current folder. `permute` (added 2026-12-07b): the fraction of
training prompts whose keys are renamed by a permutation of their own; at the end the accuracy at 4L is split
by the key's prior rank (the 16 most frequent keys against the rest). `long_permute` (2026-12-07c): the
fraction for the second stage (-1: the same as `permute`). Its defaults change nothing of the earlier runs."""
import json, sys, time
import torch, transformers
from flashtune.measure.recall_model import RecallTask, recall_positions, recall_accuracy, _lr_factor, BOS

import os
torch.set_num_threads(int(os.environ.get("NT", "2")))

args = dict(keys=512, zipf=1.0, mask="all", lr=3e-3, warmup=100, theta=500000.0, length=256, batch=32,
            steps=600, long_length=0, long_batch=4, long_steps=0, budget=170.0, layers=2, hidden=128,
            heads=4, kv=2, hd=32, inter=352, eval_every=50, seed=0, markov=0.0, init=0.02, repeat=0.0, permute=0.0,
            long_permute=-1.0)
name = sys.argv[1]
for a in sys.argv[2:]:
    k, v = a.split("=")
    args[k] = type(args[k])(v) if not isinstance(args[k], float) else float(v)

task = RecallTask(keys=args["keys"], values=args["keys"], zipf=args["zipf"])
cfg = transformers.LlamaConfig(
    vocab_size=task.vocab, hidden_size=args["hidden"], intermediate_size=args["inter"],
    num_hidden_layers=args["layers"], num_attention_heads=args["heads"], num_key_value_heads=args["kv"],
    head_dim=args["hd"], rope_theta=args["theta"], tie_word_embeddings=False,
    max_position_embeddings=2**18, initializer_range=args["init"], bos_token_id=BOS, eos_token_id=None, pad_token_id=None)
torch.manual_seed(args["seed"])
model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", torch_dtype=torch.float32)
opt = torch.optim.AdamW(model.parameters(), lr=args["lr"], betas=(0.9, 0.95), weight_decay=0.1)
stages = [(args["length"], args["batch"], args["steps"])]
if args["long_steps"]:
    stages.append((args["long_length"], args["long_batch"], args["long_steps"]))
total = sum(s[2] for s in stages)
gen = torch.Generator().manual_seed(args["seed"] + 1)
log = {"name": name, "args": args, "curve": [], "evals": []}
L = args["length"]


def acc(length, prompts):
    model.eval()
    a = recall_accuracy(model, task, length, prompts=prompts, seed=10_000 + length, device="cpu", chunk=4)
    model.train()
    return round(a, 4)


start = time.perf_counter()
train_time = 0.0
step = 0
reached = None
losses = []
model.train()
for stage_index, (length, batch, steps) in enumerate(stages):
    permute = args["permute"] if stage_index == 0 or args["long_permute"] < 0 else args["long_permute"]
    for _ in range(steps):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = args["lr"] * _lr_factor(step, total, args["warmup"])
        ids, recall = task.sample(batch, length, gen)
        if args["markov"] > 0:  # keys follow k+1 with prob markov: a first-order reason for a previous-token head
            keys = ids[:, 1::2] - 1
            follow = torch.rand(keys.shape, generator=gen) < args["markov"]
            for j in range(1, keys.shape[1]):
                keys[:, j] = torch.where(follow[:, j], (keys[:, j - 1] + 1) % task.keys, keys[:, j])
            gen2 = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
            binding = torch.multinomial(task._prior(task.values).expand(batch, -1), task.keys, replacement=True, generator=gen2)
            ids[:, 1::2] = 1 + keys
            ids[:, 2::2] = 1 + task.keys + binding.gather(1, keys[:, :ids[:, 2::2].shape[1]])
            recall = recall_positions(ids, task)
        if args["repeat"] > 0:  # a key repeats the previous key with prob repeat (values stay bound)
            keys = ids[:, 1::2] - 1
            rep = torch.rand(keys.shape, generator=gen) < args["repeat"]
            rep[:, 0] = False
            index = torch.arange(keys.shape[1]).expand_as(keys)
            start = torch.where(rep, 0, index).cummax(1).values
            keys = keys.gather(1, start)
            gen2 = torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
            binding = torch.multinomial(task._prior(task.values).expand(batch, -1), task.keys, replacement=True, generator=gen2)
            ids[:, 1::2] = 1 + keys
            ids[:, 2::2] = 1 + task.keys + binding.gather(1, keys[:, :ids[:, 2::2].shape[1]])
            recall = recall_positions(ids, task)
        if permute:  # rename the keys of this fraction of prompts: which keys are frequent changes
            names = torch.argsort(torch.rand(batch, task.keys, generator=gen), dim=1)
            renamed = 1 + names.gather(1, ids[:, 1::2] - 1)
            chosen = torch.rand(batch, 1, generator=gen) < permute
            ids[:, 1::2] = torch.where(chosen, renamed, ids[:, 1::2])
        labels = ids.clone()
        labels[:, 0] = -100  # BOS
        if args["mask"] == "values":
            labels[:, 1::2] = -100  # key positions (odd indices)
        elif args["mask"] == "recall":
            labels = torch.where(recall, ids, torch.full_like(ids, -100))
        loss = model(ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        train_time += time.perf_counter() - t0
        losses.append(loss.item())
        if step % 10 == 0:
            log["curve"].append([step, round(sum(losses[-10:]) / 10, 4)])
        if step % args["eval_every"] == 0 or step == total:
            a = acc(L, 16)
            log["evals"].append([step, round(train_time, 1), a])
            print(f"step {step} t {train_time:.1f}s loss {sum(losses[-10:]) / 10:.3f} acc@{L} {a}", flush=True)
            if reached is None and a >= 0.95:
                reached = [step, round(train_time, 1)]
        if train_time > args["budget"]:
            break
    if train_time > args["budget"]:
        print("budget hit")
        break
log["steps"] = step
log["train_seconds"] = round(train_time, 1)
log["final_loss"] = round(sum(losses[-20:]) / 20, 4)
log["reached95"] = reached
t0 = time.perf_counter()
log["acc"] = {L: acc(L, 32), 4 * L: acc(4 * L, 8), 16 * L: acc(16 * L, 4)}
log["eval_seconds"] = round(time.perf_counter() - t0, 1)


@torch.no_grad()
def by_rank(length, prompts, top=16):
    """Recall accuracy on recall positions whose key is among the `top` most frequent, and on the rest."""
    model.eval()
    ids, recall = task.sample(prompts, length, torch.Generator().manual_seed(10_000 + length))
    predicted = model(ids).logits[:, :-1].argmax(-1)
    wanted = recall[:, 1:]
    hit = (predicted == ids[:, 1:]) & wanted
    frequent = (ids[:, :-1] - 1 < top) & wanted
    return {"top": round(hit[frequent].float().mean().item(), 4),
            "rest": round(hit[wanted & ~frequent].float().mean().item(), 4)}


log["by_rank"] = {4 * L: by_rank(4 * L, 8)}
print(json.dumps({k: log[k] for k in ("name", "steps", "train_seconds", "final_loss", "reached95", "acc", "by_rank", "eval_seconds")}))
json.dump(log, open(f"{name}.json", "w"), indent=1)
if os.environ.get("SAVE"):  # the trained model, for lab/spec_vote.py (SAVE=DIR)
    model.save_pretrained(os.environ["SAVE"])
