"""bench/soak.py without a daemon: the slope fit, when a trend fails and when it is noise,
the return to idle, how outcomes are classified, the verdict's reasons, and the plot."""

from __future__ import annotations

import math
import random
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import soak  # noqa: E402

MIB = soak.MIB
RSS = soak.GAUGE_BY_NAME["rss_less_cache_bytes"]
FDS = soak.GAUGE_BY_NAME["fds"]
QUEUE = soak.GAUGE_BY_NAME["queue_depth"]


def every(seconds: float, n: int, start: float = 0.0) -> list[float]:
    return [start + i * seconds for i in range(n)]


# --- parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize("text, seconds", [("2h", 7200), ("5m", 300), ("1h30m", 5400),
                                           ("300s", 300), ("45", 45), ("1.5h", 5400)])
def test_durations(text, seconds):
    assert soak.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "2 hours", "-5m", "5x"])
def test_bad_durations_are_refused(text):
    with pytest.raises(Exception):
        soak.parse_duration(text)


def test_warmup_is_a_fifth_of_the_run_between_one_and_fifteen_minutes():
    assert soak.default_warmup(300) == 60
    assert soak.default_warmup(1800) == 360
    assert soak.default_warmup(7200) == 900


def test_metrics_text_keeps_labels_and_skips_comments():
    text = ("# HELP inferloop_queue_depth Requests waiting\n# TYPE inferloop_queue_depth gauge\n"
            "inferloop_queue_depth 3\n"
            'inferloop_prompt_cache_bytes{tier="ram"} 1.5e6\n'
            "garbage line here\n")
    m = soak.parse_metrics(text)
    assert m == {"inferloop_queue_depth": 3.0, 'inferloop_prompt_cache_bytes{tier="ram"}': 1.5e6}


def test_rss_less_cache_is_derived_only_from_both_readings():
    r = soak.with_derived({"rss_bytes": 300 * MIB, "prompt_cache_ram_bytes": 100 * MIB})
    assert r["rss_less_cache_bytes"] == 200 * MIB
    assert soak.with_derived({"rss_bytes": None, "prompt_cache_ram_bytes": 0})["rss_less_cache_bytes"] is None


# --- the fit -------------------------------------------------------------------------------


def test_linear_fit_recovers_an_exact_line():
    ts = every(10, 20)
    f = soak.linear_fit(ts, [5.0 + 0.25 * t for t in ts])
    assert f["slope"] == pytest.approx(0.25) and f["intercept"] == pytest.approx(5.0)
    assert f["resid_sd"] == pytest.approx(0, abs=1e-9) and f["n"] == 20


def test_linear_fit_needs_three_points_spread_in_time():
    assert soak.linear_fit([0, 1], [0, 1]) is None
    assert soak.linear_fit([5, 5, 5], [1, 2, 3]) is None


# --- trends --------------------------------------------------------------------------------


def test_a_steady_rss_leak_over_two_hours_fails_and_reports_its_slope_per_hour():
    ts = every(10, 630)  # 105 min after a 15-minute warm-up
    rng = random.Random(1)
    # 12 MiB/h: over the 105 minutes the rise (21 MiB) clears the 16 MiB floor too; the floor
    # makes a 2-hour run's effective threshold 16 MiB / 105 min, about 9 MiB/h.
    ys = [300 * MIB + 12 * MIB * t / 3600 + rng.gauss(0, 1 * MIB) for t in ts]
    tr = soak.judge_trend(RSS, ts, ys)
    assert tr["fail"], tr["reason"]
    assert tr["slope_per_h"] == pytest.approx(12 * MIB, rel=0.1)
    assert "MiB/h" in tr["reason"]


def test_a_slow_creep_under_the_threshold_passes():
    ts = every(10, 630)
    ys = [300 * MIB + 2 * MIB * t / 3600 for t in ts]  # 2 MiB/h < 4 MiB/h
    tr = soak.judge_trend(RSS, ts, ys)
    assert not tr["fail"] and "slope under" in tr["reason"]


def test_five_minutes_of_noise_do_not_fail():
    # 24 samples of RSS that jumps by several MiB (cache entries, arenas) with no trend, and
    # fds that jump with the connections in flight: many seeds, none fails.
    for seed in range(200):
        rng = random.Random(seed)
        ts = every(10, 24, start=60)
        rss = [260 * MIB + rng.choice([0, 2, 4, 6, 8]) * MIB for _ in ts]
        fds = [10 + rng.choice([0, 0, 0, 1, 2, 8, 12]) for _ in ts]
        queue = [rng.choice([0, 0, 0, 0, 0, 1, 4]) for _ in ts]
        for g, ys in ((RSS, rss), (FDS, fds), (QUEUE, queue)):
            tr = soak.judge_trend(g, ts, ys)
            assert not tr["fail"], (seed, g.name, tr["reason"])


