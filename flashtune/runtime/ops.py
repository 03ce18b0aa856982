"""The public attention functions, with flash_attn's names and signatures, and the custom op.

`flash_attn_func` / `flash_attn_varlen_func` validate their inputs (runtime/checks.py: a clear
error for each bad one), then call the custom op `flashtune::attention_fwd`, whose implementation picks
the kernel for the call's shape (runtime/selection.py's kernel_for: the active profile's tile, or the
decode kernel for queries of at most 16 rows), builds or loads it, and launches it through
`flashtune_C::fwd` (or `flashtune_C::decode`, runtime/decode.py). The custom op has a fake implementation, so
`torch.compile` traces calls without graph breaks.
"""
from __future__ import annotations

import torch

from flashtune.kernels.build import load_binding, load_kernel
from flashtune.kernels.decode_spec import DecodeSpec
from flashtune.kernels.spec import FP8_OUT_DTYPE, KernelSpec
from flashtune.kernels.tiles import computed_head_dim, prefill_head_dims
from flashtune.kernels.variants import Variants
from flashtune.runtime.backward import attention_bwd as _attention_bwd, check_trainable
from flashtune.runtime.checks import (FP8, FlashtuneInputError, VariantArgs, check_cu_seqlens, check_devices,
                                      check_engine_args, check_fp8_args, check_num_splits, check_tensors,
                                      check_unsupported, check_variants, fail, is_broadcast, needs_grad,
                                      read_flags, refuse_broadcast, scale_for, sinks_or_s_aux, unit_descale_flags)
from flashtune.runtime.fp8 import fp8_operands, fp8_v_operand, lse_unsmoothed, quantise_qk
from flashtune.runtime.decode import run_decode
from flashtune.runtime.selection import active_profile, kernel_for, narrow_serves, select_spec, use_profile

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "use_profile", "active_profile",
           "select_spec", "quantise_qk", "FlashtuneInputError"]


# ---------------------------------------------------------------------------- the custom op

