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

/// RFC 3339 UTC for a Unix time, without a date crate (days to civil date, H. Hinnant).
pub fn rfc3339(epoch: u64) -> String {
    let days = (epoch / 86_400) as i64;
    let secs = epoch % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}
