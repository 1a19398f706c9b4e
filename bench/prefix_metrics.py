"""Prompt-cache hit rates by tier, read from the servers' Prometheus /metrics (bench/prefix.py).

Counters are cumulative, so a workload's figures are the difference of a snapshot taken after
the warm-up request and one taken when its last request has finished. Series a daemon does not
export yet are missing from both snapshots and print as "-": the bench runs against older
daemons too.

inferloopd (issue 34): `inferloop_prefix_cache_lookup_tokens_total` (prompt tokens looked
up), `inferloop_prefix_cache_hit_tokens_total` (tokens not prefilled thanks to reuse from
any tier) and `inferloop_prompt_cache_hit_tokens_total{tier="ram"|"disk"}` (the part of them
restored from that tier); resident KV cells ("slots") are the rest. Also restores, saves and
drops per tier and the tiers' bytes and entries (gauges: the value after the workload).
llama-server (with --metrics): `llamacpp:prompt_tokens_cached_total` of
`llamacpp:prompt_tokens_total` + cached; it does not split them by tier.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from typing import Any, Callable

# name{labels} value; labels as Prometheus writes them (no escaped quotes in ours).
SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)")
LABEL_RE = re.compile(r'(\w+)="([^"]*)"')
TIERS = ("ram", "disk")

Labels = tuple[tuple[str, str], ...]
Snapshot = dict[tuple[str, Labels], float]

OURS = {
    "lookup": "inferloop_prefix_cache_lookup_tokens_total",
    "hit": "inferloop_prefix_cache_hit_tokens_total",
    "tier_hit_tokens": "inferloop_prompt_cache_hit_tokens_total",
    "tier_hits": "inferloop_prompt_cache_hits_total",
    "tier_saves": "inferloop_prompt_cache_saves_total",
    "tier_dropped": "inferloop_prompt_cache_dropped_total",
    "tier_bytes": "inferloop_prompt_cache_bytes",
    "tier_entries": "inferloop_prompt_cache_entries",
}
PEER = {"computed": "llamacpp:prompt_tokens_total", "cached": "llamacpp:prompt_tokens_cached_total"}


def parse(text: str) -> Snapshot:
    """Prometheus text format -> {(name, sorted labels): value}; comments and junk skipped."""
    out: Snapshot = {}
    for line in text.splitlines():
        m = SAMPLE_RE.match(line.strip())
        if not m or line.startswith("#"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = tuple(sorted(LABEL_RE.findall(m.group(2) or "")))
        out[(m.group(1), labels)] = value
    return out


def scrape(base_url: str, timeout: float = 10.0) -> Snapshot | None:
    """The server's /metrics, or None when it has none (llama-server without --metrics)."""
    try:
        with urllib.request.urlopen(base_url + "/metrics", timeout=timeout) as r:
            return parse(r.read().decode("utf-8", errors="replace"))
    except (urllib.error.URLError, OSError):
        return None


def value(snap: Snapshot | None, name: str, **labels: str) -> float | None:
    """The sum of `name`'s samples whose labels include `labels`; None when the server does
    not export `name`, 0 when it does but with other labels only."""
    if snap is None:
        return None
    want = set(labels.items())
    family = [(set(ls), v) for (n, ls), v in snap.items() if n == name]
    if not family:
        return None
    return sum(v for ls, v in family if want <= ls)


def delta(before: Snapshot | None, after: Snapshot | None, name: str, **labels: str) -> float | None:
    a = value(after, name, **labels)
    if a is None:
        return None
    return a - (value(before, name, **labels) or 0.0)


def frac(part: float | None, whole: float | None) -> float | None:
    return part / whole if part is not None and whole else None