def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   cu_seqlens_q: torch.Tensor | None, cu_seqlens_k: torch.Tensor | None,
                   max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                   causal: bool, q_descale: torch.Tensor | None = None,
                   k_descale: torch.Tensor | None = None, with_lse: bool = True, softcap: float = 0.0,
                   window_left: int = -1, window_right: int = -1, sinks: torch.Tensor | None = None,
                   alibi_slopes: torch.Tensor | None = None, v_descale: torch.Tensor | None = None,
                   deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Output (q's layout, v's dtype, contiguous; bfloat16 for an e4m3 v) and the log-sum-exp
    (float32, natural log), or an empty tensor in its place without with_lse (the kernel then writes
    none: up to 5% of a short sequence's time on the H200). FP8 (e4m3) q and k come with their
    (batch, heads_kv) float32 descale factors, an e4m3 v (the all-FP8 kernel) with v_descale.
    Variants (checked by checks.check_variants): softcap > 0, a window other than (-1, -1), sinks
    (heads_q,) float32, alibi_slopes (heads_q,) or (batch, heads_q) float32.
    `deterministic` is the backward's (autograd's formula below reads it from the inputs)."""
    if q.numel() == 0:
        return _empty_outputs(q, v, cu_seqlens_q is not None, with_lse)
    profile = active_profile(q.device)
    varlen = cu_seqlens_q is not None
    # the TMA pads in shared memory (a broadcast input, which no tensor map describes, is padded by a copy)
    narrow = narrow_serves(profile, q.dtype == FP8, varlen, max_seqlen_q) and not any(map(is_broadcast, (q, k, v)))
    if v.shape[-1] != q.shape[-1] and not narrow:  # a V head dim unlike Q/K's: all three zero-padded to one
        built = prefill_head_dims(profile.head_dims, fp8=q.dtype == FP8)
        width = computed_head_dim(max(q.shape[-1], v.shape[-1]), built) or max(q.shape[-1], v.shape[-1])
        out, lse = _attention_fwd(*(_zero_padded(t, width) for t in (q, k, v)), cu_seqlens_q, cu_seqlens_k,
                                  max_seqlen_q, max_seqlen_k, softmax_scale, causal, q_descale, k_descale, with_lse,
                                  softcap, window_left, window_right, sinks, alibi_slopes, v_descale, deterministic)
        return out[..., :v.shape[-1]].contiguous(), lse
    window = (window_left, window_right)
    var = VariantArgs(Variants(softcap > 0, window != (-1, -1), sinks is not None, alibi_slopes is not None), window,
                      softcap, sinks, alibi_slopes)
    spec = kernel_for(profile, _out_dtype(v), q.shape[-1], causal, max_seqlen_q, max_seqlen_k,
                      q.shape[-2] // k.shape[-2], fp8=q.dtype == FP8, varlen=varlen, variants=var.variants,
                      key_rows=0 if varlen else q.shape[0] * k.shape[-2] * max_seqlen_k, device_index=q.device.index,
                      hdim_v=v.shape[-1], narrow=narrow, fp8_pv=v.dtype == FP8)
    if isinstance(spec, DecodeSpec):  # short queries: runtime/decode.py, the same outputs
        out, lse = run_decode(spec, q, k, v, max_seqlen_q=max_seqlen_q, seqlen_k=max_seqlen_k,
                              softmax_scale=softmax_scale, num_splits=0, with_lse=with_lse, poison=poison_outputs,
                              policy=profile.decode_split, variant_args=var)
        return out, lse if lse is not None else torch.empty(0, dtype=torch.float32, device=q.device)
    extra = (softcap, window, sinks, alibi_slopes)
    if spec.hdim != q.shape[-1] and not spec.narrow:  # a head dim between the built ones: zero columns to the kernel's
        out, lse = run_spec(spec, *(_zero_padded(t, spec.hdim) for t in (q, k, v)), cu_seqlens_q, cu_seqlens_k,
                            max_seqlen_q, max_seqlen_k, softmax_scale, q_descale, k_descale, with_lse, *extra,
                            v_descale=v_descale)
        return out[..., :q.shape[-1]].contiguous(), lse
    if spec.family == "sm90":
        refuse_broadcast(q=q, k=k, v=v)
    return run_spec(spec, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                    q_descale, k_descale, with_lse, *extra, v_descale=v_descale)


def _zero_padded(t: torch.Tensor, hdim: int) -> torch.Tensor:
    """t with zero columns up to head dim `hdim`: zero q/k columns add nothing to q.k, zero v
    columns give output columns that are cut off. A copy of the inputs, which a kernel built for
    the head dim would not need (t itself where it has that head dim already)."""
    return t if t.shape[-1] == hdim else torch.nn.functional.pad(t, (0, hdim - t.shape[-1]))


def run_spec(spec: KernelSpec, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
             softmax_scale: float, q_descale=None, k_descale=None,
             with_lse: bool = True, softcap: float = 0.0, window: tuple[int, int] = (-1, -1),
             sinks=None, alibi_slopes=None, *, v_descale=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch exactly `spec` on validated inputs (the tuner times candidates through this); the
    variants' values go to a spec built with them. An all-FP8 spec (e4m3 v, v_descale) gets its V^T
    scratch here; its launcher lays V^T out in it before the attention kernel (part of the call's time)."""
    out, lse = _empty_outputs(q, v, cu_seqlens_q is not None, with_lse)
    kernel = load_kernel(spec)
    load_binding()
    v_transposed = None
    if spec.fp8_pv:  # (batch, heads_kv, head dim, keys rounded up to 32) bytes
        v_transposed = torch.empty(v.shape[0] * v.shape[2] * v.shape[3] * (-(-v.shape[1] // 32) * 32),
                                   dtype=torch.uint8, device=v.device)
    torch.ops.flashtune_C.fwd(kernel.launcher, q, k, v, out, lse if with_lse else None, cu_seqlens_q, cu_seqlens_k,
                              max_seqlen_q, max_seqlen_k, softmax_scale, q_descale, k_descale, softcap, window[0],
                              window[1], sinks, alibi_slopes, v_descale, v_transposed)
    return out, lse


# Tests and `flashtune verify` set this: outputs start as NaN, so an element the kernel
# forgot to write cannot pass for a correct one.
poison_outputs = False


_FP8_OUT = getattr(torch, FP8_OUT_DTYPE)


def _out_dtype(v: torch.Tensor) -> torch.dtype:
    """The output's dtype: v's, or the all-FP8 kernels' (spec.FP8_OUT_DTYPE) for an e4m3 v."""
    return _FP8_OUT if v.dtype == FP8 else v.dtype


def _empty_outputs(q: torch.Tensor, v: torch.Tensor, varlen: bool,
                   with_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The output (q's rows and heads, v's head dim, _out_dtype) and the LSE, unwritten."""
    out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=_out_dtype(v), device=q.device)
    if not with_lse:  # a custom op returns tensors: an empty one stands for "not computed"
        lse = torch.empty(0, dtype=torch.float32, device=q.device)
    elif varlen:  # flash_attn's layouts: (heads, total_q) for varlen, else (batch, heads, seqlen_q)
        lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    else:
        lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    if poison_outputs:
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
    return out, lse


# The custom op is what torch.compile traces (with the fake implementation below). Eager calls
# on plain tensors skip its dispatch wrapper (about 10 microseconds per call on a CPU here).
attention_fwd = torch.library.custom_op("flashtune::attention_fwd", mutates_args=())(_attention_fwd)


@attention_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, q_descale=None,
      k_descale=None, with_lse=True, softcap=0.0, window_left=-1, window_right=-1, sinks=None, alibi_slopes=None,
      v_descale=None, deterministic=False):
    return _empty_outputs(q, v, cu_seqlens_q is not None, with_lse)


# The backward: its own custom op (what torch.compile traces), the forward op's autograd formula.
attention_bwd = torch.library.custom_op("flashtune::attention_bwd", mutates_args=())(_attention_bwd)


@attention_bwd.register_fake
def _(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
      deterministic=False, poison=False):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _save_for_backward(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal = inputs[:9]
    # a loss that leaves the LSE unused gives its gradient as None, not as zeros that autograd would
    # fill (a launch) and the prep pass would read
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, *output, cu_seqlens_q, cu_seqlens_k)
    ctx.shape = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, inputs[-1])  # the last: deterministic


def _gradients(ctx, dout, dlse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    if dout is None:  # a loss of the LSE alone
        dout = torch.zeros_like(out)
    dq, dk, dv = attention_bwd(dout, q, k, v, out, lse, dlse, cu_seqlens_q, cu_seqlens_k, *ctx.shape, poison_outputs)
    return (dq, dk, dv) + (None,) * 16  # nothing flows to the lengths, scales, descales, variants, flags


attention_fwd.register_autograd(_gradients, setup_context=_save_for_backward)


def _forward(q, k, v, *args, grad: bool):
    """The custom op under autograd (`grad`: the caller's needs_grad) or torch.compile; else the
    implementation directly."""
    plain = type(q) is torch.Tensor and not torch.compiler.is_compiling() and not grad
    return (_attention_fwd if plain else attention_fwd)(q, k, v, *args)


# ---------------------------------------------------------------------------- public API

def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                    *, q_descale=None, k_descale=None, qk_fp8=False, return_lse=False, sinks=None, s_aux=None,
                    v_descale=None, pv_fp8=False):
    """Attention over (batch, seqlen, heads, head_dim) tensors, as flash_attn.flash_attn_func.

    GQA/MQA: k and v may have fewer heads than q (a divisor). causal masks bottom-right
    aligned (key j is visible to query i iff j <= i + seqlen_k - seqlen_q). Returns out,
    or (out, lse) with return_lse=True (lse: float32, (batch, heads, seqlen_q)), or
    (out, lse, None) with return_attn_probs=True, as flash_attn does.

    Gradients: inputs that require grad get dq, dk, dv from flashtune's backward kernel (16-bit,
    head dims 64, 128 and 256, no FP8 or variants; anything else is refused here, not in the backward);
    deterministic=True makes them the same bits on every run.

    FP8 (profiles with `fp8: {qk: e4m3}`): q and k in torch.float8_e4m3fn with optional
    float32 q_descale / k_descale of shape (batch, heads_kv) (FlashAttention-3's convention:
    S = q.k x q_descale x k_descale), or 16-bit q and k with qk_fp8=True, which quantises
    them per (batch, kv head) here. v and the output stay 16-bit; softmax_scale is applied
    on top of the descales.

    All-FP8 (sm90 profiles with `fp8: {qk: e4m3, pv: e4m3}`): P V on FP8 tensor cores too. v in
    e4m3 beside e4m3 q and k, with an optional float32 v_descale (batch, heads_kv) (O = P v x
    v_descale), or 16-bit q, k, v with qk_fp8=True and pv_fp8=True, which quantises all three here.
    The output is bfloat16 for an e4m3 v (FlashAttention-3's), the inputs' dtype with pv_fp8=True.
    The kernel reads V transposed: each call lays it out first (one pass over v, in the call's time).

    Variants (every kernel family has them): window_size=(left, right) bottom-right aligned (-1:
    unbounded; key blocks outside every row's window are skipped), softcap (scores = softcap x
    tanh(scores / softcap)), sinks (heads,) float (or s_aux, vLLM's name): one logit per query head
    joining every row's softmax (gpt-oss's, vLLM's), alibi_slopes (heads,) or (batch, heads) float32 (flash_attn's:
    -slope x |i + seqlen_k - seqlen_q - j|; flash_attn 2's causal kernels add +slope x j instead,
    the same output with each row's LSE offset by its own slope x position).
    """
    check_unsupported(dropout_p)
    check_tensors(q, k, v, varlen=False)
    sinks = sinks_or_s_aux(sinks, s_aux)
    var = check_variants(window_size, softcap, sinks, q.shape[2], alibi_slopes, q.shape[0])
    scale = scale_for(softmax_scale, q.shape[-1])
    check_fp8_args(q, k, q_descale, k_descale, qk_fp8, v, v_descale, pv_fp8)
    grad = needs_grad(q, k, v)
    if grad:
        check_trainable(q, k, v, fp8=qk_fp8 or q.dtype == FP8, variants=any(var.variants))
    check_devices(q, k, v, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, sinks=var.sinks,
                  alibi_slopes=var.alibi)
    # Smoothing shifts every key score of a row by one constant: exact for the softmax, not under a
    # softcap (tanh of shifted scores) or beside a sink (whose logit does not move).
    smoothing = qk_fp8 and not var.softcap and var.sinks is None and active_profile(q.device).k_smoothing
    q16, out_dtype = q, v.dtype
    q, k, q_descale, k_descale, k_mean = fp8_operands(q, k, q_descale, k_descale, qk_fp8, smoothing)
    v, v_descale = fp8_v_operand(v, v_descale, pv_fp8)
    out, lse = _forward(q, k, v, None, None, q.shape[1], k.shape[1], scale, bool(causal), q_descale, k_descale,
                        return_lse or return_attn_probs or grad, var.softcap, *var.window, var.sinks, var.alibi,
                        v_descale, bool(deterministic), grad=grad)
    if pv_fp8 and out.dtype != out_dtype:  # the all-FP8 kernel writes bfloat16
        out = out.to(out_dtype)
    if k_mean is not None and lse.numel():  # smoothing moved each row's scores by a constant
        lse = lse_unsmoothed(lse, q16, k_mean, scale)
    return _pack(out, lse, return_lse, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *, return_lse=False, seqused_k=None,
                           out=None, q_descale=None, k_descale=None, v_descale=None, sinks=None, num_splits=0,
                           s_aux=None, scheduler_metadata=None, fa_version=None):
    """Attention over packed (total, heads, head_dim) sequences delimited by int32 cu_seqlens.

    As flash_attn.flash_attn_varlen_func; lse is (heads, total_q). With block_table, k and v are a
    paged KV cache (num_pages, page_size, heads_kv, head_dim), each sequence's keys counted by
    seqused_k (int32, (batch,)) or delimited by cu_seqlens_k (which may then be None), and `out`
    (like q) is written in place when given: vLLM's call, whose keywords are taken as vLLM's
    wrapper takes them: num_splits (CTAs per sequence's keys; 0: chosen by flashtune), s_aux (the
    sinks), fa_version (2 or 3: the same kernels), window_size None (unbounded); scheduler_metadata
    must be None. An e4m3 paged cache takes k_descale / v_descale of shape (batch, heads_kv)
    (vLLM's FP8 KV cache); q stays 16-bit. Descales handed with 16-bit operands (vLLM's ones) must
    be 1, read on the host with the call's index values. Packed keys (no block_table) need
    cu_seqlens_k and max_seqlen_k, and run unsplit (num_splits 0 or 1).
    """
    paged = block_table is not None or seqused_k is not None
    check_unsupported(dropout_p)
    check_num_splits(num_splits)
    check_engine_args(scheduler_metadata, fa_version)
    sinks = sinks_or_s_aux(sinks, s_aux)
    if max_seqlen_q is None:
        fail("max_seqlen_q is required: the longest query sequence cu_seqlens_q delimits")
    grad = needs_grad(q, k, v)
    if paged and grad:
        fail("the paged KV-cache call is forward-only (inference); run it under torch.no_grad(), or detach the "
             "inputs")
    # vLLM's wrapper hands descales with 16-bit operands too (ones), which FlashAttention-3 reads only
    # for FP8 ones: taken where they are 1 (q is always 16-bit here; k and v unless an e4m3 paged cache)
    kv16 = not (isinstance(k, torch.Tensor) and k.dtype == FP8)
    unit_descales = unit_descale_flags(q_descale=q_descale,
                                       **(dict(k_descale=k_descale, v_descale=v_descale) if kv16 else {}))
    q_descale = None
    if kv16:
        k_descale = v_descale = None
    if paged:
        from flashtune.runtime.kvcache import paged_varlen

        scale = scale_for(softmax_scale, q.shape[-1])
        out, lse = paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
                                block_table, scale, causal, out, return_lse or return_attn_probs, k_descale, v_descale,
                                window_size, softcap, sinks, alibi_slopes, num_splits, unit_descales)
        return _pack(out, lse, return_lse, return_attn_probs)
    read_flags(unit_descales)  # packed keys: cu_seqlens are read as a list, the descales on their own
    if out is not None:
        fail("out= is served with a paged cache (block_table) here; drop it, or use the returned tensor")
    if num_splits > 1:
        fail(f"num_splits={num_splits} splits a KV-cache call's keys (block_table with seqused_k, or "
             "flash_attn_with_kvcache); packed keys run unsplit here: pass 0 or 1")
    if cu_seqlens_k is None or max_seqlen_k is None:
        fail("packed keys need cu_seqlens_k and max_seqlen_k (a paged cache: block_table and seqused_k instead)")
    check_tensors(q, k, v, varlen=True)
    var = check_variants(window_size, softcap, sinks, q.shape[1], alibi_slopes,
                         cu_seqlens_q.numel() - 1 if isinstance(cu_seqlens_q, torch.Tensor) else None)
    max_seqlen_q, max_seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
    if max_seqlen_q < 0 or max_seqlen_k < 0:
        fail("max_seqlen_q and max_seqlen_k must be >= 0")
    # Every row of q gets an output row, so cu_seqlens_q must cover q exactly; k may be padded.
    check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[0], max_seqlen_q, covers_all=True)
    check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", k.shape[0], max_seqlen_k, covers_all=False)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        fail(f"cu_seqlens_q and cu_seqlens_k must have the same length (batch+1), got "
              f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
    if cu_seqlens_q.numel() - 1 > 65535:
        fail("at most 65535 sequences per call")
    scale = scale_for(softmax_scale, q.shape[-1])
    if grad:
        check_trainable(q, k, v, variants=any(var.variants))
    check_devices(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, sinks=var.sinks,
                  alibi_slopes=var.alibi)
    out, lse = _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                        bool(causal), None, None, return_lse or return_attn_probs or grad, var.softcap, *var.window,
                        var.sinks, var.alibi, None, bool(deterministic), grad=grad)
    return _pack(out, lse, return_lse, return_attn_probs)


def _pack(out, lse, return_lse, return_attn_probs):
    if return_attn_probs:
        return out, lse, None
    if return_lse:
        return out, lse
    return out
