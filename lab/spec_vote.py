"""How often the sm90 kernel's speculative step (spec_max) fails its vote on a model's own queries and keys,
against the random-normal inputs the kernel grid times. On the CPU, no kernel: the vote of
csrc/sm90/softmax.cuh replayed in fp32 on the scores.

Why: the recall bench (benchmarks/h100/2026-12-07d_model_recall.json, a trained model) put flashtune's
prefill kernels at 38% of a 53.0 ms forward at 16k (5.0 ms a layer), where the same model with random
weights (lab/model_layout.py, lab/results/2026-12-07g_h100-visit/) took 3.5 ms a layer; cuDNN's took 4.1-4.3
in both. spec_max is the kernel's data-dependent step: from a tile's block 1 on, a block's exps are taken
against the rows' maxima as they stand, and if any thread's sum of a row's exps passes 2^8 anywhere in the
64-row warpgroup, S_j is computed again from K_j and the full step runs (a second QK^T GEMM, the P V
waited for). A query that finds its match far above every earlier key (recall, induction, retrieval heads)
fails it.

The replay, per (batch, head) and causal prefill: tiles of BLOCK_M rows (64-row warpgroups), blocks of
BLOCK_N keys, block 0 a full step; each later block the vote (a thread holds the columns 8 (i / 4) +
2 t + i % 2 of its two rows, t its place in the quad), then on failure the full step with lazy rescaling
(a maximum moves only when the block's is more than 2^8 above it in exp2's domain). It reports the
fraction of (warpgroup, block >= 1) steps that fail.

    PYTHONPATH=. python3 lab/spec_vote.py [MODEL_DIR] [OUT.json]

MODEL_DIR: a recall model saved by lab/recall_exp.py (SAVE=DIR); without it, the rows on random inputs
and on the recall architecture with random weights alone. RESCALE_LOG2=N replays a bound of 2^N in place
of the kernels' 2^8.
"""
import json
import math
import os
import sys

import torch

BLOCK_M, BLOCK_N = 128, 128
# lazy rescaling's bound (and the vote's), log2: the kernels' 2^8 unless RESCALE_LOG2=N asks another
RESCALE_LOG2 = float(os.environ.get("RESCALE_LOG2", 8))


def warpgroup_blocks(scores: torch.Tensor):
    """The kernel's walk of one head's causal prefill: per 64-row warpgroup of each BLOCK_M-row tile,
    (rows, blocks), blocks yielding (j, cols, s): block j's keys and their raw scores, masked to -inf
    past each row's diagonal, in the order the mainloop takes them (block 0 holds key 0)."""
    seqlen = scores.shape[0]
    for m0 in range(0, seqlen, BLOCK_M):
        for g0 in range(m0, min(m0 + BLOCK_M, seqlen), 64):
            rows = torch.arange(g0, min(g0 + 64, seqlen))

            def blocks(rows=rows, m0=m0):
                for j in range(math.ceil(min(seqlen, m0 + BLOCK_M) / BLOCK_N)):  # the tile's last row's
                    cols = torch.arange(j * BLOCK_N, min((j + 1) * BLOCK_N, seqlen))
                    s = torch.where(cols[None, :] <= rows[:, None], scores[rows][:, cols], torch.tensor(-math.inf))
                    yield j, cols, s
            yield rows, blocks()


def speculative_exps(s: torch.Tensor, row_max: torch.Tensor, scale_log2: float):
    """softmax.cuh's speculative step on one block: (p, sums, stands, exact). p: the exps against the
    maxima as they stand; sums: each quad thread's sum of its columns (a thread holds 8 (i / 4) + 2 t +
    i % 2); stands: the warpgroup's vote passes; exact: no sum overflowed and no row without a maximum
    saw a key (what mending a failed vote from p needed: docs/experiments.md, the spec-recover row)."""
    no_max = row_max == -math.inf
    p = torch.exp2(s * scale_log2 - torch.where(no_max, 0.0, row_max * scale_log2)[:, None])
    t_of_column = (torch.arange(s.shape[1]) % 8) // 2
    sums = torch.zeros(s.shape[0], 4).index_add_(1, t_of_column, p)
    stands = bool(((sums <= 2 ** RESCALE_LOG2) & (~no_max[:, None] | (sums == 0))).all())
    exact = bool(((sums <= 3.0e38) & (~no_max[:, None] | (sums == 0))).all())  # inf and NaN fail
    return p, sums, stands, exact


