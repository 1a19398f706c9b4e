"""bench/prefix_gen.py without servers: the generated requests are reproducible, fit the
context, arrive at random, and the report's bands and hit rates add up."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import prefix  # noqa: E402
import prefix_gen  # noqa: E402


def args(*extra: str):
    return prefix.parse_args(["--workloads", "gen", "--servers", "inferloopd", *extra])


def plan(cfg, n_prompts: int) -> list[list[dict]]:
    """The messages each generated client sends, captured instead of sent."""
    sent: list[list[dict]] = []
    for client in prefix_gen.clients(cfg, n_prompts, prefix.system_prompt, prefix.CHARS_PER_TOKEN):
        client(sent.append)
    return sent


def test_gen_expands_to_one_workload_per_prompt_count_with_the_issues_targets():
    cfg = args("--slots", "4", "--gen-prompts", "4", "16")
    assert cfg.workloads == ["gen-p4", "gen-p16"]
    assert prefix.workload_target("gen-p4", 4) == {"median": 1.0}
    assert prefix.workload_target("gen-p16", 4) == {"median": 0.5}
    assert args("--slots", "2").workloads == ["gen-p2", "gen-p8"], "default: slots and 4x"


def test_requests_are_reproducible_draw_from_the_distinct_prompts_and_fit_the_context(monkeypatch):
    monkeypatch.setattr(prefix_gen.time, "sleep", lambda _s: None)
    cfg = args("--ctx", "4096", "--gen-requests", "24", "--gen-prompt-tokens", "100", "3000")
    first, again = plan(cfg, 3), plan(cfg, 3)
    assert first == again, "the same seed, the same requests"
    systems = {m[0]["content"] for m in first}
    assert 1 < len(systems) <= 3
    limit = 4096 * prefix.CHARS_PER_TOKEN
    assert all(len(m[0]["content"]) + len(m[1]["content"]) < limit for m in first)
    assert len({m[1]["content"] for m in first}) == 24, "every question its own"


def test_prompt_lengths_are_clamped_to_the_context(capsys):
    cfg = args("--ctx", "2048", "--gen-prompt-tokens", "100", "3000")
    lo, hi = cfg.gen_prompt_tokens
    assert lo == 100 and hi <= 2048 - 200 - cfg.max_tokens
    assert "clamped" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        args("--ctx", "256", "--gen-prompt-tokens", "500", "600")


def test_arrivals_are_spread_as_a_poisson_process(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(prefix_gen.time, "sleep", slept.append)
    cfg = args("--gen-requests", "400", "--gen-rate", "4", "--gen-prompt-tokens", "100", "120")
    plan(cfg, 1)
    gaps = [b - a for a, b in zip([0.0] + slept, slept)]
    assert all(g > 0 for g in gaps)
    mean = sum(gaps) / len(gaps)
    assert 0.2 < mean < 0.3, f"mean gap {mean} s at 4/s"


def test_summary_splits_ttft_by_band_and_counts_hits():
    reqs = [
        {"ttft_ms": 100.0, "prompt_tokens": 200, "cached_tokens": 0},
        {"ttft_ms": 50.0, "prompt_tokens": 220, "cached_tokens": 200},
        {"ttft_ms": 900.0, "prompt_tokens": 2000, "cached_tokens": 0},
        {"ttft_ms": 300.0, "prompt_tokens": 2010, "cached_tokens": 1980},
    ]
    s = prefix_gen.summarize(reqs)
    assert s["bands"]["0-500"] == {"n": 2, "ttft_ms_median": 75.0}
    assert s["bands"]["500-1500"]["n"] == 0
    assert s["bands"][">=1500"] == {"n": 2, "ttft_ms_median": 600.0}
    kv = s["tiers"]["kv"]
    assert kv["token_hit_rate"] == pytest.approx(2180 / 4430)
    assert kv["request_hit_rate"] == 0.5
    assert s["ttft_ms_dist"]["max"] == 900.0
    assert s["ttft_ms_dist"]["p50"] == 200.0
