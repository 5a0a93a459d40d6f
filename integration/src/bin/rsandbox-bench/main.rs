//! rsandbox-bench: the rsandbox runtime handler against containerd's podsandbox + runc path,
//! side by side, on the hack/ bench's containerd (run it through `hack/bench.sh`).
//!
//! Both handlers run the same workload, interleaved runc, rsandbox, rsandbox, runc, ... so
//! drift hits both alike: every CRI call of one pod's life (then containerd's garbage
//! collection of what the pod left, run and timed), pod + container from scratch and back, N
//! pods with K in flight, density (110 pods with a sleeping container each: Ready?, wall time,
//! PSS of the per-pod shim and pause processes, containerd's RSS), and the shim binaries' own
//! `start` / `delete` actions with a ttrpc round trip to the daemon. It prints markdown tables
//! (p50 / p95 / min / max and the p50 ratio rsandbox/runc), writes JSON, and a PNG of the
//! ratios when gnuplot is installed.
//!
//! Everything it creates carries a label and is removed at the end, on failure and on
//! Ctrl-C/SIGTERM; it then checks that nothing of it is left and fails if something is.

mod compare;
mod procs;
mod report;
mod shim_actions;
mod stats;
mod ttrpc;
mod workload;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use report::{HANDLERS, Results};
use rsandbox_integration::{address, cri_clients, prefix};
use workload::Cri;

