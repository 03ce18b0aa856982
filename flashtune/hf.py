"""transformers integration: `attn_implementation="ftune"` for Llama-, Qwen- and Mistral-style models.

    import flashtune.hf  # registers "ftune" with transformers' attention registries
    model = AutoModelForCausalLM.from_config(config, attn_implementation="ftune")

Why not "flashtune": transformers 5 treats every implementation name that contains "flash"
as a FlashAttention kernel to fetch from the Hugging Face Hub (utils.generic.
is_flash_attention_requested), and fails when there is none to fetch.

transformers is optional: flashtune imports it here and in the model bench only. Its mask function
(key_mask) gives no mask when every key is valid (the call is plain causal), else the 2-D mask
of valid keys: padding, and a static cache's positions not written yet. Few queries, with such a
mask (decode steps of batched generation, dynamic or static cache) or without one, go to the decode
kernels, which read each row's run of valid keys in place, with no host read while a CUDA graph
is captured, and without flash_attn_func's per-call checks of tensors the model hands over well
formed; any other masked batch becomes a varlen call (padded query rows get zeros), as do
rows of several sequences packed end to end (position_ids that restart, or FlashAttention's
cu_seq_lens kwargs). A model flashtune cannot serve fails when it is loaded (check_model).
"""
from __future__ import annotations

import torch

from flashtune.kernels.tiles import MAX_HEAD_DIM, MIN_HEAD_DIM, computed_head_dim
from flashtune.runtime import checks, kvcache, ops
from flashtune.runtime.checks import DTYPE_NAMES
from flashtune.runtime.selection import DECODE_MAX_SEQLEN_Q

NAME = "ftune"  # no "flash" in it: see the module docstring

# Models whose attention adds what flashtune's kernels lack, told by their config's model_type
# where no config field says it: ALiBi biases (BLOOM, MPT).
ALIBI_MODEL_TYPES = ("bloom", "mpt")


def unsupported_features(config) -> list[str]:
    """What a model's config asks of its attention that flashtune's kernels lack, one phrase each;
    empty when flashtune can serve every layer. Checked when the model is loaded with "ftune".
    Sliding windows, softcap and sinks are served (every kernel family has them)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    missing = []
    if getattr(text, "v_head_dim", None) is not None and getattr(text, "qk_nope_head_dim", None) is not None:
        head_dims = {text.qk_nope_head_dim + getattr(text, "qk_rope_head_dim", 0), text.v_head_dim}  # MLA (DeepSeek)
    else:
        heads = getattr(text, "num_attention_heads", None)
        head_dims = {getattr(text, "head_dim", None) or (text.hidden_size // heads if heads else None)}
    for head_dim in sorted(d for d in head_dims if d is not None):
        if computed_head_dim(head_dim) is None:
            missing.append(f"head dim {head_dim} (served: multiples of 8 from {MIN_HEAD_DIM} to {MAX_HEAD_DIM})")
    layer_types = set(getattr(text, "layer_types", None) or ())
    model_type = getattr(text, "model_type", "")
    if "chunked_attention" in layer_types:
        missing.append(f"chunked attention (attention_chunk_size={getattr(text, 'attention_chunk_size', None)})")
    if getattr(text, "alibi", False) or model_type in ALIBI_MODEL_TYPES:
        missing.append("ALiBi position biases through transformers (the kernels have them: flash_attn_func's "
                       "alibi_slopes; these models do not hand them to an attention function)")
    return missing


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: (batch, heads, seqlen, head_dim) in,
    (batch, seqlen, heads, head_dim) out. GQA is handled by the kernel (no repeat_kv)."""
    if dropout and module.training:
        raise ValueError("flashtune attention has no dropout: set the config's attention_dropout to 0.0 to "
                         "train, or call model.eval()")
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    # Under autocast an fp32 model's q and k come out of its fp32 rotary embedding in fp32: as SDPA
    # does under autocast, attend in the autocast dtype (gradients flow back through the cast).
    if query.dtype == torch.float32 and torch.is_autocast_enabled(query.device.type):
        dtype = torch.get_autocast_dtype(query.device.type)
        query, key, value = (t.to(dtype) for t in (query, key, value))
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # views: the head dim stays contiguous
    extra = _variants(kwargs, k.shape[1])
    packed = _packed_sequences(q, k, attention_mask, kwargs)
    if packed is not None:
        return _varlen(q, k, v, *packed, scaling, causal, extra), None
    if attention_mask is None:
        if _decode_kernels_take(q, k, v):  # every key valid: the decode kernels over the cache as it is
            scale = checks.scale_for(scaling, q.shape[-1])
            return kvcache.padded_cache_decode(q, k, v, None, None, scale, causal, **extra), None
        return ops.flash_attn_func(q, k, v, softmax_scale=scaling, causal=causal, **extra), None
    if attention_mask.dim() != 2:
        raise ValueError(f"flashtune attention takes no {attention_mask.dim()}-D attention mask; it needs the "
                         "2-D padding mask that its registered mask function produces")
    return _padded(q, k, v, attention_mask.bool(), scaling, causal, extra), None


