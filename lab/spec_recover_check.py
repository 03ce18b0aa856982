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

from spec_vote import BLOCK_M, BLOCK_N, RESCALE_LOG2, captured_qk


def attention_as_the_patch(q, k, v, scale):
    """(out, lse, mended, recomputed) of one head's causal prefill, fp32, as the patched kernel computes it."""
    seqlen, sl2 = q.shape[0], scale * math.log2(math.e)
    scores = q @ k.T
    out, lse = torch.empty(seqlen, v.shape[1]), torch.empty(seqlen)
    t_of_column = (torch.arange(BLOCK_N) % 8) // 2
    mended = recomputed = 0
    for m0 in range(0, seqlen, BLOCK_M):
        for g0 in range(m0, min(m0 + BLOCK_M, seqlen), 64):
            rows = torch.arange(g0, min(g0 + 64, seqlen))
            m = torch.full((len(rows),), -math.inf)
            l, o = torch.zeros(len(rows)), torch.zeros(len(rows), v.shape[1])
            for j in range(math.ceil(min(seqlen, m0 + BLOCK_M) / BLOCK_N)):
                cols = torch.arange(j * BLOCK_N, min((j + 1) * BLOCK_N, seqlen))
                s = torch.where(cols[None, :] <= rows[:, None], scores[rows][:, cols], torch.tensor(-math.inf))
                if j > 0:  # the speculative step
                    no_max = m == -math.inf
                    p = torch.exp2(s * sl2 - torch.where(no_max, 0.0, m * sl2)[:, None])
                    sums = torch.zeros(len(rows), 4).index_add_(1, t_of_column[:len(cols)], p)
                    if bool(((sums <= 2 ** RESCALE_LOG2) & (~no_max[:, None] | (sums == 0))).all()):
                        l, o = l + p.sum(1), o + p @ v[cols]
                        continue
                    exact = (sums <= 3.0e38) & (~no_max[:, None] | (sums == 0))
                    if bool(exact.all()):  # mended
                        mended += 1
                        largest = p.max(dim=1).values
                        up = torch.where(largest > 2 ** RESCALE_LOG2, torch.log2(largest), torch.zeros(()))
                        alpha = torch.exp2(-up)
                        m = m + up / sl2
                        p = p * alpha[:, None]
                        l = (l + sums.sum(1)) * alpha
                        o = o * alpha[:, None] + p @ v[cols]
                        continue
                    recomputed += 1
                # the full step (lazy rescaling)
                block_max = torch.maximum(m, s.max(dim=1).values)
                moves = (m == -math.inf) | ((block_max - m) * sl2 > RESCALE_LOG2)
                m_new = torch.where(moves, block_max, m)
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