def ours_tiers(before: Snapshot | None, after: Snapshot | None) -> dict[str, Any]:
    """inferloopd's figures for one workload: token hit rates by tier and per-tier counts."""
    # prometheus-client exports a labelled counter only once it has counted: a daemon with
    # the tiers (its entries gauge is always there) has counted 0 where one is missing.
    tiered = value(after, OURS["tier_entries"]) is not None

    def counted(name: str, tier: str) -> float | None:
        d = delta(before, after, OURS[name], tier=tier)
        return 0.0 if d is None and tiered else d

    lookup = delta(before, after, OURS["lookup"])
    hit = delta(before, after, OURS["hit"])
    tier_tokens = {t: counted("tier_hit_tokens", t) for t in TIERS}
    slots = None
    if hit is not None and all(v is not None for v in tier_tokens.values()):
        slots = hit - sum(tier_tokens.values())  # type: ignore[arg-type]
    return {
        "lookup_tokens": lookup,
        "hit_tokens": hit,
        "hit_rate": {"all": frac(hit, lookup), "slots": frac(slots, lookup),
                     **{t: frac(tier_tokens[t], lookup) for t in TIERS}},
        "hit_tokens_by_tier": {"slots": slots, **tier_tokens},
        "restores": {t: counted("tier_hits", t) for t in TIERS},
        "saves": {t: counted("tier_saves", t) for t in TIERS},
        "dropped": {t: counted("tier_dropped", t) for t in TIERS},
        "bytes": {t: value(after, OURS["tier_bytes"], tier=t) for t in TIERS},
        "entries": {t: value(after, OURS["tier_entries"], tier=t) for t in TIERS},
    }


def peer_tiers(before: Snapshot | None, after: Snapshot | None) -> dict[str, Any]:
    """llama-server's figures: reused tokens of those looked up, no split by tier."""
    computed = delta(before, after, PEER["computed"])
    cached = delta(before, after, PEER["cached"])
    lookup = computed + cached if computed is not None and cached is not None else None
    return {"lookup_tokens": lookup, "hit_tokens": cached,
            "hit_rate": {"all": frac(cached, lookup), "slots": None, "ram": None, "disk": None}}


def tiers(server: str, before: Snapshot | None, after: Snapshot | None) -> dict[str, Any]:
    return (ours_tiers if server == "inferloopd" else peer_tiers)(before, after)


def print_rows(rows: list, widths: tuple[int, ...] | list[int]) -> None:
    """A text table: each column at least its width, and as wide as its widest cell."""
    n = max(map(len, rows))
    cols = [max([widths[i] if i < len(widths) else 0]
                + [len(r[i]) for r in rows if i < len(r)]) for i in range(n)]
    for row in rows:
        print("  ".join(c.ljust(wd) for c, wd in zip(row, cols)).rstrip())


def pair(d: dict[str, Any] | None, fmt: Callable[..., str]) -> str:
    """ram/disk counts as "r/d"; "-" when neither exists."""
    if not d or all(d.get(t) is None for t in TIERS):
        return "-"
    return "/".join(fmt(d.get(t), 0) for t in TIERS)


def print_report(workloads: dict[str, Any], fmt: Callable[..., str]) -> None:
    """One row per (workload, server) that has /metrics figures."""
    rows = [("workload", "server", "looked up", "hit", "slots", "ram", "disk",
             "restores r/d", "saves r/d", "dropped r/d", "MiB r/d", "entries r/d")]
    for name, w in workloads.items():
        for server, run in w["runs"].items():
            t = run.get("tiers")
            if not t or run.get("reused_from"):
                continue
            rate = t["hit_rate"]
            mib = {k: (v / 2**20 if v is not None else None) for k, v in (t.get("bytes") or {}).items()}
            rows.append((name, server, fmt(t["lookup_tokens"], 0),
                         *(fmt(rate[k], 2) for k in ("all", "slots", "ram", "disk")),
                         pair(t.get("restores"), fmt), pair(t.get("saves"), fmt),
                         pair(t.get("dropped"), fmt), pair(mib, fmt), pair(t.get("entries"), fmt)))
    if len(rows) == 1:
        return
    print("Prompt-cache hits by tier (from /metrics; fractions of the prompt tokens looked up; "
          "slots = resident KV; r/d = RAM/disk tier; '-' = not exported)")
    widths = (18, 13, 10, 5, 6, 5, 5, 13, 10, 12, 10, 0)
    print_rows(rows, widths)
    print()
