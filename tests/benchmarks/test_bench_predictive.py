"""Smoke test of the predictive benchmark's own machinery (benchmarks/bench_predictive.py):
the Perl-documentation corpus is split by document, and the brute-force fits recover
constructed answers. The benchmark itself is not run here (it is a benchmark, not a test)."""

from __future__ import annotations

import glob
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from predictive.corpus import (
    find_documents,
    pod_prose,
    split_by_document,
    strip_formatting,
    windows,
)
from predictive.hessian import lanczos_extremes
from predictive.truth import crossing_size, fit_s_of_b


def test_pod_markup_is_stripped_and_code_dropped() -> None:
    source = (
        "=head1 NAME\n\nFoo - a B<bold> C<< $x->y >> L<text|Some::Module> E<gt> X<index>\n\n"
        "    my $code = 1;  # verbatim: dropped\n\n=begin html\n\n<p>no</p>\n\n=end html\n\n"
        "=cut\n\nsub perl_code { }\n\n=pod\n\nBack in prose.\n"
    )
    text = pod_prose(source)
    assert text == "NAME\nFoo - a bold $x->y text >\nBack in prose.\n"
    assert strip_formatting("I<a B<b> c>") == "a b c"


@pytest.mark.skipif(not glob.glob("/usr/share/perl/5.*"), reason="no system Perl documentation")
def test_the_corpus_is_split_by_document_and_every_window_lies_inside_one() -> None:
    docs = find_documents()
    assert len(docs) >= 20
    split = split_by_document(docs, seq_len=16)
    train_paths = {d.path for d in split.train_docs}
    val_paths = {d.path for d in split.val_docs}
    assert train_paths.isdisjoint(val_paths) and val_paths
    assert set(np.unique(split.train_groups)).isdisjoint(set(np.unique(split.val_groups)))
    for groups, x, y, chosen, offset in (
        (split.train_groups, split.train_x, split.train_y, split.train_docs, 0),
        (split.val_groups, split.val_x, split.val_y, split.val_docs, len(split.train_docs)),
    ):
        for g in np.unique(groups)[:25]:
            wx, wy = windows(chosen[g - offset].ids, 16)
            np.testing.assert_array_equal(x[groups == g], wx)
            np.testing.assert_array_equal(y[groups == g], wy)
        np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # targets are the next character


def test_the_brute_force_fits_recover_constructed_answers() -> None:
    rng = np.random.default_rng(0)
    sizes = [8, 16, 32, 64, 128, 256]
    steps = [400 * (1 + 90 / b) * np.exp(rng.normal(0, 0.03)) for b in sizes]
    fit = fit_s_of_b(sizes, steps)
    assert fit["b_crit"] == pytest.approx(90, rel=0.1)
    assert fit["s_min"] == pytest.approx(400, rel=0.1)
    d = [250, 500, 1000, 2000, 4000]
    loss = [1.5 + 40 * x**-0.5 for x in d]  # crosses 2.5 at D = 1600
    assert crossing_size(d, loss, 2.5)["examples"] == pytest.approx(1600, rel=0.05)
    assert crossing_size(d, loss, 1.6)["bound"] == "> 4000"
    q, _ = np.linalg.qr(rng.normal(size=(60, 60)))
    evals = np.linspace(-1.0, 5.0, 60)
    h = torch.from_numpy((q * evals) @ q.T)
    out = lanczos_extremes(lambda v: h @ v, 60, iterations=60, tol=1e-10)
    assert out["lambda_max"] == pytest.approx(5.0, rel=1e-8)


def test_branch_rows_compare_each_checkpoints_cbs_with_the_truth() -> None:
    """The branched-CBS rows: one per checkpoint and one for the checkpoint nearest the
    target, ratio against the brute-force B_crit; a sweep that did not succeed is one
    not_available row naming why. The window gives the largest batch its steps."""
    from predictive.branch import branch_rows, branch_sweep_settings

    truth = {"b_crit": 26.0, "b_crit_note": "seed 0"}
    answers = {
        "branch_sweep": {
            "status": "succeeded",
            "result": {
                "sweep": {
                    "branch": {
                        "checkpoints": [
                            {"step": 20, "loss": 3.1, "critical_batch": 8, "status": "measured"},
                            {"step": 160, "loss": 2.6, "critical_batch": 32, "status": "measured"},
                        ]
                    }
                }
            },
        }
    }
    rows = branch_rows(answers, truth, target=2.57)
    assert [r.service for r in rows] == [8, 32, 32]  # the last: nearest the target (step 160)
    assert "step 160" in rows[-1].field
    assert rows[1].ratio == pytest.approx(32 / 26.0)
    (missing,) = branch_rows({"branch_sweep": {"status": "failed", "error": "x"}}, truth, 2.57)
    assert missing.service is None and "failed" in missing.note
    settings = branch_sweep_settings([8, 32, 16], tokens_per_example=64, checkpoint_steps=[20])
    assert settings["batch_sizes"] == [8, 16, 32]
    assert settings["window_tokens"] % (32 * 64) == 0  # whole steps of the largest batch


