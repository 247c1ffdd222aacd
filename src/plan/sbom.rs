//! `hallmark sbom`: what is inside an image and where it came from, from the plan and the
//! pins alone (offline, no engine): the image and every spec image below it, the external
//! base by digest, each source at its commit with the patch files applied to it, the
//! `[[file]]` files, the wheels, the pinned system packages, and the compile stages with
//! what they make and what they are made from. Written as SPDX 2.3 JSON or CycloneDX 1.6
//! JSON; the same plan gives the same bytes (no clock, no random: times are the spec's
//! source date, ids and namespaces come from the checksum).
//!
//! By hand rather than through the `spdx-rs` or `cyclonedx-bom` crates: both build these
//! documents from their full object models (hundreds of types, most of it for parsing), and
//! what is written here is two flat lists and their relationships. The tests check what is
//! written with each project's own validator.

use crate::inputs::pins::AptPin;
use crate::plan::checksum::sha256_hex;
use crate::plan::{Plan, PlannedImage};
use serde_json::{Value, json};

/// The SBOM formats `hallmark sbom` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// SPDX 2.3, JSON.
    Spdx,
    /// CycloneDX 1.6, JSON.
    Cyclonedx,
}

/// What a part of the image is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Image,
    Base,
    Source,
    Patch,
    File,
    Wheel,
    Deb,
    Stage,
    Made,
}

/// One part: a package in SPDX's words, a component in CycloneDX's.
#[derive(Debug, Clone)]
struct Part {
    /// Stable within the document: made from what the part is.
    id: String,
    kind: Kind,
    name: String,
    version: Option<String>,
    sha256: Option<String>,
    purl: Option<String>,
    /// Where it can be fetched (an http(s) or git URL), when known.
    location: Option<String>,
    comment: Option<String>,
}

/// How two parts relate, in SPDX's relationship names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Relation {
    /// An image holds the part.
    Contains,
    /// An image is built on another.
    DescendantOf,
    /// A patch file is applied to a source.
    PatchApplied,
    /// A compile stage makes a wheel.
    Generates,
    /// A made wheel comes from a source.
    GeneratedFrom,
    /// A package is installed into a stage's toolchain.
    BuildDependencyOf,
}

impl Relation {
    fn spdx(self) -> &'static str {
        match self {
            Relation::Contains => "CONTAINS",
            Relation::DescendantOf => "DESCENDANT_OF",
            Relation::PatchApplied => "PATCH_APPLIED",
            Relation::Generates => "GENERATES",
            Relation::GeneratedFrom => "GENERATED_FROM",
            Relation::BuildDependencyOf => "BUILD_DEPENDENCY_OF",
        }
    }
}

/// The parts of one image and how they relate.
struct Inventory {
    root: String,
    parts: Vec<Part>,
    links: Vec<(String, Relation, String)>,
    checksum: String,
    name: String,
    created: String,
}

impl Inventory {
    fn add(&mut self, part: Part) -> String {
        let id = part.id.clone();
        if !self.parts.iter().any(|p| p.id == id) {
            self.parts.push(part);
        }
        id
    }

    fn link(&mut self, from: &str, relation: Relation, to: &str) {
        let link = (from.to_string(), relation, to.to_string());
        if !self.links.contains(&link) {
            self.links.push(link);
        }
    }
}

/// An id of the alphabet both formats accept, unique by the hash of what it stands for.
fn id(kind: &str, what: &str) -> String {
    let readable: String = what
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(48)
        .collect();
    format!("{kind}-{readable}-{}", &sha256_hex(what.as_bytes())[..8])
}

/// A purl's version or name segment, percent-encoded where the purl spec asks it.
fn purl_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'-' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An http(s) or ssh git URL as SPDX writes a download location (`git+https://...@commit`);
/// `None` for a local path or file URL, which says nothing outside this machine.
fn git_location(url: &str, commit: &str) -> Option<String> {
    let remote = ["https://", "http://", "ssh://", "git://"]
        .iter()
        .any(|scheme| url.starts_with(scheme));
    remote.then(|| format!("git+{url}@{commit}"))
}

fn image_part(image: &PlannedImage) -> Part {
    let reference = image.loaded.reference();
    Part {
        id: id("image", &format!("{reference}@{}", image.checksum)),
        kind: Kind::Image,
        name: reference,
        version: Some(image.checksum.to_string()),
        sha256: None,
        purl: None,
        location: None,
        comment: Some(format!(
            "built by hallmark from images/{}/image.toml; the checksum label hallmark.checksum={} names this content",
            image.name(),
            image.checksum
        )),
    }
}