def test_a_big_leak_fails_even_in_five_minutes():
    ts = every(10, 24, start=60)
    ys = [260 * MIB + 10 * MIB * i for i in range(24)]  # 230 MiB in 4 minutes
    assert soak.judge_trend(RSS, ts, ys)["fail"]


def test_a_one_off_step_that_levels_off_is_not_a_leak():
    # The allocator takes a 40 MiB arena a quarter into the window and keeps it: the whole
    # window's slope is steep and the rise large, but the second half is flat.
    ts = every(10, 200)
    ys = [300 * MIB + (40 * MIB if t > 500 else 0) for t in ts]
    tr = soak.judge_trend(RSS, ts, ys)
    assert tr["slope_per_h"] > RSS.min_slope_per_h and tr["rise"] > RSS.min_rise
    assert not tr["fail"] and "levels off" in tr["reason"]


def test_a_rise_inside_the_noise_passes():
    rng = random.Random(3)
    ts = every(10, 60)
    # A real 120 fd/h slope (20 over 10 minutes) in noise with sd ~15: rise < 3 sd.
    ys = [10 + 120 * t / 3600 + rng.gauss(0, 15) for t in ts]
    tr = soak.judge_trend(FDS, ts, ys)
    assert tr["noise_3sd"] > tr["rise"] and not tr["fail"]


def test_too_few_samples_give_no_verdict():
    tr = soak.judge_trend(RSS, every(10, 5), [MIB * i * 100 for i in range(5)])
    assert not tr["fail"] and "too few" in tr["reason"] and "slope_per_h" not in tr


def test_missing_readings_are_skipped_not_zero():
    ts = every(10, 30)
    ys = [None if i % 7 == 0 else 100 * MIB for i in range(30)]
    tr = soak.judge_trend(RSS, ts, ys)
    assert tr["n"] == 30 - 5 and tr["slope_per_h"] == pytest.approx(0)


def test_unjudged_gauges_report_a_slope_but_never_fail():
    g = soak.GAUGE_BY_NAME["prompt_cache_ram_bytes"]
    ts = every(10, 30)
    tr = soak.judge_trend(g, ts, [t * MIB for t in ts])
    assert tr["slope_per_h"] > 0 and not tr["fail"]


def test_trends_for_fits_only_load_samples_after_warm_up():
    samples = [{"t": t, "phase": "load", "rss_less_cache_bytes": (1000 * MIB if t < 60 else 200 * MIB)}
               for t in every(10, 30)]
    samples += [{"t": 300.0, "phase": "drain", "rss_less_cache_bytes": 5000 * MIB}]
    tr = soak.trends_for(samples, warmup_s=60)["rss_less_cache_bytes"]
    assert tr["n"] == 24 and tr["slope_per_h"] == pytest.approx(0) and tr["fit_from"] == 60


# --- idle ----------------------------------------------------------------------------------


def test_idle_needs_zero_occupancy_and_fds_threads_near_baseline():
    base = {"fds": 10.0, "threads": 6.0}
    idle = {"fds": 12.0, "threads": 6.0, "kv_reserved_cells": 0.0, "queue_depth": 0.0,
            "active_slots": 0.0}
    assert soak.judge_idle(base, idle) == []
    leaky = {**idle, "fds": 13.0, "kv_reserved_cells": 128.0}
    problems = soak.judge_idle(base, leaky)
    assert len(problems) == 2
    assert any(p.startswith("fds is 13") for p in problems)
    assert any(p.startswith("kv_reserved_cells is 128, not 0") for p in problems)


def test_idle_without_readings_is_not_idle():
    problems = soak.judge_idle({}, {})
    assert any("no reading" in p for p in problems) and len(problems) == 5


# --- outcomes and verdict ------------------------------------------------------------------


@pytest.mark.parametrize("outcome, cls", [("200", "ok"), ("429", "expected"), ("500", "5xx"),
                                          ("503", "5xx"), ("400", "error"), ("timeout", "error"),
                                          ("connection_error", "error"), ("stream_error", "error")])
def test_outcomes(outcome, cls):
    assert soak.classify(outcome) == cls


def test_verdict_passes_only_with_nothing_to_say():
    counts = {"chat": {"200": 50, "429": 3}, "burst": {"200": 5, "429": 9}}
    assert soak.verdict([{"gauge": "fds", "fail": False}], [], counts, None) == []


