//! What a build records: one `BuildRecord` per image (written to `.hallmark/records/`, printed
//! by `--json`), its smoke results, the pins it was built from, and the build log's file.

use super::*;

/// What one build did; written to `.hallmark/records/` and printed by `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct BuildRecord {
    pub image: String,
    pub reference: String,
    pub checksum: String,
    pub image_id: String,
    /// `built`, `assembled`, `up-to-date` or `failed`.
    pub outcome: &'static str,
    pub size: Option<i64>,
    pub seconds: f64,
    pub parent: Option<String>,
    pub parent_image_id: Option<String>,
    pub pins: BTreeMap<String, String>,
    pub smoke: Vec<SmokeResult>,
    pub log: Option<PathBuf>,
    /// With `--check-repro`: whether two builds from scratch gave the same image.
    pub reproducible: Option<bool>,
    pub differences: Vec<String>,
    /// sha256 of the context tar as streamed to the engine (absent when up to date).
    pub context_sha256: Option<String>,
    /// The engine's own image, before normalisation rewrote it (removed once tagged).
    pub raw_image_id: Option<String>,
    pub normalize_seconds: Option<f64>,
    /// The layers normalisation rewrote, and how many of them as the export streamed in (the
    /// others from a temporary copy: see `normalize::Normalised`).
    pub normalized_layers: Option<usize>,
    pub normalized_as_streamed: Option<usize>,
    /// Where normalisation read the new layers: `export` or `layer directories`.
    pub normalized_from: Option<&'static str>,
    /// Why the export was read and not the layer directories (the engine is remote, its
    /// image store is containerd, the data root cannot be read, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub normalized_from_reason: Option<String>,
    /// How the builder ran the image's RUN, apt and compile steps: `native`, or `emulated`
    /// (another platform's code through the builder's emulator); absent when it ran none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution: Option<crate::engine::emulation::Execution>,
    /// The platform those steps ran as (the spec's, else the parent's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
    /// Why the image failed (`outcome` "failed").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SmokeResult {
    pub name: String,
    pub passed: bool,
    pub exit_code: i64,
    pub seconds: f64,
    pub output: String,
    /// A served test's process: its last 50 lines of output.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logs: Vec<String>,
    /// Whether it ran through the node's emulator (an image of another platform).
    pub emulated: bool,
}

pub(super) fn pins_of(image: &PlannedImage) -> BTreeMap<String, String> {
    let mut pins = BTreeMap::new();
    if let Some(base) = &image.pins.base {
        pins.insert(format!("base {}", base.reference), base.digest.to_string());
    }
    for source in &image.pins.sources {
        pins.insert(format!("source {}", source.name), source.commit.to_string());
    }
    for wheel in &image.pins.wheels {
        pins.insert(
            format!("wheel {}=={}", wheel.name, wheel.version),
            wheel.sha256.to_string(),
        );
    }
    pins
}

impl BuildRecord {
    pub(super) fn new(image: &PlannedImage, parent_image_id: Option<String>) -> BuildRecord {
        BuildRecord {
            image: image.name().to_string(),
            reference: image.loaded.reference(),
            checksum: image.checksum.to_string(),
            image_id: String::new(),
            outcome: "up-to-date",
            size: None,
            seconds: 0.0,
            parent: image.parent.as_ref().map(|p| p.to_string()),
            parent_image_id,
            pins: pins_of(image),
            smoke: Vec::new(),
            log: None,
            context_sha256: None,
            raw_image_id: None,
            reproducible: None,
            differences: Vec::new(),
            normalize_seconds: None,
            normalized_layers: None,
            normalized_as_streamed: None,
            normalized_from: None,
            normalized_from_reason: None,
            execution: None,
            platform: None,
            error: None,
        }
    }
}

pub(super) fn open_log(path: &Path) -> Result<fs_err::File> {
    let dir = path.parent().expect("logs live in a folder");
    fs_err::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    fs_err::File::create(path).map_err(|e| Error::io(path, e))
}

pub(super) fn write_record(state_dir: &Path, record: &BuildRecord) -> Result<()> {
    let dir = state_dir.join("records");
    fs_err::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let path = dir.join(format!("{}-{}.json", record.image, &record.checksum[..12]));
    let text = serde_json::to_string_pretty(record).expect("record serializes");
    fs_err::write(&path, text).map_err(|e| Error::io(&path, e))
}
