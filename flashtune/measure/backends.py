"""Every attention backend `flashtune bench` can put side by side, behind one interface.

A backend takes (batch, seqlen, heads, head_dim) q, k, v and returns a callable that runs
one forward pass (inputs already in the layout the backend prefers, so layout changes stay
out of the timing). A backend that is absent, or refuses a shape, raises `Unavailable`
with the reason; the benchmark shows that reason and goes on.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # torch is imported where a backend runs: `import flashtune.cli` stays fast
    import torch


class Unavailable(Exception):
    """This backend cannot run here or cannot run this shape; str() says why."""


@dataclass(frozen=True)
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    causal: bool
    scale: float
    window: int = 0  # causal: each query sees its own key and the window - 1 before it (0: every key)

    @property
    def window_size(self) -> tuple[int, int]:
        """flash_attn's window_size for it: (left, right) keys around each query's own."""
        return (self.window - 1, 0) if self.window else (-1, -1)


Runner = Callable[[], "torch.Tensor"]  # returns output as (batch, seqlen, heads, head_dim)


def _flashtune(inputs: Inputs, fp8: bool = False, fp8_pv: bool = False) -> Runner:
    """The active profile's kernel (`flashtune bench --profile` sets it). With fp8, its FP8 Q/K
    kernel on q and k quantised to e4m3 before timing, as an FP8 model would hand them over; with
    fp8_pv too, its all-FP8 kernel on v quantised as well (V's transposition is in the call, timed)."""
    from flashtune.runtime import ops
    from flashtune.runtime.fp8 import quantised_inputs

    (q, k, v), descales = quantised_inputs(inputs.q, inputs.k, inputs.v, fp8, fp8_pv)

    def run() -> torch.Tensor:
        return ops.flash_attn_func(q, k, v, softmax_scale=inputs.scale, causal=inputs.causal,
                                   window_size=inputs.window_size, **descales)

    from flashtune.kernels.build import BuildError
    from flashtune.kernels.spec import SpecError
    from flashtune.kernels.toolchain import ToolchainError

    try:
        run()  # builds or loads the spec for this shape
    except (ops.FlashtuneInputError, SpecError, BuildError, ToolchainError) as e:
        raise Unavailable(str(e).splitlines()[0][:300]) from e
    return run


def _sdpa(backend_name: str) -> Callable[[Inputs], Runner]:
    def make(inputs: Inputs) -> Runner:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)
        sq, sk = inputs.q.shape[1], inputs.k.shape[1]
        if inputs.causal and sq != sk:
            raise Unavailable("SDPA's is_causal is top-left aligned; flashtune's is bottom-right")
        hq, hkv = inputs.q.shape[2], inputs.k.shape[2]
        if inputs.q.requires_grad:
            # A timed backward: transposed views of flash_attn's layout, as a model calls SDPA. Copies
            # made here would put their backward (and, through SDPA flash's output layout, copies of
            # O and dO inside its backward) into the timing.
            q, k, v = (t.transpose(1, 2) for t in (inputs.q, inputs.k, inputs.v))
            if hq != hkv:
                k, v = (t.repeat_interleave(hq // hkv, dim=1) for t in (k, v))
        else:  # SDPA's preferred layout, prepared once outside the timed region
            q = inputs.q.transpose(1, 2).contiguous()
            k = inputs.k.transpose(1, 2).repeat_interleave(hq // hkv, dim=1).contiguous()
            v = inputs.v.transpose(1, 2).repeat_interleave(hq // hkv, dim=1).contiguous()
        # SDPA has no window: a mask of the pairs inside it (which its flash kernel refuses)
        mask = window_mask(sq, sk, inputs.window, q.device) if inputs.window else None
        if backend_name == "MATH":
            import torch

            need = 3 * q.shape[0] * hq * sq * sk * 4  # fp32 scores, softmax, and a copy
            free, _ = torch.cuda.mem_get_info()
            if need > 0.8 * free:
                raise Unavailable(f"the {need / 2**30:.0f} GiB score matrix does not fit in memory")

        def run() -> torch.Tensor:
            with sdpa_kernel([backend]):
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=inputs.causal and mask is None,
                                                     scale=inputs.scale)
            return out.transpose(1, 2)

        try:
            run()
        except RuntimeError as e:  # SDPA says why it refused, in a warning plus this error
            raise Unavailable(f"refused: {str(e).splitlines()[0][:160]}") from e
        return run

    return make


def window_mask(seqlen_q: int, seqlen_k: int, window: int, device) -> torch.Tensor:
    """(seqlen_q, seqlen_k) bool, True where a key is inside a query's causal window (its own key, bottom-right
    aligned, and the window - 1 before it): the reference's mask, for SDPA."""
    from flashtune.measure.reference import visible_keys

    return visible_keys(seqlen_q, seqlen_k, True, (window - 1, 0), device)


def imported(module: str, attr: str):
    """`module.attr` of an optional package, or Unavailable saying it is not importable."""
    try:
        return getattr(importlib.import_module(module), attr)
    except Exception as e:  # ImportError, or a broken install
        raise Unavailable(f"{module} is not importable ({type(e).__name__})") from e


def tried(call: Callable[[], object]) -> Runner:
    """A runner of another package's function, run once: its output (the first of a tuple), or
    Unavailable with the reason the function gave for refusing."""
    def run():
        out = call()
        return out[0] if isinstance(out, tuple) else out

    try:
        run()
    except Exception as e:
        raise Unavailable(f"refused: {str(e).splitlines()[0][:160]}") from e
    return run


def _flash_attn_module(module: str, attr: str = "flash_attn_func") -> Callable[[Inputs], Runner]:
    def make(inputs: Inputs) -> Runner:
        fn = imported(module, attr)
        window = {"window_size": inputs.window_size} if inputs.window else {}
        return tried(lambda: fn(inputs.q, inputs.k, inputs.v, softmax_scale=inputs.scale, causal=inputs.causal,
                                **window))

    return make


BACKENDS: dict[str, Callable[[Inputs], Runner]] = {
    "flashtune": _flashtune,
    "flashtune-fp8": lambda inputs: _flashtune(inputs, fp8=True),
    "flashtune-fp8all": lambda inputs: _flashtune(inputs, fp8=True, fp8_pv=True),
    "sdpa-flash": _sdpa("FLASH_ATTENTION"),
    "sdpa-cudnn": _sdpa("CUDNN_ATTENTION"),
    "sdpa-efficient": _sdpa("EFFICIENT_ATTENTION"),
    "sdpa-math": _sdpa("MATH"),
    "flash-attn2": _flash_attn_module("flash_attn"),
    "flash-attn3": _flash_attn_module("flash_attn_interface"),
    "flash-attn4": _flash_attn_module("flash_attn.cute"),
}
# Opt-in: flashtune-fp8 and flashtune-fp8all (they compute something else, on purpose: FP8 Q/K, and
# Q, K, P and V, with their error).
DEFAULT_BACKENDS = tuple(name for name in BACKENDS if name not in ("flashtune-fp8", "flashtune-fp8all"))
