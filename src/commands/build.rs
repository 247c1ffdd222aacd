//! `hallmark build`: builds on the builder (parents first), stamps, smokes, tags;
//! `--check-repro` builds twice from scratch and compares.

use super::{connect, runtime, until_interrupted};
use crate::commands::settings::Settings;
use crate::error::{Error, ExitStatus, Result};
use crate::make::build::{self, BuildSettings};
use crate::plan::Plan;
use crate::plan::check;

/// Builds `name` (and the parents it needs) on the builder, smoke tests included: the
/// error says what failed (`bump --build`).
pub(super) fn build_one(settings: &Settings, name: &crate::inputs::values::Name) -> Result<()> {
    let plan = Plan::new(&settings.project, std::slice::from_ref(name))?;
    let build_settings = BuildSettings {
        checksum_label: &settings.checksum_label,
        cache: &settings.cache,
        state_dir: &settings.state_dir,
        force: false,
        echo: settings.output.echo(),
    };
    let (_, outcome) = runtime()?.block_on(async {
        let engine = connect(settings, &settings.config.builder).await?;
        let work = build::build_all(&engine, &plan, &build_settings);
        Ok::<_, Error>(until_interrupted(&engine, "the build", work).await)
    })?;
    outcome
}

pub(super) fn run(
    settings: &Settings,
    images: &[String],
    force: bool,
    check_repro: bool,
) -> Result<ExitStatus> {
    // A line every few seconds where stderr is no terminal (CI logs, ssh): a silent step
    // (a compile, a long load) showed nothing there for many minutes.
    let _heartbeat = settings.output.heartbeat("build");
    let names = settings.names(images)?;
    // An image that cannot be planned is said on stderr and not built; the others are
    // (`build A B C` with a bad B built nothing), and the exit says the input was bad.
    let (plan, unplanned) = super::plan_each(settings, &names);
    let names: Vec<_> = names
        .into_iter()
        .filter(|n| !unplanned.contains_key(n))
        .collect();
    refuse_lint_problems(&plan)?;
    refuse_unusable_key(settings)?;
    let build_settings = BuildSettings {
        checksum_label: &settings.checksum_label,
        cache: &settings.cache,
        state_dir: &settings.state_dir,
        force,
        echo: settings.output.echo(),
    };
    let mut differences = Vec::new();
    let (records, outcome, signed) = runtime()?.block_on(async {
        let engine = connect(settings, &settings.config.builder).await?;
        let work = async {
            if check_repro {
                repro_all(&engine, &plan, &names, &build_settings, &mut differences).await
            } else {
                build::build_all(&engine, &plan, &build_settings).await
            }
        };
        let (records, outcome) = until_interrupted(&engine, "the build", work).await;
        let signed = sign_provenance(settings, &engine, &plan, &records).await;
        Ok::<_, Error>((records, outcome, signed))
    })?;
    if settings.output.json {
        settings.output.json("records", &records);
    }
    outcome?;
    // After the records: a failed signature does not hide what was built.
    signed?;
    for record in &records {
        let smoke = match record.smoke.len() {
            0 => String::new(),
            n => format!(", {n} smoke test(s) passed"),
        };
        settings.output.note(format!(
            "{} {}  {} ({}, {:.1} s{smoke})",
            record.checksum,
            record.reference,
            record.outcome,
            short_id(&record.image_id),
            record.seconds
        ));
    }
    if !unplanned.is_empty() {
        return Ok(ExitStatus::BadInput);
    }
    if !check_repro {
        return Ok(ExitStatus::Success);
    }
    if differences.is_empty() {
        settings
            .output
            .note("reproducible: two builds from scratch gave the same image");
        return Ok(ExitStatus::Success);
    }
    for difference in &differences {
        crate::output::stderr(&format!("differs: {difference}"));
    }
    crate::output::stderr(&format!(
        "error: not reproducible: {} difference(s) between two builds from scratch",
        differences.len()
    ));
    Ok(ExitStatus::Failure)
}

