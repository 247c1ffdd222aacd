//! The archives hallmark streams into `docker load`: the layout Docker 25+ `docker save`
//! writes (OCI `oci-layout`, `index.json` and `blobs/sha256/`), plus Docker's own
//! `manifest.json`, so Docker 20.10 and both image stores load it. The manifest lists every
//! layer; the archive may carry only those from `first` on (a thin archive for a node that
//! holds the rest).
//!
//! JSON is written with its keys sorted (as it always was): the manifest's digest is the
//! image's id on a containerd image store, so a byte that moved would make every node load
//! every image again. `manifest_digest_is_pinned` holds it.

use crate::oci::tar::{self, EntryType};
use crate::oci::{Digest, Reference};
use oci_spec::image::{
    Descriptor, ImageIndexBuilder, ImageManifestBuilder, MediaType, OciLayoutBuilder,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Blob {
    pub digest: Digest,
    pub size: u64,
    pub media_type: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StoredLayer {
    pub diff_id: Digest,
    pub blob: Blob,
}

/// One image as an archive carries it: its config and its layers in order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StoredImage {
    pub config: Blob,
    pub layers: Vec<StoredLayer>,
}

impl StoredImage {
    pub fn diff_ids(&self) -> Vec<String> {
        self.layers.iter().map(|l| l.diff_id.to_string()).collect()
    }
}

/// Where the blobs an archive carries are read from (the layer store).
pub trait Blobs {
    fn path_of(&self, digest: &Digest) -> PathBuf;
}

/// An uncompressed layer.
pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
/// The media type of an image config, as hallmark lists it in the manifests it writes.
pub const CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// `blobs/sha256/<hex>`: where an OCI layout keeps the blob `digest`.
pub fn blob_path(digest: &Digest) -> String {
    format!("blobs/sha256/{}", digest.hex())
}

/// `value` as JSON text with every object's keys in sorted order, whatever order the types
/// declare them in (and whether or not serde_json preserves insertion order).
fn sorted_json(value: &impl Serialize) -> String {
    fn sort(value: serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => {
                let mut entries: Vec<_> = map.into_iter().collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                serde_json::Value::Object(entries.into_iter().map(|(k, v)| (k, sort(v))).collect())
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.into_iter().map(sort).collect())
            }
            other => other,
        }
    }
    sort(serde_json::to_value(value).expect("OCI types serialize")).to_string()
}

fn descriptor(blob: &Blob) -> Descriptor {
    Descriptor::new(
        MediaType::from(blob.media_type.as_str()),
        blob.size,
        oci_digest(&blob.digest),
    )
}

fn oci_digest(digest: &Digest) -> oci_spec::image::Digest {
    digest
        .as_str()
        .parse()
        .expect("a checked sha256 digest is an OCI digest")
}

/// The OCI manifest hallmark writes for `image`, and its digest (the image's id on a
/// containerd image store).
pub fn manifest(image: &StoredImage) -> (Digest, String) {
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(descriptor(&image.config))
        .layers(
            image
                .layers
                .iter()
                .map(|l| descriptor(&l.blob))
                .collect::<Vec<_>>(),
        )
        .build()
        .expect("every field of the manifest is set");
    let text = sorted_json(&manifest);
    (Digest::of(&text), text)
}

/// The media type of a DSSE envelope as a layer (signed provenance beside an image).
pub const DSSE_ENVELOPE: &str = "application/vnd.dsse.envelope.v1+json";

