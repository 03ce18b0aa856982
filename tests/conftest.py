"""Shared test setup: the `gpu` marker skips cleanly without a GPU; builds never touch ~/.cache."""
from __future__ import annotations

import os

from types import SimpleNamespace

import pytest


def _gpu_visible() -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.device_count() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _gpu_visible():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is visible")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gpu_build_cache(tmp_path_factory):
    """One build cache for every GPU test of a run ($FLASHTUNE_TEST_CACHE_DIR reuses a prebuilt one)."""
    return os.environ.get("FLASHTUNE_TEST_CACHE_DIR") or str(tmp_path_factory.mktemp("gpu-cache"))


@pytest.fixture(autouse=True)
def flashtune_cache_dir(request, tmp_path_factory, monkeypatch):
    """Every CPU test gets its own FLASHTUNE_CACHE_DIR, so nothing lands in ~/.cache/flashtune;
    GPU tests share one, so each kernel is built once per run."""
    if request.node.get_closest_marker("gpu"):
        path = request.getfixturevalue("gpu_build_cache")
    else:
        path = str(tmp_path_factory.mktemp("flashtune-cache"))
    monkeypatch.setenv("FLASHTUNE_CACHE_DIR", path)
    return path


@pytest.fixture
def poisoned(monkeypatch):
    """GPU tests: every output starts as NaN (ops.poison_outputs), so an element a kernel forgot
    cannot pass for a computed one."""
    from flashtune.runtime import ops

    monkeypatch.setattr(ops, "poison_outputs", True)


@pytest.fixture
def run_profile():
    """GPU tests: the profile this run asks for (FLASHTUNE_PROFILE, e.g. h200-sm80; else the GPU's
    match), chosen again before each test."""
    from flashtune.runtime import ops

    ops.use_profile(os.environ.get("FLASHTUNE_PROFILE"))


@pytest.fixture
def fake_props():
    """Factory for objects shaped like torch.cuda.get_device_properties() (default: an RTX 4090)."""
    def make(name="NVIDIA GeForce RTX 4090", major=8, minor=9, **extra):
        values = dict(name=name, major=major, minor=minor, multi_processor_count=128,
                      shared_memory_per_multiprocessor=102400, shared_memory_per_block_optin=101376,
                      L2_cache_size=72 * 2**20, total_memory=24 * 2**30)
        values.update(extra)
        return SimpleNamespace(**values)
    return make
