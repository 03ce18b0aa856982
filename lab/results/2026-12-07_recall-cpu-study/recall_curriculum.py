"""Curriculum: keys drawn from the first n of K, follow-the-previous-key p; eval on the plain task.
Usage: python3 recall_curriculum.py K '[[length, batch, n, steps], ...]' FOLLOW BUDGET_S"""
import json, sys, time, torch, transformers
from flashtune.measure.recall_model import RecallTask, recall_positions, recall_accuracy, _lr_factor, BOS
torch.set_num_threads(2)
K = int(sys.argv[1]); stages = json.loads(sys.argv[2]); follow = float(sys.argv[3]); budget = float(sys.argv[4])
task = RecallTask(keys=K, values=K, zipf=0.0)
cfg = transformers.LlamaConfig(vocab_size=task.vocab, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, rope_theta=500000.0, tie_word_embeddings=False,
    max_position_embeddings=2**18, bos_token_id=BOS, eos_token_id=None, pad_token_id=None)
torch.manual_seed(0)
model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", torch_dtype=torch.float32)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
gen = torch.Generator().manual_seed(1)
total = sum(s[3] for s in stages)

def sample(batch, length, n):
    pairs = length // 2 + 1
    keys = torch.randint(0, n, (batch, pairs), generator=gen)
    f = torch.rand(keys.shape, generator=gen) < follow
    for j in range(1, pairs):
        keys[:, j] = torch.where(f[:, j], (keys[:, j - 1] + 1) % n, keys[:, j])
    binding = torch.randint(0, K, (batch, K), generator=gen)
    ids = torch.empty(batch, 1 + 2 * pairs, dtype=torch.long); ids[:, 0] = BOS
    ids[:, 1::2] = 1 + keys; ids[:, 2::2] = 1 + K + binding.gather(1, keys)
    return ids[:, :length]

step, t = 0, 0.0
model.train()
for length, batch, n, steps in stages:
    for _ in range(steps):
        t0 = time.perf_counter()
        for g in opt.param_groups: g["lr"] = 3e-3 * _lr_factor(step, total, 50)
        ids = sample(batch, length, n)
        loss = model(ids, labels=ids).loss
        loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step(); opt.zero_grad()
        step += 1; t += time.perf_counter() - t0
        if step % 50 == 0:
            model.eval()
            a = recall_accuracy(model, task, 256, 8, 10256, "cpu", chunk=4)
            model.train()
            print(f"step {step} ({length},{batch},{n}) t {t:.0f}s loss {loss.item():.3f} acc@256 {a:.3f}", flush=True)
        if t > budget: break
    if t > budget: break
model.eval()
print("final", {L: round(recall_accuracy(model, task, L, 8, 10000 + L, "cpu", chunk=4), 3) for L in (256, 1024)})