/// The manifest that keeps a signed provenance beside an image in a registry, as cosign
/// keeps attestations where there is no referrers API: `config` (an empty JSON object) and
/// one layer, the DSSE `envelope`; the image it is about named by its manifest digest and
/// size in annotations (no OCI `subject`: distribution 2.8 has no referrers API). Returns its
/// JSON, keys sorted.
pub fn attestation_manifest(config: &Blob, envelope: &Blob, subject: (&str, usize)) -> String {
    let mut layer = descriptor(envelope);
    layer.set_annotations(Some(HashMap::from([(
        "predicateType".to_string(),
        "https://slsa.dev/provenance/v1".to_string(),
    )])));
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(descriptor(config))
        .layers(vec![layer])
        .annotations(HashMap::from([
            (
                "org.opencontainers.image.ref.name".to_string(),
                subject.0.to_string(),
            ),
            ("hallmark.subject.size".to_string(), subject.1.to_string()),
        ]))
        .build()
        .expect("every field of the manifest is set");
    sorted_json(&manifest)
}

/// `index.json`: the manifests (digest, size), each named by its reference (none: the image
/// loads untagged).
fn index(manifests: &[(Digest, u64, Option<&Reference>)]) -> String {
    let entries: Vec<Descriptor> = manifests
        .iter()
        .map(|(digest, size, reference)| index_entry(digest, *size, *reference))
        .collect();
    let index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(entries)
        .build()
        .expect("every field of the index is set");
    sorted_json(&index)
}

fn index_entry(
    manifest_digest: &Digest,
    manifest_size: u64,
    reference: Option<&Reference>,
) -> Descriptor {
    let annotations: HashMap<String, String> = match reference {
        None => HashMap::new(),
        Some(reference) => HashMap::from([
            (
                "io.containerd.image.name".to_string(),
                reference.qualified(),
            ),
            (
                "org.opencontainers.image.ref.name".to_string(),
                reference.tag_or_latest().to_string(),
            ),
        ]),
    };
    let mut entry = Descriptor::new(
        MediaType::ImageManifest,
        manifest_size,
        oci_digest(manifest_digest),
    );
    entry.set_annotations(Some(annotations));
    entry
}

/// Docker's `manifest.json`: one entry per image (hallmark writes and reads one).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DockerManifest {
    pub config: String,
    /// `null` in what `docker save` writes for an untagged image; hallmark writes `[]`.
    #[serde(default)]
    pub repo_tags: Option<Vec<String>>,
    pub layers: Vec<String>,
}

/// Writes the archive for `image` to `out`: every layer listed, the layers from `first` on
/// included. Blobs are read from `store` as a stream.
pub fn write(
    store: &impl Blobs,
    image: &StoredImage,
    reference: Option<&Reference>,
    first: usize,
    out: &mut impl Write,
) -> std::io::Result<()> {
    write_many(store, &[(image, reference, first)], out)
}

/// Writes one archive holding several images (`docker save A B` does the same): each image's
/// layers from its `first` on are included, a blob two images share only once; the index
/// and `manifest.json` list the images in order (a load takes them in that order). With one
/// image, the bytes are [`write`]'s.
pub fn write_many(
    store: &impl Blobs,
    images: &[(&StoredImage, Option<&Reference>, usize)],
    out: &mut impl Write,
) -> std::io::Result<()> {
    let mut tar = tar::Builder::new(out);
    write_layout(&mut tar)?;
    let mut written = std::collections::HashSet::new();
    let mut manifests = Vec::new();
    for (image, reference, first) in images {
        let blobs =
            std::iter::once(&image.config).chain(image.layers[*first..].iter().map(|l| &l.blob));
        for blob in blobs {
            if written.insert(blob.digest.clone()) {
                write_blob(&mut tar, store, blob)?;
            }
        }
        let (manifest_digest, manifest) = manifest(image);
        if written.insert(manifest_digest.clone()) {
            add_text(&mut tar, &blob_path(&manifest_digest), &manifest)?;
        }
        manifests.push((manifest_digest, manifest.len() as u64, *reference));
    }
    add_text(&mut tar, "index.json", &index(&manifests))?;
    let listed: Vec<_> = images.iter().map(|(i, r, _)| (*i, *r)).collect();
    let docker_manifest = docker_manifest(&listed, |blob| blob_path(&blob.digest));
    add_text(&mut tar, "manifest.json", &docker_manifest)?;
    tar.finish()
}

