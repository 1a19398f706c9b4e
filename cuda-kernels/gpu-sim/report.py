"""gpu-sim-bench's table: each run's result.json against the copy kernel's bandwidth.

usage: report.py PLAN OUT  ->  OUT/bench.json, OUT/bench.md, the table on stdout;
exits 1 when a run failed or its result check did not pass.
"""

import json
import sys
from pathlib import Path


def main() -> int:
    plan, out = Path(sys.argv[1]), Path(sys.argv[2])
    rows, failed, copy = [], [], None
    for line in plan.read_text().splitlines():
        f = line.split()
        name, kernel = f[0], f[1]
        res_path = out / "runs" / name / "result.json"
        res = json.loads(res_path.read_text()) if res_path.exists() else {"check": "no result"}
        if res.get("check") != "ok" or res.get("rc", 1) != 0:
            failed.append(f"{name}: check {res.get('check')}, rc {res.get('rc')} "
                          f"(log: {out / 'runs' / name / 'sim.log'})")
        if kernel == "copy":
            copy = res
            continue
        _, _, model, label, full_rows, sim_rows, k, batch = f
        rows.append({
            "kernel": kernel,
            "model": model,
            "matrix": label,
            "rows": int(full_rows),
            "rows_simulated": int(sim_rows),
            "k": int(k),
            "batch": int(batch),
            "bytes": res.get("bytes"),
            "seconds": res.get("seconds"),
            "seconds_with_launch": res.get("seconds_with_launch"),
            "gb_per_s": res.get("gb_per_s"),
            "cycles": res.get("cycles"),
            "thread_insn": res.get("thread_insn"),
            "grid": res.get("grid"),
            "block": res.get("block"),
            "check": res.get("check"),
            "sim_wall_s": res.get("sim_wall_s"),
        })
    copy_bw = (copy or {}).get("gb_per_s")
    copy_bw_launch = (copy or {}).get("bytes", 0) / copy["seconds_with_launch"] / 1e9 \
        if (copy or {}).get("seconds_with_launch") else None
    for r in rows:
        r["ratio"] = (r["gb_per_s"] / copy_bw) if (copy_bw and r["gb_per_s"]) else None
        r["ratio_with_launch"] = (
            r["bytes"] / r["seconds_with_launch"] / 1e9 / copy_bw_launch
            if (copy_bw_launch and r.get("seconds_with_launch")) else None)

    doc = {
        "config": "orin-nx (GPGPU-Sim 4.2, from SM86_RTX3070: 8 SMs at 918 MHz, "
                  "8 x 16-bit channels at 1600 MHz = 102.4 GB/s, 2 MB L2, cold L2)",
        "copy": {k: (copy or {}).get(k) for k in
                 ("bytes", "seconds", "seconds_with_launch", "gb_per_s", "cycles",
                  "sim_wall_s", "check")},
        "seconds": "simulated kernel time without the simulator's fixed launch latency "
                   "(gpgpu_kernel_launch_latency, 5000 cycles); seconds_with_launch has it",
        "rows": rows,
    }
    (out / "bench.json").write_text(json.dumps(doc, indent=1) + "\n")

    def fmt(v, spec):
        return format(v, spec) if isinstance(v, (int, float)) else "-"

    lines = [
        f"copy (float4, block 256): {fmt((copy or {}).get('bytes'), '.0f')} B in "
        f"{fmt(1e6 * ((copy or {}).get('seconds') or 0), '.1f')} us = "
        f"{fmt(copy_bw, '.1f')} GB/s (simulated; 102.4 GB/s peak)",
        "",
        "| kernel | model | matrix | rows (simulated) | k | batch | bytes | simulated us "
        "| GB/s | ratio to copy | ratio with launch | sim wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        shrunk = f"{r['rows']} ({r['rows_simulated']})" if r["rows_simulated"] != r["rows"] \
            else str(r["rows"])
        lines.append(
            f"| {r['kernel']} | {r['model']} | {r['matrix']} | {shrunk} | {r['k']} | "
            f"{r['batch']} | {fmt(r['bytes'], '.0f')} | {fmt(1e6 * (r['seconds'] or 0), '.1f')} "
            f"| {fmt(r['gb_per_s'], '.1f')} | {fmt(r['ratio'], '.3f')} "
            f"| {fmt(r['ratio_with_launch'], '.3f')} | {r['sim_wall_s']} |")
    lines += ["", "simulated us and GB/s leave out the simulator's fixed 5.4 us launch latency "
              "(back-to-back launches overlap it on a GPU); 'ratio with launch' keeps it."]
    if any(r["rows_simulated"] != r["rows"] for r in rows):
        lines += ["", "rows (simulated): the matrix kept its k and lost rows so that one run "
                  "stays within MAX_SIM_BYTES; the ratio is that of the simulated rows."]
    (out / "bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    for f in failed:
        print(f"gpu-sim-bench: FAILED {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
