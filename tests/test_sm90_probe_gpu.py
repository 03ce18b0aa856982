"""The sm90 probe on a Hopper GPU: TMA-loaded, wgmma-multiplied S = Q K^T equals torch's."""
from __future__ import annotations

import ctypes

import pytest
import torch

pytestmark = pytest.mark.gpu


def _build_probe(source: str, tmp_path) -> ctypes.CDLL:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs an sm_90 (H100/H200) GPU")
    from flashtune.kernels.build import _run_worker
    from flashtune.paths import csrc_dir
    from flashtune.kernels.toolchain import detect_toolchain

    name = source.replace(".cu", "")
    _run_worker(name, [str(csrc_dir() / "sm90" / source)], tmp_path, "9.0a", ["-O3", "-DNDEBUG"],
                detect_toolchain().cuda_home)
    return ctypes.CDLL(str(tmp_path / f"{name}.so"))


def _stream():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def test_probe_qk_matches_torch(tmp_path):
    lib = _build_probe("probe_qk.cu", tmp_path)
    torch.manual_seed(0)
    q = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    s = torch.full((64, 64), float("nan"), device="cuda")
    err = lib.flashtune_probe_sm90_qk_launch(ctypes.c_void_p(q.data_ptr()), ctypes.c_void_p(k.data_ptr()),
                                             ctypes.c_void_p(s.data_ptr()), _stream())
    torch.cuda.synchronize()
    assert err == 0
    ref = q.float() @ k.float().T
    torch.testing.assert_close(s, ref, atol=1e-3, rtol=1e-3)


def test_probe_attention_matches_the_reference(tmp_path):
    from flashtune.measure.reference import attention_reference, rel_l2

    lib = _build_probe("probe_attn.cu", tmp_path)
    torch.manual_seed(0)
    q = torch.randn(128, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(320, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(320, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    err = lib.flashtune_probe_sm90_attn_launch(*(ctypes.c_void_p(t.data_ptr()) for t in (q, k, v, out)),
                                               128, 320, ctypes.c_float(0.125), _stream())
    torch.cuda.synchronize()
    assert err == 0
    ref, _ = attention_reference(q[None, :, None], k[None, :, None], v[None, :, None], False, 0.125)
    assert rel_l2(out, ref[0, :, 0]) < 1e-2
