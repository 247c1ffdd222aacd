//! Signed provenance: an in-toto Statement in a DSSE envelope (the format in-toto, SLSA and
//! Sigstore read), signed with the operator's ed25519 key in OpenSSH format and checked
//! against the public keys `hallmark.toml` trusts (`[provenance]`).
//!
//! The signature is a plain ed25519 signature over DSSE's pre-authentication encoding, so
//! any DSSE implementation checks it with the public key; `ssh-keygen -Y sign` is not used:
//! it signs its own SSHSIG wrapping, which DSSE verifiers do not read. The key file is read
//! by the `ssh-key` crate and signs through `ed25519-dalek`.

use base64::Engine as _;
use ed25519_dalek::{Signer as _, Verifier as _};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The payload type of an in-toto Statement in DSSE.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";

/// A DSSE envelope (`payload` base64 of the Statement's JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    pub payload: String,
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    pub signatures: Vec<Signature>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    /// The key's OpenSSH fingerprint (`SHA256:...`), as `ssh-keygen -l` prints it.
    pub keyid: String,
    /// base64 of the 64-byte ed25519 signature.
    pub sig: String,
}

/// DSSE's pre-authentication encoding: what is signed.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut bytes = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    bytes.extend_from_slice(payload);
    bytes
}

/// Why a key cannot sign or be trusted, or why an envelope does not verify.
#[derive(Debug, thiserror::Error)]
pub enum AttestError {
    #[error(transparent)]
    Read(#[from] std::io::Error),
    #[error("{}: not an OpenSSH private key: {source}", path.display())]
    NotPrivateKey {
        path: PathBuf,
        source: ssh_key::Error,
    },
    #[error("{}: the key has a passphrase; hallmark signs unattended: make one without (`ssh-keygen -t ed25519 -N '' -f ...`)", .0.display())]
    Passphrase(PathBuf),
    #[error("{}: a {algorithm} key; provenance is signed with ed25519 (`ssh-keygen -t ed25519`)", path.display())]
    NotEd25519Private {
        path: PathBuf,
        algorithm: ssh_key::Algorithm,
    },
    #[error("{}: holds no public key", .0.display())]
    NoPublicKey(PathBuf),
    #[error("{}, key {number}: not an OpenSSH public key: {source}", path.display())]
    NotPublicKey {
        path: PathBuf,
        number: usize,
        source: ssh_key::Error,
    },
    #[error("{}: not an ed25519 key", .0.display())]
    NotEd25519(PathBuf),
    #[error("{}: {source}", path.display())]
    BadKey {
        path: PathBuf,
        source: ed25519_dalek::SignatureError,
    },
    #[error("payload type `{0}`, not an in-toto Statement")]
    PayloadType(String),
    #[error("the payload is not base64: {0}")]
    NotBase64(base64::DecodeError),
    #[error("the signed payload is not JSON: {0}")]
    NotJson(serde_json::Error),
    /// Key ids, each list joined with `, `.
    #[error(
        "no signature verifies with a key hallmark.toml trusts (signed by {signed_by}; trusted: {trusted})"
    )]
    Untrusted { signed_by: String, trusted: String },
}

fn base64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// Signs `statement` with the OpenSSH ed25519 private key at `key` (unencrypted: hallmark
/// runs unattended).
pub fn sign(statement: &serde_json::Value, key: &Path) -> Result<Envelope, AttestError> {
    let (private, signing) = signing_key(key)?;
    let payload = serde_json::to_vec(statement).expect("JSON values serialize");
    let signature = signing.sign(&pae(PAYLOAD_TYPE, &payload));
    Ok(Envelope {
        payload: base64().encode(&payload),
        payload_type: PAYLOAD_TYPE.to_string(),
        signatures: vec![Signature {
            keyid: private
                .public_key()
                .fingerprint(ssh_key::HashAlg::Sha256)
                .to_string(),
            sig: base64().encode(signature.to_bytes()),
        }],
    })
}

/// `Ok` if the private key at `key` can sign provenance (it exists, is an OpenSSH ed25519
/// key, has no passphrase), else why not: asked before a build starts, so that a build of
/// hours does not end in a signature that cannot be made.
pub fn usable(key: &Path) -> Result<(), AttestError> {
    signing_key(key).map(drop)
}