def test_verdict_names_every_reason():
    counts = {"chat": {"200": 50, "500": 2}, "tools": {"503": 1, "stream_error": 1}}
    trends = [{"gauge": "rss_less_cache_bytes", "fail": True, "reason": "climbs 9 MiB/h"}]
    reasons = soak.verdict(trends, ["queue_depth is 1, not 0"], counts, "the daemon died")
    assert reasons[0] == "rss_less_cache_bytes trends upward: climbs 9 MiB/h"
    assert "not idle after the load: queue_depth is 1, not 0" in reasons
    assert "3 responses with a 5xx: chat 500 x2, tools 503 x1" in reasons
    assert "1 requests failed otherwise: tools stream_error x1" in reasons
    assert reasons[-1] == "the daemon died"


def test_merge_counts_sums_by_kind_and_outcome():
    merged = soak.merge_counts({"chat": {"200": 1}}, {"chat": {"200": 2, "429": 1}, "drop": {"200": 1}})
    assert merged == {"chat": {"200": 3, "429": 1}, "drop": {"200": 1}}


# --- plot ----------------------------------------------------------------------------------


def test_svg_has_a_panel_per_gauge_with_its_slope_and_is_well_formed():
    samples = [{"t": t, "phase": "load" if t <= 300 else "drain", "rss_bytes": 300 * MIB + t * 1000,
                "rss_less_cache_bytes": 250 * MIB, "fds": 10, "threads": 6, "queue_depth": 0,
                "kv_reserved_cells": None} for t in every(10, 33)]
    trends = soak.trends_for(samples, 60)
    svg = soak.render_svg(samples, trends, 60, 300, "soak <test>")
    root = ET.fromstring(svg)  # parses: escaped title, closed tags
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    for g in soak.GAUGES:
        assert any(t.startswith(g.label) for t in texts), g.label
    assert any(t.startswith("RSS less prompt cache: 0.0 MiB/h ok") for t in texts)
    lines = list(root.iter("{http://www.w3.org/2000/svg}polyline"))
    assert len(lines) == 5  # the gauges with readings (kv is None, three are absent)
    assert all(not math.isnan(float(v)) for p in lines for xy in p.get("points").split()
               for v in xy.split(","))


@pytest.mark.parametrize("t1, ticks", [(300, [0, 1, 2, 3, 4, 5]), (7260, [0, 30, 60, 90, 120]),
                                       (1800, [0, 5, 10, 15, 20, 25, 30]), (59, [0])])
def test_minute_ticks_are_whole_and_few(t1, ticks):
    assert soak.minute_ticks(0, t1) == [m * 60.0 for m in ticks]


def test_svg_shows_the_verdicts_reasons_under_the_title():
    samples = [{"t": t, "phase": "load", "fds": 10} for t in every(10, 30)]
    svg = soak.render_svg(samples, soak.trends_for(samples, 60), 60, 290, "t",
                          ["1 responses with a 5xx: tools 500 x1"])
    root = ET.fromstring(svg)
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "1 responses with a 5xx: tools 500 x1" in texts


def test_report_judges_a_partial_run_from_its_files(tmp_path):
    import json

    samples = [{"t": t, "phase": "load", "paused": False, "fds": 10 + t / 60,
                "rss_less_cache_bytes": 300 * MIB} for t in every(10, 60)]
    (tmp_path / "series.json").write_text(json.dumps(
        {"meta": {"warmup_s": 60, "started": "2026-12-06T08:00:00+00:00", "rate": 1.0},
         "samples": samples}))
    (tmp_path / "requests.jsonl").write_text(
        '{"kind": "chat", "outcome": "200"}\n{"kind": "tools", "outcome": "500"}\n')
    assert soak.main(["--report", str(tmp_path)]) == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["slopes_per_hour_text"]["fds"] == "60/h"  # one fd a minute
    assert rep["slopes_per_hour_text"]["rss_less_cache_bytes"] == "0.0 MiB/h"
    assert rep["reasons"][0].startswith("fds trends upward")
    assert "1 responses with a 5xx: tools 500 x1" in rep["reasons"]
    ET.fromstring((tmp_path / "report.svg").read_text())


def test_report_of_a_missing_run_is_a_clear_error(tmp_path, capsys):
    assert soak.main(["--report", str(tmp_path / "nothing")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_flags_default_and_refuse():
    a = soak.parse_args(["--duration", "5m"])
    assert (a.duration, a.warmup, a.rate, a.sample_every) == (300, 60, 1.0, 10.0)
    assert soak.parse_args([]).duration == 7200
    for bad in (["--base-url", "http://x"], ["--duration", "5m", "--warmup", "5m"],
                ["--rate", "0"]):
        with pytest.raises(SystemExit):
            soak.parse_args(bad)
