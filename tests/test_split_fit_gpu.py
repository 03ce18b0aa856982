"""tune --decode's split fit on the GPU, on two cells and three counts: every count timed, and the
fit's losses are what the times say."""
from __future__ import annotations

import pytest

from flashtune.kernels.profiles import find_profile
from flashtune.tuning import split_fit

pytestmark = pytest.mark.gpu


def test_every_count_is_timed_and_the_fit_reads_those_times(monkeypatch):
    monkeypatch.setattr(split_fit, "CELLS", ((8, 1, 4096), (1, 4, 2048)))
    monkeypatch.setattr(split_fit, "COUNTS", (1, 2, 4))
    monkeypatch.setattr(split_fit, "GRID", {"ring_turnaround_us": (4,), "combine_us": (1, 40), "combine_gbps": (2400,)})
    fit = split_fit.run_split_fit(find_profile("h200"), "bfloat16", (64,), repeats=6)
    assert [c.label for c in fit.cells] == ["h64 32/8 b1 x 4096", "h64 32/1 b4 x 2048"]
    for cell in fit.cells:
        assert sorted(cell.us) == [1, 2, 4] and all(0 < us < 1e4 for us in cell.us.values())
    assert 1.0 <= fit.loss[0] <= fit.loss[1] and 1.0 <= fit.base_loss[0] <= fit.base_loss[1]
