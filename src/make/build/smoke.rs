//! The smoke tests of a built image, run before its tag moves: each test's run as the engine
//! does it, its result and its output.

use super::*;
use crate::engine::emulation::Execution;

/// Runs the smoke tests of `image` in containers from `image_id`, appending each result to
/// `results`; the first failure stops and is the error. A foreign-platform image is refused
/// before any container starts: the engine could not run it, or would emulate it.
pub async fn smoke(
    engine: &Engine,
    image: &PlannedImage,
    image_id: &str,
    results: &mut Vec<SmokeResult>,
    on_builder: bool,
    emulate: bool,
) -> Result<()> {
    let tests: Vec<_> = (image.loaded.spec.smokes.iter())
        .filter(|t| t.runs_on(on_builder))
        .collect();
    if tests.is_empty() {
        return Ok(());
    }
    let execution = tests_execution(engine, image, image_id, &tests, emulate).await?;
    for test in tests {
        let mut result = run_one(engine, image, image_id, test).await?;
        result.emulated = execution == Execution::Emulated;
        results.push(result.clone());
        if !result.passed {
            let mut output = result.output;
            if !result.logs.is_empty() {
                output.push_str(&format!(
                    "\nthe served process's last {} lines:\n{}",
                    result.logs.len(),
                    result.logs.join("\n")
                ));
            }
            return Err(Error::SmokeFailed {
                image: image.name().to_string(),
                smoke: result.name,
                node: engine.node.clone(),
                code: result.exit_code,
                output,
            });
        }
    }
    Ok(())
}

/// How the engine runs the image's tests: natively, or emulated when the image is of another
/// platform and the node may and can emulate it; a refusal otherwise, before any container
/// starts. A test that asks for GPUs never runs emulated.
async fn tests_execution(
    engine: &Engine,
    image: &PlannedImage,
    image_id: &str,
    tests: &[&crate::inputs::spec::Smoke],
    emulate: bool,
) -> Result<Execution> {
    let Some(inspected) = engine.inspect(image_id).await? else {
        return Ok(Execution::Native);
    };
    let made = inspected.platform();
    let execution = runs_platform(engine, image, &made, emulate, "the smoke tests").await?;
    if execution == Execution::Emulated
        && let Some(gpu) = tests.iter().find(|t| t.gpus.is_some())
    {
        return Err(engine.error(format!(
            "smoke test `{}` of `{}` asks for GPUs, and the image is {made} on a {} engine: a GPU test never runs emulated (the device and its driver are the node's own platform's)",
            gpu.name.get_ref(),
            image.name(),
            engine.platform()
        )));
    }
    Ok(execution)
}

/// One smoke test run in a container from `image_id`: its result, passed or not; an error
/// only when the engine could not run it.
async fn run_one(
    engine: &Engine,
    image: &PlannedImage,
    image_id: &str,
    test: &crate::inputs::spec::Smoke,
) -> Result<SmokeResult> {
    let started = Instant::now();
    // A program that cannot start (not in the image, not executable) is the engine's
    // refusal to start the container: said with the image, the test and its spec line
    // (a bare "400 Bad Request" named none of them).
    let line = crate::error::Location::of_offset(&image.loaded.text, test.name.span().start).line;
    let ran = engine
        .run_smoke(image_id, &smoke_run(test))
        .await
        .map_err(|e| {
            let words = match e {
                Error::Engine { message, .. } => message,
                other => other.to_string(),
            };
            engine.error(format!(
                "smoke test `{}` of `{}` ({}:{line}) could not run `{}`: {words}",
                test.name.get_ref(),
                image.name(),
                image.loaded.path.display(),
                test.run.get_ref().join(" "),
            ))
        })?;
    let mut output = crate::error::plain_text(&ran.output);
    let expected = test.expect.as_ref().map(|e| e.get_ref());
    let matched = expected
        .is_none_or(|pattern| regex::Regex::new(pattern).is_ok_and(|re| re.is_match(&ran.stdout)));
    if let Some(why) = &ran.failure {
        output = format!("{why}\n{output}");
    } else if ran.code == 0 && !matched {
        output = format!(
            "its output does not match `{}`\n{output}",
            expected.map(String::as_str).unwrap_or_default()
        );
    }
    Ok(SmokeResult {
        name: test.name.get_ref().clone(),
        passed: ran.failure.is_none() && ran.code == 0 && matched,
        exit_code: ran.code,
        seconds: started.elapsed().as_secs_f64(),
        output,
        logs: ran
            .logs
            .iter()
            .map(|l| crate::error::plain_text(l))
            .collect(),
        emulated: false,
    })
}

/// A `[[smoke]]` in the engine's terms.
pub(super) fn smoke_run(test: &crate::inputs::spec::Smoke) -> crate::engine::smoke::SmokeRun {
    use crate::engine::smoke::{Gpus, Mount, Served, SmokeRun};
    use crate::inputs::spec::Serve;
    let served = test.served().then(|| Served {
        argv: match test.serve.as_ref().map(|s| s.get_ref()) {
            Some(Serve::Argv(argv)) => Some(argv.clone()),
            _ => None,
        },
        args: test.args.as_ref().map(|a| a.get_ref().clone()),
        ready: test.ready.as_ref().map(|r| r.get_ref().clone()),
        within: std::time::Duration::from_secs(test.timeout.as_ref().map_or(300, |t| *t.get_ref())),
    });
    SmokeRun {
        command: test.run.get_ref().clone(),
        served,
        env: test.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        mounts: (test.mounts.iter())
            .map(|m| Mount {
                source: m.get_ref().source.clone(),
                target: m.get_ref().target.clone(),
                readonly: m.get_ref().readonly,
            })
            .collect(),
        shm_size: (test.shm_size.as_ref())
            .and_then(|s| crate::inputs::spec::byte_size(s.get_ref())),
        ipc: test.ipc.as_ref().map(|i| i.get_ref().clone()),
        ulimits: test.ulimits.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        user: test.user.clone(),
        gpus: test.gpus.as_ref().map(|g| match g.get_ref() {
            crate::inputs::spec::GpuRequest::Count(n) => Gpus::Count(*n),
            crate::inputs::spec::GpuRequest::All(_) => Gpus::All,
            crate::inputs::spec::GpuRequest::Named(names) => Gpus::Named(names.clone()),
        }),
    }
}