def lazy_max(row_max: torch.Tensor, s: torch.Tensor, scale_log2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The full step's maxima (lazy rescaling: a row's moves only when the block's is more than 2^8
    above it in exp2's domain, or from -inf): (new maxima, which moved)."""
    block_max = torch.maximum(row_max, s.max(dim=1).values)
    moves = (row_max == -math.inf) | ((block_max - row_max) * scale_log2 > RESCALE_LOG2)
    return torch.where(moves, block_max, row_max), moves


def vote_failures(q: torch.Tensor, k: torch.Tensor, scale: float, until_failure: bool = False) -> tuple[int, int, int]:
    """(failed, speculative steps, failed with an exp that overflowed) over one head's causal prefill;
    q, k: (seqlen, d) fp32. until_failure: a warpgroup stops speculating for the rest of its tile at
    its first failed vote, and its later blocks take the full step (the kernel since 2026-12-07; without
    it, the kernel before). A failed vote without an overflow (or a row without a maximum that sees a
    key) is one that the spec-recover experiment (docs/experiments.md) mended from the exps."""
    scale_log2 = scale * math.log2(math.e)
    failed = steps = overflowed = 0
    for rows, blocks in warpgroup_blocks(q @ k.T):
        row_max = torch.full((len(rows),), -math.inf)
        speculate = True
        for j, _, s in blocks:
            if j > 0 and speculate:
                steps += 1
                p, sums, stands, exact = speculative_exps(s, row_max, scale_log2)
                if stands:
                    continue
                failed += 1
                speculate = not until_failure
                overflowed += int(not exact)
            row_max, _ = lazy_max(row_max, s, scale_log2)
    return failed, steps, overflowed


def rate(pairs: list[tuple[torch.Tensor, torch.Tensor]], scale: float) -> dict:
    """Over every (warpgroup, block >= 1) of the heads' prefills: the share of speculative steps whose
    vote fails, as the kernel speculates today, and of those with an exp that overflowed (which only
    S computed again mends); and, stopping at a tile's first failure, the share of blocks that still
    speculate (and pass) and of blocks whose vote fails."""
    blocks = failed = overflowed = until_failed = until_steps = 0
    for q, k in pairs:
        f, s, o = vote_failures(q.float(), k.float(), scale)
        uf, us, _ = vote_failures(q.float(), k.float(), scale, until_failure=True)
        blocks, failed, overflowed = blocks + s, failed + f, overflowed + o
        until_failed, until_steps = until_failed + uf, until_steps + us
    share = lambda n: round(n / max(blocks, 1), 4)  # noqa: E731
    return {"blocks": blocks, "failed": share(failed), "failed with an overflow": share(overflowed),
            "until_failure": {"speculated": share(until_steps - until_failed), "failed": share(until_failed)}}


def captured_layers(model, ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Each layer's (q, k, v) as transformers hands them to attention, (batch, heads, seqlen, d) after
    RoPE, through an attention function registered with transformers that records them and then
    runs SDPA."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layers = []

    def record(module, query, key, value, attention_mask, **kwargs):
        layers.append((query, key, value))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    AttentionInterface.register("spec_vote_record", record)
    model.set_attn_implementation("spec_vote_record")
    with torch.no_grad():
        model(ids, use_cache=False, logits_to_keep=1)
    return layers


def captured_qk(model, ids: torch.Tensor) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Each layer's (q, k) per (batch, query head), k that head's KV head."""
    pairs = []
    for q, k, _ in captured_layers(model, ids):
        ratio = q.shape[1] // k.shape[1]
        pairs.append([(q[b, h], k[b, h // ratio]) for b in range(q.shape[0]) for h in range(q.shape[1])])
    return pairs


def main() -> None:
    from flashtune.measure.recall_model import RecallTask
    torch.manual_seed(0)
    out: dict = {"block_m": BLOCK_M, "block_n": BLOCK_N, "rows": []}
    for d in (64, 128):
        for seqlen in (2048,):
            pairs = [(torch.randn(seqlen, d), torch.randn(seqlen, d)) for _ in range(4)]
            row = {"inputs": f"random normal, d {d}", "seqlen": seqlen, **rate(pairs, d ** -0.5)}
            out["rows"].append(row)
            print(row, flush=True)
    model_dir = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "-" else None
    if model_dir:
        import transformers
        model = transformers.LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
        cfg = model.config
        task = RecallTask(keys=(cfg.vocab_size - 1) // 2, values=(cfg.vocab_size - 1) // 2)
        for trained in (True, False):
            if not trained:  # the same architecture with its initial weights' scale
                model = transformers.LlamaForCausalLM._from_config(cfg, torch_dtype=torch.float32).eval()
            for seqlen in (512, 2048):
                ids, _ = task.sample(2, seqlen, torch.Generator().manual_seed(10_000 + seqlen))
                for layer, pairs in enumerate(captured_qk(model, ids)):
                    row = {"inputs": f"recall model {'trained' if trained else 'random weights'}, layer {layer}",
                           "seqlen": seqlen, **rate(pairs, cfg.head_dim ** -0.5)}
                    out["rows"].append(row)
                    print(row, flush=True)
    if len(sys.argv) > 2:
        json.dump(out, open(sys.argv[2], "w"), indent=1)


if __name__ == "__main__":
    main()
