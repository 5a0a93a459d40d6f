//! Two runs side by side: per metric, the old and the new rsandbox/runc ratio and the change,
//! so that what a change costs (or saves) shows before it lands.
//!
//! Ratios, not times, are compared: both paths run interleaved on the same containerd in each
//! run, so a ratio carries over between machines and loads far better than a time does. A
//! quick run (3 samples) against a full baseline only shows a trend; the comparison is
//! informational and never fails a run.
//!
//! Metrics are matched by group and name with every number replaced (`50 pods × ...` of a
//! full run is `10 pods × ...` in a quick one).

use std::fmt::Write as _;

use crate::report::{Results, Row};

/// The name a metric is matched by: group and name, each run of digits (and decimal point)
/// replaced by `N`.
pub fn match_key(group: &str, name: &str) -> String {
    let mut out = String::with_capacity(group.len() + name.len() + 1);
    for part in [group, "\u{1f}", name] {
        let mut in_number = false;
        for c in part.chars() {
            if c.is_ascii_digit() || (in_number && c == '.') {
                if !in_number {
                    out.push('N');
                    in_number = true;
                }
            } else {
                in_number = false;
                out.push(c);
            }
        }
    }
    out
}

/// `new / old - 1` as a signed percentage, e.g. `-25.3%`; `–` when either is missing.
fn change(old: Option<f64>, new: Option<f64>) -> String {
    match (old, new) {
        (Some(o), Some(n)) if o > 0.0 => {
            let pct = (n / o - 1.0) * 100.0;
            if pct.abs() < 0.05 {
                "±0.0%".into()
            } else {
                format!("{pct:+.1}%")
            }
        }
        _ => "–".into(),
    }
}

fn ratio_cell(r: Option<f64>) -> String {
    r.map(|x| format!("{x:.2}×")).unwrap_or_else(|| "–".into())
}

/// "commit abc1234 (full, 2026-12-01T10:00:00Z)" of a run's metadata.
fn describe(res: &Results) -> String {
    let get = |k: &str| {
        res.meta
            .get(k)
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty())
            .unwrap_or("?")
            .to_string()
    };
    format!(
        "commit {} ({} run, {}, shim sha256 {})",
        get("commit"),
        get("mode"),
        get("date"),
        get("rsandbox_shim_sha256").get(..12).unwrap_or("?")
    )
}

/// The markdown comparison of `new` with `old`: one table per group of `new`, then the
/// metrics only `old` has.
pub fn markdown(old: &Results, new: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n### Compared with {}\n\nThis run: {}. Ratios are rsandbox/runc of the p50s \
         (below 1: rsandbox is faster or smaller); change = new ratio / old ratio − 1.",
        describe(old),
        describe(new)
    );
    let old_by_key: Vec<(String, &Row)> = old
        .rows
        .iter()
        .map(|r| (match_key(&r.group, &r.name), r))
        .collect();
    let find_old = |r: &Row| {
        let k = match_key(&r.group, &r.name);
        old_by_key.iter().find(|(ok, _)| *ok == k).map(|(_, o)| *o)
    };
    for g in new.groups() {
        let _ = writeln!(out, "\n#### {g}\n");
        let _ = writeln!(
            out,
            "| metric | unit | old rsandbox p50 | new rsandbox p50 | old rsandbox/runc | new rsandbox/runc | change |"
        );
        let _ = writeln!(out, "| --- | --- | ---: | ---: | ---: | ---: | ---: |");
        for r in new.rows.iter().filter(|r| r.group == g) {
            let o = find_old(r);
            let p50 = |row: Option<&Row>| {
                row.and_then(|x| x.samples[1].summary())
                    .map(|s| crate::report::fmt_value(s.p50, &r.unit))
                    .unwrap_or_else(|| "–".into())
            };
            let (old_ratio, new_ratio) = (o.and_then(Row::ratio_p50), r.ratio_p50());
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                r.name,
                r.unit,
                p50(o),
                p50(Some(r)),
                ratio_cell(old_ratio),
                ratio_cell(new_ratio),
                change(old_ratio, new_ratio)
            );
        }
    }
    let new_keys: Vec<String> = new
        .rows
        .iter()
        .map(|r| match_key(&r.group, &r.name))
        .collect();
    let only_old: Vec<&Row> = old_by_key
        .iter()
        .filter(|(k, _)| !new_keys.contains(k))
        .map(|(_, r)| *r)
        .collect();
    if !only_old.is_empty() {
        let _ = writeln!(out, "\nNot measured in this run (old ratio):\n");
        for r in only_old {
            let _ = writeln!(
                out,
                "- {}: {} ({})",
                r.group,
                r.name,
                ratio_cell(r.ratio_p50())
            );
        }
    }
    out
}

