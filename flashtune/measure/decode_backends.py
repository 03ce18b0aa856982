"""The backends `flashtune bench --decode` puts side by side: flashtune's flash_attn_with_kvcache,
SDPA's backends and flash-attn's KV-cache functions where importable. Each takes the inputs of a
DecodeProblem (measure/decode_problem.py) and returns a callable for one decode step, or raises
Unavailable with the reason. Layout work (SDPA's transposes, a paged cache gathered for backends
without paging, GQA heads repeated for SDPA backends without GQA) happens once, outside the timing.
"""
from __future__ import annotations

from typing import Callable

from flashtune.measure.backends import Runner, Unavailable, imported, tried
from flashtune.measure.decode_problem import contiguous_kv


def _flashtune(inputs: dict, causal: bool, scale: float) -> Runner:
    from flashtune.runtime import kvcache

    def run():
        return kvcache.flash_attn_with_kvcache(inputs["q"], inputs["k"], inputs["v"], block_table=inputs["block_table"],
                                               softmax_scale=scale, causal=causal)

    try:
        run()
    except ValueError as e:  # FlashtuneInputError, SpecError
        raise Unavailable(str(e).splitlines()[0][:300]) from e
    return run


def _flashtune_fp8kv(package: str = "flashtune") -> Callable[[dict, bool, float], Runner]:
    """flashtune (or another copy of it, `package`: an A/B's release) on the same cache stored in
    e4m3 (quantised before timing with one descale per KV head, as an engine's FP8 cache holds it):
    half the bytes read. Its GB/s counts the 16-bit cache's bytes, the work every row does, so it
    can pass the copy bandwidth."""
    def make(inputs: dict, causal: bool, scale: float) -> Runner:
        import importlib

        kvcache = importlib.import_module(f"{package}.runtime.kvcache")
        fp8 = importlib.import_module(f"{package}.runtime.fp8")
        k, v, batch = inputs["k"], inputs["v"], inputs["q"].shape[0]
        k_head, v_head = ((x.abs().amax(dim=(0, 1, 3)).float() / fp8.FP8_MAX).clamp_min(1e-12) for x in (k, v))
        k8, v8 = (fp8.quantise_kv(x, d[None].expand(x.shape[0], -1)) for x, d in ((k, k_head), (v, v_head)))
        k_descale, v_descale = (d[None].expand(batch, -1).contiguous() for d in (k_head, v_head))

        def run():
            return kvcache.flash_attn_with_kvcache(inputs["q"], k8, v8, block_table=inputs["block_table"],
                                                   softmax_scale=scale, causal=causal, k_descale=k_descale,
                                                   v_descale=v_descale)

        try:
            run()
        except ValueError as e:  # FlashtuneInputError, SpecError
            raise Unavailable(str(e).splitlines()[0][:300]) from e
        return run

    return make


def _sdpa(backend_name: str | None) -> Callable[[dict, bool, float], Runner]:
    """SDPA with GQA passed as SDPA takes it (enable_gqa) where the backend accepts it, else K/V
    repeated to every query head; paged caches gathered into contiguous ones first."""
    def make(inputs: dict, causal: bool, scale: float) -> Runner:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        q = inputs["q"].transpose(1, 2)
        k, v = (t.transpose(1, 2) for t in contiguous_kv(inputs))
        mask = None
        if causal:
            from torch.nn.attention.bias import causal_lower_right

            mask = causal_lower_right(q.shape[2], k.shape[2])
        backend = getattr(SDPBackend, backend_name) if backend_name else None

        def call(k, v, gqa):
            if backend is None:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)

        try:
            call(k, v, True)
            return lambda: call(k, v, True).transpose(1, 2)
        except RuntimeError:
            pass
        ratio = q.shape[1] // k.shape[1]
        try:
            kr, vr = k.repeat_interleave(ratio, dim=1), v.repeat_interleave(ratio, dim=1)
            call(kr, vr, False)
        except torch.cuda.OutOfMemoryError as e:
            raise Unavailable("out of memory repeating K/V for every query head") from e
        except RuntimeError as e:
            raise Unavailable(f"refused: {str(e).splitlines()[0][:160]}") from e
        return lambda: call(kr, vr, False).transpose(1, 2)

    return make


def _flash_attn_kvcache(module: str) -> Callable[[dict, bool, float], Runner]:
    """flash-attn 2/3's flash_attn_with_kvcache (paged where the page size is one it takes)."""
    def make(inputs: dict, causal: bool, scale: float) -> Runner:
        fn = imported(module, "flash_attn_with_kvcache")
        return tried(lambda: fn(inputs["q"], inputs["k"], inputs["v"], block_table=inputs["block_table"],
                                softmax_scale=scale, causal=causal))

    return make


def _flash_attn4(inputs: dict, causal: bool, scale: float) -> Runner:
    """FA4's flash_attn_func on the (gathered) cache: it has no KV-cache entry point of its own."""
    fn = imported("flash_attn.cute", "flash_attn_func")
    k, v = contiguous_kv(inputs)
    return tried(lambda: fn(inputs["q"], k, v, softmax_scale=scale, causal=causal))


DECODE_BACKENDS: dict[str, Callable[[dict, bool, float], Runner]] = {
    "flashtune": _flashtune,
    "sdpa-default": _sdpa(None),
    "sdpa-flash": _sdpa("FLASH_ATTENTION"),
    "sdpa-efficient": _sdpa("EFFICIENT_ATTENTION"),
    "sdpa-cudnn": _sdpa("CUDNN_ATTENTION"),
    "flash-attn2": _flash_attn_kvcache("flash_attn"),
    "flash-attn3": _flash_attn_kvcache("flash_attn_interface"),
    "flash-attn4": _flash_attn4,
    "flashtune-fp8kv": _flashtune_fp8kv(),  # not in the default backends: an e4m3 cache
}