def _decode_kernels_take(q, k, v) -> bool:
    """A decode step of generation (few queries, no gradients, one 16-bit dtype, Q's head dim for V,
    a head dim the kernels compute): it goes to kvcache.padded_cache_decode, which launches what
    flash_attn_func would (the same kernel, split count and arguments) without its checks of the
    call's tensors, which a transformers model hands over well formed (the model was checked when
    loaded): 55 -> 34 us a call on a CPU with the launch stubbed (on an H100 that path took 44 us,
    flash_attn_func's 104-133). Anything else (a V head dim unlike Q/K's, a backward) takes the
    checked calls, dense or varlen."""
    return (q.shape[1] <= DECODE_MAX_SEQLEN_Q and q.dtype in DTYPE_NAMES and q.dtype == k.dtype == v.dtype
            and v.shape[-1] == q.shape[-1] and computed_head_dim(q.shape[-1]) is not None
            and not checks.needs_grad(q, k, v))


def _variants(kwargs, keys: int) -> dict:
    """flash_attn's keyword arguments for the variants a layer asks for: transformers passes its
    sliding_window (tokens, the query's own included), softcap, and s_aux (gpt-oss's sinks)."""
    extra = {}
    window = kwargs.get("sliding_window")
    if window is not None and keys > window:  # a window no shorter than the keys changes nothing
        extra["window_size"] = (window - 1, window - 1)  # as transformers' FlashAttention path: causal bounds the right
    if kwargs.get("softcap"):
        extra["softcap"] = kwargs["softcap"]
    if kwargs.get("s_aux") is not None:
        extra["sinks"] = kwargs["s_aux"]
    return extra


def _packed_sequences(q, k, attention_mask, kwargs) -> tuple | None:
    """(cu_seqlens_q, cu_seqlens_k, max_q, max_k) when one row holds several sequences end to end:
    given by the caller as FlashAttention's kwargs (cu_seq_lens_q/k, max_length_q/k: padding-free
    batches, transformers' continuous batching without a block table), or told by position_ids
    that restart inside the row (DataCollatorWithFlattening). None for an ordinary batch."""
    if kwargs.get("block_table") is not None:
        raise ValueError("flashtune attention does not serve transformers' continuous batching with a paged "
                         "cache (block_table); use attn_implementation='sdpa' for generate_batch")
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None:
        if q.shape[0] != 1 or k.shape[0] != 1:
            raise ValueError(f"packed sequences (cu_seq_lens_q/k) come in one row, got batch {q.shape[0]}")
        max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
        max_q = int(max_q) if max_q is not None else int((cu_q[1:] - cu_q[:-1]).max())
        max_k = int(max_k) if max_k is not None else int((cu_k[1:] - cu_k[:-1]).max())
        return cu_q.to(torch.int32), cu_k.to(torch.int32), max_q, max_k
    position_ids = kwargs.get("position_ids")
    if (attention_mask is not None or position_ids is None or q.shape[0] != 1 or q.shape[1] != k.shape[1]
            or q.shape[1] < 2 or position_ids.dim() != 2 or position_ids.shape[-1] != q.shape[1]
            or not _host_reads_allowed()):
        return None
    return _sequences_of(position_ids)