/// The private key at `key` and its ed25519 signing half.
fn signing_key(
    key: &Path,
) -> Result<(ssh_key::PrivateKey, ed25519_dalek::SigningKey), AttestError> {
    let text = fs_err::read_to_string(key)?;
    let private =
        ssh_key::PrivateKey::from_openssh(&text).map_err(|source| AttestError::NotPrivateKey {
            path: key.to_path_buf(),
            source,
        })?;
    if private.is_encrypted() {
        return Err(AttestError::Passphrase(key.to_path_buf()));
    }
    let Some(pair) = private.key_data().ed25519() else {
        return Err(AttestError::NotEd25519Private {
            path: key.to_path_buf(),
            algorithm: private.algorithm(),
        });
    };
    let signing = ed25519_dalek::SigningKey::from_bytes(&pair.private.to_bytes());
    Ok((private, signing))
}

/// A public key hallmark.toml trusts, read.
pub struct Trusted {
    pub path: PathBuf,
    pub keyid: String,
    key: ed25519_dalek::VerifyingKey,
}

/// Reads the OpenSSH public keys at `paths`: each line of each file one ed25519 key (as in
/// `authorized_keys`; blank lines and `#` comments skipped). A file with no key, or a line
/// that is not an ed25519 key, is an error naming the file.
pub fn trusted(paths: &[PathBuf]) -> Result<Vec<Trusted>, AttestError> {
    let mut keys = Vec::new();
    for path in paths {
        let text = fs_err::read_to_string(path)?;
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        if lines.is_empty() {
            return Err(AttestError::NoPublicKey(path.clone()));
        }
        for (number, line) in lines.into_iter().enumerate() {
            let public = ssh_key::PublicKey::from_openssh(line).map_err(|source| {
                AttestError::NotPublicKey {
                    path: path.clone(),
                    number: number + 1,
                    source,
                }
            })?;
            keys.push(trusted_key(path, &public)?);
        }
    }
    Ok(keys)
}

fn trusted_key(path: &Path, public: &ssh_key::PublicKey) -> Result<Trusted, AttestError> {
    let bytes = public
        .key_data()
        .ed25519()
        .ok_or_else(|| AttestError::NotEd25519(path.to_path_buf()))?;
    let key = ed25519_dalek::VerifyingKey::from_bytes(&bytes.0).map_err(|source| {
        AttestError::BadKey {
            path: path.to_path_buf(),
            source,
        }
    })?;
    Ok(Trusted {
        path: path.to_path_buf(),
        keyid: public.fingerprint(ssh_key::HashAlg::Sha256).to_string(),
        key,
    })
}

/// Whether `envelope` verifies with the public half of the private key at `key` (the one
/// `build` signs with now): a kept envelope signed by another key is signed again.
pub fn signed_with(envelope: &Envelope, key: &Path) -> bool {
    let Ok(text) = fs_err::read_to_string(key) else {
        return false;
    };
    let Ok(private) = ssh_key::PrivateKey::from_openssh(&text) else {
        return false;
    };
    let Ok(public) = trusted_key(key, private.public_key()) else {
        return false;
    };
    verify(envelope, std::slice::from_ref(&public)).is_ok()
}

/// The Statement of `envelope` if one of its signatures verifies with a `trusted` key; which
/// key did, or why none did.
pub fn verify<'a>(
    envelope: &Envelope,
    trusted: &'a [Trusted],
) -> Result<(&'a Trusted, serde_json::Value), AttestError> {
    if envelope.payload_type != PAYLOAD_TYPE {
        return Err(AttestError::PayloadType(envelope.payload_type.clone()));
    }
    let payload = base64()
        .decode(&envelope.payload)
        .map_err(AttestError::NotBase64)?;
    let signed = pae(&envelope.payload_type, &payload);
    for signature in &envelope.signatures {
        let Ok(bytes) = base64().decode(&signature.sig) else {
            continue;
        };
        let Ok(signature) = ed25519_dalek::Signature::from_slice(&bytes) else {
            continue;
        };
        if let Some(key) = trusted
            .iter()
            .find(|k| k.key.verify(&signed, &signature).is_ok())
        {
            let statement = serde_json::from_slice(&payload).map_err(AttestError::NotJson)?;
            return Ok((key, statement));
        }
    }
    let keyids: Vec<&str> = envelope
        .signatures
        .iter()
        .map(|s| s.keyid.as_str())
        .collect();
    Err(AttestError::Untrusted {
        signed_by: if keyids.is_empty() {
            "nobody".to_string()
        } else {
            keyids.join(", ")
        },
        trusted: trusted
            .iter()
            .map(|k| k.keyid.as_str())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// The sha256 digests a Statement names as its subjects.
pub fn subjects(statement: &serde_json::Value) -> Vec<String> {
    statement["subject"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["digest"]["sha256"].as_str())
        .map(|hex| format!("sha256:{hex}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_is_dsse_v1() {
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
        );
    }
}
