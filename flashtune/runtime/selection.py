"""Which profile serves a device (use_profile(), else $FLASHTUNE_PROFILE, else the GPU's match)
and which KernelSpec serves a call under it. Per-device state, behind a lock.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import torch

from flashtune.kernels.gpu import GpuInfo, detect_gpus
from flashtune.kernels.profiles import Profile, ProfileError, find_profile, select_profile
from flashtune.kernels.decode_spec import DecodeSpec
from flashtune.kernels.spec import KernelSpec, spec_for
from flashtune.kernels.tiles import SM90_V_HEAD_DIMS, computed_head_dim, prefill_head_dims
from flashtune.kernels.variants import NO_VARIANTS, Variants
from flashtune.runtime.checks import DTYPE_NAMES, FlashtuneInputError


@dataclass
class _State:
    explicit: Profile | None = None  # use_profile()
    per_device: dict | None = None  # device index -> Profile (auto-matched or from env)


_state = _State(per_device={})
_state_lock = threading.Lock()
_spec_cache: dict[tuple, KernelSpec] = {}  # select_spec's, by what a spec is made of


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


def check_runs_on(profile: Profile, gpu: GpuInfo) -> None:
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
    elif device is not None and device.index is not None:
        index = device.index
    elif not torch.cuda.is_available():  # asked before any GPU call: say so, not torch's driver error
        raise FlashtuneInputError("no CUDA GPU is visible: active_profile() names the profile a GPU's calls use "
                                  "(`flashtune profiles show NAME` describes one without a GPU)")
    else:
        index = torch.cuda.current_device()
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
        check_runs_on(profile, gpu)
        _state.per_device[index] = profile
        return profile


def select_spec(profile: Profile, dtype: torch.dtype | str, hdim: int, causal: bool,
                seqlen_q: int, seqlen_k: int, fp8: bool = False,
                variants: Variants = NO_VARIANTS, narrow: bool = False, fp8_pv: bool = False,
                hdim_v: int = 0) -> KernelSpec:
    """The KernelSpec that serves a call of this shape under `profile` (`dtype`: the output's, and
    v's unless fp8_pv; `fp8`: q and k in e4m3; `fp8_pv`: v too, the all-FP8 kernel). A head dim
    between the built ones (a multiple of 8 from 32 to 256) is served by the next built one's kernel:
    its narrow twin (`narrow`, sm90: the inputs read in place), or on inputs zero-padded to it (ops.py). `hdim_v`: the kernel's V head dim where it is
    below the built head dim (KernelSpec.hdim_v; kernel_for decides it)."""
    dtype_name = dtype if isinstance(dtype, str) else DTYPE_NAMES[dtype]
    if fp8 and not profile.arch.fp8:
        raise FlashtuneInputError(
            f"FP8 attention needs FP8 tensor cores, which {profile.arch.name} (profile {profile.name}) lacks: "
            "they exist on sm_89 (RTX 4090, L40S), sm_90 (H100/H200) and sm_120 (RTX 5090); "
            "use 16-bit q/k here")
    if fp8 and not profile.fp8_qk:
        raise FlashtuneInputError(
            f"profile {profile.name} has no FP8 kernels (fp8: null); use a profile with "
            "`fp8: {qk: e4m3}` for this GPU (`flashtune profiles` lists them), or 16-bit q/k")
    built = computed_head_dim(hdim, profile.head_dims)
    if built is None:
        raise FlashtuneInputError(f"head dim {hdim} is not served by profile {profile.name} (its kernels: head dims "
                                  f"{', '.join(map(str, profile.head_dims))}; a multiple of 8 from 32 to 256 is "
                                  "computed at the next of them)")
    fp8_dims = prefill_head_dims(profile.head_dims, fp8=True)
    if fp8 and (built != hdim or hdim not in fp8_dims):
        raise FlashtuneInputError(f"FP8 q/k need head dim {', '.join(map(str, fp8_dims))} exactly, got {hdim}; "
                                  "use 16-bit q/k")
    if fp8_pv and not profile.fp8_pv:
        raise FlashtuneInputError(
            f"profile {profile.name} builds no all-FP8 kernels (its fp8 has no pv: e4m3); use a profile with "
            "`fp8: {qk: e4m3, pv: e4m3}` (sm90 family), or a 16-bit v for the FP8 Q/K kernel")
    hdim = built
    try:
        tile = profile.tile_for(hdim, causal, seqlen_q, seqlen_k, fp8=fp8, fp8_pv=fp8_pv)
    except ProfileError as e:
        raise FlashtuneInputError(str(e)) from e
    if dtype_name not in profile.dtypes:
        raise FlashtuneInputError(f"dtype {dtype_name} is not in profile {profile.name} "
                                  f"(dtypes: {', '.join(profile.dtypes)})")
    # Keyed by exactly what the spec is made of: constructing one validates its tile (slow).
    key = (profile.family, profile.arch.name, dtype_name, hdim, tile, bool(causal), bool(fp8), profile.nvcc_flags,
           variants, narrow, bool(fp8_pv), hdim_v)
    spec = _spec_cache.get(key)
    if spec is None:
        spec = _spec_cache[key] = spec_for(profile, tile, dtype_name, hdim, causal, fp8, variants=variants,
                                           narrow=narrow, fp8_pv=fp8_pv, hdim_v=hdim_v)
    return spec


def narrow_serves(profile: Profile, fp8: bool, varlen: bool, seqlen_q: int) -> bool:
    """Whether a prefill call whose head dims are not a built one's (or whose V head dim is not Q/K's)
    runs on its tensors as they are: an sm90 profile's narrow kernel (16-bit, not a decode-length
    call), which the TMA reads with zeros past each tensor's head dim; elsewhere the op zero-pads
    copies of them."""
    return profile.family == "sm90" and not fp8 and (varlen or seqlen_q > DECODE_MAX_SEQLEN_Q)


# Query lengths up to this (decode, speculative decoding) go to the decode kernels: their query
# heads of one KV head share a tile and their keys are split across CTAs, where a prefill tile of
# 64-192 rows per head would be nearly empty and one CTA per head would leave most SMs idle.
DECODE_MAX_SEQLEN_Q = 16


def kernel_for(profile: Profile, dtype: torch.dtype | str, hdim: int, causal: bool, seqlen_q: int, seqlen_k: int,
               head_ratio: int = 1, fp8: bool = False, varlen: bool = False,
               variants: Variants = NO_VARIANTS, key_rows: int = 0, device_index: int = 0,
               hdim_v: int | None = None, narrow: bool = True, fp8_pv: bool = False) -> KernelSpec | DecodeSpec:
    """The kernel flash_attn_func / flash_attn_varlen_func launch for a call of this shape: the
    decode kernel (DecodeSpec) for short fixed-length queries in 16 bits, else the profile's tile
    (select_spec). The one place that decides; `flashtune verify` asks it for the expected name.
    `variants`: which of softcap, window, sinks and alibi the call has (every family has them);
    key_rows, device_index: the key rows the call reads (sequences x KV heads x keys), on which
    device (runtime/decode.py's decode_spec: a short call's packed rows). hdim_v: V's head dim where it
    is not Q/K's (a prefill call that narrow_serves; elsewhere the op pads v to one head dim first):
    a pair of SM90_V_HEAD_DIMS (192/128, 128/64; V inside its panels), a kernel whose P V and O have
    V's panels only; any other, the narrow kernel at the larger.
    narrow=False: the op pads copies anyway (a broadcast input, which no tensor map describes).
    fp8_pv: v in e4m3 too, the all-FP8 kernel (bf16 output)."""
    decode = not (fp8 or varlen or seqlen_q > DECODE_MAX_SEQLEN_Q)
    hdim_v = hdim_v or hdim
    narrow = narrow and narrow_serves(profile, fp8, varlen, seqlen_q)
    if hdim_v != hdim and not narrow:
        raise FlashtuneInputError(f"a V head dim ({hdim_v}) unlike Q/K's ({hdim}) takes an sm90 profile's narrow "
                                  "prefill kernel; the op pads the others to one head dim")
    wide = max(hdim, hdim_v)
    built = computed_head_dim(wide, profile.head_dims)
    kernel_v, narrower = 0, False
    if narrow and not decode and built is not None:
        # V's own head dim: its 64-column panels, a pair that is built (MLA's 128 beside 192)
        v_panels = -(-hdim_v // 64) * 64
        kernel_v = v_panels if v_panels in SM90_V_HEAD_DIMS.get(built, ()) else 0
        narrower = hdim < built or hdim_v < (kernel_v or built)  # a tensor short of its kernel's dims: narrow
    spec = select_spec(profile, dtype, wide, causal, seqlen_q, seqlen_k, fp8=fp8,  # validates the call
                       variants=NO_VARIANTS if decode else variants, narrow=narrower, hdim_v=kernel_v,
                       fp8_pv=fp8_pv)
    if not decode:
        return spec
    from flashtune.runtime.decode import decode_spec

    dtype = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype)
    return decode_spec(profile, dtype, hdim, bool(causal), seqlen_q, head_ratio, None, variants=variants,
                       key_rows=key_rows, device_index=device_index)
