"""The public attention functions: flash_attn-compatible names, checks, kernel choice.

`flash_attn_func` / `flash_attn_varlen_func` validate their inputs (a clear error for each
bad one), then call the custom op `flashtune::attention_fwd`, whose implementation picks
the KernelSpec for the call's shape from the active profile, builds or loads it, and
launches it through `flashtune_C::fwd`. The custom op has a fake implementation, so
`torch.compile` traces calls without graph breaks.
"""
from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass

import torch

from flashtune.build import load_binding, load_kernel
from flashtune.gpu import GpuInfo, detect_gpus
from flashtune.profiles import Profile, ProfileError, find_profile, select_profile
from flashtune.spec import KernelSpec, spec_for

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "use_profile", "active_profile",
           "select_spec", "quantise_qk", "FlashtuneInputError"]

_DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
_FP8 = torch.float8_e4m3fn  # FP8 profiles: q and k in e4m3, v and the output 16-bit
_FP8_MAX = 448.0  # the largest finite e4m3 value
_ALIGN_BYTES = 16  # 16-byte vector (and TMA) loads
# Reading cu_seqlens on the GPU costs a device sync per varlen call; with this set, their
# values are trusted (a wrong one gives wrong output, as in flash_attn).
_TRUST_CU_SEQLENS = os.environ.get("FLASHTUNE_TRUST_CU_SEQLENS") == "1"
_MAX_TILE_ROWS = 256  # the kernels address a tile with 32-bit offsets: rows * row_stride < 2^31


class FlashtuneInputError(ValueError):
    """A call flashtune cannot serve as asked; the message says what to change."""


# ---------------------------------------------------------------------------- profile state

@dataclass
class _State:
    explicit: Profile | None = None  # use_profile()
    per_device: dict | None = None  # device index -> Profile (auto-matched or from env)


_state = _State(per_device={})
_state_lock = threading.Lock()


def use_profile(name_or_path: str | os.PathLike | Profile | None) -> Profile | None:
    """Choose the profile every later call uses (None: back to auto-matching the GPU); a name, a
    YAML path, or a Profile already loaded.

    The environment variable FLASHTUNE_PROFILE does the same without code changes.
    """
    with _state_lock:
        _state.explicit = (name_or_path if isinstance(name_or_path, Profile) or name_or_path is None
                           else find_profile(name_or_path))
        _state.per_device.clear()
        _spec_cache.clear()
        return _state.explicit


def _device_gpu(index: int) -> GpuInfo:
    for gpu in detect_gpus():
        if gpu.index == index:
            return gpu
    raise FlashtuneInputError(f"CUDA device {index} is not visible")


def _check_runs_on(profile: Profile, gpu: GpuInfo) -> None:
    """SASS for sm_XY runs on the same major with minor >= Y; sm_90a only on 9.0."""
    (am, an), (gm, gn) = profile.arch.compute_capability, gpu.compute_capability
    runs = am == gm and an <= gn and (not profile.arch.name.endswith("a") or an == gn)
    if not runs:
        raise FlashtuneInputError(
            f"profile {profile.name} builds for {profile.arch.name}, which cannot run on "
            f"{gpu.name} (compute capability {gm}.{gn}); choose a profile for this GPU "
            "(`flashtune detect` names it; `flashtune profiles` lists all)")


def active_profile(device: torch.device | int | None = None) -> Profile:
    """The profile calls on `device` use: use_profile(), else $FLASHTUNE_PROFILE, else the match."""
    if isinstance(device, int):
        index = device
    else:
        index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
    profile = _state.per_device.get(index)
    if profile is not None:
        return profile
    with _state_lock:
        gpu = _device_gpu(index)
        if _state.explicit is not None:
            profile = _state.explicit
        elif os.environ.get("FLASHTUNE_PROFILE"):
            profile = find_profile(os.environ["FLASHTUNE_PROFILE"])
        else:
            profile = select_profile(gpu=gpu)
        _check_runs_on(profile, gpu)
        _state.per_device[index] = profile
        return profile


# ---------------------------------------------------------------------------- kernel choice

_spec_cache: dict[tuple, KernelSpec] = {}


