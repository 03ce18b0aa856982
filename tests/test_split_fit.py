"""tune --decode's split-policy fit (tuning/split_fit.py) without a GPU: on times a known policy's cost
model gives, the fit finds constants that pick the fastest counts, writes them only when they beat the
profile's, and the tuned profile and report say so."""

from rich.console import Console

from flashtune.commands import tune
from flashtune.kernels.decode_spec import DecodeSplitPolicy
from flashtune.kernels.profiles import find_profile
from flashtune.runtime.decode_splits import call_terms, call_time_us, most_splits
from flashtune.tuning.split_fit import CELLS, COUNTS, HEADS, SplitCell, fit_split_policy, spec_for_profile
from test_tune_decode import fake_result

H200 = find_profile("h200")
SPEC_FOR = spec_for_profile(H200, "bfloat16")
TRUTH = DecodeSplitPolicy(ring_turnaround_us=3, combine_us=2.5, combine_gbps=3200)
SMS, GBPS = 132, 4800


def modelled_cells(policy=TRUTH):
    """Every count's time on CELLS at hdim 128 as `policy`'s model predicts it, plus 5 us for all."""
    cells = []
    for heads_kv, batch, cache in CELLS:
        cell = SplitCell(128, heads_kv, batch, cache)
        spec = SPEC_FOR(cell)
        t = call_terms(spec, batch, heads_kv, 1, HEADS // heads_kv, cache, policy)
        most = most_splits(spec, cache, policy.max_splits)
        cell.us = {n: 5 + call_time_us(n, t.ctas, t.kv_bytes, t.partial_bytes, t.rate_gbps, SMS, GBPS,
                                       policy.combine_us, policy.combine_gbps) for n in COUNTS if n <= most}
        cells.append(cell)
    return cells


def test_the_fit_recovers_a_policy_that_picks_the_fastest_counts_and_beats_a_bad_one():
    bad = DecodeSplitPolicy(combine_us=60)  # never splits short calls' keys, nor long ones' enough
    fit = fit_split_policy(modelled_cells(), SPEC_FOR, SMS, GBPS, bad)
    assert fit.loss[0] < 1.005 and fit.loss[1] < 1.03
    assert fit.base_loss[0] > fit.loss[0] + 0.01 and fit.wins and fit.policy == fit.fitted
    assert fit.fitted.max_splits == bad.max_splits and fit.fitted.memory_gbps == bad.memory_gbps


def test_a_profile_policy_as_good_as_the_fit_is_kept():
    fit = fit_split_policy(modelled_cells(), SPEC_FOR, SMS, GBPS, TRUTH)
    assert fit.base_loss[0] < 1.005 and not fit.wins and fit.policy == TRUTH


def test_the_tuned_profile_takes_a_winning_policy_and_records_the_cells(tmp_path):
    fit = fit_split_policy(modelled_cells(), SPEC_FOR, SMS, GBPS, DecodeSplitPolicy(combine_us=60))
    written, prov = tune.write_decode_tuned(H200, fake_result(H200), fit, "bfloat16", "NVIDIA H200", "h200-decode",
                                            str(tmp_path / "out.yaml"))
    assert written.decode_split == fit.fitted
    record = prov["decode_tune"]["split_fit"]
    assert record["written"] and len(record["cells"]) == len(CELLS) and record["fitted"] == \
        {k: v for k, v in vars(fit.fitted).items()}
    console = Console(record=True, width=300)
    tune.render_split_fit(fit, console)
    assert "written" in console.export_text() and "not written" not in console.export_text()
