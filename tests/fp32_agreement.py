"""How close a bf16 transformers model through flashtune comes to fp32 math, judged against SDPA (or
eager) in the same dtype: the GPU tests of the transformers integration use this.

Random weights give near-flat logits, on which any two exact bf16 attentions pick different tokens
at a few positions in a hundred (a random Qwen2 on an H100: top-1 agreement with fp32 math 97.8% for
SDPA in bf16, 97.7% for its bf16 math kernel, 97.7% for flashtune), so a bar on flashtune's
agreement with SDPA cannot tell a bug from rounding, and greedy continuations part at the first
near-tie. A bar relative to the same-dtype backend's own agreement with fp32 math can: a wrong mask,
cache position or kernel falls far below it.
"""
from __future__ import annotations

import copy

import torch

# Slack under the same-dtype backend's agreement with fp32 math: for top-1 over every prompt position
# (600-1000 positions, of which rounding moves about 2% for either backend, mostly the same ones), and
# for greedy tokens (32-72 of them; where the two continuations part, they meet different near-ties).
# A wrong mask, window or cache position costs far more.
TOP1_SLACK = 0.02
GREEDY_SLACK = 0.15


def three_models(build, config, reference: str = "sdpa"):
    """fp32 math, `reference` in bf16 and flashtune in bf16, with the same weights, each from a config of
    its own (_from_config sets the attention on the config it is handed). `build(config, attention,
    dtype)` makes one model."""
    from flashtune import hf

    torch.manual_seed(0)
    exact = build(copy.deepcopy(config), reference, torch.float32).cuda().eval()
    same_dtype = build(copy.deepcopy(config), reference, torch.bfloat16).cuda().eval()
    ours = build(copy.deepcopy(config), hf.NAME, torch.bfloat16).cuda().eval()
    for model in (same_dtype, ours):
        model.load_state_dict(exact.state_dict())
    got = [m.config._attn_implementation for m in (exact, same_dtype, ours)]
    assert got == [reference, reference, hf.NAME], got
    return exact, same_dtype, ours


def top1(model, exact, ids, **kwargs) -> float:
    """The fraction of positions whose top-1 token is fp32 math's."""
    with torch.no_grad():
        return (model(ids, **kwargs).logits.argmax(-1) == exact(ids, **kwargs).logits.argmax(-1)).float().mean().item()


def greedy(model, exact, ids, new_tokens: int, attention_mask=None, **generate_kwargs) -> float:
    """`model`'s greedy continuation of ids (left padded where attention_mask says so), scored by
    fp32 math (fp32_picks)."""
    with torch.no_grad():
        tokens = model.generate(ids, attention_mask=attention_mask, max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, do_sample=False, **generate_kwargs)
    return fp32_picks(exact, ids, tokens[:, ids.shape[1]:], attention_mask)


def fp32_picks(exact, ids, new, attention_mask=None) -> float:
    """The fraction of the new tokens (batch, n) continuing ids that fp32 math picks given the same
    prefix (one forward over prompt and continuation)."""
    tokens = torch.cat([ids, new], dim=1)
    mask = torch.ones_like(tokens) if attention_mask is None else torch.cat(
        [attention_mask, attention_mask.new_ones(new.shape)], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # generate's positions under left padding
    with torch.no_grad():
        picks = exact(tokens, attention_mask=mask, position_ids=positions).logits[:, ids.shape[1] - 1:-1].argmax(-1)
    return (picks == new).float().mean().item()


def assert_as_close_as(ours: float, same_dtype: float, slack: float, what: str) -> None:
    assert ours >= same_dtype - slack, f"{what}: flashtune {ours:.4f}, the same-dtype backend {same_dtype:.4f}"
