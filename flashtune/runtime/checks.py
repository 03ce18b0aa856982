"""The checks of a call's arguments: each bad input is one FlashtuneInputError that says what to
change, raised before anything runs (and testable without a GPU: devices are checked last).
"""
from __future__ import annotations

import math
import os
import weakref
from dataclasses import dataclass

import torch

from flashtune.kernels.tiles import MAX_HEAD_DIM, MIN_HEAD_DIM, computed_head_dim
from flashtune.kernels.variants import Variants

DTYPE_NAMES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
FP8 = torch.float8_e4m3fn  # FP8 profiles: q and k in e4m3, v and the output 16-bit
ALIGN_BYTES = 16  # 16-byte vector (and TMA) loads
# Reading cu_seqlens on the GPU costs a device sync per varlen call; with this set, their
# values are trusted (a wrong one gives wrong output, as in flash_attn).
TRUST_CU_SEQLENS = os.environ.get("FLASHTUNE_TRUST_CU_SEQLENS") == "1"
MAX_TILE_ROWS = 256  # the kernels address a tile with 32-bit offsets: rows * row_stride < 2^31


class FlashtuneInputError(ValueError):
    """A call flashtune cannot serve as asked; the message says what to change."""


def fail(msg: str) -> None:
    raise FlashtuneInputError(f"flashtune: {msg}")


def is_broadcast(t: torch.Tensor) -> bool:
    """A stride of 0 over more than one row (.expand()): what no TMA tensor map describes."""
    return any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape))


def refuse_broadcast(**tensors: torch.Tensor) -> None:
    """The sm90 kernels (prefill, and decode's KV-cache kernels) load by TMA, whose tensor maps
    cannot broadcast: a stride of 0 over more than one row is refused."""
    for name, t in tensors.items():
        if is_broadcast(t):
            fail(f"{name} is broadcast (a stride of 0, e.g. from .expand()), which the sm90 kernels' "
                 "TMA loads cannot read; call .contiguous()")


def check_strides(name: str, t: torch.Tensor) -> None:
    """What every kernel needs of a (.., rows, heads, head_dim) tensor's layout: a contiguous last
    dimension, 16-byte strides and start, rows close enough for 32-bit offsets inside a tile."""
    if t.stride(-1) != 1:
        fail(f"{name} must have a contiguous last dimension (stride 1), got strides "
              f"{tuple(t.stride())}; call .contiguous()")
    # A dimension of size 1 is never stepped over: its stride does not matter (binding.cpp
    # replaces it with the dense one).
    align = ALIGN_BYTES // t.element_size()
    if any(st % align for st, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1):
        fail(f"{name}'s strides {tuple(t.stride())} are not multiples of {align} "
              "elements (16 bytes); call .contiguous()")
    # The storage offset is not traceable by torch.compile; binding.cpp checks the data
    # pointer's 16-byte alignment at launch either way.
    if not torch.compiler.is_compiling() and t.storage_offset() % align:
        fail(f"{name} starts at storage offset {t.storage_offset()}, not a multiple of "
              f"{align} elements (16 bytes); call .contiguous()")
    row_stride = t.stride(-3)
    if row_stride * MAX_TILE_ROWS >= 2**31:
        fail(f"{name}'s row stride {row_stride} is too large for the kernel's 32-bit tile "
              "offsets; call .contiguous()")