fn add(
    tar: &mut tar::Builder<impl Write>,
    path: &str,
    size: u64,
    data: &mut dyn std::io::Read,
) -> std::io::Result<()> {
    let header = tar::header(EntryType::Regular, 0o444, size, 0);
    tar::append(tar, header, path, data)
}

fn add_text(tar: &mut tar::Builder<impl Write>, path: &str, text: &str) -> std::io::Result<()> {
    add(tar, path, text.len() as u64, &mut text.as_bytes())
}

/// `oci-layout`, the first entry of an archive.
pub fn write_layout(tar: &mut tar::Builder<impl Write>) -> std::io::Result<()> {
    let layout = sorted_json(
        &OciLayoutBuilder::default()
            .image_layout_version("1.0.0")
            .build()
            .expect("the layout version is set"),
    );
    add_text(tar, "oci-layout", &layout)
}

/// One blob of `store`, under its digest. (Engines load the entries in any order: a
/// writer may send layers before it has the config.)
pub fn write_blob(
    tar: &mut tar::Builder<impl Write>,
    store: &impl Blobs,
    blob: &Blob,
) -> std::io::Result<()> {
    let mut file = fs_err::File::open(store.path_of(&blob.digest))?;
    add(tar, &blob_path(&blob.digest), blob.size, &mut file)
}

/// The manifest, `index.json` and `manifest.json` naming `image` (the last entries).
pub fn write_manifests(
    tar: &mut tar::Builder<impl Write>,
    image: &StoredImage,
    reference: Option<&Reference>,
) -> std::io::Result<()> {
    let (manifest_digest, manifest) = manifest(image);
    add_text(tar, &blob_path(&manifest_digest), &manifest)?;
    let index = index(&[(manifest_digest, manifest.len() as u64, reference)]);
    add_text(tar, "index.json", &index)?;
    write_docker_manifest(tar, image, reference, |blob| blob_path(&blob.digest))
}

/// `manifest.json` alone (what Docker's classic image store reads), each layer's entry named
/// by `path_of`: an archive may carry layers under names other than their digests.
pub fn write_docker_manifest(
    tar: &mut tar::Builder<impl Write>,
    image: &StoredImage,
    reference: Option<&Reference>,
    path_of: impl Fn(&Blob) -> String,
) -> std::io::Result<()> {
    add_text(
        tar,
        "manifest.json",
        &docker_manifest(&[(image, reference)], path_of),
    )
}

