//! The OCI and Docker formats hallmark reads and writes, typed once: image references as
//! engines read them, content digests, the archives hallmark streams to engines (OCI layout
//! plus Docker's `manifest.json`), and the one deterministic tar writer every archive,
//! context and layer goes through.
//!
//! The manifest, index, descriptor and layout types come from the oci-spec crate. Image
//! configs stay `serde_json::Value` where they are read: oci-spec's `ImageConfiguration`
//! would drop Docker's own fields (`Healthcheck`, `OnBuild`, `Shell`, ...), and hallmark
//! passes configs on byte for byte.

pub mod archive;
pub mod digest;
pub mod reference;
pub mod tar;

pub use digest::{Digest, Hashing};
pub use reference::Reference;