/// With `[provenance] key`, each image hallmark finished gets its signed provenance (kept in
/// the layer store and `.hallmark/provenance/`), unless the one kept names the same image
/// and checksum.
async fn sign_provenance(
    settings: &Settings,
    engine: &crate::engine::Engine,
    plan: &Plan,
    records: &[build::BuildRecord],
) -> Result<()> {
    use crate::make::provenance;
    let Some(key) = settings
        .config
        .provenance
        .as_ref()
        .and_then(|p| p.key.as_ref())
    else {
        return Ok(());
    };
    let key = settings.project.root.join(key);
    let store = crate::images::store::LayerStore::open(&settings.cache);
    let ids_are_config_digests = engine.store().await?.ids_are_config_digests();
    for record in records {
        if !matches!(record.outcome, "built" | "assembled" | "up-to-date") {
            continue;
        }
        let name = settings.project.image_name(&record.image)?;
        let Some(image) = plan.images.get(&name) else {
            continue;
        };
        let subject = crate::images::identity::config_digest(
            &store,
            &record.image_id,
            ids_are_config_digests,
        )
        .ok_or_else(|| {
            engine.error(format!(
                "the config digest of `{name}` ({}) is not known: cannot sign its provenance",
                record.image_id
            ))
        })?;
        let kept = provenance::kept(&settings.state_dir, name.as_str())?;
        // Kept for this image and checksum, and signed with the key of now (a changed key or
        // a damaged envelope is signed again).
        let same = kept.as_ref().is_some_and(|envelope| {
            crate::images::attest::signed_with(envelope, &key)
                && provenance::payload(envelope).is_some_and(|statement| {
                crate::images::attest::subjects(&statement) == [subject.clone()]
                    && statement["predicate"]["buildDefinition"]["externalParameters"]["checksum"]
                        == record.checksum.as_str()
            })
        });
        if same {
            continue;
        }
        let builder = provenance::Builder {
            node: &engine.node,
            engine_version: &engine.version.version,
        };
        // The versions the package files say, not the pins' (the build fetched the files).
        let mut image = image.clone();
        crate::plan::apt::from_files(&settings.cache, &mut image.pins.apt);
        let statement =
            provenance::statement(plan, &image, &subject, &builder, &settings.checksum_label);
        let envelope = provenance::sign_and_keep(
            &statement,
            &key,
            &store,
            &settings.state_dir,
            name.as_str(),
            &subject,
        )?;
        settings.output.note(format!(
            "{name}: provenance signed by {} for {subject}",
            envelope.signatures[0].keyid
        ));
    }
    Ok(())
}

/// `[provenance] key` that cannot sign (missing, a passphrase, not ed25519) is refused before
/// anything is built: the build would otherwise run for hours and fail at its signature.
fn refuse_unusable_key(settings: &Settings) -> Result<()> {
    let Some(key) = settings
        .config
        .provenance
        .as_ref()
        .and_then(|p| p.key.as_ref())
    else {
        return Ok(());
    };
    let path = settings.project.root.join(key);
    crate::images::attest::usable(&path).map_err(|why| Error::Usage {
        message: format!(
            "{}: `[provenance] key`: cannot sign provenance: {why}",
            settings
                .config
                .path
                .as_deref()
                .unwrap_or(std::path::Path::new("hallmark.toml"))
                .display()
        ),
        hint: Some("nothing was built; fix the key or remove `key` from `[provenance]`".into()),
    })
}

/// The lints cost nothing and a wrong ENTRYPOINT costs a deployment: refused before building.
fn refuse_lint_problems(plan: &Plan) -> Result<()> {
    let mut problems: Vec<Error> = plan
        .order
        .iter()
        .flat_map(|n| check::lints(plan, plan.get(n)))
        .collect();
    match problems.len() {
        0 => Ok(()),
        1 => Err(problems.remove(0)),
        _ => Err(Error::Many(problems)),
    }
}

/// `--check-repro` of each named image: its records (two builds each) and, in `differences`,
/// what differed, prefixed with the image's name.
async fn repro_all(
    engine: &crate::engine::Engine,
    plan: &Plan,
    names: &[crate::inputs::values::Name],
    build_settings: &BuildSettings<'_>,
    differences: &mut Vec<String>,
) -> (Vec<build::BuildRecord>, Result<()>) {
    let mut records = Vec::new();
    for name in names {
        let (mut pair, found) =
            match crate::make::repro::check(engine, plan, name, build_settings).await {
                Ok(done) => done,
                Err(error) => return (records, Err(error)),
            };
        for record in &mut pair {
            record.reproducible = Some(found.is_empty());
            record.differences = found.clone();
        }
        differences.extend(found.into_iter().map(|d| format!("{name}: {d}")));
        records.extend(pair);
    }
    (records, Ok(()))
}

fn short_id(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    &hex[..hex.len().min(12)]
}
