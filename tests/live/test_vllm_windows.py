"""benchmarks/vllm_windows.py: the validation targets pooled over measured windows."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "vllm-epyc"


def _script():
    spec = importlib.util.spec_from_file_location("vllm_windows",
                                                  ROOT / "benchmarks" / "vllm_windows.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _window(errors: dict[str, float], policy: str = "fixed:k=2", rate: float = 1.5,
            measured: float = 2.0) -> pd.DataFrame:
    """A window's rows, each metric simulated `errors[metric]` percent off `measured`."""
    return pd.DataFrame([{"policy": policy, "rate": rate, "metric": m, "measured": measured,
                          "simulated": measured * (1 + e / 100)} for m, e in errors.items()])


def test_pooled_error_is_the_mean_simulated_over_the_mean_measured():
    """Two runs 8% long and 6% short on equal measured values pool to +1%: each misses its
    own E2E target, the configuration over both meets it."""
    w = _script()
    fine = dict.fromkeys(w.TARGETS, 0.0)
    pooled = w.pool([_window({**fine, "e2e_mean_s": 8.0}), _window({**fine, "e2e_mean_s": -6.0})])
    row = pooled.iloc[0]
    assert row.windows == 2 and row.runs_within == 0
    assert row.e2e_mean_s == pytest.approx(1.0)
    assert bool(row.within)
    # weighed by the measured values (as the requests' mean over both windows), not the
    # errors' mean: 1.1 s against 1 s and 3 s against 3 s pool to 4.1 against 4, +2.5%
    pooled = w.pool([_window({"e2e_mean_s": 10.0}, measured=1.0),
                     _window({"e2e_mean_s": 0.0}, measured=3.0)])
    assert pooled.iloc[0].e2e_mean_s == pytest.approx(2.5)


def test_a_metric_past_its_target_fails_the_pool_and_a_missing_one_fails_the_run():
    w = _script()
    fine = dict.fromkeys(w.TARGETS, 0.0)
    # TTFT 12% long in one window: that run misses, the pool (+6%) meets its 10%
    pooled = w.pool([_window({**fine, "ttft_mean_s": 12.0}), _window(fine)])
    assert pooled.iloc[0].ttft_mean_s == pytest.approx(6.0) and bool(pooled.iloc[0].within)
    assert pooled.iloc[0].runs_within == 1
    # ... 12% long in both: pooled +12%
    pooled = w.pool([_window({**fine, "ttft_mean_s": 12.0})] * 2)
    assert not bool(pooled.iloc[0].within)
    # a window without tokens per step is no run that met all five, and the pool has it from
    # the other window only
    partial = {m: 0.0 for m in w.TARGETS if m != "emitted_per_step"}
    pooled = w.pool([_window(partial), _window(fine)])
    assert pooled.iloc[0].runs_within == 1 and bool(pooled.iloc[0].within)


def test_a_value_one_side_lacks_is_not_pooled_one_sided(tmp_path):
    """A window whose simulation of a metric is empty leaves that metric to the other
    windows (its measured value is not pooled against the others' simulations)."""
    w = _script()
    fine = dict.fromkeys(w.TARGETS, 0.0)
    gap = _window(fine, measured=4.0)
    gap.loc[gap.metric == "e2e_mean_s", "simulated"] = None
    path = tmp_path / "gap.csv"
    gap.to_csv(path, index=False)
    pooled = w.pool([_window({**fine, "e2e_mean_s": 2.0}), w.read_window(path)])
    assert pooled.iloc[0].e2e_mean_s == pytest.approx(2.0)
    assert pooled.iloc[0].runs_within == 1  # the gap's window is no complete run


def test_configurations_pool_separately_in_order_of_appearance():
    w = _script()
    fine = dict.fromkeys(w.TARGETS, 0.0)
    pooled = w.pool([pd.concat([_window(fine, "fixed:k=4", 3.0), _window(fine, "fixed:k=0")]),
                     _window({**fine, "tpot_mean_s": 4.0}, "fixed:k=0")])
    assert list(zip(pooled.policy, pooled.rate, pooled.windows)) == [
        ("fixed:k=4", 3.0, 1), ("fixed:k=0", 1.5, 2)]
    assert pooled.iloc[1].tpot_mean_s == pytest.approx(2.0)


def test_what_is_not_a_validate_table_is_refused_in_one_line(tmp_path, capsys):
    w = _script()
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    assert w.main([str(other)]) == 2
    assert "not a validate.csv" in capsys.readouterr().err
    assert w.main([str(tmp_path / "missing.csv")]) == 2
    assert "missing.csv: cannot read it" in capsys.readouterr().err
    twice = tmp_path / "twice.csv"
    pd.concat([_window(dict.fromkeys(w.TARGETS, 0.0))] * 2).to_csv(twice, index=False)
    assert w.main([str(twice)]) == 2
    assert "appears twice" in capsys.readouterr().err
    text = _window(dict.fromkeys(w.TARGETS, 0.0)).astype({"simulated": object})
    text.loc[0, "simulated"] = "fast"
    text.to_csv(other, index=False)
    assert w.main([str(other)]) == 2
    assert "column simulated holds a value that is not a number" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the same window twice would count twice
        w.main([str(other), str(other)])
    assert "given twice" in capsys.readouterr().err


