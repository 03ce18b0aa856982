"""The arithmetic of lab/pending/spec-recover.patch, in fp32 on the CPU, against exact attention: the
sm90 kernel's online softmax (block 0 a full step; from block 1 on the speculative exps against the
maxima as they stand; a failed vote mended from those exps where none overflowed: a row whose largest
exp passes 2^8 moves its maximum by that exp's log2 and scales its exps, sum and O by 2^-that; S again
and the full step where one overflowed), per 64-row warpgroup of 128-row tiles, blocks of 128 keys,
causal. Checks that the mending gives the output and LSE the full step gives, on the inputs that fail
the vote most: a trained recall model's (lab/spec_vote.py) and random keys with 40x outliers (the GPU
test's kind). No kernel runs here; the patch's GPU tests are the kernel's check.

    PYTHONPATH=. python3 lab/spec_recover_check.py [MODEL_DIR]
"""
import math
import sys

import torch

from spec_vote import RESCALE_LOG2, captured_qk, lazy_max, speculative_exps, warpgroup_blocks


def attention_as_the_patch(q, k, v, scale):
    """(out, lse, mended, recomputed) of one head's causal prefill, fp32, as the patched kernel computes it."""
    sl2 = scale * math.log2(math.e)
    out, lse = torch.empty(q.shape[0], v.shape[1]), torch.empty(q.shape[0])
    mended = recomputed = 0
    for rows, blocks in warpgroup_blocks(q @ k.T):
        m = torch.full((len(rows),), -math.inf)
        l, o = torch.zeros(len(rows)), torch.zeros(len(rows), v.shape[1])
        for j, cols, s in blocks:
            if j > 0:  # the speculative step
                p, sums, stands, exact = speculative_exps(s, m, sl2)
                if stands:
                    l, o = l + p.sum(1), o + p @ v[cols]
                    continue
                if exact:  # mended
                    mended += 1
                    largest = p.max(dim=1).values
                    up = torch.where(largest > 2 ** RESCALE_LOG2, torch.log2(largest), torch.zeros(()))
                    alpha = torch.exp2(-up)
                    m = m + up / sl2
                    l = (l + sums.sum(1)) * alpha
                    o = o * alpha[:, None] + (p * alpha[:, None]) @ v[cols]
                    continue
                recomputed += 1
            m_new, moves = lazy_max(m, s, sl2)  # the full step
            m_scaled = torch.where(m_new == -math.inf, 0.0, m_new * sl2)
            alpha = torch.where(moves & (m != -math.inf), torch.exp2(m * sl2 - m_scaled), torch.ones(()))
            p = torch.exp2(s * sl2 - m_scaled[:, None])
            l, o, m = l * alpha + p.sum(1), o * alpha[:, None] + p @ v[cols], m_new
        out[rows] = o / l[:, None]
        lse[rows] = m * scale + torch.log(l)
    return out, lse, mended, recomputed


def check(name, triples, scale):
    worst_out = worst_lse = 0.0
    mended = recomputed = 0
    for q, k, v in triples:
        q, k, v = q.float(), k.float(), v.float()
        out, lse, me, re = attention_as_the_patch(q, k, v, scale)
        s = (q.double() @ k.double().T) * scale
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), -math.inf)
        ref, ref_lse = torch.softmax(s, -1) @ v.double(), torch.logsumexp(s, -1)
        worst_out = max(worst_out, ((out.double() - ref).norm() / ref.norm()).item())
        worst_lse = max(worst_lse, (lse.double() - ref_lse).abs().max().item())
        mended, recomputed = mended + me, recomputed + re
    print(f"{name}: mended {mended}, recomputed {recomputed}; worst rel L2 of O {worst_out:.2e}, "
          f"worst |LSE error| {worst_lse:.2e}", flush=True)


def main() -> None:
    torch.manual_seed(0)
    for d in (64, 128):
        triples = []
        for _ in range(2):
            q, k, v = torch.randn(2048, d), torch.randn(2048, d), torch.randn(2048, d)
            k[[700, 1100, 1500, 1900]] *= 40
            triples.append((q, k, v))
        check(f"random, keys 700/1100/1500/1900 x40, d {d}", triples, d ** -0.5)
    if len(sys.argv) > 1:
        import transformers
        from flashtune.measure.recall_model import RecallTask
        model = transformers.LlamaForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32).eval()
        cfg = model.config
        task = RecallTask(keys=(cfg.vocab_size - 1) // 2, values=(cfg.vocab_size - 1) // 2)
        ids, _ = task.sample(2, 2048, torch.Generator().manual_seed(12_048))
        for layer, triples in enumerate(captured_qk(model, ids, values=True)):
            check(f"recall model trained, layer {layer}, 2,048 tokens", triples, cfg.head_dim ** -0.5)


if __name__ == "__main__":
    main()
