"""lab/ab_winner.py picks the profile of an A/B that a release visit then runs on: the best
geomean against the reference over its rounds, and the control unless that beats it by the margin."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).parents[1] / "ab_winner.py"


def _bench(path: Path, ratios: list[float]) -> str:
    """A bench JSON whose cells have flashtune / sdpa-cudnn at these ratios."""
    rows = []
    for seqlen, ratio in zip((512, 1024, 2048), ratios):
        cell = {"hdim": 64, "causal": True, "seqlen_q": seqlen}
        rows += [{**cell, "backend": "flashtune", "tflops": 100.0 * ratio}, {**cell, "backend": "sdpa-cudnn", "tflops": 100.0}]
    path.write_text(json.dumps({"rows": rows}))
    return str(path)


def _winner(tmp_path: Path, margin: float, rounds: dict[str, list[list[float]]]) -> str:
    args = [f"{name}=" + ",".join(_bench(tmp_path / f"{name}_{i}.json", r) for i, r in enumerate(runs))
            for name, runs in rounds.items()]
    out = subprocess.run([sys.executable, str(TOOL), "sdpa-cudnn", str(margin), *args],
                         capture_output=True, text=True, check=True, cwd=TOOL.parents[1])
    return out.stdout.strip()


def test_the_best_profile_wins_by_more_than_the_margin(tmp_path):
    rounds = {"control": [[1.0, 1.0, 1.0], [0.98, 1.0, 1.0]], "better": [[1.05, 1.03, 1.04], [1.04, 1.05, 1.03]],
              "worse": [[0.9, 0.95, 0.97], [0.92, 0.9, 0.95]]}
    assert _winner(tmp_path, 0.005, rounds) == "better"


def test_the_control_stays_within_the_margin(tmp_path):
    rounds = {"control": [[1.0, 1.0, 1.0]], "slightly": [[1.003, 1.0, 1.004]]}
    assert _winner(tmp_path, 0.005, rounds) == "control"


def test_an_experiment_folder_names_its_rounds(tmp_path):
    """--dir: lab/experiment.sh's folder, bench_<profile name>_<round>.json (bench_<name>.json for
    one round); the same choice as with the files listed, and a profile without files is an error."""
    for name, runs in {"h200": [[1.0, 1.0, 1.0], [0.99, 1.0, 1.0]], "exp-a": [[1.06, 1.04, 1.05], [1.05, 1.05, 1.04]]}.items():
        for i, r in enumerate(runs, 1):
            _bench(tmp_path / f"bench_{name}_{i}.json", r)
    _bench(tmp_path / "bench_exp-b.json", [0.9, 0.9, 0.9])

    def run(*profiles):
        return subprocess.run([sys.executable, str(TOOL), "sdpa-cudnn", "0.005", "--dir", str(tmp_path), *profiles],
                              capture_output=True, text=True, cwd=TOOL.parents[1])

    out = run("profiles/h200.yaml", "lab/exp-a.yaml", "x/exp-b.yaml")
    assert out.returncode == 0 and out.stdout.strip() == "lab/exp-a.yaml"
    assert "exp-b.yaml: 0.9000" in out.stderr
    missing = run("profiles/h200.yaml", "exp-c.yaml")
    assert missing.returncode != 0 and "no bench files of exp-c" in missing.stderr
