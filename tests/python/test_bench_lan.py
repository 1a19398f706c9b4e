"""bench/lan.py without daemons or a router: the workload generator, the /metrics and SSE
parsing, the hit-rate sums, and how the fault cases and the policy targets are judged."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import lan  # noqa: E402

R = lan.Result


# --- the workload --------------------------------------------------------------------------------


def test_system_prompts_are_deterministic_distinct_and_sized():
    a = lan.make_system_prompts(12, seed=32)
    assert a == lan.make_system_prompts(12, seed=32)
    assert a != lan.make_system_prompts(12, seed=33)
    assert len(set(a)) == 12
    for p in a:
        assert 230 <= len(p.split()) <= 420
    # distinct from the first words on, so no two prompts share a long prefix
    firsts = {" ".join(p.split()[:3]) for p in a}
    assert len(firsts) == 12


@pytest.mark.parametrize("n, lo, hi", [(0, 230, 420), (3, 10, 420), (3, 300, 200)])
def test_bad_prompt_sizes_are_refused(n, lo, hi):
    with pytest.raises(ValueError):
        lan.make_system_prompts(n, seed=1, min_words=lo, max_words=hi)


def test_schedule_is_seeded_and_in_range():
    s = lan.make_schedule(clients=6, requests=8, prompts=12, seed=5)
    assert s == lan.make_schedule(6, 8, 12, 5)
    assert len(s) == 6 and all(len(plan) == 8 for plan in s)
    assert all(0 <= p < 12 and 0 <= q < len(lan.QUESTIONS) for plan in s for p, q in plan)
    # over 48 draws from 12 prompts some must repeat: the workload has reuse to find
    assert len({p for plan in s for p, _ in plan}) < 48


def test_chat_body_streams_with_usage():
    body = lan.chat_body("sys", "q?", 16)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["max_tokens"] == 16


# --- parsing -------------------------------------------------------------------------------------

METRICS = """\
# HELP inferloop_prompt_tokens_total Prompt tokens.
# TYPE inferloop_prompt_tokens_total counter
inferloop_prompt_tokens_total 1200
inferloop_prefix_cache_lookup_tokens_total 1000
inferloop_prefix_cache_hit_tokens_total 400
inferloop_prompt_cache_hit_tokens_total{tier="ram"} 100
inferloop_prompt_cache_hit_tokens_total{tier="disk"} 50
inferloop_requests_total{route="/v1/chat/completions",code="200"} 7
inferloop_requests_total{route="/v1/chat/completions",code="429"} 2
garbage line without value x
"""


def test_parse_metrics_and_counters():
    m = lan.parse_metrics(METRICS)
    assert m["inferloop_prompt_tokens_total"] == 1200
    assert lan.chat_ok_count(m) == 7
    assert lan.cache_counters(m) == {"lookup": 1000, "hit": 400, "tier_hit": 150, "prompt": 1200}
    assert not any(k.startswith("#") for k in m)
    assert lan.chat_ok_count({}) == 0


def test_hit_rates_sum_over_boxes_and_survive_a_restart():
    before = [{"lookup": 100, "hit": 10, "tier_hit": 0},
              {"lookup": 500, "hit": 300, "tier_hit": 0}]
    # box 0 gained 900 looked up / 450 hit (50 of them restored from a tier); box 1 restarted
    # (its counters fell): it counts from zero
    after = [{"lookup": 1000, "hit": 460, "tier_hit": 50},
             {"lookup": 100, "hit": 50, "tier_hit": 50}]
    h = lan.hit_rates(before, after)
    assert h["lookup_tokens"] == 1000
    assert h["total"] == pytest.approx(500 / 1000)
    assert h["from_tiers"] == pytest.approx(100 / 1000)
    # restored tokens are inside the daemon's hit counter already: not added twice
    assert h["resident"] == pytest.approx(400 / 1000)


def test_hit_rates_without_traffic_are_none_not_zero():
    c = {"lookup": 5, "hit": 1, "tier_hit": 0}
    assert lan.hit_rates([c], [c])["total"] is None


def test_sse_parsing_skips_the_role_chunk():
    role = lan.sse_event('data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}')
    text = lan.sse_event('data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}')
    usage = lan.sse_event('data: {"choices":[],"usage":{"completion_tokens":3}}')
    assert lan.chunk_content(role) == ""
    assert lan.chunk_content(text) == "Hi"
    assert lan.chunk_content(usage) == ""
    assert lan.sse_event("data: [DONE]") == "DONE"
    assert lan.sse_event(": keep-alive") is None
    assert lan.sse_event("data: {not json") is None
    assert lan.chunk_content({"choices": [{"delta": {"content": None}}]}) == ""


@pytest.mark.parametrize("status, done, error, outcome", [
    (200, True, "", "ok"), (200, False, "stream ended without [DONE]", "failed"),
    (429, False, "busy", "refused"), (503, False, "draining", "refused"),
    (500, False, "boom", "failed"), (None, False, "ConnectionRefusedError", "failed"),
    (200, True, "error chunk", "failed"),
])
def test_classify(status, done, error, outcome):
    assert lan.classify(status, done, error) == outcome


def test_percentile_and_summary():
    assert lan.percentile([], 50) is None
    assert lan.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert lan.percentile([0.0, 10.0], 95) == pytest.approx(9.5)
    rs = [R(0, 1, "ok", 200, 0.2, 10), R(0, 2, "ok", 200, 0.4, 6), R(0, 1, "refused", 429),
          R(0, 1, "failed", None, error="x")]
    s = lan.summarize(rs, wall_s=2.0)
    assert (s["ok"], s["refused"], s["failed"]) == (2, 1, 1)
    assert s["ttft_median_s"] == pytest.approx(0.3)
    assert s["requests_per_s"] == 1.0 and s["completion_tokens_per_s"] == 8.0


# --- judging -------------------------------------------------------------------------------------


def test_kill_passes_with_errors_up_to_in_flight_and_none_late():
    rs = [R(8, 10.2, "failed"), R(9, 10.5, "failed"), R(9, 12, "ok"), R(15.5, 17, "ok"), R(1, 9, "failed")]
    j = lan.judge_kill(rs, t_kill=10, in_flight=2, grace_s=5, t_end=20)
    assert j["errors"] == 2 and j["errors_after_grace"] == 0 and j["pass"]
    assert j["requests_ended_after_grace"] == 1  # the error before the kill is not counted


def test_kill_fails_on_more_errors_than_in_flight():
    rs = [R(9, 10.1, "failed"), R(9, 10.2, "failed"), R(10, 11, "refused")]
    assert not lan.judge_kill(rs, 10, in_flight=2, grace_s=5, t_end=20)["pass"]


def test_kill_fails_on_an_error_after_the_grace():
    rs = [R(14, 15.5, "failed")]
    j = lan.judge_kill(rs, 10, in_flight=3, grace_s=5, t_end=20)
    assert j["errors_after_grace"] == 1 and not j["pass"]
    # an error after the restart belongs to the rejoin, not to the kill
    assert lan.judge_kill([R(19, 21, "failed")], 10, 3, 5, 20)["pass"]


def test_rejoin():
    assert lan.judge_rejoin(10.0, 12.5, 5.0) == {"ready_to_work_s": 2.5, "target_s": 5.0, "pass": True}
    assert not lan.judge_rejoin(10.0, 16.0, 5.0)["pass"]
    assert not lan.judge_rejoin(10.0, None, 5.0)["pass"]
    assert not lan.judge_rejoin(None, None, 5.0)["pass"]


def test_thermal():
    assert lan.judge_thermal(0, 0)["pass"]
    assert not lan.judge_thermal(1, 0)["pass"]
    assert not lan.judge_thermal(0, 2)["pass"]
    assert not lan.judge_thermal(None, 0)["pass"]  # never saw the 503: no evidence, no pass


def test_drain():
    rs = [R(0, 4, "ok"), R(6, 9, "ok"), R(11, 12, "ok")]
    j = lan.judge_drain(rs, t_term=5, t_end=10)
    assert j == {"requests": 1, "failed": 0, "pass": True}
    assert not lan.judge_drain(rs + [R(7, 8, "refused")], 5, 10)["pass"]


def row(ttft, hit):
    return {"ttft_median_s": ttft, "hit_rate": {"total": hit}}


def test_policy_targets():
    t = lan.judge_policies({"round_robin": row(1.0, 0.2), "cache_aware": row(0.4, 0.5)})
    ca = t["cache_aware"]
    assert ca["ttft_ratio_vs_round_robin"] == pytest.approx(0.4) and ca["ttft_pass"]
    assert ca["hit_ratio_vs_round_robin"] == pytest.approx(2.5) and ca["hit_pass"]
    t = lan.judge_policies({"round_robin": row(1.0, 0.3), "cache_aware": row(0.6, 0.5)})
    assert not t["cache_aware"]["ttft_pass"] and not t["cache_aware"]["hit_pass"]


def test_policy_targets_with_missing_data_fail_or_are_absent():
    assert lan.judge_policies({"cache_aware": row(0.1, 0.9)}) == {}
    t = lan.judge_policies({"round_robin": row(None, 0.0), "cache_aware": row(0.2, 0.4)})
    assert not t["cache_aware"]["ttft_pass"]
    assert t["cache_aware"]["hit_ratio_vs_round_robin"] == math.inf and t["cache_aware"]["hit_pass"]


def test_verdict_smoke_reports_but_does_not_judge_targets():
    report = {
        "policies": {"cache_aware": {"faults": {"kill": {"pass": True, "errors": 1},
                                                "drain": {"pass": True, "failed": 0}}}},
        "targets": {"cache_aware": {"ttft_pass": False, "hit_pass": False,
                                    "ttft_ratio_vs_round_robin": 0.9, "hit_ratio_vs_round_robin": 1.1}},
    }
    lines, ok = lan.verdict_lines(report, smoke=True)
    assert ok and any(line.startswith("info") for line in lines)
    lines, ok = lan.verdict_lines(report, smoke=False)
    assert not ok and sum(line.startswith("FAIL") for line in lines) == 2
    report["policies"]["cache_aware"]["faults"]["drain"]["pass"] = False
    assert not lan.verdict_lines(report, smoke=True)[1]


@pytest.mark.parametrize("argv", [["--faults", "kill,explode"], ["--boxes", "1"],
                                  ["--policies", "round_robin", "--fault-policy", "cache_aware"],
                                  ["--policies", "least_tokens"]])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit):
        lan.parse_args(argv)


def test_defaults():
    a = lan.parse_args([])
    assert a.boxes == 3 and a.policies == list(lan.POLICIES) and a.fault_policy == "cache_aware"
    assert a.faults == list(lan.FAULTS)
    assert lan.parse_args(["--faults", "none"]).faults == []


def test_the_hit_ceiling_counts_each_prompts_first_request_as_a_miss():
    schedule = [[(0, 0), (1, 0)], [(0, 1), (1, 1)]]
    c = lan.hit_ceiling(schedule, 0.25)
    assert c["ceiling"] == 0.5 and c["max_ratio_vs_round_robin"] == 2.0
    assert lan.hit_ceiling(schedule, None)["max_ratio_vs_round_robin"] is None
    assert lan.hit_ceiling([], 0.3)["ceiling"] == 0.0


def test_router_kv_lookups_sums_the_lookups_by_result(monkeypatch):
    text = ('vllm_router_kv_placement_lookups_total{result="hit"} 3\n'
            'vllm_router_kv_placement_lookups_total{result="miss"} 2\n'
            'vllm_router_other_total 9\n')
    monkeypatch.setattr(lan, "http_get", lambda url, timeout=2.0: (200, text))
    assert lan.router_kv_lookups(1) == {"hit": 3.0, "miss": 2.0}
    monkeypatch.setattr(lan, "http_get", lambda url, timeout=2.0: (None, ""))
    assert lan.router_kv_lookups(1) == {}


def test_repeat_ttft_counts_only_requests_sent_after_their_prompt_was_answered():
    R = lan.Result
    results = [R(start=0.0, end=2.0, outcome="ok", ttft=1.5, prompt=0),
               R(start=0.5, end=2.5, outcome="ok", ttft=1.9, prompt=0),   # before 0's answer
               R(start=2.1, end=2.4, outcome="ok", ttft=0.2, prompt=0),   # a repeat
               R(start=3.0, end=3.3, outcome="ok", ttft=0.4, prompt=0),   # a repeat
               R(start=1.0, end=4.0, outcome="ok", ttft=2.0, prompt=1),   # 1's first
               R(start=4.5, end=4.6, outcome="failed", prompt=1)]
    assert lan.repeat_ttft_median(results) == pytest.approx(0.3)
    assert lan.repeat_ttft_median(results[:1]) is None


# --- the rejoin probes ---------------------------------------------------------------------------


def test_rejoin_probes_are_one_token_requests_with_distinct_prompts_until_stopped():
    import http.server
    import json
    import threading
    import time

    bodies = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            n = int(self.headers.get("Content-Length", 0))
            bodies.append((self.path, json.loads(self.rfile.read(n))))
            payload = b"data: [DONE]\n\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        probes = lan.Probes(server.server_address[1], 0.05, 5.0)
        probes.start()
        time.sleep(0.4)
        probes.stop()
        time.sleep(0.2)
        sent = len(bodies)
        time.sleep(0.2)
        assert len(bodies) == sent, "no probe after stop()"
    finally:
        server.shutdown()
    assert sent >= 4, sent
    assert all(path == lan.CHAT_ROUTE and b["max_tokens"] == 1 for path, b in bodies)
    systems = [b["messages"][0]["content"] for _, b in bodies]
    assert len(set(systems)) == len(systems), "each probe has its own system prompt"