fn deb_part(pin: &AptPin) -> Part {
    let vendor = if pin.archive.contains("ubuntu") {
        "ubuntu"
    } else {
        "debian"
    };
    Part {
        id: id(
            "deb",
            &format!("{}={}:{}", pin.name, pin.version, pin.architecture),
        ),
        kind: Kind::Deb,
        name: pin.name.clone(),
        version: Some(pin.version.clone()),
        sha256: Some(pin.sha256.to_string()),
        purl: Some(format!(
            "pkg:deb/{vendor}/{}@{}?arch={}",
            purl_encode(&pin.name),
            purl_encode(&pin.version),
            purl_encode(&pin.architecture)
        )),
        location: Some(format!("{}/{}", pin.archive, pin.path)),
        comment: None,
    }
}

/// Adds `image` (and, through its parent, every image below it) to `inventory`; returns
/// its part's id.
fn add_image(inventory: &mut Inventory, plan: &Plan, image: &PlannedImage) -> String {
    let me = inventory.add(image_part(image));
    match (&image.parent, &image.pins.base) {
        (Some(parent), _) => {
            let below = add_image(inventory, plan, plan.get(parent));
            inventory.link(&me, Relation::DescendantOf, &below);
        }
        (None, Some(base)) => {
            let base_id = inventory.add(base_part(base));
            inventory.link(&me, Relation::DescendantOf, &base_id);
        }
        (None, None) => {}
    }
    let source_ids = add_sources(inventory, image, &me);
    add_files(inventory, image, &me);
    add_stages(inventory, image, &me, &source_ids);
    me
}

