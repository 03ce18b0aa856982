"""The timers on the GPU: CUDA-event times leave the host's launch overhead out, the host time of
one call is measured on its own, and the tuner's side-by-side round times real kernels."""
from __future__ import annotations

import pytest
import torch

from flashtune.measure import timing
from flashtune.tuning import search as tune
from flashtune.tuning.space import candidates

pytestmark = pytest.mark.gpu


def test_event_times_leave_out_the_hosts_launch_overhead():
    """A call that spends 2 ms on the host and microseconds on the GPU is timed at its GPU time
    (timed host-bound, every call would read >= 2 ms). 10 such calls outlast the first spin
    (about 10 ms), so the retry behind a longer one runs too."""
    import time

    x = torch.zeros(1024, device="cuda")

    def slow_host_call():
        time.sleep(0.002)
        x.add_(1)

    times = timing.time_ms([slow_host_call], warmup=1, repeats=10, warmup_seconds=0.0)
    assert len(times) == 10 and max(times) < 0.5, times


def test_host_ms_is_the_host_side_of_one_call():
    """The same call, 2 ms on the host and microseconds on the GPU: host_ms_per_call reads its
    host time (the event times above leave it out), launched behind a spin so none waits."""
    import time

    x = torch.zeros(1024, device="cuda")

    def slow_host_call():
        time.sleep(0.002)
        x.add_(1)

    assert 1.9 < timing.host_ms_per_call([slow_host_call], calls=10) < 10.0
    assert timing.host_ms_per_call([lambda: x.add_(1)], calls=10) < 0.5


def test_side_by_side_times_every_candidate_on_the_gpu():
    """The final round's timer on real kernels: two candidates of the active profile's family,
    one shape, interleaved rounds; a median per candidate, each a plausible GPU time."""
    from flashtune.runtime import ops
    from flashtune.kernels.spec import spec_for

    profile = ops.active_profile()
    start = profile.tile_for(128, False, 1024, 1024)
    tiles = candidates(profile.family, 128, profile.arch, starting=(start,), limit=2)
    specs = [spec_for(profile, t, "bfloat16", 128, False) for t in tiles]
    ms = tune.time_side_by_side(specs, 1024, repeats=6)
    assert sorted(ms) == sorted(s.name for s in specs) and all(0.01 < m < 100 for m in ms.values()), ms