def test_the_shipped_windows_meet_every_target_pooled(capsys):
    """The ten calibrated windows measured on vLLM (docs/vllm.md, "Over several windows"):
    every configuration and rate within all five targets over its windows."""
    w = _script()
    assert w.main([str(t) for t in _ten_windows()]) == 0
    out = capsys.readouterr().out
    assert ("configurations and rates within all five targets over their windows: 24 of 24; "
            "single runs: 143 of 168") in out
    assert w.main([]) == 0  # the same windows, by default
    assert capsys.readouterr().out == out
    assert w.main(["--plain"]) == 0
    plain = capsys.readouterr().out
    assert "23 of 24; single runs: 102 of 168" in plain
    # the files docs/vllm.md points to are this output, below their comment line
    for kind, printed in (("calibrated", out), ("plain", plain)):
        shipped = (RESULTS / f"windows-{kind}.md").read_text().split("\n", 2)[2]
        assert shipped == printed


def test_the_ranking_of_the_tables_windows_against_the_tunes_prediction(capsys):
    """The four windows of the two tables (docs/vllm.md, "The loop over the four windows of the
    tables"): per rate, vLLM's means over the windows that served all five, and the tune's
    order against them; the file the docs point to is this output."""
    w = _script()
    tables = [str(RESULTS / f"tables-s{s}-calibrated.csv") for s in (4, 5, 6, 7)]
    args = ["--ranking", "--predicted", str(RESULTS / "tables-predicted.csv"), *tables]
    assert w.main(args) == 0
    out = capsys.readouterr().out
    taus = [line.split(":")[1].split()[0] for line in out.splitlines() if "Kendall" in line]
    assert taus == ["1.00", "1.00", "0.80"]
    assert out.count("3 windows served all 5") == 3  # the sixth served three, at two rates
    shipped = (RESULTS / "tables-s4-s7-ranking.txt").read_text().split("\n", 2)[2]
    assert shipped == out


def _ten_windows() -> list[Path]:
    names = ["matched", "matched-s1", "matched-s2", "matched-s3"]
    names += [f"tables-s{s}" for s in (4, 5, 6, 7)] + ["loop-s8", "loop-s9"]
    return [RESULTS / f"{name}-calibrated.csv" for name in names]


def test_the_anchored_ranking_of_the_ten_windows(capsys):
    """Every configuration against k = 2 in each window that served both (docs/vllm.md, "The
    loop over all ten windows"): eight configurations per rate, k = 4 and 6 from five
    windows; the file the docs point to is this output."""
    w = _script()
    args = ["--ranking", "--anchor", "fixed:k=2", "--predicted",
            str(RESULTS / "loop-predicted.csv"), *map(str, _ten_windows())]
    assert w.main(args) == 0
    out = capsys.readouterr().out
    taus = [line.split(":")[1].split()[0] for line in out.splitlines() if "Kendall" in line]
    assert taus == ["0.93", "0.86", "0.86"]
    assert "fixed:k=3" in out and out.count("9 windows served fixed:k=2") == 1
    shipped = (RESULTS / "windows-anchored-ranking.txt").read_text().split("\n", 2)[2]
    assert shipped == out
    # the same by default: the shipped windows against the shipped prediction (README)
    assert w.main(["--ranking", "--anchor", "fixed:k=2"]) == 0
    assert capsys.readouterr().out == out


def test_the_anchor_takes_out_what_moves_a_whole_window():
    """Two windows, one twice as slow: a configuration 10% behind the anchor in each is 10%
    behind over both, and one served only in the slow window compares through the anchor
    (its mean E2E alone would put it 90% behind)."""
    w = _script()
    fast = pd.concat([_window({"e2e_mean_s": 0.0}, "fixed:k=2", measured=1.0),
                      _window({"e2e_mean_s": 0.0}, "fixed:k=4", measured=1.1)])
    slow = pd.concat([_window({"e2e_mean_s": 0.0}, "fixed:k=2", measured=2.0),
                      _window({"e2e_mean_s": 0.0}, "fixed:k=4", measured=2.2),
                      _window({"e2e_mean_s": 0.0}, "fixed:k=6", measured=1.9)])
    out = w.anchored([fast, slow], {}, "fixed:k=2")
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:]}
    assert rows["fixed:k=4"][:3] == ["2", "+10.0%", "+15.8%"]
    assert rows["fixed:k=6"][:3] == ["1", "-5.0%", "+0.0%"]
    assert "2 windows served fixed:k=2" in out
    # at a rate where no window served the anchor, it says so
    other = _window({"e2e_mean_s": 0.0}, "fixed:k=4", rate=3.0, measured=2.0)
    assert "rate 3: no window served the anchor fixed:k=2" in w.anchored(
        [fast, other], {}, "fixed:k=2")


