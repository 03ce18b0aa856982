"""Copy task: BOS, random tokens S (length L/2), then S again; accuracy on the second copy's positions.
Usage: python3 copy_task.py VOCAB '[[length, batch, steps], ...]' LR"""
import sys, time, torch, transformers
torch.set_num_threads(2)
import json
V = int(sys.argv[1]); stages = json.loads(sys.argv[2]); lr = float(sys.argv[3]); L = stages[-1][0]; steps = sum(s[2] for s in stages)
cfg = transformers.LlamaConfig(vocab_size=V + 1, hidden_size=128, intermediate_size=352, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, rope_theta=500000.0, tie_word_embeddings=False,
    max_position_embeddings=2**18, bos_token_id=0, eos_token_id=None, pad_token_id=None)
torch.manual_seed(0)
model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", torch_dtype=torch.float32)
opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
gen = torch.Generator().manual_seed(1)
def sample(b, length, g):
    half = length // 2
    s = 1 + torch.randint(0, V, (b, half), generator=g)
    return torch.cat([torch.zeros(b, 1, dtype=torch.long), s, s], 1)[:, :length]
@torch.no_grad()
def acc(length, n=8):
    model.eval(); ids = sample(n, length, torch.Generator().manual_seed(99 + length))
    pred = model(ids).logits[:, :-1].argmax(-1); half = length // 2
    m = pred[:, half + 1:] == ids[:, half + 2:]  # predictions of the second copy's tokens after its first
    model.train(); return m.float().mean().item()
t = 0.0
plan = [(l, b) for l, b, n in stages for _ in range(n)]
for step in range(1, steps + 1):
    t0 = time.perf_counter(); Lc, B = plan[step - 1]
    for g_ in opt.param_groups: g_["lr"] = lr * min(1, step / 50)
    ids = sample(B, Lc, gen)
    loss = model(ids, labels=ids).loss; loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step(); opt.zero_grad()
    t += time.perf_counter() - t0
    if step % 50 == 0: print(f"step {step} t {t:.0f}s loss {loss.item():.3f} acc@{L} {acc(L):.3f}", flush=True)
print("final", {l: round(acc(l, 4), 3) for l in (L, 4 * L, 16 * L)})