def test_branch_rows_put_the_efficiency_fit_and_the_crossing_beside_the_truth() -> None:
    """With the continuous estimates in the answer, every checkpoint gets three rows (ladder,
    efficiency fit, ε-crossing) with their ratios to the truth; the window table recomputes
    them on the curves cut at each evaluation (the full cut equals the service's numbers)."""
    from predictive.branch import branch_rows, window_rows

    from curvplan_core.planner.branched_batch import BranchLosses, efficiency_fit

    truth = {"b_crit": 26.0, "b_crit_note": "seed 0"}
    marks = [0.0, 64.0, 128.0, 192.0, 256.0]

    def loss(b: int, x: float) -> float:  # the reference at effective examples, B_c = 20
        return 2.0 + 1.0 / (1 + x * (20 + 8) / (20 + b) / 100)

    curves = [
        {"batch_size": b, "tokens": [m * 4 for m in marks], "losses": [loss(b, m) for m in marks]}
        for b in (8, 16, 32, 64)
    ]
    fit = efficiency_fit(
        [BranchLosses(c["batch_size"], marks, c["losses"]) for c in curves], 0.01
    ).estimate
    checkpoint = {
        "step": 160,
        "loss": 2.6,
        "critical_batch": 16,
        "status": "measured",
        "next_batch": 32,
        "curves": curves,
        "efficiency": fit.model_dump(),
        "crossing": {"value": 21.0, "status": "measured", "low": 16.0, "high": 32.0},
    }
    answers = {
        "branch_sweep": {
            "status": "succeeded",
            "result": {"sweep": {"branch": {"tolerance": 0.01, "checkpoints": [checkpoint]}}},
        }
    }
    rows = branch_rows(answers, truth, target=2.57)
    assert [r.service for r in rows] == [16, fit.value, 21.0] * 2
    assert "efficiency B_c at step 160" in rows[1].field and "ε-crossing" in rows[2].field
    assert rows[1].ratio == pytest.approx(fit.value / 26.0)
    assert fit.value == pytest.approx(20.0, rel=0.07)  # the construction's B_c
    windows = window_rows(answers["branch_sweep"]["result"]["sweep"]["branch"], 4.0)
    assert [w["window_tokens"] for w in windows] == [256.0, 512.0, 768.0, 1024.0]
    assert windows[-1]["efficiency"] == pytest.approx(fit.value)
    assert all(w["cbs"] in (8, 16, 32, 64) for w in windows)


def test_the_data_truth_trains_each_subset_longer_and_flags_a_rising_l_of_d() -> None:
    """The epochs rule: the horizon grows with the subset between its floor and its cap; a
    fixed horizon (the old rule) is kept for recorded runs. L(D) that rises by more than the
    tolerance from one subset to the next is named."""
    from predictive.compare import solve_l_of_d
    from predictive.truth import MONOTONE_TOLERANCE, DataSettings, monotone_violations

    sizes = (250, 1000, 4000, 16000)
    rule = DataSettings(sizes, 2.5, 32, (300,) * 4, (3e-3,), epochs=20, min_steps=200,
                        max_steps=2500)  # fmt: skip
    assert [rule.horizon(i) for i in range(4)] == [200, 625, 2500, 2500]
    assert "20 epochs" in rule.rule() and "at most 2500" in rule.rule()
    fixed = DataSettings(sizes, 2.5, 32, (300,) * 4, (3e-3,))
    assert [fixed.horizon(i) for i in range(4)] == [300] * 4
    # the seed 0 at a fixed 300 steps: 2.430 at D = 1,000, 2.518 at D = 4,000
    assert monotone_violations([1000, 4000], [2.430, 2.518], MONOTONE_TOLERANCE)
    assert not monotone_violations([1000, 4000], [2.430, 2.430 + MONOTONE_TOLERANCE], 0.02)
    # the service's L(D) solved at a target: the size it was built from
    fit = {"E": 1.5, "A": 40.0, "beta": 0.5}
    assert solve_l_of_d(fit, 1.5 + 40 * 1234**-0.5) == pytest.approx(1234)
    assert solve_l_of_d(fit, 1.4) is None