def _sequences_of(position_ids: torch.Tensor) -> tuple | None:
    """The sequences of a row whose positions restart (a step other than +1 starts a sequence),
    as cu_seqlens; None when the row is one sequence. One read on the host per position_ids
    tensor and version (checks.read_values): every layer of a forward gets the same one."""
    known = checks.read_values.get((position_ids,), ("sequences",))
    if known is not None:
        return known or None
    row = position_ids[0]
    starts = torch.nonzero(row[1:] != row[:-1] + 1).flatten() + 1
    answer = None
    if starts.numel():
        total = torch.tensor([row.numel()], device=row.device)
        cu = torch.cat([torch.zeros(1, dtype=torch.int64, device=row.device), starts, total]).to(torch.int32)
        longest = int((cu[1:] - cu[:-1]).max())
        answer = (cu, cu, longest, longest)
    checks.read_values.put((position_ids,), ("sequences",), answer or ())
    return answer


def _varlen(q, k, v, cu_q, cu_k, max_q: int, max_k: int, scaling, causal: bool, extra: dict) -> torch.Tensor:
    """Packed sequences of one row: (1, total, heads, d) in and out."""
    out = ops.flash_attn_varlen_func(q[0], k[0], v[0], cu_q, cu_k, max_q, max_k, softmax_scale=scaling,
                                     causal=causal, **extra)
    return out[None]


def key_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
             attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor | None:
    """The mask function registered with "ftune". None when every key a layer gets is valid (the
    call is then plain causal); else a (batch, keys) bool mask of the valid keys, which leaves out
    the padding and, with a static cache (whose layers get the whole preallocated buffer), the
    positions not written yet. The keys written are q_offset + q_length: when the host knows that
    number the mask stops there (attention_forward slices K/V to it, as transformers' FlashAttention
    mask does); when it is a tensor on the device (a static cache's decode step, in a compiled or
    captured graph too) the mask covers the whole buffer, and the decode kernels take each row's
    last valid key as the end of its keys."""
    device = kwargs.get("device") or (attention_mask.device if attention_mask is not None else None)
    written = q_offset + q_length
    if not isinstance(written, int) and q_length > DECODE_MAX_SEQLEN_Q and _host_reads_allowed():
        written = int(written)  # a prefill (not captured): one read, so the queries' positions are known
    known = isinstance(written, int)
    length = written - kv_offset if known else kv_length
    if known and attention_mask is None and length == kv_length:
        return None
    valid = torch.arange(kv_offset, kv_offset + length, device=device) < written
    valid = valid[None, :].expand(batch_size, length)
    if attention_mask is not None:  # 2-D padding mask over the positions so far
        padding = attention_mask.bool()[:, -length:]
        if padding.shape[1] < length:  # a static cache's positions beyond it are not written yet
            padding = torch.nn.functional.pad(padding, (0, length - padding.shape[1]))
        valid = valid & padding
        if known and length == kv_length and _host_reads_allowed() and bool(valid.all()):
            return None  # one read per forward, as transformers' FlashAttention mask function
    return valid


def _host_reads_allowed() -> bool:
    """Not while torch.compile traces or a CUDA graph is captured: a read would break the graph."""
    return not torch.compiler.is_compiling() and checks.device_values_checked()


def _padded(q, k, v, kv_mask: torch.Tensor, scaling, causal: bool, extra: dict) -> torch.Tensor:
    """A masked batch (key_mask's mask: padding, a static cache's unwritten positions). Few
    queries per row go to the decode kernels, which read each row's run of valid keys in place
    (first..last valid key; the queries are the last ones of the run, as in generation);
    anything else is one varlen call (keep the valid tokens, attend, scatter back)."""
    batch, q_len = q.shape[0], q.shape[1]
    mask, kv_mask = kv_mask, kv_mask[:, -k.shape[1]:]
    if kv_mask.shape[1] < k.shape[1]:  # a static cache: the keys after the mask are not written yet
        k, v = k[:, :kv_mask.shape[1]], v[:, :kv_mask.shape[1]]
    if _decode_kernels_take(q, k, v):
        run = _one_run(mask, kv_mask, q_len)
        if run is not None:
            scale = checks.scale_for(scaling, q.shape[-1])
            return kvcache.padded_cache_decode(q, k, v, *run, scale, causal, **extra)
    q_mask = kv_mask[:, -q_len:]  # the queries are the last q_len positions of the sequence
    lens_q, lens_k = q_mask.sum(1, dtype=torch.int32), kv_mask.sum(1, dtype=torch.int32)
    zero = torch.zeros(1, dtype=torch.int32, device=q.device)
    cu_q = torch.cat([zero, lens_q.cumsum(0, dtype=torch.int32)])
    cu_k = torch.cat([zero, lens_k.cumsum(0, dtype=torch.int32)])
    out_packed = ops.flash_attn_varlen_func(
        q[q_mask], k[kv_mask], v[kv_mask], cu_q, cu_k, int(lens_q.max()), int(lens_k.max()),
        softmax_scale=scaling, causal=causal, **extra)
    out = q.new_zeros(batch, q_len, q.shape[2], v.shape[3])
    out[q_mask] = out_packed
    return out