/// Docker's `manifest.json` for `images`, in order.
fn docker_manifest(
    images: &[(&StoredImage, Option<&Reference>)],
    path_of: impl Fn(&Blob) -> String,
) -> String {
    sorted_json(
        &images
            .iter()
            .map(|(image, reference)| DockerManifest {
                config: blob_path(&image.config.digest),
                repo_tags: Some(reference.map(Reference::to_string).into_iter().collect()),
                layers: image.layers.iter().map(|l| path_of(&l.blob)).collect(),
            })
            .collect::<Vec<_>>(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::store::LayerStore;

    /// The attestation's manifest was a `json!` literal; built by oci-spec, it reads back as
    /// an OCI image manifest and keeps the bytes registries already hold for it.
    #[test]
    fn the_attestation_manifest_is_built_by_oci_spec_with_the_same_bytes() {
        let blob = |bytes: &[u8], media_type: &str| Blob {
            digest: Digest::of(bytes),
            size: bytes.len() as u64,
            media_type: media_type.into(),
        };
        let config = blob(b"{}", CONFIG);
        let envelope = blob(br#"{"payload":"e30="}"#, DSSE_ENVELOPE);
        let subject = format!("sha256:{}", "ab".repeat(32));
        let text = attestation_manifest(&config, &envelope, (&subject, 1234));
        let manifest = oci_spec::image::ImageManifest::from_reader(text.as_bytes()).unwrap();
        assert_eq!(
            manifest.config().digest().to_string(),
            config.digest.as_str()
        );
        assert_eq!(manifest.config().media_type(), &MediaType::ImageConfig);
        let layer = &manifest.layers()[0];
        assert_eq!(layer.media_type().to_string(), DSSE_ENVELOPE);
        assert_eq!(layer.size(), envelope.size);
        let annotations = manifest.annotations().as_ref().unwrap();
        assert_eq!(annotations["hallmark.subject.size"], "1234");
        // What the literal wrote (serde_json sorted its keys), byte for byte.
        let literal = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config.digest.as_str(),
                "size": config.size,
            },
            "layers": [{
                "mediaType": "application/vnd.dsse.envelope.v1+json",
                "digest": envelope.digest.as_str(),
                "size": envelope.size,
                "annotations": {"predicateType": "https://slsa.dev/provenance/v1"},
            }],
            "annotations": {"org.opencontainers.image.ref.name": subject, "hallmark.subject.size": "1234"},
        });
        assert_eq!(text, sorted_json(&literal));
    }

    /// An image of two layers (one uncompressed, one gzip) in a fresh store.
    fn known_image(store: &LayerStore) -> StoredImage {
        let blob = |bytes: &[u8], media_type: &str| {
            let (digest, size) = store.add_blob(|w| w.write_all(bytes)).unwrap();
            Blob {
                digest,
                size,
                media_type: media_type.into(),
            }
        };
        let layer = |bytes: &[u8], media_type: &str| StoredLayer {
            diff_id: Digest::of(bytes),
            blob: blob(bytes, media_type),
        };
        StoredImage {
            config: blob(br#"{"architecture":"amd64","os":"linux"}"#, CONFIG),
            layers: vec![
                layer(b"first layer", LAYER_TAR),
                layer(
                    b"second layer",
                    "application/vnd.docker.image.rootfs.diff.tar.gzip",
                ),
            ],
        }
    }

    /// The values hallmark wrote before the archive code used oci-spec (computed on main
    /// with the `json!` literals): the manifest digest is the image id on a containerd
    /// store, so it may never move.
    /// Docker writes `"RepoTags": null` for an untagged image; reading it failed every
    /// assembly on the testbed.
    #[test]
    fn an_untagged_docker_manifest_reads() {
        let text = r#"[{"Config":"blobs/sha256/a","RepoTags":null,"Layers":["blobs/sha256/b"]}]"#;
        let manifests: Vec<DockerManifest> = serde_json::from_str(text).unwrap();
        assert_eq!(manifests[0].layers, ["blobs/sha256/b"]);
    }

    #[test]
    fn manifest_digest_is_pinned() {
        let dir = tempfile::tempdir().unwrap();
        let store = LayerStore::open(dir.path());
        let image = known_image(&store);
        let (digest, _) = manifest(&image);
        assert_eq!(
            digest.as_str(),
            "sha256:1e1debec25e469edbe8fa5f285c50ec68764773a944f87232c00f0d401b7c84a"
        );
        for (reference, first, pinned) in [
            (
                "hello:1",
                0,
                "sha256:c788c98f161b2081907d5443fdddfb9fcfe938ab41790ad6b87d31c971a49d9f",
            ),
            (
                "",
                1,
                "sha256:444e202d715502f9ae49427759dd592e88f19a0ba837a52e2ff390464c7f3437",
            ),
            (
                "host:5000/a/b:2",
                1,
                "sha256:c0a6a37f55d1362c17244a16eaa983d80d25a5648a746975369aaa16b2e511b5",
            ),
        ] {
            let reference = (!reference.is_empty()).then(|| Reference::parse(reference).unwrap());
            let mut out = Vec::new();
            write(&store, &image, reference.as_ref(), first, &mut out).unwrap();
            assert_eq!(
                Digest::of(&out).as_str(),
                pinned,
                "{reference:?} from layer {first}"
            );
        }
    }
}
