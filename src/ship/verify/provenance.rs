//! `verify --provenance`: the keys hallmark.toml trusts, whether the provenance kept for an
//! image verifies against them (for its checksum, its subject the builder's image), and each
//! node's row of it.

use super::{Holding, NodeHolding};
use crate::error::{Error, Result};
use crate::inputs::config::Config;
use crate::plan::PlannedImage;
use std::path::Path;

/// The public keys `[provenance] trusted` names; none is a usage error that says so.
pub fn trusted_keys(config: &Config, root: &Path) -> Result<Vec<crate::images::attest::Trusted>> {
    let paths: Vec<std::path::PathBuf> = config
        .provenance
        .iter()
        .flat_map(|p| &p.trusted)
        .map(|p| root.join(p))
        .collect();
    if paths.is_empty() {
        return Err(Error::Usage {
            message: "verify --provenance: hallmark.toml trusts no key ([provenance] trusted), so no provenance can be checked; without [provenance] nothing is signed either".into(),
            hint: Some("[provenance]\nkey = \"keys/hallmark\"\ntrusted = [\"keys/hallmark.pub\"]   (docs/supply-chain.md)".into()),
        });
    }
    crate::images::attest::trusted(&paths).map_err(|message| Error::Usage {
        message: format!("[provenance] trusted: {message}"),
        hint: None,
    })
}

/// Whether the provenance kept for `image` verifies: signed by a trusted key, for its
/// checksum, with `subject` (the config digest of the builder's finished image) as its
/// subject. `Ok` names the key; `Err` says why not.
pub fn signed(
    state_dir: &Path,
    image: &PlannedImage,
    subject: Option<&str>,
    trusted: &[crate::images::attest::Trusted],
) -> std::result::Result<String, String> {
    let envelope = crate::make::provenance::kept(state_dir, image.name().as_str())
        .map_err(|e| e.to_string())?
        .ok_or_else(|| {
            format!(
                "no provenance kept for `{}`: build it with [provenance] key set",
                image.name()
            )
        })?;
    let (key, statement) = crate::images::attest::verify(&envelope, trusted)?;
    let checksum = &statement["predicate"]["buildDefinition"]["externalParameters"]["checksum"];
    if checksum != image.checksum.as_str() {
        return Err(format!(
            "the provenance kept is for checksum {checksum}, the image's is {}",
            image.checksum
        ));
    }
    let subjects = crate::images::attest::subjects(&statement);
    match subject {
        None => Err("the builder's image to compare the signed subject with is not at hand".into()),
        Some(subject) if subjects.iter().any(|s| s == subject) => Ok(format!(
            "provenance signed by {} ({})",
            key.keyid,
            key.path.display()
        )),
        Some(subject) => Err(format!(
            "the signed subject is {}, the builder's image is {subject}",
            subjects.join(", ")
        )),
    }
}

/// Each node's row of each image, with its provenance: a node that holds the image (current)
/// is `unsigned` unless the provenance verifies; one that holds another says it does not
/// hold the signed subject.
pub fn judge_provenance(
    columns: &mut [Vec<NodeHolding>],
    verdicts: &[std::result::Result<String, String>],
) {
    for column in columns {
        for (holding, verdict) in column.iter_mut().zip(verdicts) {
            let note = match (&holding.state, verdict) {
                (Holding::Current, Ok(signed)) => signed.clone(),
                (Holding::Current, Err(why)) => {
                    holding.state = Holding::Unsigned;
                    format!("provenance: {why}")
                }
                (
                    Holding::Stale | Holding::Mismatch | Holding::Missing | Holding::Incomplete,
                    _,
                ) => "provenance: the node does not hold the signed subject".to_string(),
                // Unreachable, unverified, unplanned: what it holds is not known.
                _ => continue,
            };
            holding.detail = Some(match holding.detail.take() {
                Some(detail) => format!("{detail}; {note}"),
                None => note,
            });
        }
    }
}
