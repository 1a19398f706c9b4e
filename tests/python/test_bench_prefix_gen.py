"""bench/prefix_gen.py without servers: the generated requests are reproducible, fit the
context the gen runs are given, arrive at random, fall in their bands, and the report's hit
rates add up."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import prefix  # noqa: E402
import prefix_gen  # noqa: E402


def args(*extra: str):
    return prefix.parse_args(["--workloads", "gen", "--servers", "inferloopd", *extra])


def plan(cfg, workload: str) -> list[list[dict]]:
    """The messages each generated client sends, captured instead of sent."""
    sent: list[list[dict]] = []
    for client in prefix_gen.clients(cfg, workload, prefix.system_prompt, prefix.CHARS_PER_TOKEN):
        client(sent.append)
    return sent


def test_gen_expands_to_one_workload_per_prompt_count_with_the_issues_targets():
    cfg = args("--slots", "4", "--gen-prompts", "4", "16")
    assert cfg.workloads == ["gen-p4", "gen-p16"]
    assert prefix.workload_target("gen-p4", 4) == {"median": 1.0}
    assert prefix.workload_target("gen-p16", 4) == {"median": 0.5}
    assert args("--slots", "2").workloads == ["gen-p2", "gen-p8"], "default: slots and 4x"


def test_bands_expand_to_one_workload_per_band_and_prompt_count():
    cfg = args("--slots", "1", "--gen-prompts", "1", "8", "--gen-band", "100-500,500-1500",
               "--gen-band", "1500-3000")
    assert cfg.workloads == [f"gen-p{n}@{b}" for b in ("100-500", "500-1500", "1500-3000")
                             for n in (1, 8)]
    assert prefix_gen.parse_workload("gen-p8@500-1500") == (8, (500, 1500))
    assert prefix_gen.parse_workload("gen-p8") == (8, None)
    assert prefix_gen.parse_workload("shared") is None
    with pytest.raises(SystemExit):
        args("--gen-band", "900-100")


def test_requests_are_reproducible_draw_from_the_distinct_prompts_and_fit_the_context(monkeypatch):
    monkeypatch.setattr(prefix_gen.time, "sleep", lambda _s: None)
    cfg = args("--gen-requests", "24", "--gen-prompt-tokens", "100", "3000")
    first, again = plan(cfg, "gen-p3"), plan(cfg, "gen-p3")
    assert first == again, "the same seed, the same requests"
    systems = {m[0]["content"] for m in first}
    assert 1 < len(systems) <= 3
    limit = cfg.gen_ctx * prefix.CHARS_PER_TOKEN
    assert all(len(m[0]["content"]) + len(m[1]["content"]) < limit for m in first)
    assert len({m[1]["content"] for m in first}) == 24, "every question its own"


def test_system_prompts_fall_in_their_band(monkeypatch):
    monkeypatch.setattr(prefix_gen.time, "sleep", lambda _s: None)
    cfg = args("--gen-requests", "40", "--gen-band", "500-1500")
    sent = plan(cfg, "gen-p16@500-1500")
    for content in {m[0]["content"] for m in sent}:
        tokens = len(content) / prefix.CHARS_PER_TOKEN
        assert 400 <= tokens <= 1700, f"{tokens:.0f} tokens outside the 500-1500 band"


def test_gen_runs_get_a_context_that_holds_the_longest_prompt(capsys):
    cfg = args("--ctx", "2048", "--gen-prompt-tokens", "100", "3000")
    assert cfg.gen_ctx == prefix_gen.needed_ctx(3000, cfg) > 2048
    assert cfg.ctx == 2048, "the other workloads keep theirs"
    assert "--ctx" in capsys.readouterr().err
    short = args("--ctx", "8192", "--gen-prompt-tokens", "100", "300")
    assert short.gen_ctx == 8192, "a context that is large enough stays"
    with pytest.raises(SystemExit):
        args("--gen-prompt-tokens", "600", "500")


def test_arrivals_are_spread_as_a_poisson_process(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(prefix_gen.time, "sleep", slept.append)
    cfg = args("--gen-requests", "400", "--gen-rate", "4", "--gen-prompt-tokens", "100", "120")
    plan(cfg, "gen-p1")
    gaps = [b - a for a, b in zip([0.0] + slept, slept)]
    assert all(g > 0 for g in gaps)
    mean = sum(gaps) / len(gaps)
    assert 0.2 < mean < 0.3, f"mean gap {mean} s at 4/s"


def test_summary_gives_the_ttft_distribution_and_reported_hit_rates():
    reqs = [
        {"ttft_ms": 100.0, "prompt_tokens": 200, "cached_tokens": 0},
        {"ttft_ms": 50.0, "prompt_tokens": 220, "cached_tokens": 200},
        {"ttft_ms": 900.0, "prompt_tokens": 2000, "cached_tokens": 0},
        {"ttft_ms": 300.0, "prompt_tokens": 2010, "cached_tokens": 1980},
    ]
    s = prefix_gen.summarize(reqs)
    assert s["prompt_tokens_range"] == [200, 2010]
    rep = s["reported"]
    assert rep["token_hit_rate"] == pytest.approx(2180 / 4430)
    assert rep["request_hit_rate"] == 0.5
    assert s["ttft_ms_dist"]["max"] == 900.0
    assert s["ttft_ms_dist"]["p50"] == 200.0
