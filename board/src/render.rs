//! The detection as human text, for `inferloopd board`.

use std::fmt::Write as _;

use crate::Detection;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Renders the detected board, why it was chosen and what its profile says.
pub fn render_detection(d: &Detection) -> String {
    let p = &d.profile;
    let mut out = String::new();
    let mut row = |label: &str, value: String| {
        let _ = writeln!(out, "{:<13}{value}", format!("{label}:"));
    };
    row("board", format!("{} ({})", p.name, p.description));
    row("why", d.reason.to_string());
    if let Some(model) = &d.model {
        row("model", model.clone());
    }
    if !d.compatible.is_empty() {
        row("compatible", d.compatible.join(", "));
    }
    let host_cpus = d
        .host
        .cpus_online
        .map(|n| format!("{n} online"))
        .unwrap_or_else(|| "unknown online".into());
    row(
        "cpu",
        match p.cpu_cores {
            Some(cores) => format!("{cores} cores ({host_cpus})"),
            None => host_cpus,
        },
    );
    let mut memory = Vec::new();
    if let Some(bytes) = p.dram_bytes {
        memory.push(format!("{:.1} GiB", bytes as f64 / GIB));
    }
    if let Some(bytes) = d.host.mem_total_bytes {
        memory.push(format!("{:.1} GiB visible to Linux", bytes as f64 / GIB));
    }
    if p.unified_memory {
        memory.push("unified with the GPU".into());
    }
    if let Some(bw) = p.dram_bandwidth_gb_s {
        memory.push(format!("{bw} GB/s theoretical"));
    }
    row(
        "memory",
        if memory.is_empty() {
            "unknown".into()
        } else {
            memory.join(", ")
        },
    );
    if let Some(gpu) = &p.gpu {
        let mut parts = Vec::new();
        if let Some(sms) = gpu.sm_count {
            parts.push(format!("{sms} SMs"));
        }
        if let Some(cc) = gpu.compute_capability {
            parts.push(cc.sm_name());
        }
        if let Some(mhz) = gpu.max_clock_mhz {
            parts.push(format!("max {mhz} MHz"));
        }
        row("gpu", parts.join(", "));
    }
    if let Some(gpu) = &d.gpu {
        let mut parts = vec![format!("{} (x{})", gpu.name, gpu.count)];
        if let Some(cc) = gpu.compute_capability {
            parts.push(cc.sm_name());
        }
        if let Some(bytes) = gpu.memory_bytes {
            parts.push(format!("{:.1} GiB", bytes as f64 / GIB));
        }
        row("nvml gpu", parts.join(", "));
    }
    if !p.power_modes.is_empty() {
        let modes: Vec<String> = p
            .power_modes
            .iter()
            .map(|m| {
                let default = if p.default_power_mode == Some(m.id) {
                    " (default)"
                } else {
                    ""
                };
                format!("{} {}{default}", m.id, m.name)
            })
            .collect();
        row("power modes", modes.join(", "));
    }
    for (i, zone) in p.thermal_zones.iter().enumerate() {
        row(
            if i == 0 { "thermal" } else { "" },
            format!(
                "{}: throttle {:.1} °C, critical {:.1} °C",
                zone.name, zone.throttle_c, zone.critical_c
            ),
        );
    }
    let floors = match &p.perf_floors {
        Some(f) if f.ttft_ms_max.is_some() || f.decode_tok_s_min.is_some() => {
            let mut parts = Vec::new();
            if let Some(ms) = f.ttft_ms_max {
                parts.push(format!("TTFT <= {ms} ms"));
            }
            if let Some(tps) = f.decode_tok_s_min {
                parts.push(format!("decode >= {tps} tok/s"));
            }
            parts.join(", ")
        }
        _ => "none (qualification records measured values)".into(),
    };
    row("perf floors", floors);
    for (i, note) in d.notes.iter().enumerate() {
        row(if i == 0 { "notes" } else { "" }, note.clone());
    }
    out
}
