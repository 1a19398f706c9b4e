#!/usr/bin/env bash
# Checks every relative Markdown link in README.md, ARCHITECTURE.md, CHANGELOG.md and docs/:
# the file must exist and a `#anchor` must name a heading of it (GitHub's slugs). Prints each
# broken link and exits 1 if there is one. Not wired into `make test`; run it after editing docs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python3 - README.md ARCHITECTURE.md CHANGELOG.md docs/*.md <<'PY'
import os, re, sys

def slugs(path):
    out, seen, fence = set(), {}, False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        if fence or not line.startswith("#"):
            continue
        text = line.lstrip("#").strip()
        s = re.sub(r"[^\w\- ]", "", text.lower().replace("`", "")).replace(" ", "-")
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out

link = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
bad = 0
for doc in sys.argv[1:]:
    fence = False
    for no, line in enumerate(open(doc, encoding="utf-8"), 1):
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        for target in link.findall(line):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
            if not os.path.exists(dest):
                print(f"{doc}:{no}: {target}: no such file {dest}")
                bad += 1
            elif anchor and dest.endswith(".md") and anchor not in slugs(dest):
                print(f"{doc}:{no}: {target}: no heading #{anchor} in {dest}")
                bad += 1
print(f"doc links: {bad} broken" if bad else "doc links: all resolve")
sys.exit(1 if bad else 0)
PY