/// The base image's part: its reference, pinned by digest.
fn base_part(base: &crate::inputs::pins::BasePin) -> Part {
    let digest = base.digest.to_string();
    let repository = base.reference.name();
    Part {
        id: id("base", &format!("{}@{digest}", base.reference)),
        kind: Kind::Base,
        name: base.reference.to_string(),
        version: Some(digest.clone()),
        sha256: digest.strip_prefix("sha256:").map(str::to_string),
        purl: Some(format!(
            "pkg:docker/{}@{}",
            repository
                .split('/')
                .map(purl_encode)
                .collect::<Vec<_>>()
                .join("/"),
            purl_encode(&digest)
        )),
        location: None,
        comment: Some(format!(
            "the base image, pinned by its {}",
            serde_json::to_value(base.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        )),
    }
}

/// Each source at its commit and the patches applied to it; an image without compile
/// stages contains them. Returns the sources' ids, in order.
fn add_sources(inventory: &mut Inventory, image: &PlannedImage, me: &str) -> Vec<String> {
    let spec = &image.loaded.spec;
    let compiled = !spec.compiles.is_empty();
    let mut source_ids = Vec::new();
    for (pin, patches) in image.pins.sources.iter().zip(&image.patches) {
        // Credentials in a git URL never reach the document (as they never reach a label).
        let git = crate::inputs::values::redact_url(&pin.git);
        let source = inventory.add(Part {
            id: id("source", &format!("{}@{git}@{}", pin.name, pin.commit)),
            kind: Kind::Source,
            name: pin.name.to_string(),
            version: Some(pin.commit.to_string()),
            sha256: None,
            purl: Some(format!(
                "pkg:generic/{}@{}?vcs_url={}",
                purl_encode(pin.name.as_str()),
                pin.commit,
                purl_encode(&format!("git+{git}@{}", pin.commit))
            )),
            location: git_location(&git, &pin.commit.to_string()),
            comment: Some(format!("{git} at {} ({})", pin.commit, pin.rev)),
        });
        for set in &patches.sets {
            for patch in &set.patches {
                let file = format!("patches/{}/{}", set.name, patch.file);
                let patch_id = inventory.add(Part {
                    id: id("patch", &format!("{file}@{}", patch.sha256)),
                    kind: Kind::Patch,
                    name: file,
                    version: None,
                    sha256: Some(patch.sha256.clone()),
                    purl: None,
                    location: None,
                    comment: Some(format!("applied with -p{}", patch.strip)),
                });
                inventory.link(&patch_id, Relation::PatchApplied, &source);
            }
        }
        // Sources a compile stage builds reach the image as wheels, not as a tree.
        if !compiled {
            inventory.link(me, Relation::Contains, &source);
        }
        source_ids.push(source);
    }
    source_ids
}

/// The files, wheels and apt packages the image contains.
fn add_files(inventory: &mut Inventory, image: &PlannedImage, me: &str) {
    for file in &image.files {
        let part = inventory.add(Part {
            id: id("file", &format!("{}@{}", file.dest, file.sha256)),
            kind: Kind::File,
            name: file.dest.clone(),
            version: None,
            sha256: Some(file.sha256.clone()),
            purl: None,
            location: None,
            comment: Some(format!("mode {:04o}", file.mode())),
        });
        inventory.link(me, Relation::Contains, &part);
    }
    for wheel in &image.pins.wheels {
        let part = inventory.add(Part {
            id: id("wheel", &format!("{}@{}", wheel.file, wheel.sha256)),
            kind: Kind::Wheel,
            name: wheel.name.to_string(),
            version: Some(wheel.version.clone()),
            sha256: Some(wheel.sha256.to_string()),
            purl: Some(format!(
                "pkg:pypi/{}@{}",
                purl_encode(&wheel.name.as_str().to_lowercase().replace(['_', '.'], "-")),
                purl_encode(&wheel.version)
            )),
            location: None,
            comment: Some(wheel.file.clone()),
        });
        inventory.link(me, Relation::Contains, &part);
    }
    for pin in image.pins.apt_for(None) {
        let part = inventory.add(deb_part(pin));
        inventory.link(me, Relation::Contains, &part);
    }
}

/// Each compile stage, the apt packages it builds with and the wheels it makes from the
/// sources.
fn add_stages(inventory: &mut Inventory, image: &PlannedImage, me: &str, source_ids: &[String]) {
    for stage in &image.compiles {
        let stage_id = inventory.add(Part {
            id: id("stage", &format!("{}@{}", stage.name, stage.checksum)),
            kind: Kind::Stage,
            name: format!("compile stage {} of {}", stage.name, image.name()),
            version: Some(stage.checksum.to_string()),
            sha256: None,
            purl: None,
            location: None,
            comment: Some(format!("runs in {}", stage.toolchain_line)),
        });
        for pin in image.pins.apt_for(Some(&stage.name)) {
            let part = inventory.add(deb_part(pin));
            inventory.link(&part, Relation::BuildDependencyOf, &stage_id);
        }
        for wheel in &stage.spec.wheels {
            let made = inventory.add(Part {
                id: id("made", &format!("{wheel}@{}", stage.checksum)),
                kind: Kind::Made,
                name: wheel.to_string(),
                version: None,
                sha256: None,
                purl: None,
                location: None,
                comment: Some(format!(
                    "a wheel compile stage {} makes; its file is known once built",
                    stage.name
                )),
            });
            inventory.link(&stage_id, Relation::Generates, &made);
            for &index in &stage.sources {
                inventory.link(&made, Relation::GeneratedFrom, &source_ids[index]);
            }
            inventory.link(me, Relation::Contains, &made);
        }
    }
}

fn inventory(plan: &Plan, image: &PlannedImage) -> Inventory {
    let mut inventory = Inventory {
        root: String::new(),
        parts: Vec::new(),
        links: Vec::new(),
        checksum: image.checksum.to_string(),
        name: image.name().to_string(),
        created: crate::oci::rfc3339(image.loaded.spec.image.source_date_epoch),
    };
    inventory.root = add_image(&mut inventory, plan, image);
    inventory
}

/// The SBOM of `image` (planned in `plan` with its parents) in `format`: pretty JSON with
/// sorted keys and a final line break.
pub fn write(plan: &Plan, image: &PlannedImage, format: Format) -> String {
    let inventory = inventory(plan, image);
    let document = match format {
        Format::Spdx => spdx(&inventory),
        Format::Cyclonedx => cyclonedx(&inventory),
    };
    let mut text = serde_json::to_string_pretty(&document).expect("JSON values serialize");
    text.push('\n');
    text
}

fn tool() -> String {
    format!("hallmark-{}", env!("CARGO_PKG_VERSION"))
}

fn spdx(inventory: &Inventory) -> Value {
    let spdx_id = |id: &str| format!("SPDXRef-{id}");
    let packages: Vec<Value> = inventory
        .parts
        .iter()
        .map(|part| {
            let mut package = json!({
                "SPDXID": spdx_id(&part.id),
                "name": part.name,
                "downloadLocation": part.location.clone().unwrap_or_else(|| "NOASSERTION".into()),
                "filesAnalyzed": false,
                "primaryPackagePurpose": match part.kind {
                    Kind::Image | Kind::Base => "CONTAINER",
                    Kind::Source => "SOURCE",
                    Kind::Patch | Kind::File => "FILE",
                    Kind::Wheel | Kind::Deb | Kind::Made => "LIBRARY",
                    Kind::Stage => "OTHER",
                },
            });
            if let Some(version) = &part.version {
                package["versionInfo"] = json!(version);
            }
            if let Some(sha256) = &part.sha256 {
                package["checksums"] = json!([{"algorithm": "SHA256", "checksumValue": sha256}]);
            }
            if let Some(purl) = &part.purl {
                package["externalRefs"] = json!([{
                    "referenceCategory": "PACKAGE-MANAGER",
                    "referenceType": "purl",
                    "referenceLocator": purl,
                }]);
            }
            if let Some(comment) = &part.comment {
                package["comment"] = json!(comment);
            }
            package
        })
        .collect();
    let mut relationships = vec![json!({
        "spdxElementId": "SPDXRef-DOCUMENT",
        "relationshipType": "DESCRIBES",
        "relatedSpdxElement": spdx_id(&inventory.root),
    })];
    relationships.extend(inventory.links.iter().map(|(from, relation, to)| {
        json!({
            "spdxElementId": spdx_id(from),
            "relationshipType": relation.spdx(),
            "relatedSpdxElement": spdx_id(to),
        })
    }));
    json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": format!("{} {}", inventory.name, inventory.checksum),
        "documentNamespace": format!("https://hallmark.invalid/spdx/{}/{}", inventory.name, inventory.checksum),
        "creationInfo": {
            "created": inventory.created,
            "creators": [format!("Tool: {}", tool())],
        },
        "packages": packages,
        "relationships": relationships,
    })
}

