"""bench/speed.py without a model: the workloads are reproducible and of the sizes the issue
asks for, the configurations are chosen and started as documented (a server that refuses to
start is reported, not fatal), and the ratios, targets, acceptance and same-text counts come
out of the measured figures as the report says."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import speed  # noqa: E402
import speed_workloads  # noqa: E402


def tokens(text: str) -> float:
    return len(text) / speed_workloads.CHARS_PER_TOKEN


def text(messages: list[dict]) -> str:
    return "\n".join(m["content"] for m in messages)


# --- workloads -----------------------------------------------------------------------------


def test_workloads_are_reproducible_and_every_prompt_is_its_own():
    for w in speed_workloads.WORKLOADS:
        first = speed_workloads.prompts(w, 6, seed=1)
        assert first == speed_workloads.prompts(w, 6, seed=1), w
        assert len(first) == 6 and len({text(m) for m in first}) == 6, f"{w}: a prompt repeated"
        assert all(m[-1]["role"] == "user" for m in first)
    assert speed_workloads.prompts("grounded", 4, 1) != speed_workloads.prompts("grounded", 4, 2)


def test_grounded_handbooks_spread_from_a_few_hundred_to_about_1500_tokens_and_ask_for_a_quote():
    requests = speed_workloads.prompts("grounded", 6, seed=3)
    sizes = [tokens(text(m)) for m in requests]
    assert sizes == sorted(sizes), "lengths spread evenly, shortest first"
    assert 250 <= sizes[0] <= 450 and 1400 <= sizes[-1] <= 1700, sizes
    for system, ask in requests:
        assert system["role"] == "system", "the handbook is the context, as RAG sends it"
        titles = [p.split("\n", 1)[0] for p in system["content"].split("\n\n")[2:]]
        named = [t for t in titles if f'"{t}"' in ask["content"]
                 or f"about {t.split(' (')[0].lower()}?" in ask["content"]]
        assert named, f"the question names a section the handbook has: {ask['content']}"


def test_code_edits_return_whole_functions_of_20_to_60_lines_with_one_change():
    for lang, source, changes in speed_workloads.FUNCTIONS:
        assert 20 <= source.count("\n") <= 60, f"{lang}: {source.count(chr(10))} lines"
        assert len(changes) >= 1
    requests = speed_workloads.prompts("code", 2 * len(speed_workloads.FUNCTIONS), seed=1)
    for i, [m] in enumerate(requests):
        lang, source, changes = speed_workloads.FUNCTIONS[i % len(speed_workloads.FUNCTIONS)]
        assert source in m["content"], "the function verbatim, so the answer can copy it"
        assert changes[i // len(speed_workloads.FUNCTIONS) % len(changes)] in m["content"]


def test_chat_questions_vary_in_length_and_share_no_document():
    requests = speed_workloads.prompts("chat", 6, seed=1)
    assert all(len(m) == 1 for m in requests), "no system message: the template's default"
    assert len({len(text(m)) for m in requests}) > 3
    assert max(tokens(text(m)) for m in requests) < 40


# --- configurations ------------------------------------------------------------------------


def test_draft_configurations_run_only_with_a_draft_model_and_it_makes_q8_0_the_main_model():
    plain = speed.parse_args([])
    assert plain.configs == ["ours-off", "ours-ngram", "ours-ngram-q8kv", "peer-off",
                             "peer-ngram-simple", "peer-ngram-map-k", "peer-q8kv"]
    assert Path(plain.model) == speed.DEFAULT_MODEL
    drafted = speed.parse_args(["--draft-model", "d.gguf"])
    assert "ours-draft" in drafted.configs and "peer-draft" in drafted.configs
    assert Path(drafted.model) == speed.DRAFT_MAIN_MODEL
    assert speed.parse_args(["--draft-model", "d.gguf", "--model", "m.gguf"]).model == "m.gguf"
    with pytest.raises(SystemExit):
        speed.parse_args(["--configs", "ours-draft"])
    with pytest.raises(SystemExit):
        speed.parse_args(["--configs", "ours-fast"])


def test_a_second_build_runs_as_the_ab_configuration_only_when_given():
    ab = speed.parse_args(["--ab-daemon", "/tmp/other-inferloopd", "--configs", "ours-ngram",
                           "ours-ngram-ab"])
    assert ab.configs == ["ours-ngram", "ours-ngram-ab"]
    argv, _, _ = speed.server_argv("ours-ngram-ab", ab)
    assert argv[0] == "/tmp/other-inferloopd" and argv[argv.index("--spec") + 1] == "ngram"
    assert speed.server_argv("ours-ngram", ab)[0][0] == ab.daemon
    assert "ours-ngram-ab" not in speed.parse_args([]).configs
    with pytest.raises(SystemExit):
        speed.parse_args(["--configs", "ours-ngram-ab"])


def test_quick_is_smaller_and_explicit_values_win():
    q = speed.parse_args(["--quick"])
    full = speed.parse_args([])
    assert (q.prompts, q.rounds, q.max_tokens) == (2, 1, 64)
    assert (full.prompts, full.rounds, full.max_tokens) == (6, 2, 256)
    assert speed.parse_args(["--quick", "--max-tokens", "100"]).max_tokens == 100
    assert speed.parse_args(["--configs", "peer-off,ours-off"]).configs == ["ours-off", "peer-off"]


def test_both_servers_get_the_same_model_threads_slots_and_context():
    args = speed.parse_args(["--draft-model", "draft.gguf", "--threads", "3", "--ctx", "1024"])
    ours, _, ready = speed.server_argv("ours-draft", args)
    assert ready == "/readyz"
    assert ours[ours.index("--model") + 1] == args.model
    assert ours[ours.index("--draft-model") + 1] == "draft.gguf"
    assert ours[ours.index("--threads") + 1] == "3" and ours[ours.index("--slots") + 1] == "4"
    assert ours[ours.index("--ctx") + 1] == "1024"
    peer, url, ready = speed.server_argv("peer-draft", args)
    assert ready == "/health" and url.startswith("http://127.0.0.1:")
    assert peer[peer.index("-m") + 1] == args.model
    assert peer[peer.index("--model-draft") + 1] == "draft.gguf"
    assert peer[peer.index("-t") + 1] == "3" and peer[peer.index("-np") + 1] == "4"
    assert peer[peer.index("-c") + 1] == str(4 * 1024), "llama-server's -c is shared by its slots"
    assert "--no-cache-prompt" in peer and "--prefix-cache" in ours, "every request a full prefill"
    q8, _, _ = speed.server_argv("peer-q8kv", args)
    assert q8[q8.index("-ctk") + 1] == "q8_0" and q8[q8.index("-ctv") + 1] == "q8_0"


def test_a_server_that_refuses_to_start_is_reported_unavailable(tmp_path):
    refuser = tmp_path / "inferloopd"
    refuser.write_text("#!/bin/sh\necho 'error: --spec draft is not implemented yet' >&2\nexit 2\n")
    refuser.chmod(refuser.stat().st_mode | stat.S_IEXEC)
    args = speed.parse_args(["--daemon", str(refuser), "--draft-model", "d.gguf",
                             "--ready-timeout", "20"])
    srv = speed.Server("ours-draft", args, tmp_path)
    run = srv.out
    assert run["status"] == "unavailable" and not srv.ok
    assert "not implemented" in run["reason"]
    assert run["workloads"] == {}
    rows = speed.config_rows({"ours-draft": run}, "grounded")
    assert rows[1][:2] == ("ours-draft", "unavailable")


def idle_server(name: str) -> speed.Server:
    """A Server as if started, without a process: run_workload only reads its name, URL and
    model id (the HTTP calls are replaced in the test)."""
    srv = object.__new__(speed.Server)
    srv.name, srv.base_url, srv.model_id, srv.proc = name, f"http://{name}", "m", None
    srv.out = {"server": "test", "workloads": {}, "status": "ok"}
    return srv


def test_turns_rotate_so_no_configuration_is_always_first():
    servers = [idle_server(n) for n in ("a", "b", "c")]
    orders = [[s.name for s in speed.turns(servers, k)] for k in range(4)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    servers[1].out["status"] = "error"
    assert [s.name for s in speed.turns(servers, 1)] == ["c", "a"], "a failed server gets no turn"


def test_each_prompt_goes_to_every_server_before_the_next_and_a_failing_one_drops_out(monkeypatch):
    sent: list[tuple[str, str]] = []

    def stream(base_url, model_id, messages, max_tokens):
        name, prompt = base_url.removeprefix("http://"), messages[-1]["content"]
        if name == "b" and len(sent) > 3:
            raise speed.BenchError("connection reset")
        sent.append((name, prompt))
        return {"ttft_ms": 10.0, "decode_tps": 50.0, "completion_tokens": 5, "prompt_tokens": 7,
                "finish_reason": "stop", "t_start": 0.0, "t_end": 1.0, "text": "t",
                "server_timings": {"predicted_per_second": 60.0}}

    monkeypatch.setattr(speed, "stream_messages", stream)
    monkeypatch.setattr(speed.prefix_metrics, "scrape", lambda url: {})
    monkeypatch.setattr(speed.speed_workloads, "prompts",
                        lambda w, n, seed: [[{"role": "user", "content": f"p{i}"}] for i in range(n)])
    args = speed.parse_args(["--prompts", "3", "--rounds", "1", "--streams", "2"])
    servers = [idle_server(n) for n in ("a", "b")]
    speed.run_workload(servers, "chat", args)
    # p0: a then b; p1: b then a; p2: a, then b fails; the round: a alone.
    assert sent[:4] == [("a", "p0"), ("b", "p0"), ("b", "p1"), ("a", "p1")]
    assert [n for n, _ in sent[4:]] == ["a", "a", "a"]
    assert servers[1].out["status"] == "error" and "connection reset" in servers[1].out["reason"]
    w = servers[0].out["workloads"]["chat"]
    assert [r["prompt"] for r in w["single"]["requests"]] == [0, 1, 2]
    assert w["single"]["decode_tps_median"] == 60.0, "the server's own decode rate"
    assert w["concurrent"]["aggregate_decode_tps_median"] == 120.0
    assert "chat" not in servers[1].out["workloads"]


# --- figures -------------------------------------------------------------------------------


def req(prompt: int, tps: float, text: str = "x", drafted: int | None = 0, accepted: int | None = 0,
        ttft: float = 100.0, tokens_: int = 50) -> dict:
    return {"prompt": prompt, "ttft_ms": ttft, "decode_tps": tps, "completion_tokens": tokens_,
            "prompt_tokens": 300 + prompt, "decode_tps_client": tps, "decode_from": "server",
            "draft_n": drafted,
            "draft_n_accepted": accepted, "text": text, "t_start": 0.0, "t_end": 2.0}


def run(single_tps: list[float], agg: float, drafted: int = 0, accepted: int = 0) -> dict:
    single = [req(i, t, drafted=drafted, accepted=accepted) for i, t in enumerate(single_tps)]
    streams = [req(i, agg / 2, drafted=drafted, accepted=accepted) for i in range(2)]
    rounds = [{"streams": streams, "aggregate_decode_tps": agg,
               "aggregate_tps": agg}]
    w = speed.summarize(single, rounds, {"drafted": None, "accepted": None})
    return {"status": "ok", "workloads": {"grounded": w, "chat": w}}


def test_record_takes_decode_rate_and_drafts_from_the_servers_timings():
    base = {"ttft_ms": 1.0, "decode_tps": 2.0, "completion_tokens": 3, "prompt_tokens": 4,
            "finish_reason": "stop", "t_start": 0.0, "t_end": 1.0, "text": "t"}
    peer = speed.record({**base, "server_timings": {"predicted_per_second": 9.0}}, 0)
    assert (peer["decode_tps"], peer["decode_from"], peer["decode_tps_client"]) == (9.0, "server", 2.0)
    assert (peer["draft_n"], peer["draft_n_accepted"]) == (0, 0), "llama-server omits zeros"
    ours = speed.record({**base, "server_timings": {"draft_n": 10, "draft_n_accepted": 7,
                                                    "predicted_per_second": 8.0}}, 1)
    assert (ours["draft_n"], ours["draft_n_accepted"]) == (10, 7)
    none = speed.record({**base, "server_timings": None}, 2)
    assert none["draft_n"] is None
    assert (none["decode_tps"], none["decode_from"]) == (2.0, "client")
    one = speed.record({**base, "completion_tokens": 1, "decode_tps": None,
                        "server_timings": {"predicted_per_second": 0.0}}, 3)
    assert one["decode_tps"] is None, "one token has no decode rate"
    assert speed.acceptance([ours, peer]) == {"drafted": 10, "accepted": 7, "rate": 0.7}
    assert speed.acceptance([peer])["rate"] is None, "nothing drafted: no rate"
    assert speed.acceptance([none])["drafted"] is None


def test_aggregate_is_the_sum_of_the_streams_decode_rates():
    streams = [req(0, 30.0), req(1, 20.0), req(2, None)]
    assert speed.aggregate_decode_tps(streams) == 50.0
    assert speed.round_tps(streams) == pytest.approx(150 / 2.0)


def test_summary_takes_medians_of_one_at_a_time_requests_and_sums_drafts_over_all():
    w = run([10.0, 30.0, 20.0], 80.0, drafted=10, accepted=4)["workloads"]["grounded"]
    assert w["single"]["decode_tps_median"] == 20.0
    assert w["single"]["prompt_tokens_range"] == [300, 302]
    assert w["concurrent"]["aggregate_decode_tps_median"] == 80.0
    assert w["acceptance"] == {"drafted": 50, "accepted": 20, "rate": 0.4}, "3 single + 2 streams"


def test_ratios_compare_against_the_faster_llama_server_ngram_mode_and_check_the_targets():
    configs = {
        "ours-off": run([20.0, 20.0], 60.0),
        "ours-ngram": run([33.0, 31.0], 90.0, drafted=10, accepted=8),
        "peer-off": run([22.0], 70.0),
        "peer-ngram-simple": run([25.0], 75.0),
        "peer-ngram-map-k": run([29.0], 65.0),
        "peer-q8kv": {"status": "error", "reason": "boom", "workloads": {}},
    }
    cmp = speed.compare(configs, "grounded")
    assert cmp["peer_best"] == "peer-ngram-map-k"
    r = cmp["ratios"]
    assert r["ours-ngram/ours-off"]["single"] == pytest.approx(32.0 / 20.0)
    assert r["ours-ngram/ours-off"]["aggregate"] == pytest.approx(1.5)
    assert r["ours-ngram/peer-best"]["single"] == pytest.approx(32.0 / 29.0)
    assert r["ours-ngram/peer-best"]["aggregate"] == pytest.approx(90.0 / 65.0)
    assert r["peer-best/peer-off"]["single"] == pytest.approx(29.0 / 22.0)
    assert "peer-q8kv/peer-off" not in r, "a configuration that failed gives no ratio"
    assert cmp["targets"]["ours-ngram/ours-off"]["pass"] is True
    assert cmp["targets"]["ours-ngram/peer-best"]["pass"] is True
    chat = speed.compare(configs, "chat")["targets"]
    assert list(chat) == ["ours-ngram/ours-off"] and chat["ours-ngram/ours-off"]["least"] == 0.97
    slow = speed.compare({**configs, "ours-ngram": run([25.0, 25.0], 60.0)}, "grounded")
    assert slow["targets"]["ours-ngram/ours-off"]["pass"] is False
    missing = speed.compare({"ours-ngram": configs["ours-ngram"]}, "grounded")
    assert missing["targets"]["ours-ngram/ours-off"]["pass"] is None
    rows = speed.ratio_rows(cmp)
    assert any(row[0] == "ours-ngram/peer-best (peer-ngram-map-k)" and row[3] == "PASS (>= 1.1)"
               for row in rows)


def test_same_text_counts_answers_by_prompt_and_says_where_they_part():
    a = [req(0, 1, "The cat sat."), req(1, 1, "A dog ran far."), req(2, 1, "Same")]
    b = [req(0, 1, "The cat sat."), req(1, 1, "A dog ran home."), req(2, 1, "Same")]
    got = speed.same_texts(a, b)
    assert (got["same"], got["of"]) == (2, 3)
    assert got["differ"] == [{"prompt": 1, "common_chars": 10, "chars": [14, 15]}]
    configs = {"ours-ngram": {"status": "ok", "workloads": {"code": {"single": {"requests": a}}}},
               "ours-off": {"status": "ok", "workloads": {"code": {"single": {"requests": b}}}},
               "peer-ngram-simple": {"status": "unavailable", "workloads": {}}}
    assert list(speed.text_identity(configs, ["code"])) == ["ours-ngram/ours-off"]


def test_report_prints_a_table_per_workload_the_ratios_and_what_did_not_run(capsys):
    configs = {"ours-off": run([20.0, 20.0], 60.0), "ours-ngram": run([31.0, 31.0], 90.0, 10, 8),
               "ours-draft": {"status": "unavailable", "reason": "--spec draft: not implemented",
                              "workloads": {}}}
    args = speed.parse_args(["--quick", "--workloads", "grounded", "chat"])
    result = {"config": speed.config(args), "configs": configs,
              "compare": {w: speed.compare(configs, w) for w in args.workloads},
              "same_text": speed.text_identity(configs, args.workloads),
              "prompt_tokens_differ": {}}
    speed.print_report(result)
    out = capsys.readouterr().out
    assert "## grounded, 300-301 prompt tokens" in out and "## chat" in out
    assert "ours-ngram/ours-off" in out and "PASS (>= 1.5)" in out and "PASS (>= 0.97)" in out
    assert "ours-ngram/ours-off: grounded 2/2, chat 2/2" in out
    assert "ours-draft: unavailable: --spec draft: not implemented" in out


def test_differing_prompt_token_counts_are_reported():
    a, b = run([20.0, 20.0], 60.0), run([20.0, 20.0], 60.0)
    assert speed.prompt_token_mismatch({"ours-off": a, "peer-off": b}, "chat") == {}
    for r in b["workloads"]["chat"]["single"]["requests"]:
        r["prompt_tokens"] -= 21
    b["workloads"] = {"chat": b["workloads"]["chat"]}
    odd = speed.prompt_token_mismatch({"ours-off": a, "peer-off": b}, "chat")
    assert odd == {"ours-off": [300, 301], "peer-off": [279, 280]}
