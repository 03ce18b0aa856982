"""transformers integration: `attn_implementation="ftune"` for Llama-, Qwen- and Mistral-style models.

    import flashtune.hf  # registers "ftune" with transformers' attention registries
    model = AutoModelForCausalLM.from_config(config, attn_implementation="ftune")

Why not "flashtune": transformers 5 treats every implementation name that contains "flash"
as a FlashAttention kernel to fetch from the Hugging Face Hub (utils.generic.
is_flash_attention_requested), and fails when there is none to fetch.

transformers is optional: this module is the only one that imports it. The mask side reuses
transformers' FlashAttention mask function: no mask when the batch is unpadded and causal,
else the 2-D padding mask. Decode steps over a left-padded cache go to the decode kernels with
each row's padding as its first valid key; any other padded batch becomes a varlen call (padded
query rows get zeros).
"""
from __future__ import annotations

import torch

from flashtune.runtime import kvcache, ops
from flashtune.runtime.checks import DTYPE_NAMES
from flashtune.runtime.selection import DECODE_MAX_SEQLEN_Q

NAME = "ftune"  # no "flash" in it: see the module docstring

# Where decode steps (one new query against the KV cache) go: flashtune's decode kernels, or, with
# "sdpa", torch's scaled_dot_product_attention, by name (`bench --model` calls that route
# flashtune+sdpa-decode, to measure one against the other).
DECODE_ROUTES = ("flashtune", "sdpa")
decode_route = "flashtune"


def set_decode_route(route: str) -> None:
    """"flashtune" (default): every call through flashtune; "sdpa": single-query decode steps
    through torch SDPA, prefill through flashtune."""
    global decode_route
    if route not in DECODE_ROUTES:
        raise ValueError(f"decode route {route!r}; allowed: {', '.join(DECODE_ROUTES)}")
    decode_route = route


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: (batch, heads, seqlen, head_dim) in,
    (batch, seqlen, heads, head_dim) out. GQA is handled by the kernel (no repeat_kv)."""
    for unsupported in ("softcap", "s_aux"):
        if kwargs.get(unsupported) is not None:
            raise ValueError(f"flashtune attention does not support {unsupported}; use attn_implementation='sdpa'")
    window = kwargs.get("sliding_window")
    if window is not None and key.shape[2] > window:  # a window no longer than the sequence changes nothing
        raise ValueError(f"flashtune attention has no sliding window ({window} < {key.shape[2]} keys); "
                         "use attn_implementation='sdpa' for sequences longer than the window")
    if dropout and module.training:
        raise ValueError("flashtune attention is forward-only (inference): no dropout; call model.eval()")
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    if decode_route == "sdpa" and query.shape[2] == 1:
        return _sdpa_decode(query, key, value, attention_mask, scaling), None
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # views: the head dim stays contiguous
    if attention_mask is None:
        return ops.flash_attn_func(q, k, v, softmax_scale=scaling, causal=causal), None
    if attention_mask.dim() != 2:
        raise ValueError(f"flashtune attention takes no {attention_mask.dim()}-D attention mask; it needs the "
                         "2-D padding mask that its registered mask function produces")
    return _padded(q, k, v, attention_mask.bool(), scaling, causal), None


def _sdpa_decode(query, key, value, attention_mask, scaling) -> torch.Tensor:
    """One query per sequence (it is the last position, so causal masks nothing) through torch
    SDPA; a 2-D padding mask hides the padded keys. (batch, 1, heads, head_dim) out."""
    mask = None
    if attention_mask is not None:
        if attention_mask.dim() != 2:
            raise ValueError("flashtune's decode route takes the 2-D padding mask of its mask function")
        mask = attention_mask.bool()[:, -key.shape[2]:][:, None, None, :]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=scaling, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2)


def _padded(q, k, v, kv_mask: torch.Tensor, scaling, causal: bool) -> torch.Tensor:
    """A padded batch: decode steps over a left-padded cache through the decode kernels, reading
    the cache in place; anything else as one varlen call (keep the valid tokens, attend, scatter back)."""
    batch, q_len = q.shape[0], q.shape[1]
    kv_mask = kv_mask[:, -k.shape[1]:]
    if q_len <= DECODE_MAX_SEQLEN_Q and q.dtype in DTYPE_NAMES and q.shape[-1] in (64, 128, 256):
        pads = (~kv_mask).sum(1, dtype=torch.int32)
        positions = torch.arange(kv_mask.shape[1], device=kv_mask.device)
        # one read on the host, as the varlen path's lengths: every row a run of valid keys that ends
        # at the last position (left padding, as batched generation pads) and covers its queries
        left_padded = (kv_mask == (positions[None, :] >= pads[:, None])).all() & (kv_mask.shape[1] - pads >= q_len).all()
        if bool(left_padded):
            scale = scaling if scaling is not None else q.shape[-1] ** -0.5
            return kvcache.left_padded_decode(q, k, v, pads, scale, causal)
    q_mask = kv_mask[:, -q_len:]  # the queries are the last q_len positions of the sequence
    lens_q, lens_k = q_mask.sum(1, dtype=torch.int32), kv_mask.sum(1, dtype=torch.int32)
    zero = torch.zeros(1, dtype=torch.int32, device=q.device)
    cu_q = torch.cat([zero, lens_q.cumsum(0, dtype=torch.int32)])
    cu_k = torch.cat([zero, lens_k.cumsum(0, dtype=torch.int32)])
    out_packed = ops.flash_attn_varlen_func(
        q[q_mask], k[kv_mask], v[kv_mask], cu_q, cu_k, int(lens_q.max()), int(lens_k.max()),
        softmax_scale=scaling, causal=causal)
    out = q.new_zeros(batch, q_len, q.shape[2], q.shape[3])
    out[q_mask] = out_packed
    return out


def register() -> None:
    """Add "ftune" to transformers' attention and attention-mask registries (idempotent)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    except ImportError as e:
        raise ImportError("the transformers integration needs transformers >= 4.56: "
                          "pip install 'flashtune[hf]'") from e
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, flash_attention_mask)


register()