/// A UUID made of the checksum (version 5's bits set), so the serial number is the same for
/// the same inputs and another for others.
fn serial(checksum: &str) -> String {
    let hex = sha256_hex(format!("hallmark sbom {checksum}").as_bytes());
    let variant = ["8", "9", "a", "b"][usize::from_str_radix(&hex[16..17], 16).unwrap_or(0) % 4];
    format!(
        "urn:uuid:{}-{}-5{}-{variant}{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

fn cyclonedx(inventory: &Inventory) -> Value {
    let component = |part: &Part| {
        let mut c = json!({
            "bom-ref": part.id,
            "type": match part.kind {
                Kind::Image | Kind::Base => "container",
                Kind::Patch | Kind::File => "file",
                Kind::Stage => "application",
                Kind::Source | Kind::Wheel | Kind::Deb | Kind::Made => "library",
            },
            "name": part.name,
        });
        if let Some(version) = &part.version {
            c["version"] = json!(version);
        }
        if let Some(sha256) = &part.sha256 {
            c["hashes"] = json!([{"alg": "SHA-256", "content": sha256}]);
        }
        if let Some(purl) = &part.purl {
            c["purl"] = json!(purl);
        }
        if let Some(location) = &part.location {
            let kind = if part.kind == Kind::Source {
                "vcs"
            } else {
                "distribution"
            };
            c["externalReferences"] = json!([{"type": kind, "url": location}]);
        }
        if let Some(comment) = &part.comment {
            c["description"] = json!(comment);
        }
        c
    };
    let root = inventory
        .parts
        .iter()
        .find(|p| p.id == inventory.root)
        .expect("the root is a part");
    let components: Vec<Value> = inventory
        .parts
        .iter()
        .filter(|p| p.id != inventory.root)
        .map(component)
        .collect();
    let mut dependencies: Vec<Value> = Vec::new();
    for part in &inventory.parts {
        let on: Vec<&str> = inventory
            .links
            .iter()
            .filter_map(|(from, relation, to)| match relation {
                Relation::Contains | Relation::DescendantOf | Relation::Generates
                    if from == &part.id =>
                {
                    Some(to.as_str())
                }
                Relation::GeneratedFrom if from == &part.id => Some(to.as_str()),
                Relation::PatchApplied | Relation::BuildDependencyOf if to == &part.id => {
                    Some(from.as_str())
                }
                _ => None,
            })
            .collect();
        dependencies.push(json!({"ref": part.id, "dependsOn": on}));
    }
    json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "serialNumber": serial(&inventory.checksum),
        "version": 1,
        "metadata": {
            "timestamp": inventory.created,
            "tools": {"components": [{"type": "application", "name": "hallmark", "version": env!("CARGO_PKG_VERSION")}]},
            "component": component(root),
        },
        "components": components,
        "dependencies": dependencies,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_purls_keep_to_their_alphabets() {
        let made = id("deb", "libstdc++6=12.2.0-14:amd64");
        assert!(
            made.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-')),
            "{made}"
        );
        assert_ne!(id("deb", "a+b"), id("deb", "a-b"));
        assert_eq!(purl_encode("1:2.36-9+deb12u4"), "1%3A2.36-9%2Bdeb12u4");
        assert_eq!(purl_encode("ré✓"), "r%C3%A9%E2%9C%93");
        assert_eq!(git_location("/tmp/x", "c"), None);
        assert_eq!(
            git_location("https://github.com/v/v.git", "c").as_deref(),
            Some("git+https://github.com/v/v.git@c")
        );
        let serial = serial("abc");
        assert_eq!(serial.len(), "urn:uuid:".len() + 36, "{serial}");
        assert_eq!(&serial[23..24], "5", "{serial}");
    }
}
