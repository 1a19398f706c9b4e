#!/usr/bin/env python3
"""Copies test executables out of `cargo test --no-run --message-format=json` on stdin.

    pick-test-executables.py PACKAGE DEST [--lib-only NAME]

Every test executable of PACKAGE goes into the folder DEST; with --lib-only, only the
library's unit-test executable, copied to the file DEST/NAME. Fails when none matched, so a
renamed package or target cannot leave a bundle silently empty.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path


def package_name(package_id: str) -> str:
    # "path+file:///…/cuda-kernels#inferloop-kernels@0.1.0", or before cargo 1.77
    # "inferloop-kernels 0.1.0 (path+file:///…)".
    if "#" in package_id:
        return package_id.rsplit("#", 1)[1].split("@", 1)[0]
    return package_id.split(" ", 1)[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("package")
    p.add_argument("dest")
    p.add_argument("--lib-only", metavar="NAME", help="only the library's unit tests, as DEST/NAME")
    args = p.parse_args()
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    copied = 0
    for line in sys.stdin:
        m = json.loads(line)
        if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
            continue
        if package_name(m["package_id"]) != args.package:
            continue
        if args.lib_only:
            if "lib" not in m["target"]["kind"]:
                continue
            shutil.copy(m["executable"], dest / args.lib_only)
        else:
            shutil.copy(m["executable"], dest)
        copied += 1
    if not copied:
        print(f"pick-test-executables: no test executable of {args.package} in cargo's output", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