def check_tensors(q, k, v, varlen: bool) -> None:
    rank, layout = (3, "(total, heads, head_dim)") if varlen else (4, "(batch, seqlen, heads, head_dim)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank:
            fail(f"{name} must be {layout}, got shape {tuple(t.shape)}")
        fp8_ok = not varlen
        if t.dtype not in DTYPE_NAMES and not (fp8_ok and t.dtype == FP8):
            fail(f"{name} has dtype {t.dtype}; allowed: torch.float16, torch.bfloat16 "
                  "(cast with .to(torch.bfloat16))"
                  + ("; q, k (and v) may also be torch.float8_e4m3fn (with q_descale/k_descale/v_descale)"
                     if fp8_ok else "")
                  + ("; FP8 q/k/v go through flash_attn_func, not the varlen one" if varlen and t.dtype == FP8
                     else ""))
        # q's head dim before its strides, which an odd one fails too (k shares it; v's: below)
        if name == "q" and t.stride(-1) == 1 and computed_head_dim(t.shape[-1]) is None:
            fail(f"{name}'s head dim {t.shape[-1]} is not served: head dims are multiples of 8 from {MIN_HEAD_DIM} "
                 f"to {MAX_HEAD_DIM}")
        check_strides(name, t)
    if v.dtype == FP8 and not q.dtype == k.dtype == FP8:
        fail(f"an e4m3 v runs the all-FP8 kernel, which takes e4m3 q and k too (got {q.dtype} and {k.dtype}); "
             "quantise them as well, or pass a 16-bit v")
    if q.dtype == FP8 or k.dtype == FP8:
        if q.dtype != k.dtype:
            fail(f"FP8 attention needs both q and k in torch.float8_e4m3fn, got {q.dtype} and {k.dtype}")
    elif not (q.dtype == k.dtype == v.dtype):
        fail(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape[:-1] != v.shape[:-1]:
        fail(f"k and v must have the same shape but for the head dim, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        fail(f"q and k must share head_dim, got {q.shape[-1]} and {k.shape[-1]}")
    if v.shape[-1] != k.shape[-1]:  # at the next built head dim: in place (sm90's narrow kernels) or zero-padded (ops.py)
        if computed_head_dim(v.shape[-1]) is None or computed_head_dim(q.shape[-1]) is None:
            fail(f"head dims q/k {q.shape[-1]}, v {v.shape[-1]}: each must be a multiple of 8 from {MIN_HEAD_DIM} "
                 f"to {MAX_HEAD_DIM}")
        if q.dtype == FP8:
            fail(f"FP8 q/k need v's head dim to be theirs, got {q.shape[-1]} and {v.shape[-1]}; use 16-bit q/k")
    if not varlen and q.shape[0] != k.shape[0]:
        fail(f"q and k must share the batch size, got {q.shape[0]} and {k.shape[0]}")
    if not varlen and q.shape[0] > 65535:
        fail(f"at most 65535 batch entries per call, got {q.shape[0]}")
    heads_q, heads_kv = q.shape[-2], k.shape[-2]
    if heads_kv == 0 or heads_q % heads_kv:
        fail(f"heads of q ({heads_q}) must be a multiple of heads of k/v ({heads_kv}) (GQA/MQA)")
    if heads_q > 65535:
        fail(f"at most 65535 heads, got {heads_q}")


def needs_grad(*tensors) -> bool:
    """Whether autograd will ask this call for a backward (None and non-tensors ignored)."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def check_devices(q, k, v, **extra) -> None:
    """Checked last, so every other input error is reported (and testable) without a GPU.
    `extra`: cu_seqlens_q/k (varlen) or q_descale/k_descale (FP8), which must sit beside q."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device.type != "cuda":
            fail(f"{name} is on {t.device}; flashtune runs on CUDA tensors (move it with .cuda())")
    if not (q.device == k.device == v.device):
        fail(f"q, k, v are on different devices ({q.device}, {k.device}, {v.device})")
    for name, t in extra.items():
        if t is not None and t.device != q.device:
            fail(f"{name} is on {t.device}, q on {q.device}; put them on the same device")


def check_unsupported(dropout_p) -> None:
    """Arguments flash_attn has that flashtune cannot serve (the variants: check_variants)."""
    if dropout_p:
        fail(f"dropout_p={dropout_p}: dropout is not supported (flashtune's kernels have none); pass 0.0")


MAX_SPLITS = 256


def check_num_splits(num_splits) -> None:
    """flash_attn's num_splits: 0 lets flashtune choose; 1 runs unsplit; more splits a call's keys."""
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or not 0 <= num_splits <= MAX_SPLITS:
        fail(f"num_splits must be an int in 0..{MAX_SPLITS} (0: chosen by flashtune), got {num_splits!r}")


def check_engine_args(scheduler_metadata=None, fa_version=None) -> None:
    """The arguments vLLM's and SGLang's FlashAttention wrappers add. fa_version picks which
    FlashAttention build vLLM's wrapper runs: flashtune's kernels serve 2 and 3 alike.
    scheduler_metadata is FlashAttention-3's precomputed tile schedule (get_scheduler_metadata),
    which flashtune's kernels do not read: they take num_splits, or choose."""
    if scheduler_metadata is not None:
        fail("scheduler_metadata (FlashAttention-3's get_scheduler_metadata) is not read by flashtune's kernels, "
             "which schedule themselves: pass None (num_splits sets a KV-cache call's split count)")
    if fa_version not in (None, 2, 3):
        fail(f"fa_version={fa_version!r}: vLLM's FlashAttention versions are 2 and 3 (flashtune serves both)")


def unit_descale_flags(**descales) -> dict[str, torch.Tensor]:
    """Descales handed with 16-bit operands, as vLLM's wrapper hands them (ones; FlashAttention-3 reads
    descales only for FP8 operands): each must be a float tensor (checked here) whose values are 1
    (returned as {error: flag} for the call's one host read of its device values, read_flags)."""
    given = {name: t for name, t in descales.items() if t is not None}
    for name, t in given.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            fail(f"{name} must be a float tensor, got "
                 + (f"{t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__))
    return {f"{name} scales FP8 operands; with 16-bit ones, as here, it must be 1 (vLLM's default): the descales "
            "a KV cache needs come with a torch.float8_e4m3fn cache; an FP8 q: flash_attn_func": (t != 1)
            for name, t in given.items()}


def read_flags(found: dict[str, torch.Tensor]) -> None:
    """A call's checks of values on the device, read on the host at once (one sync; skipped while a
    graph is captured, or trusted): the first error whose flag is set anywhere fails."""
    if not found or not device_values_checked():
        return
    names = list(found)
    hits = torch.stack([found[n].any() for n in names]).cpu()
    for name, hit in zip(names, hits.tolist()):
        if hit:
            fail(name)


def sinks_or_s_aux(sinks, s_aux):
    """The attention sinks under flashtune's name or vLLM's (`s_aux`), not both."""
    if sinks is not None and s_aux is not None:
        fail("sinks and s_aux are the same argument (vLLM's name for the sinks): pass one")
    return s_aux if sinks is None else sinks


@dataclass(frozen=True)
class VariantArgs:
    """A call's variants, checked: which are on (the kernel's `Variants`) and their values."""
    variants: Variants
    window: tuple[int, int]  # (left, right), -1: unbounded
    softcap: float           # 0: none
    sinks: torch.Tensor | None  # contiguous float32 (heads_q,)
    alibi: torch.Tensor | None  # contiguous float32 (heads_q,) or (batch, heads_q)


NO_VARIANT_ARGS = VariantArgs(Variants(), (-1, -1), 0.0, None, None)


MAX_WINDOW = 2**30  # a side at least this long is as good as unbounded (no sequence is that long)


def check_variants(window_size, softcap, sinks, heads_q: int, alibi_slopes=None, batch: int | None = None
                   ) -> VariantArgs:
    """A call's variants from flash_attn's arguments (and vLLM's sinks), checked. window_size None:
    unbounded (vLLM's wrapper's default)."""
    if window_size is None:
        window_size = (-1, -1)
    try:
        left, right = (int(x) for x in window_size)
    except (TypeError, ValueError):
        fail(f"window_size must be a pair of ints (left, right), -1 for unbounded; got {window_size!r}")
    if left < -1 or right < -1:
        fail(f"window_size={tuple(window_size)}: each side is a number of keys >= 0, or -1 for unbounded")
    left, right = (min(side, MAX_WINDOW) for side in (left, right))  # the kernels add to it in int32
    softcap = float(softcap or 0.0)
    if softcap < 0 or not math.isfinite(softcap):
        fail(f"softcap must be a finite number >= 0 (0: none), got {softcap}")
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point() or sinks.shape != (heads_q,):
            got = f"{sinks.dtype} {tuple(sinks.shape)}" if isinstance(sinks, torch.Tensor) else type(sinks).__name__
            fail(f"sinks must be a float tensor of shape (heads_q,) = ({heads_q},), one logit per query head; got {got}")
        sinks = sinks.float().contiguous()
    if alibi_slopes is not None:
        shapes = [(heads_q,)] + ([(batch, heads_q)] if batch is not None else [])
        if not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.dtype != torch.float32 or \
                tuple(alibi_slopes.shape) not in shapes:
            got = (f"{alibi_slopes.dtype} {tuple(alibi_slopes.shape)}" if isinstance(alibi_slopes, torch.Tensor)
                   else type(alibi_slopes).__name__)
            fail(f"alibi_slopes must be a float32 tensor of shape (heads,) or (batch, heads) = "
                 f"{' or '.join(map(str, shapes))}; got {got}")
        alibi_slopes = alibi_slopes.contiguous()
    variants = Variants(softcap > 0, (left, right) != (-1, -1), sinks is not None, alibi_slopes is not None)
    return VariantArgs(variants, (left, right), softcap, sinks, alibi_slopes)


def scale_for(softmax_scale: float | None, hdim: int) -> float:
    """The softmax scale a call asked for (1/sqrt(head_dim) by default), checked."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(hdim)
    try:
        scale = float(softmax_scale)
    except (TypeError, ValueError):
        scale = math.nan
    if not (scale > 0 and math.isfinite(scale)):
        fail(f"softmax_scale must be a positive finite number, got {softmax_scale}")
    return scale


def device_values_checked() -> bool:
    """Whether index values on the GPU are read on the host (a device sync): not when trusted,
    nor while a graph is captured (a read is impossible then)."""
    return not (TRUST_CU_SEQLENS or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()))


class ReadValues:
    """Index tensors on the GPU whose values a host read found valid, remembered by identity and
    version (every PyTorch write to a tensor, or to a view of it, moves its version), so that the
    layers of one forward, which pass the same index tensors, pay one read (a device sync), not one
    each: 32 syncs a decode step of an 8B model. A write that bypasses PyTorch (a kernel handed the
    tensor's pointer) leaves the version, so values so written go unread until the next PyTorch write,
    as flash_attn never reads them. Inference-mode tensors have no version: read on every call."""

    def __init__(self, size: int = 16):
        self.size = size
        self.entries: dict[tuple, tuple] = {}  # key -> (weak references, versions, answer)

    @staticmethod
    def _key(tensors, extra) -> tuple | None:
        if any(t is not None and t.is_inference() for t in tensors):
            return None
        return tuple(None if t is None else id(t) for t in tensors), extra

    def get(self, tensors: tuple, extra: tuple = ()):
        """The answer remembered for these tensors (None is no tensor) and host values, or None."""
        key = self._key(tensors, extra)
        entry = self.entries.get(key) if key is not None else None
        if entry is None:
            return None
        refs, versions, answer = entry
        same = all((r is None and t is None) or (r is not None and r() is t and t._version == version)
                   for r, t, version in zip(refs, tensors, versions))
        return answer if same else None

    def put(self, tensors: tuple, extra: tuple = (), answer=True) -> None:
        key = self._key(tensors, extra)
        if key is None:
            return
        self.entries.pop(key, None)
        if len(self.entries) >= self.size:  # the oldest goes
            self.entries.pop(next(iter(self.entries)))
        self.entries[key] = (tuple(None if t is None else weakref.ref(t) for t in tensors),
                             tuple(None if t is None else t._version for t in tensors), answer)


read_values = ReadValues()  # the process's; the calls that read index values on the host ask it first


def check_cu_seqlens(cu: torch.Tensor, name: str, total: int, max_seqlen: int,
                      covers_all: bool) -> None:
    if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1:
        got = (f"a {cu.dim()}-D {DTYPE_NAMES.get(cu.dtype, cu.dtype)} tensor" if isinstance(cu, torch.Tensor)
               else type(cu).__name__)
        fail(f"{name} must be a 1-D torch.int32 tensor of length batch+1, got {got} (e.g. .to(torch.int32))")
    if cu.numel() < 1 or cu.stride(0) != 1:
        fail(f"{name} must be contiguous with at least one element (batch+1)")
    if torch.compiler.is_compiling() or (cu.is_cuda and not device_values_checked()):
        return  # unread: a traced call's lengths are not values yet (a read would break the graph)
    asked = (name, total, max_seqlen, covers_all)
    if read_values.get((cu,), asked):
        return
    values = cu.tolist()
    lengths = [b - a for a, b in zip(values, values[1:])]
    if values[0] != 0 or any(n < 0 for n in lengths):
        fail(f"{name} must start at 0 and never decrease, got {values[:8]}...")
    if values[-1] > total or (covers_all and values[-1] != total):
        fail(f"{name}[-1] = {values[-1]} must {'equal' if covers_all else 'not exceed'} the "
              f"{total} rows of the packed tensor")
    if lengths and max(lengths) > max_seqlen:
        fail(f"a sequence in {name} has {max(lengths)} tokens, more than max_seqlen {max_seqlen}")
    read_values.put((cu,), asked)


def check_fp8_args(q, k, q_descale, k_descale, qk_fp8: bool, v=None, v_descale=None, pv_fp8: bool = False) -> None:
    batch, heads_kv = q.shape[0], k.shape[2]
    if pv_fp8 and (q.dtype == FP8 or not qk_fp8):
        fail("pv_fp8=True quantises a 16-bit v beside 16-bit q and k: pass qk_fp8=True with it"
             if q.dtype != FP8 else "pv_fp8=True quantises 16-bit inputs; with e4m3 q and k, drop it and pass an "
             "e4m3 v (with its v_descale) for the all-FP8 kernel")
    if v is not None and v.dtype != FP8 and v_descale is not None:
        fail(f"v_descale scales an e4m3 v; v is {v.dtype}: pass qk_fp8=True and pv_fp8=True to quantise it, "
             "or drop v_descale" if not pv_fp8 else "pv_fp8=True computes v's descale; drop v_descale")
    if v is not None and v.dtype == FP8 and v_descale is not None and (
            not isinstance(v_descale, torch.Tensor) or v_descale.dtype != torch.float32
            or tuple(v_descale.shape) != (batch, heads_kv)):
        got = f"{tuple(v_descale.shape)} {v_descale.dtype}" if isinstance(v_descale, torch.Tensor) else type(
            v_descale).__name__
        fail(f"v_descale must be a float32 tensor of shape (batch, heads_kv) = ({batch}, {heads_kv}), got {got}")
    if q.dtype != FP8:
        if (q_descale is not None or k_descale is not None) and qk_fp8:
            fail("qk_fp8=True computes its own descales; drop q_descale/k_descale")
        if q_descale is not None or k_descale is not None:
            fail("q_descale/k_descale scale FP8 (torch.float8_e4m3fn) q and k; q and k are "
                  f"{q.dtype}: pass qk_fp8=True to quantise them, or drop the descales")
        return
    if qk_fp8:
        fail("qk_fp8=True quantises 16-bit q and k; these are already torch.float8_e4m3fn "
              "(pass their q_descale/k_descale instead)")
    for name, d in (("q_descale", q_descale), ("k_descale", k_descale)):
        if d is not None and (not isinstance(d, torch.Tensor) or d.dtype != torch.float32
                              or tuple(d.shape) != (batch, heads_kv)):
            got = f"{tuple(d.shape)} {d.dtype}" if isinstance(d, torch.Tensor) else type(d).__name__
            fail(f"{name} must be a float32 tensor of shape (batch, heads_kv) = ({batch}, {heads_kv}), got {got}")
