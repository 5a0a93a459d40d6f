//! What `check` found, and how it is shown: findings with a status, the overall verdict and
//! its exit status, the human report and the JSON document (`rsandbox-check/v1`, the
//! installer's interface: fields are only ever added).

use serde::Serialize;
use serde_json::{Map, Value};

/// The JSON document's schema name.
pub const SCHEMA: &str = "rsandbox-check/v1";

/// How a finding is judged, from harmless to blocking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// As it should be.
    Ok,
    /// Worth knowing, nothing to do.
    Info,
    /// Works, with a limit or a hazard the operator must know of.
    Warn,
    /// Do not run rsandbox pods here (or do not restart containerd into this config).
    Block,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Info => "info",
            Status::Warn => "WARN",
            Status::Block => "BLOCK",
        }
    }
}

/// One judged fact. `id` is stable (the installer may match on it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub id: &'static str,
    pub status: Status,
    /// One line.
    pub summary: String,
    /// More, or empty.
    pub detail: String,
    /// What to do, or empty.
    pub fix: String,
}

impl Finding {
    pub fn new(id: &'static str, status: Status, summary: impl Into<String>) -> Finding {
        Finding {
            id,
            status,
            summary: summary.into(),
            detail: String::new(),
            fix: String::new(),
        }
    }

    pub fn detail(mut self, detail: impl Into<String>) -> Finding {
        self.detail = detail.into();
        self
    }

    pub fn fix(mut self, fix: impl Into<String>) -> Finding {
        self.fix = fix.into();
        self
    }
}

/// The overall verdict: the worst status, with `info` counting as ok.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Warn,
    Blocking,
}

/// Everything `check` reports.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub findings: Vec<Finding>,
    /// Probed values by area (`containerd`, `runc`, `kernel`, ...); `null` where not found.
    pub facts: Map<String, Value>,
}

/// Exit status without a blocking finding.
pub const EXIT_OK: i32 = 0;
/// Exit status with at least one blocking finding.
pub const EXIT_BLOCKING: i32 = 1;
/// Exit status of a usage error: nothing was checked.
pub const EXIT_USAGE: i32 = 2;

impl Report {
    pub fn add(&mut self, findings: impl IntoIterator<Item = Finding>) {
        self.findings.extend(findings);
    }

    pub fn fact(&mut self, area: &str, value: Value) {
        self.facts.insert(area.to_string(), value);
    }

    pub fn verdict(&self) -> Verdict {
        match self.findings.iter().map(|f| f.status).max() {
            Some(Status::Block) => Verdict::Blocking,
            Some(Status::Warn) => Verdict::Warn,
            _ => Verdict::Ok,
        }
    }

    pub fn exit_status(&self) -> i32 {
        if self.verdict() == Verdict::Blocking {
            EXIT_BLOCKING
        } else {
            EXIT_OK
        }
    }

    /// The finding `id` (tests, and callers that act on one).
    pub fn finding(&self, id: &str) -> Option<&Finding> {
        self.findings.iter().find(|f| f.id == id)
    }

    /// The JSON document.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "schema": SCHEMA,
            "shim": {
                "version": crate::records::version::VERSION,
                "revision": crate::records::version::REVISION,
                "rustc": crate::records::version::RUSTC,
            },
            "verdict": self.verdict(),
            "findings": self.findings,
            "facts": self.facts,
        })
    }

    /// The report for a person: one line per finding (status, id, summary), its detail and fix
    /// indented below, then the verdict.
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "containerd-shim-rsandbox-v1 {} ({}) check\n\n",
            crate::records::version::VERSION,
            crate::records::version::REVISION
        );
        for f in &self.findings {
            out.push_str(&format!(
                "[{:>5}] {:<27} {}\n",
                f.status.label(),
                f.id,
                f.summary
            ));
            for (label, text) in [("", &f.detail), ("fix: ", &f.fix)] {
                for (i, line) in text.lines().enumerate() {
                    let lead = if i == 0 { label } else { "" };
                    out.push_str(&format!("        {lead}{line}\n"));
                }
            }
        }
        let count = |s: Status| self.findings.iter().filter(|f| f.status == s).count();
        out.push_str(&format!(
            "\nverdict: {} ({} blocking, {} warnings)\n",
            match self.verdict() {
                Verdict::Ok => "ok",
                Verdict::Warn => "ok, with warnings",
                Verdict::Blocking => "BLOCKING: do not run rsandbox pods on this node as it is",
            },
            count(Status::Block),
            count(Status::Warn)
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_and_exit_status_follow_the_worst_finding() {
        let mut r = Report::default();
        assert_eq!((r.verdict(), r.exit_status()), (Verdict::Ok, EXIT_OK));
        r.add([Finding::new("a", Status::Info, "x")]);
        assert_eq!((r.verdict(), r.exit_status()), (Verdict::Ok, EXIT_OK));
        r.add([Finding::new("b", Status::Warn, "y")]);
        assert_eq!((r.verdict(), r.exit_status()), (Verdict::Warn, EXIT_OK));
        r.add([Finding::new("c", Status::Block, "z")]);
        assert_eq!(
            (r.verdict(), r.exit_status()),
            (Verdict::Blocking, EXIT_BLOCKING)
        );
    }

    #[test]
    fn json_has_the_documented_shape() {
        let mut r = Report::default();
        r.add([Finding::new("containerd.version", Status::Warn, "s")
            .detail("d")
            .fix("f")]);
        r.fact("runc", serde_json::json!({"version": null}));
        let j = r.to_json();
        assert_eq!(j["schema"], "rsandbox-check/v1");
        assert_eq!(j["verdict"], "warn");
        assert_eq!(j["shim"]["version"], crate::records::version::VERSION);
        let f = &j["findings"][0];
        assert_eq!(
            (
                &f["id"],
                &f["status"],
                &f["summary"],
                &f["detail"],
                &f["fix"]
            ),
            (
                &Value::from("containerd.version"),
                &Value::from("warn"),
                &Value::from("s"),
                &Value::from("d"),
                &Value::from("f")
            )
        );
        assert!(j["facts"]["runc"]["version"].is_null());
    }

    #[test]
    fn text_shows_each_finding_its_fix_and_the_verdict() {
        let mut r = Report::default();
        r.add([
            Finding::new("kernel.openat2", Status::Ok, "openat2 works"),
            Finding::new("containerd.default-runtime", Status::Block, "bad")
                .detail("line 1\nline 2")
                .fix("do this"),
        ]);
        let t = r.to_text();
        assert!(t.contains("[   ok] kernel.openat2"), "{t}");
        assert!(t.contains("[BLOCK] containerd.default-runtime"), "{t}");
        assert!(t.contains("        line 2\n"), "{t}");
        assert!(t.contains("        fix: do this\n"), "{t}");
        assert!(t.contains("verdict: BLOCKING"), "{t}");
    }
}