const USAGE: &str = "\
usage: rsandbox-bench [--quick] [--samples N] [--pods N] [--in-flight N] [--rounds N]
                      [--density N] [--density-rounds N] [--actions N]
                      [--only calls,scratch,actions,many,density] [--json PATH] [--png PATH]
                      [--compare OLD.json]
       rsandbox-bench --report RUN.json [--compare OLD.json]

  --quick             smoke run (< 1 min): 3 samples, 10 pods, density 10, 3 action samples
  --samples N         samples per handler of the per-call and from-scratch workloads (40)
  --pods N            pods of the many-pods workload (50)
  --in-flight N       calls in flight in the many-pods and density workloads (10)
  --rounds N          many-pods rounds per handler (2)
  --density N         pods of the density workload (110, the kubelet's default max pods)
  --density-rounds N  density rounds per handler (2; --quick: 1)
  --actions N         samples per shim of the start/delete actions (20)
  --only LIST         run only these workloads
  --json PATH         JSON output (rsandbox-bench.json)
  --png PATH          bar chart of the ratios (the JSON path with .png), if gnuplot exists
  --compare OLD.json  after the tables, per metric: OLD's rsandbox/runc ratio, this run's,
                      and the change (informational: never fails the run)
  --report RUN.json   run nothing: print the tables of a stored run (and --compare's)

Environment: CONTAINERD_ADDRESS, RSANDBOX_PREFIX (see hack/containerd.sh env),
RSANDBOX_BENCH_COMMIT (recorded in the JSON).";

#[derive(Debug, Clone)]
struct Opts {
    quick: bool,
    samples: usize,
    pods: usize,
    in_flight: usize,
    rounds: usize,
    density: usize,
    density_rounds: usize,
    actions: usize,
    only: Option<BTreeSet<String>>,
    json: PathBuf,
    png: Option<PathBuf>,
    compare: Option<PathBuf>,
    report: Option<PathBuf>,
}

const WORKLOADS: [&str; 5] = ["calls", "scratch", "actions", "many", "density"];

impl Opts {
    fn parse(args: &[String]) -> Result<Opts, String> {
        let quick = args.iter().any(|a| a == "--quick");
        let mut o = Opts {
            quick,
            samples: if quick { 3 } else { 40 },
            pods: if quick { 10 } else { 50 },
            in_flight: 10,
            rounds: if quick { 1 } else { 2 },
            density: if quick { 10 } else { 110 },
            density_rounds: if quick { 1 } else { 2 },
            actions: if quick { 3 } else { 20 },
            only: None,
            json: PathBuf::from("rsandbox-bench.json"),
            png: None,
            compare: None,
            report: None,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            let num = |name: &str, v: String| {
                v.parse::<usize>()
                    .map_err(|_| format!("{name}: not a number: {v:?}"))
            };
            match a.as_str() {
                "--quick" => {}
                "--samples" => o.samples = num(a, value(a)?)?,
                "--pods" => o.pods = num(a, value(a)?)?,
                "--in-flight" => o.in_flight = num(a, value(a)?)?.max(1),
                "--rounds" => o.rounds = num(a, value(a)?)?,
                "--density" => o.density = num(a, value(a)?)?,
                "--density-rounds" => o.density_rounds = num(a, value(a)?)?,
                "--actions" => o.actions = num(a, value(a)?)?,
                "--json" => o.json = PathBuf::from(value(a)?),
                "--png" => o.png = Some(PathBuf::from(value(a)?)),
                "--compare" => o.compare = Some(PathBuf::from(value(a)?)),
                "--report" => o.report = Some(PathBuf::from(value(a)?)),
                "--only" => {
                    let list: BTreeSet<String> =
                        value(a)?.split(',').map(|s| s.trim().to_string()).collect();
                    if let Some(bad) = list.iter().find(|w| !WORKLOADS.contains(&w.as_str())) {
                        return Err(format!(
                            "--only: unknown workload {bad:?} (one of {WORKLOADS:?})"
                        ));
                    }
                    o.only = Some(list);
                }
                "-h" | "--help" => return Err(String::new()),
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(o)
    }

    fn runs(&self, workload: &str) -> bool {
        self.only.as_ref().is_none_or(|s| s.contains(workload))
    }
}

/// Handler index of the k-th step: runc, rsandbox, rsandbox, runc, runc, rsandbox, ...
fn abba(k: usize) -> usize {
    [0, 1, 1, 0][k % 4]
}

const G_CALLS: &str = "Per CRI call (one pod's life, one call at a time)";
const G_SCRATCH: &str = "Pod + one container, one pod at a time";
const G_MANY: &str = "Many pods";
const G_DENSITY: &str = "Density";
const G_ACTIONS: &str = "Shim binary actions alone (as containerd runs them)";

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn log(msg: impl AsRef<str>) {
    eprintln!("[bench] {}", msg.as_ref());
}

async fn measure(cri: &Cri, o: &Opts, work: &Path, res: &mut Results) -> Result<(), String> {
    log("warm-up: one pod's life per handler (not counted)");
    for h in HANDLERS {
        cri.calls_one_by_one(h).await?;
    }

    if o.runs("calls") || o.runs("scratch") {
        log(format!(
            "per-call and from-scratch workloads: {} samples per handler, interleaved",
            o.samples
        ));
        for k in 0..2 * o.samples {
            let h = abba(k);
            if o.runs("calls") {
                for (call, d) in cri.calls_one_by_one(HANDLERS[h]).await? {
                    res.add(G_CALLS, call, "ms", h, stats::ms(d));
                }
            }
            if o.runs("scratch") {
                let (up, down) = cri.pod_from_scratch(HANDLERS[h]).await?;
                let g = G_SCRATCH;
                res.add(
                    g,
                    "to Running (RunPodSandbox + CreateContainer + StartContainer)",
                    "ms",
                    h,
                    stats::ms(up),
                );
                res.add(
                    g,
                    "back to nothing (StopPodSandbox + RemovePodSandbox)",
                    "ms",
                    h,
                    stats::ms(down),
                );
                res.add(g, "total", "ms", h, stats::ms(up + down));
            }
        }
    }

    if o.runs("actions") {
        log(format!(
            "shim binary actions: {} samples per shim",
            o.actions
        ));
        let bin = prefix().join("usr/bin");
        let env = vec![(
            "RSANDBOX_CONFIG".to_string(),
            prefix()
                .join("conf/rsandbox.toml")
                .to_string_lossy()
                .into_owned(),
        )];
        let shims = [
            shim_actions::ShimBinary {
                path: bin.join("containerd-shim-runc-v2"),
                address: address(),
                containerd: bin.join("containerd"),
                env: env.clone(),
                needs_spec: true,
            },
            shim_actions::ShimBinary {
                path: bin.join(rsandbox_integration::SHIM),
                address: address(),
                containerd: bin.join("containerd"),
                env,
                needs_spec: false,
            },
        ];
        let shims = std::sync::Arc::new(shims);
        for k in 0..2 * o.actions {
            let h = abba(k);
            let (shims, work) = (shims.clone(), work.to_path_buf());
            let id = format!("act-{}-{k}", std::process::id());
            let t = tokio::task::spawn_blocking(move || shims[h].sample(&work, &id))
                .await
                .map_err(|e| format!("shim actions: {e}"))??;
            let g = G_ACTIONS;
            res.add(
                g,
                "`-v` (exec + start-up, nothing else)",
                "ms",
                h,
                stats::ms(t.version),
            );
            res.add(g, "`start` (spawn to exit)", "ms", h, stats::ms(t.start));
            res.add(
                g,
                "one ttrpc round trip to the daemon (Task Connect)",
                "µs",
                h,
                stats::us(t.round_trip),
            );
            res.add(
                g,
                "daemon exit after its Shutdown reply",
                "ms",
                h,
                stats::ms(t.exit_after_shutdown),
            );
            res.add(g, "`delete` (spawn to exit)", "ms", h, stats::ms(t.delete));
        }
    }

    if o.runs("many") {
        let name = format!(
            "{} pods × (RunPodSandbox + StopPodSandbox + RemovePodSandbox), {} in flight: wall",
            o.pods, o.in_flight
        );
        for k in 0..2 * o.rounds {
            let h = abba(k);
            log(format!(
                "many pods: {} pods, {} in flight, {}",
                o.pods, o.in_flight, HANDLERS[h]
            ));
            let d = cri.many_pods(HANDLERS[h], o.pods, o.in_flight).await?;
            res.add(G_MANY, &name, "s", h, d.as_secs_f64());
        }
    }

    if o.runs("density") {
        for k in 0..2 * o.density_rounds {
            let h = abba(k);
            log(format!(
                "density: {} pods with a sleeping container, {} in flight, {}",
                o.density, o.in_flight, HANDLERS[h]
            ));
            density(cri, o, h, res).await?;
        }
    }
    Ok(())
}

/// One density round for handler `h`.
async fn density(cri: &Cri, o: &Opts, h: usize, res: &mut Results) -> Result<(), String> {
    let handler = HANDLERS[h];
    let g = G_DENSITY;
    let n = o.density;
    let cd =
        procs::containerd_pid(&prefix()).ok_or("containerd's pid file names no running process")?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = procs::rss_kib(cd).unwrap_or(0);
    let (up, pods) = cri.start_density(handler, n, o.in_flight).await?;
    let (pod_ids, cids): (Vec<String>, Vec<String>) = pods.iter().cloned().unzip();
    let (ready, running) = cri.count_ready(&pod_ids, &cids).await?;
    res.add(
        g,
        &format!("wall time until all {n} pods and containers run"),
        "s",
        h,
        up.as_secs_f64(),
    );
    res.add(g, &format!("pods Ready (of {n})"), "pods", h, ready as f64);
    res.add(
        g,
        &format!("containers Running (of {n})"),
        "ctrs",
        h,
        running as f64,
    );
    if ready != n || running != n {
        // the pods are tracked: the clean-up removes them
        return Err(format!(
            "density ({handler}): only {ready} of {n} pods Ready and {running} of {n} containers Running"
        ));
    }
    // Let the runtimes settle (idle thread pools shrink, page faults of the start are done).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut app = BTreeSet::new();
    for c in &cids {
        app.insert(cri.container_pid(c).await?);
    }
    let table = procs::ProcTable::read();
    let addr = address().to_string_lossy().into_owned();
    let (mut total, mut odd) = (0u64, 0usize);
    for p in &pod_ids {
        let procs = table.pod_runtime(p, &addr, &app);
        if procs.shims.len() != 1 || procs.others.len() != 1 {
            odd += 1;
        }
        let shim: u64 = procs.shims.iter().filter_map(|&p| procs::pss_kib(p)).sum();
        let pause: u64 = procs.others.iter().filter_map(|&p| procs::pss_kib(p)).sum();
        res.add(g, "PSS per pod: shim", "MiB", h, mib(shim));
        res.add(g, "PSS per pod: pause", "MiB", h, mib(pause));
        res.add(g, "PSS per pod: shim + pause", "MiB", h, mib(shim + pause));
        total += shim + pause;
    }
    if odd > 0 {
        res.notes.push(format!(
            "density ({handler}): {odd} of {n} pods did not show exactly one shim and one pause process"
        ));
    }
    res.add(
        g,
        &format!("PSS of all {n} pods' shims + pauses"),
        "MiB",
        h,
        mib(total),
    );
    res.add(g, "containerd RSS before", "MiB", h, mib(rss_before));
    res.add(
        g,
        &format!("containerd RSS with {n} pods"),
        "MiB",
        h,
        mib(procs::rss_kib(cd).unwrap_or(0)),
    );
    let down = cri.remove_pods(handler, &pod_ids, o.in_flight).await?;
    res.add(
        g,
        &format!("wall time to stop and remove all {n} pods"),
        "s",
        h,
        down.as_secs_f64(),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    res.add(
        g,
        "containerd RSS after removing them",
        "MiB",
        h,
        mib(procs::rss_kib(cd).unwrap_or(0)),
    );
    Ok(())
}

/// Removes whatever the bench created, then checks that nothing of it is left.
async fn clean_up(cri: &Cri, work: &Path, log_dir: &Path) -> Vec<String> {
    let mut left = Vec::new();
    // A RunPodSandbox cut short by Ctrl-C may still finish in containerd: sweep until a
    // sweep finds nothing.
    for round in 0..5 {
        let (removed, errors) = cri.sweep().await;
        if round > 0 && removed > 0 {
            log(format!("clean-up: removed {removed} more pods"));
        }
        if removed == 0 && errors.is_empty() {
            break;
        }
        if round == 4 {
            left.extend(errors);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    match cri.labelled_pods().await {
        Ok(p) if !p.is_empty() => left.push(format!("pods still listed: {p:?}")),
        Ok(_) => {}
        Err(e) => left.push(e),
    }
    // Shims exit shortly after their pod is removed.
    let addr = address().to_string_lossy().into_owned();
    let ids = cri.all_created();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let table = procs::ProcTable::read();
        let shims: Vec<String> = ids
            .iter()
            .flat_map(|id| table.shims_of(id, &addr))
            .chain(
                table
                    .0
                    .values()
                    .filter(|p| p.exe.starts_with("containerd-shim-"))
                    .filter(|p| {
                        p.cmdline
                            .contains(&format!(" -namespace {} ", shim_actions::NAMESPACE))
                    }),
            )
            .map(|p| format!("pid {}: {}", p.pid, p.cmdline))
            .collect();
        if shims.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            left.push(format!("shim processes still running: {shims:?}"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for d in [work, log_dir] {
        if let Err(e) = std::fs::remove_dir_all(d)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            left.push(format!("remove {}: {e}", d.display()));
        }
    }
    left
}

/// Date, machine, versions, shim and commit of a run, from its metadata.
fn header_line(res: &Results) -> String {
    let get = |k: &str| {
        res.meta
            .get(k)
            .map(|v| match v.as_str() {
                Some(s) => s.to_string(),
                None => v.to_string(),
            })
            .unwrap_or_default()
    };
    let commit = get("commit");
    format!(
        "{} · {} × {} · kernel {} · {} · {} · shim sha256 {}{}",
        get("date"),
        get("cpus"),
        get("cpu"),
        get("kernel"),
        get("containerd"),
        get("runc"),
        get("rsandbox_shim_sha256").get(..12).unwrap_or(""),
        if commit.is_empty() {
            String::new()
        } else {
            format!(" · commit {commit}")
        }
    )
}

fn sh(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn first_line(s: String) -> String {
    s.lines().next().unwrap_or("").to_string()
}

fn meta(o: &Opts, res: &mut Results) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    let bin = prefix().join("usr/bin");
    let sha = |p: PathBuf| {
        sh("sha256sum", &[&p.to_string_lossy()])
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_string()
    };
    let m = &mut res.meta;
    m.insert(
        "date".into(),
        sh("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]).into(),
    );
    m.insert("mode".into(), if o.quick { "quick" } else { "full" }.into());
    m.insert(
        "commit".into(),
        std::env::var("RSANDBOX_BENCH_COMMIT")
            .unwrap_or_default()
            .into(),
    );
    m.insert(
        "cpus".into(),
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
            .into(),
    );
    m.insert("cpu".into(), cpu.into());
    m.insert("kernel".into(), sh("uname", &["-r"]).into());
    m.insert(
        "containerd".into(),
        first_line(sh(
            &bin.join("containerd").to_string_lossy(),
            &["--version"],
        ))
        .into(),
    );
    m.insert("runc".into(), first_line(sh("runc", &["--version"])).into());
    m.insert(
        "rsandbox_shim_sha256".into(),
        sha(bin.join(rsandbox_integration::SHIM)).into(),
    );
    m.insert(
        "params".into(),
        serde_json::json!({
            "samples": o.samples, "pods": o.pods, "in_flight": o.in_flight, "rounds": o.rounds,
            "density": o.density, "density_rounds": o.density_rounds, "actions": o.actions,
            "only": o.only,
        }),
    );
    m.insert(
        "loadavg_start".into(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
            .into(),
    );
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = match Opts::parse(&args) {
        Ok(o) => o,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return;
        }
        Err(e) => {
            eprintln!("rsandbox-bench: {e}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    // Read first: a wrong path fails at once, not after the run.
    let baseline = match o.compare.as_deref().map(compare::load).transpose() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("rsandbox-bench: --compare: {e}");
            std::process::exit(2);
        }
    };
    if let Some(path) = &o.report {
        match compare::load(path) {
            Ok(run) => {
                println!("## rsandbox-bench: stored run {}", path.display());
                println!("\n{}", header_line(&run));
                print!("{}", run.markdown());
                if let Some(old) = &baseline {
                    print!("{}", compare::markdown(old, &run));
                }
                return;
            }
            Err(e) => {
                eprintln!("rsandbox-bench: --report: {e}");
                std::process::exit(2);
            }
        }
    }
    for b in [
        rsandbox_integration::SHIM,
        "containerd-shim-runc-v2",
        "containerd",
    ] {
        let p = prefix().join("usr/bin").join(b);
        if !p.exists() {
            eprintln!(
                "rsandbox-bench: {} is missing (hack/setup.sh, hack/build.sh)",
                p.display()
            );
            std::process::exit(2);
        }
    }
    let (rt, _) = cri_clients().await;
    let containerd = rsandbox_integration::tasks::channel().await;
    let id = std::process::id();
    let work = prefix().join(format!("run/rsandbox-bench-{id}"));
    let log_dir = std::env::temp_dir().join(format!("rsandbox-bench-logs-{id}"));
    let cri = Cri::new(rt, containerd, log_dir.clone());

    let (removed, errors) = cri.sweep().await;
    if removed > 0 || !errors.is_empty() {
        log(format!(
            "removed {removed} pods of an earlier run; errors: {errors:?}"
        ));
    }
    let mut res = Results::default();
    meta(&o, &mut res);
    let started = Instant::now();
    let outcome = {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("rsandbox-bench: SIGTERM handler: {e}");
                    std::process::exit(2);
                }
            };
        tokio::select! {
            r = measure(&cri, &o, &work, &mut res) => r,
            _ = tokio::signal::ctrl_c() => Err("interrupted (SIGINT)".to_string()),
            _ = term.recv() => Err("terminated (SIGTERM)".to_string()),
        }
    };
    let elapsed = started.elapsed();
    log("cleaning up");
    let left = clean_up(&cri, &work, &log_dir).await;
    res.meta
        .insert("duration_s".into(), elapsed.as_secs_f64().into());
    res.meta.insert(
        "loadavg_end".into(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
            .into(),
    );

    println!(
        "## rsandbox-bench ({}, {:.0} s): rsandbox vs containerd's podsandbox + runc path",
        if o.quick { "quick" } else { "full" },
        elapsed.as_secs_f64()
    );
    println!("\n{}", header_line(&res));
    print!("{}", res.markdown());
    if let Some(old) = &baseline {
        print!("{}", compare::markdown(old, &res));
    }
    let mut code = 0;
    if let Some(dir) = o.json.parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = std::fs::create_dir_all(dir);
    }
    match serde_json::to_string_pretty(&res.json()) {
        Ok(j) => match std::fs::write(&o.json, j + "\n") {
            Ok(()) => log(format!("JSON: {}", o.json.display())),
            Err(e) => {
                eprintln!("rsandbox-bench: write {}: {e}", o.json.display());
                code = 1;
            }
        },
        Err(e) => {
            eprintln!("rsandbox-bench: JSON: {e}");
            code = 1;
        }
    }
    let png = o
        .png
        .clone()
        .unwrap_or_else(|| o.json.with_extension("png"));
    match res.png(&png) {
        Ok(true) => log(format!("chart: {}", png.display())),
        Ok(false) => log("chart: skipped (gnuplot is not installed; Debian: gnuplot-nox)"),
        Err(e) => log(format!("chart: {e}")),
    }
    if let Err(e) = &outcome {
        eprintln!("rsandbox-bench: FAILED: {e}");
        code = 1;
    }
    if !left.is_empty() {
        eprintln!("rsandbox-bench: LEFT BEHIND:\n  {}", left.join("\n  "));
        code = 1;
    }
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn abba_interleaves() {
        let seq: Vec<usize> = (0..8).map(abba).collect();
        assert_eq!(seq, [0, 1, 1, 0, 0, 1, 1, 0]);
    }

    #[test]
    fn quick_and_explicit_options() {
        let q = Opts::parse(&args("--quick")).unwrap();
        assert_eq!(
            (q.samples, q.pods, q.density, q.actions, q.rounds),
            (3, 10, 10, 3, 1)
        );
        let o = Opts::parse(&args(
            "--samples 5 --density 20 --only calls,density --json /x/y.json",
        ))
        .unwrap();
        assert_eq!((o.samples, o.pods, o.density), (5, 50, 20));
        assert!(o.runs("calls") && o.runs("density") && !o.runs("many"));
        assert_eq!(o.json, PathBuf::from("/x/y.json"));
        let c = Opts::parse(&args("--quick --compare bench/baseline.json")).unwrap();
        assert_eq!(c.compare, Some(PathBuf::from("bench/baseline.json")));
        assert!(c.quick && c.report.is_none());
        let r = Opts::parse(&args("--report a.json --compare b.json")).unwrap();
        assert_eq!(
            (r.report, r.compare),
            (Some(PathBuf::from("a.json")), Some(PathBuf::from("b.json")))
        );
        assert!(Opts::parse(&args("--compare")).is_err());
        assert!(Opts::parse(&args("--samples")).is_err());
        assert!(Opts::parse(&args("--samples x")).is_err());
        assert!(Opts::parse(&args("--only bogus")).is_err());
        assert!(Opts::parse(&args("--frobnicate")).is_err());
        assert_eq!(Opts::parse(&args("--help")).unwrap_err(), "");
    }
}