@pytest.mark.parametrize("mode", ["quick", "full"])
def test_the_committed_data_truth_is_monotone_with_two_targets_off_the_checkpoints(mode) -> None:
    """benchmarks/results/predictive-truth-<mode>.json, the committed ground truth: each subset
    trained to convergence (the epochs rule), L(D) non-increasing within the tolerance at every
    seed (checked here on the recorded losses), and at least two targets, none at an
    intermediate checkpoint's fraction of the reference run."""
    import json

    from predictive.truth import MONOTONE_TOLERANCE, monotone_violations

    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    truth = json.loads((results / f"predictive-truth-{mode}.json").read_text())
    settings = truth["mode"]
    assert settings["data_epochs"] > 0
    fractions = [settings["target_fraction"], *settings["more_target_fractions"]]
    assert len(truth["targets"]) == len(fractions) >= 2
    assert not set(fractions) & set(settings["intermediate_fractions"])
    for seed, s in truth["seeds"].items():
        data = s["data"]
        assert "to convergence" in data["rule"], seed
        sizes = [p["examples"] for p in data["points"]]
        losses = [p["loss"] for p in data["points"]]
        assert sizes == sorted(sizes)
        assert [p["steps"] for p in data["points"]] == sorted(p["steps"] for p in data["points"])
        assert not monotone_violations(sizes, losses, MONOTONE_TOLERANCE), (seed, losses)
        assert [n["target_loss"] for n in data["needed"]] == truth["targets"]


def test_the_data_sweep_runs_the_printed_next_step_unchanged(tmp_path) -> None:
    """The service half runs budget.data.next_step's command as printed: every flag the
    planner wrote is kept (no step cap or other setting of the benchmark's own), the
    placeholders name the benchmark's files, and only --url and --json are added."""
    from predictive.service import printed_command

    from curvplan_core.planner.budget_section import data_sweep_next_step

    step = data_sweep_next_step(2.62, 75_405, 32.0, model_parameters=22_791)
    files = {k: tmp_path / f"{k}.x" for k in ("spec", "train", "eval")}
    argv = printed_command(step.command, "http://127.0.0.1:1", files)
    printed = step.command.split()[1:]
    assert argv[-3:] == ["--url", "http://127.0.0.1:1", "--json"]
    tail = argv[len(argv) - 3 - len(printed) : len(argv) - 3]
    names = {"model.json": "spec", "train.safetensors": "train", "eval.safetensors": "eval"}
    assert tail == [str(files[names[a]]) if a in names else a for a in printed]
    assert "--max-steps" not in argv and "--data-sizes" in argv
    with pytest.raises(ValueError, match="curvplan sweep"):
        printed_command("curvplan analyze --spec model.json", "http://x", files)


def test_the_rounds_table_and_the_further_targets_rows() -> None:
    """Each analysis after a data sweep is a line of the rounds table (source, interval open on
    the extrapolated side, the next round); the further target's budget.data is a row with the
    truth's seeds' spread beside it."""
    from predictive.compare import data_round_lines, further_target_rows

    service = {
        "data_sweep": {
            "command": "curvplan sweep --type data",
            "status": "succeeded",
            "wall_s": 60,
        },
        "data_next_rounds": [{"command": "curvplan sweep --data-sizes 1,2", "status": "failed"}],
        "data_rounds": [
            {
                "target_loss": 2.62,
                "data_sweeps": ["a"],
                "source": "extrapolated",
                "recommended_examples": 700,
                "recommended_examples_ci": [None, 1500.0],
                "measured_sizes": [2356.0, 75405.0],
                "next_round_sizes": [1178, 589],
            }
        ],
    }
    text = "\n".join(data_round_lines(service))
    assert "1. `curvplan sweep --type data` — succeeded, 1.0 min wall" in text
    assert "2. `curvplan sweep --data-sizes 1,2` — failed" in text
    assert "| 2.62 | 1 | extrapolated | 700 | open – 1,500 | 2,356 – 75,405 | 1178, 589 |" in text
    truth = {
        "data_by_target": [
            {"target_loss": 2.62},
            {
                "target_loss": 2.53,
                "examples": 524.0,
                "per_seed": [531.0, 518.0],
                "bounds": [None, None],
                "spread_text": " (seeds' spread ×1.02)",
            },
        ]
    }
    answer = {
        "status": "succeeded",
        "result": {
            "recommendation": {
                "budget": {"data": {"source": "data_sweep", "recommended_examples": 600}}
            }
        },
    }
    (row,) = further_target_rows({"2.53": answer}, truth)
    assert row.ratio == pytest.approx(600 / 524) and row.verdict == "yes"
    assert "×1.02" in row.truth_note and "source data_sweep" in row.note
    assert further_target_rows({}, truth) == []