def test_an_anchor_no_window_served_or_a_configuration_never_beside_it(capsys):
    """An anchor no window served is an error naming what they served; a configuration never
    served beside the anchor is listed as not compared, not dropped in silence."""
    w = _script()
    one = pd.concat([_window({"e2e_mean_s": 0.0}, "fixed:k=2", measured=1.0),
                     _window({"e2e_mean_s": 0.0}, "fixed:k=4", measured=1.1)])
    alone = _window({"e2e_mean_s": 0.0}, "fixed:k=6", measured=0.9)
    with pytest.raises(w.WindowsError, match="no window served the anchor fixed:k=20; they "
                                             "served: fixed:k=2, fixed:k=4"):
        w.anchored([one], {}, "fixed:k=20")
    out = w.anchored([one, alone], {}, "fixed:k=2")
    assert "never served in a window with fixed:k=2, so not compared: fixed:k=6" in out
    only = w.anchored([_window({"e2e_mean_s": 0.0}, "fixed:k=2"), alone],
                      {("fixed:k=2", 1.5): 2.0}, "fixed:k=2")
    assert "no Kendall tau: one configuration compared" in only
    zero = _window({"e2e_mean_s": 0.0}, "fixed:k=4", measured=0.0)
    with pytest.raises(w.WindowsError, match="a ratio needs a positive one"):
        w.anchored([one, zero], {}, "fixed:k=2")
    # on the command line: one line, exit 2
    assert w.main(["--ranking", "--anchor", "fixed:k=20"]) == 2
    assert "no window served the anchor fixed:k=20" in capsys.readouterr().err


def test_the_anchor_is_read_only_with_the_ranking(capsys):
    w = _script()
    with pytest.raises(SystemExit):
        w.main(["--anchor", "fixed:k=2", str(RESULTS / "loop-s8-calibrated.csv")])
    assert "--predicted and --anchor are read with --ranking" in capsys.readouterr().err


def test_kendall_tau_counts_pairs_in_the_same_order():
    w = _script()
    assert w.kendall_tau([1, 2, 3], [10, 20, 30]) == 1.0
    assert w.kendall_tau([1, 2, 3], [30, 20, 10]) == -1.0
    assert w.kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    assert w.kendall_tau([1, 1, 3], [1, 2, 3]) == pytest.approx(2 / 3)  # a tie counts 0
    # over the pairs more than 4% apart: the swapped pair 1% apart is left out
    assert w.pair_tau([1, 2, 3], [2.0, 1.98, 3.0], w.APART_PCT) == (1.0, 2)
    assert w.kendall_tau([1, 2, 3], [2.0, 1.98, 3.0]) == pytest.approx(1 / 3)


def test_a_configuration_without_prediction_or_common_window_is_said(tmp_path):
    w = _script()
    fine = dict.fromkeys(w.TARGETS, 0.0)
    one = pd.concat([_window(fine, "fixed:k=0", 1.0), _window(fine, "fixed:k=2", 1.0, 1.5),
                     _window(fine, "fixed:k=0", 2.0)])
    two = _window(fine, "fixed:k=2", 2.0)  # at 2 req/s no window served both
    text = w.ranking([one, two], {("fixed:k=0", 1.0): 2.0})
    assert "no Kendall tau: no prediction for fixed:k=2" in text
    assert "rate 2: no window served all 2 configurations" in text
    assert w.ranking([one], {}).count("Kendall") == 0  # nothing predicted: nothing to say


def test_predictions_are_read_only_with_the_ranking(tmp_path, capsys):
    w = _script()
    with pytest.raises(SystemExit):
        w.main(["--predicted", str(RESULTS / "tables-predicted.csv")])
    assert "--predicted and --anchor are read with --ranking" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    tables = [str(RESULTS / "tables-s4-calibrated.csv")]
    assert w.main(["--ranking", "--predicted", str(bad), *tables]) == 2
    assert "not a CSV of policy, rate, e2e_mean_s" in capsys.readouterr().err
    bad.write_text("policy,rate,e2e_mean_s\nfixed:k=0,1.5,2\nfixed:k=0,1.5,2\n")
    assert w.main(["--ranking", "--predicted", str(bad), *tables]) == 2
    assert "appears twice" in capsys.readouterr().err
    bad.write_text("policy,rate,e2e_mean_s\nfixed:k=0,1.5,\n")
    assert w.main(["--ranking", "--predicted", str(bad), *tables]) == 2
    assert "no positive mean E2E" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the default windows served different configurations
        w.main(["--ranking"])
    assert "give their validate.csv" in capsys.readouterr().err

