"""flashtune: build, verify, benchmark and tune our own attention kernels for the GPU at hand.

`import flashtune` stays light (the CLI starts fast); the attention functions and torch are
loaded on first use of these names.
"""
__version__ = "0.1.0"

_OPS = ("flash_attn_func", "flash_attn_varlen_func", "use_profile", "active_profile",
        "FlashtuneInputError")
_PACKED = ("flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func")
_KVCACHE = ("flash_attn_with_kvcache",)
_FP8 = ("kv_descales",)
__all__ = ["__version__", *_OPS, *_PACKED, *_KVCACHE, *_FP8]


def __getattr__(name):
    if name in _OPS:
        from flashtune.runtime import ops

        return getattr(ops, name)
    if name in _PACKED:
        from flashtune.runtime import packed

        return getattr(packed, name)
    if name in _KVCACHE:
        from flashtune.runtime import kvcache

        return getattr(kvcache, name)
    if name in _FP8:
        from flashtune.runtime import fp8

        return getattr(fp8, name)
    raise AttributeError(f"module 'flashtune' has no attribute {name!r}")
