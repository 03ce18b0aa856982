"""The sm90 probe on a Hopper GPU: TMA-loaded, wgmma-multiplied S = Q K^T equals torch's."""
from __future__ import annotations

import ctypes

import pytest
import torch

pytestmark = pytest.mark.gpu


def test_probe_qk_matches_torch(tmp_path):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs an sm_90 (H100/H200) GPU")
    from flashtune.build import _run_worker
    from flashtune.paths import csrc_dir
    from flashtune.toolchain import detect_toolchain

    _run_worker("flashtune_probe_sm90", [str(csrc_dir() / "sm90" / "probe_qk.cu")], tmp_path, "9.0a",
                ["-O3", "-DNDEBUG"], detect_toolchain().cuda_home)
    lib = ctypes.CDLL(str(tmp_path / "flashtune_probe_sm90.so"))
    torch.manual_seed(0)
    q = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    s = torch.full((64, 64), float("nan"), device="cuda")
    err = lib.flashtune_probe_sm90_qk_launch(ctypes.c_void_p(q.data_ptr()), ctypes.c_void_p(k.data_ptr()),
                                             ctypes.c_void_p(s.data_ptr()),
                                             ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    torch.cuda.synchronize()
    assert err == 0
    ref = q.float() @ k.float().T
    torch.testing.assert_close(s, ref, atol=1e-3, rtol=1e-3)
