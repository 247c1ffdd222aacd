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

/// Why the provenance kept for an image does not verify.
#[derive(Debug, thiserror::Error)]
pub enum Unverified {
    #[error(transparent)]
    Unreadable(Error),
    #[error("no provenance kept for `{0}`: build it with [provenance] key set")]
    NoneKept(String),
    #[error(transparent)]
    Attest(#[from] crate::images::attest::AttestError),
    /// The checksum the statement names (as JSON), and the image's.
    #[error("the provenance kept is for checksum {kept}, the image's is {image}")]
    OtherChecksum {
        kept: serde_json::Value,
        image: String,
    },
    #[error("the builder's image to compare the signed subject with is not at hand")]
    NoBuilderImage,
    /// The subjects signed (joined with `, `), and the builder's image.
    #[error("the signed subject is {signed}, the builder's image is {builder}")]
    OtherSubject { signed: String, builder: String },
}

/// Whether the provenance kept for `image` verifies: signed by a trusted key, for its
/// checksum, with `subject` (the config digest of the builder's finished image) as its
/// subject. `Ok` names the key; `Err` says why not.
pub fn signed(
    state_dir: &Path,
    image: &PlannedImage,
    subject: Option<&str>,
    trusted: &[crate::images::attest::Trusted],
) -> std::result::Result<String, Unverified> {
    let envelope = crate::make::provenance::kept(state_dir, image.name().as_str())
        .map_err(Unverified::Unreadable)?
        .ok_or_else(|| Unverified::NoneKept(image.name().to_string()))?;
    let (key, statement) = crate::images::attest::verify(&envelope, trusted)?;
    let checksum = &statement["predicate"]["buildDefinition"]["externalParameters"]["checksum"];
    if checksum != image.checksum.as_str() {
        return Err(Unverified::OtherChecksum {
            kept: checksum.clone(),
            image: image.checksum.to_string(),
        });
    }
    let subjects = crate::images::attest::subjects(&statement);
    match subject {
        None => Err(Unverified::NoBuilderImage),
        Some(subject) if subjects.iter().any(|s| s == subject) => Ok(format!(
            "provenance signed by {} ({})",
            key.keyid,
            key.path.display()
        )),
        Some(subject) => Err(Unverified::OtherSubject {
            signed: subjects.join(", "),
            builder: subject.to_string(),
        }),
    }
}

/// Each node's row of each image, with its provenance: a node that holds the image (current)
/// is `unsigned` unless the provenance verifies; one that holds another says it does not
/// hold the signed subject.
pub fn judge_provenance(
    columns: &mut [Vec<NodeHolding>],
    verdicts: &[std::result::Result<String, Unverified>],
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