def select_spec(profile: Profile, dtype: torch.dtype | str, hdim: int, causal: bool,
                seqlen_q: int, seqlen_k: int, fp8: bool = False) -> KernelSpec:
    """The KernelSpec that serves a call of this shape under `profile` (`dtype`: v's and the
    output's; `fp8`: q and k in e4m3)."""
    dtype_name = dtype if isinstance(dtype, str) else _DTYPE_NAMES[dtype]
    if fp8 and not profile.arch.fp8:
        raise FlashtuneInputError(
            f"FP8 attention needs FP8 tensor cores, which {profile.arch.name} (profile {profile.name}) lacks: "
            "they exist on sm_89 (RTX 4090, L40S), sm_90 (H100/H200) and sm_120 (RTX 5090); "
            "use 16-bit q/k here")
    if fp8 and not profile.fp8_qk:
        raise FlashtuneInputError(
            f"profile {profile.name} has no FP8 kernels (fp8: null); use a profile with "
            "`fp8: {qk: e4m3}` for this GPU (`flashtune profiles` lists them), or 16-bit q/k")
    if hdim not in profile.head_dims:
        raise FlashtuneInputError(f"head dim {hdim} is not served by profile {profile.name} "
                                  f"(head dims: {', '.join(map(str, profile.head_dims))})")
    try:
        tile = profile.tile_for(hdim, causal, seqlen_q, seqlen_k, fp8=fp8)
    except ProfileError as e:
        raise FlashtuneInputError(str(e)) from e
    if dtype_name not in profile.dtypes:
        raise FlashtuneInputError(f"dtype {dtype_name} is not in profile {profile.name} "
                                  f"(dtypes: {', '.join(profile.dtypes)})")
    # Keyed by exactly what the spec is made of: constructing one validates its tile (slow).
    key = (profile.family, profile.arch.name, dtype_name, hdim, tile, bool(causal), bool(fp8), profile.nvcc_flags)
    spec = _spec_cache.get(key)
    if spec is None:
        spec = _spec_cache[key] = spec_for(profile, tile, dtype_name, hdim, causal, fp8)
    return spec


# ---------------------------------------------------------------------------- checks

def _fail(msg: str) -> None:
    raise FlashtuneInputError(f"flashtune: {msg}")