/// Reads a JSON file written by the bench.
pub fn load(path: &std::path::Path) -> Result<Results, String> {
    let raw = std::fs::read(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_slice(&raw).map_err(|e| format!("parse {}: {e}", path.display()))?;
    Results::from_json(&v).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_do_not_split_a_metric() {
        assert_eq!(
            match_key("Many pods", "50 pods × (RunPodSandbox), 10 in flight: wall"),
            match_key("Many pods", "10 pods × (RunPodSandbox), 10 in flight: wall")
        );
        assert_eq!(
            match_key("Density", "pods Ready (of 110)"),
            "Density\u{1f}pods Ready (of N)"
        );
        assert_ne!(
            match_key("Density", "PSS per pod: shim"),
            match_key("Density", "PSS per pod: pause")
        );
        // a version-like number is one number
        assert_eq!(match_key("g", "v1.2.3"), "g\u{1f}vN");
    }

    #[test]
    fn change_is_the_relative_change_of_the_ratio() {
        assert_eq!(change(Some(1.0), Some(0.75)), "-25.0%");
        assert_eq!(change(Some(0.5), Some(0.6)), "+20.0%");
        assert_eq!(change(Some(0.5), Some(0.5)), "±0.0%");
        assert_eq!(change(None, Some(0.5)), "–");
        assert_eq!(change(Some(0.0), Some(0.5)), "–");
    }

    fn run(commit: &str, pods: usize, calls: &[(f64, f64)]) -> Results {
        let mut r = Results::default();
        for &(runc, rsandbox) in calls {
            r.add("Per CRI call", "CreateContainer", "ms", 0, runc);
            r.add("Per CRI call", "CreateContainer", "ms", 1, rsandbox);
        }
        r.add("Many pods", &format!("{pods} pods: wall"), "s", 0, 4.0);
        r.add("Many pods", &format!("{pods} pods: wall"), "s", 1, 2.0);
        r.meta.insert("commit".into(), commit.into());
        r.meta.insert("mode".into(), "full".into());
        r
    }

    #[test]
    fn the_table_shows_both_ratios_and_the_change() {
        let old = run("old1", 50, &[(8.0, 12.0), (8.0, 12.0)]);
        let mut new = run("new1", 10, &[(8.0, 6.0)]);
        new.add("Per CRI call", "StartContainer", "ms", 0, 10.0);
        let md = markdown(&old, &new);
        assert!(md.contains("Compared with commit old1 (full run"), "{md}");
        assert!(
            md.contains("| CreateContainer | ms | 12.0 | 6.0 | 1.50× | 0.75× | -50.0% |"),
            "{md}"
        );
        // matched although the pod count differs
        assert!(
            md.contains("| 10 pods: wall | s | 2.00 | 2.00 | 0.50× | 0.50× | ±0.0% |"),
            "{md}"
        );
        // new metric: no old values
        assert!(
            md.contains("| StartContainer | ms | – | – | – | – | – |"),
            "{md}"
        );
    }

    #[test]
    fn metrics_only_the_old_run_has_are_listed() {
        let mut old = run("a", 50, &[(1.0, 1.0)]);
        old.add("Density", "PSS per pod: shim", "MiB", 0, 4.0);
        old.add("Density", "PSS per pod: shim", "MiB", 1, 1.0);
        let new = run("b", 50, &[(1.0, 1.0)]);
        let md = markdown(&old, &new);
        assert!(
            md.contains(
                "Not measured in this run (old ratio):\n\n- Density: PSS per pod: shim (0.25×)"
            ),
            "{md}"
        );
    }

    #[test]
    fn a_stored_run_reads_back_whole() {
        let mut r = run("c", 50, &[(8.0, 6.0), (9.0, 7.0)]);
        r.notes.push("a note".into());
        let back = Results::from_json(&r.json()).unwrap();
        assert_eq!(back.markdown(), r.markdown());
        assert_eq!(back.meta["commit"], "c");
        assert_eq!(back.rows[0].samples[1].0, vec![6.0, 7.0]);
        assert!(Results::from_json(&serde_json::json!({})).is_err());
        assert!(
            Results::from_json(&serde_json::json!({"rows": [{"group": "g", "metric": "m",
                "unit": "ms", "runc": {"samples": ["x"]}}]}))
            .is_err()
        );
    }
}
