//! Two or more `report.json` files side by side: pass / fail / skip per group as a Markdown
//! table (`inferloop-qual compare out/qual/report.json out/qual-peer/report.json`), then the
//! cases that failed on any of them.

use std::path::Path;

use serde_json::Value;

use crate::case::Group;

/// One report, as read back.
#[derive(Debug, Clone)]
pub struct Column {
    /// The server's short name: `inferloopd`, `llama-server`, or what it called itself.
    pub label: String,
    pub report: Value,
}

impl Column {
    pub fn from_json(report: Value) -> Column {
        Column {
            label: label(&report),
            report,
        }
    }

    /// Reads `path`; the error names the file.
    pub fn load(path: &Path) -> Result<Column, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not a report.json: {e}", path.display()))?;
        if !v["groups"].is_array() || !v["cases"].is_array() {
            return Err(format!(
                "{} is not a report.json (no groups or cases)",
                path.display()
            ));
        }
        Ok(Column::from_json(v))
    }

    /// `pass / fail / skip` of `group` (`None`: the whole report).
    fn tally(&self, group: Option<Group>) -> String {
        let counts = match group {
            Some(g) => self.report["groups"]
                .as_array()
                .and_then(|gs| gs.iter().find(|x| x["group"] == g.name()))
                .cloned()
                .unwrap_or(Value::Null),
            None => self.report["totals"].clone(),
        };
        if counts.is_null() {
            return "not run".to_string();
        }
        let n = |k: &str| counts[k].as_u64().unwrap_or(0);
        format!("{} / {} / {}", n("passed"), n("failed"), n("skipped"))
    }

    fn failed(&self) -> Vec<(String, String)> {
        self.report["cases"]
            .as_array()
            .map(|cs| {
                cs.iter()
                    .filter(|c| c["status"] == "failed")
                    .map(|c| {
                        let text = |k: &str| c[k].as_str().unwrap_or_default().to_string();
                        let why = format!(
                            "expected {}, observed {}",
                            text("expected"),
                            text("observation")
                        );
                        (
                            text("id"),
                            crate::case::snippet(&why.replace(['\n', '|'], " "), 240),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The short name of the server a report is about (reports from before the server was
/// recorded are inferloopd's).
fn label(report: &Value) -> String {
    let server = &report["environment"]["server"];
    if server.is_null() || server["inferloopd"] == true {
        return "inferloopd".to_string();
    }
    let name = server["name"].as_str().unwrap_or("server");
    if name.contains("llama-server") {
        "llama-server".to_string()
    } else {
        name.to_string()
    }
}

/// The Markdown comparison of `columns`, group by group, then every failed case per column.
pub fn render(columns: &[Column]) -> String {
    let mut s = String::from("| group |");
    for c in columns {
        s.push_str(&format!(" {} pass / fail / skip |", c.label));
    }
    s.push_str("\n|---|");
    s.push_str(&"---|".repeat(columns.len()));
    s.push('\n');
    for g in Group::ALL {
        s.push_str(&format!("| {} ({}) |", g.name(), g.size()));
        for c in columns {
            s.push_str(&format!(" {} |", c.tally(Some(g))));
        }
        s.push('\n');
    }
    s.push_str("| **total** |");
    for c in columns {
        s.push_str(&format!(" **{}** |", c.tally(None)));
    }
    s.push('\n');
    for c in columns {
        let failed = c.failed();
        if failed.is_empty() {
            continue;
        }
        s.push_str(&format!("\nFailed on {} ({}):\n\n", c.label, failed.len()));
        for (id, why) in failed {
            s.push_str(&format!("- `{id}`: {why}\n"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn report(server: Value, api: [u64; 3], failed_case: Option<&str>) -> Value {
        let [p, f, sk] = api;
        json!({
            "totals": {"passed": p, "failed": f, "skipped": sk},
            "groups": [{"group": "api", "passed": p, "failed": f, "skipped": sk}],
            "environment": {"server": server},
            "cases": failed_case.map_or(vec![], |id| vec![json!({
                "id": id, "status": "failed", "expected": "404", "observation": "200 | ok"
            })]),
        })
    }

    #[test]
    fn comparison_puts_each_server_in_a_column_group_by_group() {
        let ours = Column::from_json(report(
            json!({"inferloopd": true, "name": "inferloopd 0.1.0"}),
            [40, 0, 0],
            None,
        ));
        let peer = Column::from_json(report(
            json!({"inferloopd": false, "name": "llama.cpp llama-server (b1-x)"}),
            [20, 3, 17],
            Some("api.route.unknown_404"),
        ));
        let md = render(&[ours, peer]);
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(
            lines[0],
            "| group | inferloopd pass / fail / skip | llama-server pass / fail / skip |"
        );
        assert_eq!(lines[1], "|---|---|---|");
        assert_eq!(lines[2], "| api (40) | 40 / 0 / 0 | 20 / 3 / 17 |");
        assert_eq!(lines[3], "| chat (60) | not run | not run |");
        assert!(md.contains("| **total** | **40 / 0 / 0** | **20 / 3 / 17** |"));
        // A pipe in an observation would break the table's neighbours; it is blanked.
        assert!(md.contains(
            "Failed on llama-server (1):\n\n- `api.route.unknown_404`: expected 404, observed 200   ok\n"
        ));
        assert!(!md.contains("Failed on inferloopd"));
    }

    #[test]
    fn reports_without_a_server_record_are_inferloopd() {
        assert_eq!(label(&json!({"environment": {}})), "inferloopd");
        assert_eq!(
            label(&json!({"environment": {"server": {"inferloopd": false, "name": "vllm"}}})),
            "vllm"
        );
    }

    #[test]
    fn a_file_that_is_not_a_report_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("x.json");
        std::fs::write(&p, "{}").expect("write");
        let e = Column::load(&p).expect_err("not a report");
        assert!(e.contains("x.json is not a report.json"), "{e}");
    }
}