def _check_tensors(q, k, v, varlen: bool) -> None:
    rank, layout = (3, "(total, heads, head_dim)") if varlen else (4, "(batch, seqlen, heads, head_dim)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank:
            _fail(f"{name} must be {layout}, got shape {tuple(t.shape)}")
        fp8_ok = name != "v" and not varlen
        if t.dtype not in _DTYPE_NAMES and not (fp8_ok and t.dtype == _FP8):
            _fail(f"{name} has dtype {t.dtype}; allowed: torch.float16, torch.bfloat16 "
                  "(cast with .to(torch.bfloat16))"
                  + ("; q and k may also be torch.float8_e4m3fn (with q_descale/k_descale)" if fp8_ok else "")
                  + ("; FP8 q/k go through flash_attn_func, not the varlen one" if varlen and name != "v"
                     and t.dtype == _FP8 else ""))
        if t.stride(-1) != 1:
            _fail(f"{name} must have a contiguous last dimension (stride 1), got strides "
                  f"{tuple(t.stride())}; call .contiguous()")
        # A dimension of size 1 is never stepped over: its stride does not matter (binding.cpp
        # replaces it with the dense one).
        align = _ALIGN_BYTES // t.element_size()
        if any(st % align for st, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1):
            _fail(f"{name}'s strides {tuple(t.stride())} are not multiples of {align} "
                  "elements (16 bytes); call .contiguous()")
        # The storage offset is not traceable by torch.compile; binding.cpp checks the data
        # pointer's 16-byte alignment at launch either way.
        if not torch.compiler.is_compiling() and t.storage_offset() % align:
            _fail(f"{name} starts at storage offset {t.storage_offset()}, not a multiple of "
                  f"{align} elements (16 bytes); call .contiguous()")
        row_stride = t.stride(-3)
        if row_stride * _MAX_TILE_ROWS >= 2**31:
            _fail(f"{name}'s row stride {row_stride} is too large for the kernel's 32-bit tile "
                  "offsets; call .contiguous()")
    if q.dtype == _FP8 or k.dtype == _FP8:
        if q.dtype != k.dtype:
            _fail(f"FP8 attention needs both q and k in torch.float8_e4m3fn, got {q.dtype} and {k.dtype}")
    elif not (q.dtype == k.dtype == v.dtype):
        _fail(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape != v.shape:
        _fail(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        _fail(f"q and k must share head_dim, got {q.shape[-1]} and {k.shape[-1]}")
    if not varlen and q.shape[0] != k.shape[0]:
        _fail(f"q and k must share the batch size, got {q.shape[0]} and {k.shape[0]}")
    if not varlen and q.shape[0] > 65535:
        _fail(f"at most 65535 batch entries per call, got {q.shape[0]}")
    heads_q, heads_kv = q.shape[-2], k.shape[-2]
    if heads_kv == 0 or heads_q % heads_kv:
        _fail(f"heads of q ({heads_q}) must be a multiple of heads of k/v ({heads_kv}) (GQA/MQA)")
    if heads_q > 65535:
        _fail(f"at most 65535 heads, got {heads_q}")
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        _fail("flashtune computes the forward pass only; run it under torch.no_grad() or "
              "torch.inference_mode(), or detach the inputs")


def _check_devices(q, k, v, **extra) -> None:
    """Checked last, so every other input error is reported (and testable) without a GPU.
    `extra`: cu_seqlens_q/k (varlen) or q_descale/k_descale (FP8), which must sit beside q."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cuda":
            _fail(f"{name} is on {t.device}; flashtune runs on CUDA tensors (move it with .cuda())")
    if not (q.device == k.device == v.device):
        _fail(f"q, k, v are on different devices ({q.device}, {k.device}, {v.device})")
    for name, t in extra.items():
        if t is not None and t.device != q.device:
            _fail(f"{name} is on {t.device}, q on {q.device}; put them on the same device")


def _check_unsupported(dropout_p, window_size, softcap, alibi_slopes) -> None:
    if dropout_p:
        _fail(f"dropout_p={dropout_p}: dropout is not supported (forward inference kernel); pass 0.0")
    if tuple(window_size) != (-1, -1):
        _fail(f"window_size={tuple(window_size)}: sliding-window attention is not supported; "
              "pass (-1, -1)")
    if softcap:
        _fail(f"softcap={softcap} is not supported; pass 0.0")
    if alibi_slopes is not None:
        _fail("alibi_slopes are not supported; pass None")


def _softmax_scale(softmax_scale: float | None, hdim: int) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(hdim)
    scale = float(softmax_scale)
    if not (scale > 0 and math.isfinite(scale)):
        _fail(f"softmax_scale must be a positive finite number, got {softmax_scale}")
    return scale


def _check_cu_seqlens(cu: torch.Tensor, name: str, total: int, max_seqlen: int,
                      covers_all: bool) -> None:
    if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1:
        _fail(f"{name} must be a 1-D torch.int32 tensor of length batch+1")
    if cu.numel() < 1 or cu.stride(0) != 1:
        _fail(f"{name} must be contiguous with at least one element (batch+1)")
    if cu.is_cuda and (_TRUST_CU_SEQLENS or torch.cuda.is_current_stream_capturing()):
        return  # reading its values syncs the device (and is impossible during graph capture)
    values = cu.tolist()
    lengths = [b - a for a, b in zip(values, values[1:])]
    if values[0] != 0 or any(n < 0 for n in lengths):
        _fail(f"{name} must start at 0 and never decrease, got {values[:8]}...")
    if values[-1] > total or (covers_all and values[-1] != total):
        _fail(f"{name}[-1] = {values[-1]} must {'equal' if covers_all else 'not exceed'} the "
              f"{total} rows of the packed tensor")
    if lengths and max(lengths) > max_seqlen:
        _fail(f"a sequence in {name} has {max(lengths)} tokens, more than max_seqlen {max_seqlen}")


# ---------------------------------------------------------------------------- the custom op

def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   cu_seqlens_q: torch.Tensor | None, cu_seqlens_k: torch.Tensor | None,
                   max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                   causal: bool, q_descale: torch.Tensor | None = None,
                   k_descale: torch.Tensor | None = None, with_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Output (q's layout, v's dtype, contiguous) and the log-sum-exp (float32, natural log),
    or an empty tensor in its place without with_lse (the kernel then writes none: up to 5% of a short
    sequence's time on the H200). FP8 (e4m3) q and k come with their (batch, heads_kv) float32
    descale factors."""
    if q.numel() == 0:
        return _empty_outputs(q, v.dtype, cu_seqlens_q is not None, with_lse)
    profile = active_profile(q.device)
    spec = select_spec(profile, v.dtype, q.shape[-1], causal, max_seqlen_q, max_seqlen_k, fp8=q.dtype == _FP8)
    if spec.family == "sm90":  # TMA tensor maps cannot broadcast (a stride of 0 over >1 rows)
        for name, t in (("q", q), ("k", k), ("v", v)):
            if any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape)):
                _fail(f"{name} is broadcast (a stride of 0, e.g. from .expand()), which the sm90 kernels' "
                      "TMA loads cannot read; call .contiguous()")
    return run_spec(spec, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                    q_descale, k_descale, with_lse)


def run_spec(spec: KernelSpec, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int,
             softmax_scale: float, q_descale=None, k_descale=None,
             with_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch exactly `spec` on validated inputs (the tuner times candidates through this)."""
    out, lse = _empty_outputs(q, v.dtype, cu_seqlens_q is not None, with_lse)
    kernel = load_kernel(spec)
    load_binding()
    torch.ops.flashtune_C.fwd(kernel.launcher, q, k, v, out, lse if with_lse else None, cu_seqlens_q, cu_seqlens_k,
                              max_seqlen_q, max_seqlen_k, softmax_scale, q_descale, k_descale)
    return out, lse


# Tests and `flashtune verify` set this: outputs start as NaN, so an element the kernel
# forgot to write cannot pass for a correct one.
poison_outputs = False


def _empty_outputs(q: torch.Tensor, dtype: torch.dtype, varlen: bool,
                   with_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty(q.shape, dtype=dtype, device=q.device)
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
      k_descale=None, with_lse=True):
    return _empty_outputs(q, v.dtype, cu_seqlens_q is not None, with_lse)


def _forward(q, *args):
    plain = type(q) is torch.Tensor and not torch.compiler.is_compiling()
    return (_attention_fwd if plain else attention_fwd)(q, *args)


# ---------------------------------------------------------------------------- public API

def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False,
                    *, q_descale=None, k_descale=None, qk_fp8=False, return_lse=False):
    """Attention over (batch, seqlen, heads, head_dim) tensors, as flash_attn.flash_attn_func.

    GQA/MQA: k and v may have fewer heads than q (a divisor). causal masks bottom-right
    aligned (key j is visible to query i iff j <= i + seqlen_k - seqlen_q). Returns out,
    or (out, lse) with return_lse=True (lse: float32, (batch, heads, seqlen_q)), or
    (out, lse, None) with return_attn_probs=True, as flash_attn does.

    FP8 (profiles with `fp8: {qk: e4m3}`): q and k in torch.float8_e4m3fn with optional
    float32 q_descale / k_descale of shape (batch, heads_kv) (FlashAttention-3's convention:
    S = q.k x q_descale x k_descale), or 16-bit q and k with qk_fp8=True, which quantises
    them per (batch, kv head) here. v and the output stay 16-bit; softmax_scale is applied
    on top of the descales.
    """
    _check_unsupported(dropout_p, window_size, softcap, alibi_slopes)
    _check_tensors(q, k, v, varlen=False)
    scale = _softmax_scale(softmax_scale, q.shape[-1])
    _check_fp8_args(q, k, q_descale, k_descale, qk_fp8)
    _check_devices(q, k, v, q_descale=q_descale, k_descale=k_descale)
    q, k, q_descale, k_descale = _fp8_operands(q, k, q_descale, k_descale, qk_fp8)
    out, lse = _forward(q, k, v, None, None, q.shape[1], k.shape[1], scale, bool(causal), q_descale, k_descale,
                        return_lse or return_attn_probs)
    return _pack(out, lse, return_lse, return_attn_probs)


def _check_fp8_args(q, k, q_descale, k_descale, qk_fp8: bool) -> None:
    batch, heads_kv = q.shape[0], k.shape[2]
    if q.dtype != _FP8:
        if (q_descale is not None or k_descale is not None) and qk_fp8:
            _fail("qk_fp8=True computes its own descales; drop q_descale/k_descale")
        if q_descale is not None or k_descale is not None:
            _fail("q_descale/k_descale scale FP8 (torch.float8_e4m3fn) q and k; q and k are "
                  f"{q.dtype}: pass qk_fp8=True to quantise them, or drop the descales")
        return
    if qk_fp8:
        _fail("qk_fp8=True quantises 16-bit q and k; these are already torch.float8_e4m3fn "
              "(pass their q_descale/k_descale instead)")
    for name, d in (("q_descale", q_descale), ("k_descale", k_descale)):
        if d is not None and (not isinstance(d, torch.Tensor) or d.dtype != torch.float32
                              or tuple(d.shape) != (batch, heads_kv)):
            got = f"{tuple(d.shape)} {d.dtype}" if isinstance(d, torch.Tensor) else type(d).__name__
            _fail(f"{name} must be a float32 tensor of shape (batch, heads_kv) = ({batch}, {heads_kv}), got {got}")


def _fp8_operands(q, k, q_descale, k_descale, qk_fp8: bool):
    """(q, k, q_descale, k_descale) as the kernel takes them (arguments already checked): e4m3
    q/k with contiguous float32 (batch, heads_kv) descales, or 16-bit q/k with none."""
    if q.dtype != _FP8:
        return quantise_qk(q, k, k.shape[2]) if qk_fp8 else (q, k, None, None)
    def ones():  # FlashAttention-3's default: no descaling
        return torch.ones(q.shape[0], k.shape[2], dtype=torch.float32, device=q.device)

    return (q, k, ones() if q_descale is None else q_descale.contiguous(),
            ones() if k_descale is None else k_descale.contiguous())


def quantise_qk(q: torch.Tensor, k: torch.Tensor, heads_kv: int):
    """16-bit (batch, seqlen, heads, d) q, k -> (q8, k8, q_descale, k_descale): per (batch, kv
    head) absmax scaling to e4m3, x = x8 x descale with |x8| <= 448 (a q head shares its kv
    head's factor, as the kernel's descale layout has it)."""
    for name, x in (("q", q), ("k", k)):
        if x.dim() != 4 or heads_kv <= 0 or x.shape[2] % heads_kv:
            raise FlashtuneInputError(f"flashtune: quantise_qk needs (batch, seqlen, heads, head_dim) {name} whose "
                                      f"heads ({x.shape[2] if x.dim() == 4 else '?'}) are a multiple of "
                                      f"heads_kv ({heads_kv})")

    def one(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, h, d = x.shape
        if x.numel() == 0:  # an empty sequence: nothing to scale (the kernel sees no rows)
            return x.to(_FP8), torch.ones(b, heads_kv, dtype=torch.float32, device=x.device)
        grouped = x.reshape(b, s, heads_kv, h // heads_kv, d)
        amax = grouped.abs().amax(dim=(1, 3, 4)).float()  # (b, heads_kv)
        descale = torch.where(amax > 0, amax / _FP8_MAX, torch.ones_like(amax))
        x8 = (grouped.float() / descale[:, None, :, None, None]).to(_FP8).reshape(b, s, h, d)
        return x8, descale

    q8, q_descale = one(q)
    k8, k_descale = one(k)
    return q8, k8, q_descale, k_descale


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *, return_lse=False):
    """Attention over packed (total, heads, head_dim) sequences delimited by int32 cu_seqlens.

    As flash_attn.flash_attn_varlen_func; lse is (heads, total_q).
    """
    _check_unsupported(dropout_p, window_size, softcap, alibi_slopes)
    if block_table is not None:
        _fail("block_table (paged KV cache) is not supported; pass None")
    _check_tensors(q, k, v, varlen=True)
    max_seqlen_q, max_seqlen_k = int(max_seqlen_q), int(max_seqlen_k)
    if max_seqlen_q < 0 or max_seqlen_k < 0:
        _fail("max_seqlen_q and max_seqlen_k must be >= 0")
    # Every row of q gets an output row, so cu_seqlens_q must cover q exactly; k may be padded.
    _check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", q.shape[0], max_seqlen_q, covers_all=True)
    _check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", k.shape[0], max_seqlen_k, covers_all=False)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        _fail(f"cu_seqlens_q and cu_seqlens_k must have the same length (batch+1), got "
              f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
    if cu_seqlens_q.numel() - 1 > 65535:
        _fail("at most 65535 sequences per call")
    scale = _softmax_scale(softmax_scale, q.shape[-1])
    _check_devices(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    out, lse = _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                        bool(causal), None, None, return_lse or return_attn_probs)
    return _pack(out, lse, return_lse, return_attn_probs)


def _pack(out, lse, return_lse, return_attn_probs):
    if return_attn_probs:
        return out, lse, None
    if return_lse:
        return out, lse
    return out