def _one_run(mask: torch.Tensor, kv_mask: torch.Tensor, q_len: int) -> tuple | None:
    """(first, end): each row's first valid key and one past its last, int32, when every row's
    valid keys are one run that holds its queries, as generation with left padding and a static
    cache gives; else None. One read on the host per mask (none while a graph is captured or
    traced), remembered (checks.read_values) with the two tensors for the other layers of the
    forward, which get the same mask: one sync a decode step, not one a layer."""
    eager = _host_reads_allowed()
    asked = ("one run", kv_mask.shape[1], q_len)
    known = checks.read_values.get((mask,), asked) if eager else None
    if known is not None:
        return known or None
    positions = torch.arange(kv_mask.shape[1], device=kv_mask.device, dtype=torch.int32)
    end = torch.where(kv_mask, positions + 1, 0).amax(1).to(torch.int32)
    first = torch.minimum(torch.where(kv_mask, positions, kv_mask.shape[1]).amin(1), end).to(torch.int32)
    if not eager:
        return first, end
    one_run = bool(((kv_mask == ((positions >= first[:, None]) & (positions < end[:, None]))).all(1)
                    & (end - first >= q_len)).all())
    checks.read_values.put((mask,), asked, (first, end) if one_run else ())
    return (first, end) if one_run else None


class UnsupportedModelError(ValueError):
    """A model loaded with attn_implementation="ftune" whose attention flashtune cannot serve."""


def check_model(model) -> None:
    """Raise UnsupportedModelError, one line naming what is missing, if flashtune cannot serve
    every attention layer of `model` (a transformers PreTrainedModel or its config)."""
    config = getattr(model, "config", model)
    missing = unsupported_features(config)
    if missing:
        name = type(model).__name__ if hasattr(model, "config") else getattr(config, "model_type", "this model")
        raise UnsupportedModelError(f"flashtune cannot serve {name}'s attention: it needs {' and '.join(missing)}; "
                                    "load it with attn_implementation='sdpa'")


def _checked_at_load(choose):
    """transformers' PreTrainedModel.get_correct_attn_implementation, which every model's
    __init__ and set_attn_implementation call, with check_model when "ftune" is chosen: a model
    flashtune cannot serve fails when it is loaded, not at its first token."""
    if getattr(choose, "_checks_flashtune", False):
        return choose

    def get_correct_attn_implementation(self, requested_attention, *args, **kwargs):
        chosen = choose(self, requested_attention, *args, **kwargs)
        if chosen == NAME:
            check_model(self)
        return chosen

    get_correct_attn_implementation._checks_flashtune = True
    get_correct_attn_implementation.__doc__ = choose.__doc__
    return get_correct_attn_implementation


def register() -> None:
    """Add "ftune" to transformers' attention and attention-mask registries, and its check to
    model loading (idempotent)."""
    try:
        from transformers import AttentionInterface, PreTrainedModel
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:
        raise ImportError("the transformers integration needs transformers >= 4.56: "
                          "pip install 'flashtune[hf]'") from e
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, key_mask)
    # The one hook transformers offers between a model's config and its first forward. Without
    # it (another transformers), attention_forward still refuses what it cannot serve, per call.
    if hasattr(PreTrainedModel, "get_correct_attn_implementation"):
        PreTrainedModel.get_correct_attn_implementation = _checked_at_load(
            PreTrainedModel.get_correct_attn_implementation)


register()
