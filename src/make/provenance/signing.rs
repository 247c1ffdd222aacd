//! Signing at build time: each image hallmark finished gets its signed provenance with the
//! key `[provenance] key` names, unless the one kept already names it; a key that cannot
//! sign is refused before anything is built.

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::inputs::config::Config;
use crate::inputs::project::Project;
use crate::make::build::{self, BuildSettings};
use crate::output::Output;
use crate::plan::Plan;

/// With `[provenance] key`, each image hallmark finished gets its signed provenance (kept in
/// the layer store and `.hallmark/provenance/`), unless the one kept names the same image
/// and checksum.
pub async fn sign_provenance(
    (config, project, output): (&Config, &Project, &Output),
    settings: &BuildSettings<'_>,
    engine: &Engine,
    plan: &Plan,
    records: &[build::BuildRecord],
) -> Result<()> {
    use crate::make::provenance;
    let Some(key) = config.provenance.as_ref().and_then(|p| p.key.as_ref()) else {
        return Ok(());
    };
    let key = project.root.join(key);
    let store = crate::images::store::LayerStore::open(settings.cache);
    let ids_are_config_digests = engine.store().await?.ids_are_config_digests();
    for record in records {
        if !matches!(record.outcome, "built" | "assembled" | "up-to-date") {
            continue;
        }
        let name = project.image_name(&record.image)?;
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
        let kept = provenance::kept(settings.state_dir, name.as_str())?;
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
        crate::plan::apt::from_files(settings.cache, &mut image.pins.apt);
        let statement =
            provenance::statement(plan, &image, &subject, &builder, settings.checksum_label);
        let envelope = provenance::sign_and_keep(
            &statement,
            &key,
            &store,
            settings.state_dir,
            name.as_str(),
            &subject,
        )?;
        output.note(format!(
            "{name}: provenance signed by {} for {subject}",
            envelope.signatures[0].keyid
        ));
    }
    Ok(())
}

/// `[provenance] key` that cannot sign (missing, a passphrase, not ed25519) is refused before
/// anything is built: the build would otherwise run for hours and fail at its signature.
pub fn refuse_unusable_key(config: &Config, project: &Project) -> Result<()> {
    let Some(key) = config.provenance.as_ref().and_then(|p| p.key.as_ref()) else {
        return Ok(());
    };
    let path = project.root.join(key);
    crate::images::attest::usable(&path).map_err(|why| Error::Usage {
        message: format!(
            "{}: `[provenance] key`: cannot sign provenance: {why}",
            config
                .path
                .as_deref()
                .unwrap_or(std::path::Path::new("hallmark.toml"))
                .display()
        ),
        hint: Some("nothing was built; fix the key or remove `key` from `[provenance]`".into()),
    })
}
