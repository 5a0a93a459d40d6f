//! Issue 14, items 5 and 6: deep images and the answers for processes that never started, each
//! against rsandbox and containerd's runc shim (`io.containerd.runc.v2`) in the same test.

use rsandbox_integration::images::import_deep_image;
use rsandbox_integration::tasks::{StdioPaths, TaskApi};
use rsandbox_integration::*;

const NS: &str = "default";
/// containerd's own runc shim, the reference.
const RUNC: &str = "io.containerd.runc.v2";

/// Removes an image when dropped.
struct ImageGone(&'static str, String);

impl Drop for ImageGone {
    fn drop(&mut self) {
        let _ = ctr(self.0, &["images", "rm", "--sync", &self.1]);
    }
}

/// Item 5: images of 80 and 128 layers run. Their overlay `lowerdir` list is longer than the
/// page mount(2) takes; both shims mount it relative to the layers' common parent.
#[test]
fn deep_images_run_as_with_runc() {
    let g = Guard::new();
    let mut ids = Vec::new();
    for layers in [80usize, 128] {
        let image = format!("localhost/rsandbox-deep-{layers}:latest");
        let work = scratch_dir(&unique_id(&format!("deep{layers}-image")));
        let _gone = ImageGone(NS, image.clone());
        if let Err(e) = import_deep_image(NS, &image, layers, &work) {
            panic!("build the {layers}-layer image: {e}");
        }
        let want = format!("2 {layers} {layers} {layers}\n");
        let script = format!(
            "echo $(cat /layers/2) $(cat /layers/{layers}) $(cat /layers/shadowed) $(ls /layers | wc -l)"
        );
        for (runtime, short) in [(RUNC, "runc"), (RUNTIME, "rsb")] {
            let id = unique_id(&format!("deep{layers}-{short}"));
            ids.push(id.clone());
            let _cleanup = CtrObjects {
                ns: NS,
                ids: vec![id.clone()],
            };
            let o = ctr(
                NS,
                &[
                    "run",
                    "--rm",
                    "--runtime",
                    runtime,
                    &image,
                    &id,
                    "sh",
                    "-c",
                    &script,
                ],
            );
            assert_eq!(
                (o.code, o.stdout.as_str()),
                (Some(0), want.as_str()),
                "{layers} layers on {runtime}: {o:?}\n{}",
                log_lines(&id, 10)
            );
        }
        let _ = std::fs::remove_dir_all(&work);
    }
    g.assert_clean(&ids);
}

/// The container's process spec with other `args` (what containerd's client suite sends).
async fn process_with_args(
    api: &mut TaskApi,
    id: &str,
    args: &[&str],
) -> Result<serde_json::Value, String> {
    let spec = api.spec(id).await?;
    let mut process = spec["process"].clone();
    ensure!(process.is_object(), "spec of {id} has no process: {spec}");
    process["args"] = serde_json::json!(args);
    Ok(process)
}

/// What one shim answers for processes that never started.
#[derive(Debug, PartialEq, Eq)]
struct NeverStarted {
    /// Delete of an exec that was created and never started (TestDeleteContainerExecCreated).
    created_exec_delete: u32,
    /// Delete of a task that was created and never started.
    created_task_delete: u32,
}

async fn never_started(
    api: &mut TaskApi,
    runtime: &str,
    id: &str,
    id2: &str,
) -> Result<NeverStarted, String> {
    let o = ctr(
        NS,
        &[
            "run",
            "-d",
            "--runtime",
            runtime,
            BUSYBOX,
            id,
            "sleep",
            "300",
        ],
    );
    ensure!(o.ok(), "ctr run -d: {o:?}");
    let process = process_with_args(api, id, &["sh", "-c", "exit 6"]).await?;
    api.exec(id, "never", &process, &StdioPaths::default(), false)
        .await?;
    let created_exec_delete = api.delete_exec(id, "never").await?;

    let o = ctr(
        NS,
        &[
            "container",
            "create",
            "--runtime",
            runtime,
            BUSYBOX,
            id2,
            "sleep",
            "300",
        ],
    );
    ensure!(o.ok(), "ctr container create: {o:?}");
    api.create(id2, &StdioPaths::default(), false).await?;
    let created_task_delete = api.delete(id2).await?;
    Ok(NeverStarted {
        created_exec_delete,
        created_task_delete,
    })
}

/// Item 6: Delete of a created exec, and of a created task, answers 0 on both shims.
#[tokio::test]
async fn delete_of_processes_that_never_started_answers_as_runc() {
    let g = Guard::new();
    let mut api = TaskApi::connect(NS).await;
    let mut seen = Vec::new();
    let mut ids = Vec::new();
    for (runtime, short) in [(RUNC, "runc"), (RUNTIME, "rsb")] {
        let (id, id2) = (
            unique_id(&format!("never-{short}")),
            unique_id(&format!("never-task-{short}")),
        );
        ids.extend([id.clone(), id2.clone()]);
        let res = {
            let _cleanup = CtrObjects {
                ns: NS,
                ids: vec![id.clone(), id2.clone()],
            };
            never_started(&mut api, runtime, &id, &id2).await
        };
        match res {
            Ok(s) => seen.push((runtime, s)),
            Err(e) => panic!("{runtime}: {e}\n{}", log_lines(&id, 10)),
        }
    }
    let want = NeverStarted {
        created_exec_delete: 0,
        created_task_delete: 0,
    };
    for (runtime, s) in &seen {
        assert_eq!(s, &want, "{runtime}");
    }
    g.assert_clean(&ids);
}

/// Item 6, the other half: an exec whose start fails still answers Wait with 255 on rsandbox
/// (containerd's "unknown"); containerd's runc shim answers its unset status (printed, not
/// compared: the difference is deliberate, see src/task/process.rs).
#[tokio::test]
async fn wait_of_an_exec_that_failed_to_start_answers_255() {
    let g = Guard::new();
    let mut api = TaskApi::connect(NS).await;
    let mut ids = Vec::new();
    for (runtime, short) in [(RUNC, "runc"), (RUNTIME, "rsb")] {
        let id = unique_id(&format!("failexec-{short}"));
        ids.push(id.clone());
        let _cleanup = CtrObjects {
            ns: NS,
            ids: vec![id.clone()],
        };
        let res: Result<u32, String> = async {
            let o = ctr(
                NS,
                &[
                    "run",
                    "-d",
                    "--runtime",
                    runtime,
                    BUSYBOX,
                    &id,
                    "sleep",
                    "300",
                ],
            );
            ensure!(o.ok(), "ctr run -d: {o:?}");
            let process = process_with_args(&mut api, &id, &["/no/such/binary"]).await?;
            api.exec(&id, "bad", &process, &StdioPaths::default(), false)
                .await?;
            ensure!(api.start(&id, "bad").await.is_err(), "the exec started");
            let status = tokio::time::timeout(HANG, api.wait(&id, "bad"))
                .await
                .map_err(|_| format!("Wait did not return within {HANG:?}"))??;
            api.delete_exec(&id, "bad").await?;
            Ok(status)
        }
        .await;
        match res {
            Ok(status) => {
                eprintln!("{runtime}: Wait of an exec that failed to start: {status}");
                if runtime == RUNTIME {
                    assert_eq!(status, 255);
                }
            }
            Err(e) => panic!("{runtime}: {e}"),
        }
    }
    g.assert_clean(&ids);
}
