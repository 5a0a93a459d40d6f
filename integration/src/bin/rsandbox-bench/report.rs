//! Results: a markdown table per group on stdout, JSON to a file, a PNG bar chart of the
//! p50 ratios through gnuplot when it is installed.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::stats::{Samples, Summary, ratio};

/// The two runtime handlers, in the order of [`Row::samples`].
pub const HANDLERS: [&str; 2] = ["runc", "rsandbox"];

/// One metric, measured for both handlers.
pub struct Row {
    pub group: String,
    pub name: String,
    pub unit: String,
    pub samples: [Samples; 2],
}

impl Row {
    /// rsandbox / runc of the p50s.
    pub fn ratio_p50(&self) -> Option<f64> {
        let a = self.samples[1].summary()?;
        let b = self.samples[0].summary()?;
        ratio(a.p50, b.p50)
    }
}

/// Every metric, in the order first measured, plus notes and run metadata.
#[derive(Default)]
pub struct Results {
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
    pub meta: serde_json::Map<String, serde_json::Value>,
}

impl Results {
    /// Adds one sample of `name` for handler index `h`.
    pub fn add(&mut self, group: &str, name: &str, unit: &str, h: usize, v: f64) {
        let i = match self
            .rows
            .iter()
            .position(|r| r.group == group && r.name == name)
        {
            Some(i) => i,
            None => {
                self.rows.push(Row {
                    group: group.to_string(),
                    name: name.to_string(),
                    unit: unit.to_string(),
                    samples: Default::default(),
                });
                self.rows.len() - 1
            }
        };
        self.rows[i].samples[h].push(v);
    }

    /// The rows' groups, each once, in the order of their first row.
    pub fn groups(&self) -> Vec<&str> {
        let mut groups: Vec<&str> = Vec::new();
        for r in &self.rows {
            if !groups.contains(&r.group.as_str()) {
                groups.push(&r.group);
            }
        }
        groups
    }

    /// The markdown report: one table per group.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        for g in self.groups() {
            let _ = writeln!(out, "\n#### {g}\n");
            let _ = writeln!(
                out,
                "| metric | unit | runc p50 | p95 | min | max | rsandbox p50 | p95 | min | max | n | rsandbox/runc (p50) |"
            );
            let _ = writeln!(
                out,
                "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
            );
            for r in self.rows.iter().filter(|r| r.group == g) {
                let cells = |s: Option<Summary>| match s {
                    Some(s) => [s.p50, s.p95, s.min, s.max]
                        .map(|v| fmt_value(v, &r.unit))
                        .join(" | "),
                    None => "– | – | – | –".to_string(),
                };
                let (a, b) = (r.samples[0].summary(), r.samples[1].summary());
                let n = match (a, b) {
                    (Some(a), Some(b)) if a.n == b.n => a.n.to_string(),
                    (a, b) => format!(
                        "{}/{}",
                        a.map(|s| s.n).unwrap_or(0),
                        b.map(|s| s.n).unwrap_or(0)
                    ),
                };
                let ratio = r
                    .ratio_p50()
                    .map(|x| format!("**{x:.2}×**"))
                    .unwrap_or_else(|| "–".into());
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} |",
                    r.name,
                    r.unit,
                    cells(a),
                    cells(b),
                    n,
                    ratio
                );
            }
        }
        if !self.notes.is_empty() {
            out.push('\n');
            for n in &self.notes {
                let _ = writeln!(out, "- {n}");
            }
        }
        out
    }

    /// A run written by [`Results::json`], read back (samples, notes, metadata) so that it can
    /// be printed again or compared with another.
    pub fn from_json(v: &serde_json::Value) -> Result<Results, String> {
        let mut res = Results::default();
        let rows = v
            .get("rows")
            .and_then(|r| r.as_array())
            .ok_or("no \"rows\" array")?;
        for (i, r) in rows.iter().enumerate() {
            let text = |k: &str| {
                r.get(k)
                    .and_then(|x| x.as_str())
                    .map(str::to_string)
                    .ok_or_else(|| format!("row {i}: no {k:?}"))
            };
            let mut row = Row {
                group: text("group")?,
                name: text("metric")?,
                unit: text("unit")?,
                samples: Default::default(),
            };
            for (h, handler) in HANDLERS.iter().enumerate() {
                let Some(s) = r.get(*handler).filter(|s| !s.is_null()) else {
                    continue;
                };
                let values = s
                    .get("samples")
                    .and_then(|x| x.as_array())
                    .ok_or_else(|| format!("row {i} ({}): {handler}: no samples", row.name))?;
                for x in values {
                    row.samples[h].push(x.as_f64().ok_or_else(|| {
                        format!(
                            "row {i} ({}): {handler}: a sample is not a number",
                            row.name
                        )
                    })?);
                }
            }
            res.rows.push(row);
        }
        if let Some(notes) = v.get("notes").and_then(|n| n.as_array()) {
            res.notes = notes
                .iter()
                .filter_map(|n| n.as_str().map(str::to_string))
                .collect();
        }
        if let Some(meta) = v.get("meta").and_then(|m| m.as_object()) {
            res.meta = meta.clone();
        }
        Ok(res)
    }

    pub fn json(&self) -> serde_json::Value {
        let rows: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|r| {
                let mut o = serde_json::Map::new();
                o.insert("group".into(), r.group.clone().into());
                o.insert("metric".into(), r.name.clone().into());
                o.insert("unit".into(), r.unit.clone().into());
                for (h, s) in HANDLERS.iter().zip(&r.samples) {
                    let v = match s.summary() {
                        Some(x) => serde_json::json!({
                            "n": x.n, "p50": x.p50, "p95": x.p95, "min": x.min, "max": x.max,
                            "mean": x.mean, "samples": s.0,
                        }),
                        None => serde_json::Value::Null,
                    };
                    o.insert((*h).into(), v);
                }
                o.insert("ratio_p50".into(), r.ratio_p50().into());
                o.into()
            })
            .collect();
        serde_json::json!({ "meta": self.meta, "rows": rows, "notes": self.notes })
    }

    /// A bar chart of the p50 ratios of the time and memory rows, if gnuplot is installed.
    /// Ok(false) when it is not.
    pub fn png(&self, path: &Path) -> Result<bool, String> {
        if Command::new("gnuplot")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| !s.success())
            .unwrap_or(true)
        {
            return Ok(false);
        }
        let mut data = String::new();
        let mut top: f64 = 1.0;
        for r in &self.rows {
            if !matches!(r.unit.as_str(), "µs" | "ms" | "s" | "MiB") {
                continue;
            }
            if let Some(x) = r.ratio_p50() {
                let label = chart_label(&r.group, &r.name);
                let _ = writeln!(data, "\"{label}\" {x:.4}");
                top = top.max(x);
            }
        }
        if data.is_empty() {
            return Err("no metric measured on both paths: no chart".into());
        }
        let dat = path.with_extension("dat");
        std::fs::write(&dat, data).map_err(|e| format!("write {}: {e}", dat.display()))?;
        // pngcairo draws nicer text; libgd's png is the fallback
        let mut last_err = String::new();
        for terminal in ["pngcairo", "png"] {
            let script = format!(
                "set terminal {terminal} size 1400,800 noenhanced\n\
                 set output '{}'\n\
                 set title 'rsandbox / runc path, p50 ratio (below 1: rsandbox is faster or smaller)'\n\
                 set style data histograms\n\
                 set style fill solid 0.8\n\
                 set boxwidth 0.8\n\
                 set xtics rotate by -50 scale 0 font ',9'\n\
                 set grid ytics\n\
                 set yrange [0:{:.2}]\n\
                 set bmargin 12\n\
                 set rmargin 12\n\
                 set arrow from graph 0, first 1 to graph 1, first 1 nohead lc rgb 'red' dt 2\n\
                 plot '{}' using 2:xtic(1) notitle lc rgb '#4477aa'\n",
                path.display(),
                top * 1.1,
                dat.display()
            );
            let gp = path.with_extension("gp");
            std::fs::write(&gp, script).map_err(|e| format!("write {}: {e}", gp.display()))?;
            let out = Command::new("gnuplot")
                .arg(&gp)
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("gnuplot: {e}"));
            let _ = std::fs::remove_file(&gp);
            match out {
                Ok(o) if o.status.success() => {
                    let _ = std::fs::remove_file(&dat);
                    return Ok(true);
                }
                Ok(o) => last_err = String::from_utf8_lossy(&o.stderr).trim().to_string(),
                Err(e) => last_err = e,
            }
        }
        let _ = std::fs::remove_file(&dat);
        Err(format!("gnuplot: {last_err}"))
    }
}

/// A short x-axis label: the group's first word and the metric up to its first parenthesis.
fn chart_label(group: &str, name: &str) -> String {
    let name = name
        .split(" (")
        .next()
        .unwrap_or(name)
        .replace(['"', '`'], "");
    let mut label = format!("{}: {}", group.split(' ').next().unwrap_or(""), name.trim());
    if label.chars().count() > 42 {
        label = label.chars().take(41).collect::<String>() + "…";
    }
    label
}

/// A value in its unit's precision.
pub fn fmt_value(v: f64, unit: &str) -> String {
    match unit {
        "ms" => format!("{v:.1}"),
        "s" | "MiB" => format!("{v:.2}"),
        _ => format!("{v:.0}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_labels_are_short() {
        assert_eq!(
            chart_label("Per CRI call (x)", "RunPodSandbox"),
            "Per: RunPodSandbox"
        );
        assert_eq!(
            chart_label("Shim binary actions", "`start` (spawn to exit)"),
            "Shim: start"
        );
        let long = chart_label("Many pods", &"x".repeat(80));
        assert_eq!(long.chars().count(), 42);
        assert!(long.ends_with('…'));
    }

    #[test]
    fn table_has_both_handlers_and_the_ratio() {
        let mut r = Results::default();
        for v in [10.0, 20.0, 30.0] {
            r.add("Per CRI call", "RunPodSandbox", "ms", 0, v);
            r.add("Per CRI call", "RunPodSandbox", "ms", 1, v / 2.0);
        }
        r.add("Density", "pods Ready", "pods", 0, 110.0);
        let md = r.markdown();
        assert!(md.contains("#### Per CRI call"), "{md}");
        assert!(
            md.contains("| RunPodSandbox | ms | 20.0 | 30.0 | 10.0 | 30.0 | 10.0 | 15.0 | 5.0 | 15.0 | 3 | **0.50×** |"),
            "{md}"
        );
        assert!(
            md.contains("| pods Ready | pods | 110 | 110 | 110 | 110 | – | – | – | – | 1/0 | – |"),
            "{md}"
        );
        let j = r.json();
        assert_eq!(j["rows"][0]["ratio_p50"], 0.5);
        assert_eq!(j["rows"][0]["runc"]["samples"][2], 30.0);
        assert!(j["rows"][1]["rsandbox"].is_null());
    }
}
