//! What engines answer, read leniently: only the fields hallmark uses, each one missing,
//! `null` or empty taken as absent. bollard's models require fields engines leave out:
//! Docker 28's containerd store answers image inspect for an image whose content it lacks
//! with a stub (empty `Os`, `RootFS: {}`, `Config: null`) that bollard 0.21 cannot parse
//! ("missing field `Type`"), Docker 29 drops empty fields (an image summary's `Labels`, a new
//! container's `Warnings`), and each engine answers at its own API version. An answer is an
//! error only when it is not JSON or a field hallmark needs has another type.

use super::kind::ImageStore;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

/// A missing field and `null` both read as the type's default.
fn nullable<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// One entry of `GET /images/{name}/history`, newest first: the id of the image the step
/// made while the engine holds it (`<missing>` or empty where it does not), the size of the
/// layer it added, and what made it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct HistoryStep {
    #[serde(rename = "Id", deserialize_with = "nullable")]
    pub id: String,
    #[serde(rename = "Size", deserialize_with = "nullable")]
    pub size: i64,
    #[serde(rename = "CreatedBy", deserialize_with = "nullable")]
    pub created_by: String,
    #[serde(rename = "Comment", deserialize_with = "nullable")]
    pub comment: String,
}

/// `GET /images/{name}/json`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ImageAnswer {
    #[serde(rename = "Id", deserialize_with = "nullable")]
    id: String,
    #[serde(rename = "RepoDigests", deserialize_with = "nullable")]
    pub repo_digests: Vec<String>,
    #[serde(rename = "RepoTags", deserialize_with = "nullable")]
    pub repo_tags: Vec<String>,
    /// The runtime config as the engine wrote it (`Env`, `Cmd`, `Labels`, ...).
    #[serde(rename = "Config", deserialize_with = "nullable")]
    pub config: Map<String, Value>,
    #[serde(rename = "RootFS", deserialize_with = "nullable")]
    root_fs: RootFs,
    #[serde(rename = "Os", deserialize_with = "nullable")]
    os: String,
    #[serde(rename = "Architecture", deserialize_with = "nullable")]
    architecture: String,
    #[serde(rename = "Variant", deserialize_with = "nullable")]
    variant: String,
    #[serde(rename = "Size")]
    pub size: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
struct RootFs {
    #[serde(rename = "Layers", deserialize_with = "nullable")]
    layers: Vec<String>,
}

impl ImageAnswer {
    /// The engine's id for the image: the config digest on the classic store, the manifest
    /// (or index) digest on the containerd store.
    pub fn id(&self) -> Option<&str> {
        Some(self.id.as_str()).filter(|id| !id.is_empty())
    }

    /// The layer diff IDs, in order.
    pub fn layers(&self) -> &[String] {
        &self.root_fs.layers
    }

    /// `os/arch[/variant]`, as the OCI names platforms.
    /// `os/architecture`, without the variant (which some engines leave out).
    pub fn os_architecture(&self) -> String {
        format!("{}/{}", self.os, self.architecture)
    }

    pub fn platform(&self) -> String {
        let mut platform = format!("{}/{}", self.os, self.architecture);
        if !self.variant.is_empty() {
            platform = format!("{platform}/{}", self.variant);
        }
        platform
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.config.get("Labels")?.get(key)?.as_str()
    }

    /// A list of strings in the runtime config (`Entrypoint`, `Cmd`); absent when missing,
    /// `null` or empty.
    pub fn strings(&self, field: &str) -> Option<Vec<String>> {
        let list: Vec<String> = self
            .config
            .get(field)?
            .as_array()?
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        Some(list).filter(|l| !l.is_empty())
    }

    /// The engine has the image's name but not what it is made of (the containerd store's
    /// stub for an image whose manifest it lacks): no OS and no layers.
    pub fn is_stub(&self) -> bool {
        self.os.is_empty() && self.root_fs.layers.is_empty()
    }
}

/// One entry of `GET /images/json`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ImageListed {
    #[serde(rename = "Id", deserialize_with = "nullable")]
    pub id: String,
    #[serde(rename = "RepoTags", deserialize_with = "nullable")]
    pub repo_tags: Vec<String>,
    #[serde(rename = "Labels", deserialize_with = "nullable")]
    pub labels: std::collections::BTreeMap<String, String>,
}

/// `GET /version`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct EngineVersion {
    #[serde(rename = "Version", deserialize_with = "nullable")]
    pub version: String,
    #[serde(rename = "ApiVersion", deserialize_with = "nullable")]
    pub api_version: String,
    #[serde(rename = "MinAPIVersion", deserialize_with = "nullable")]
    pub min_api_version: String,
    #[serde(rename = "Os", deserialize_with = "nullable")]
    pub os: String,
    #[serde(rename = "Arch", deserialize_with = "nullable")]
    pub arch: String,
    #[serde(rename = "Components", deserialize_with = "nullable")]
    pub components: Vec<EngineComponent>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct EngineComponent {
    #[serde(rename = "Name", deserialize_with = "nullable")]
    pub name: String,
    #[serde(rename = "Version", deserialize_with = "nullable")]
    pub version: String,
}

impl EngineVersion {
    /// The engine's own platform, `os/arch`.
    pub fn platform(&self) -> String {
        format!("{}/{}", self.os, self.arch)
    }

    /// `Some("Podman Engine 5.8.6")` when the engine is Podman's Docker-compatible API (it
    /// names itself in the components), `None` for Docker.
    pub fn podman(&self) -> Option<String> {
        self.components
            .iter()
            .find(|c| c.name.to_ascii_lowercase().contains("podman"))
            .map(|c| format!("{} {}", c.name, c.version))
    }
}

/// `1.45` -> `(1, 45)`.
fn api_number(text: &str) -> Option<(usize, usize)> {
    let (major, minor) = text.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

impl EngineVersion {
    /// Whether the engine's own version (`28.5.2+dfsg4`, `v26.1.5`) is `major.minor` or
    /// newer; false when it does not read as one.
    pub fn at_least(&self, major: u64, minor: u64) -> bool {
        let text = self.version.trim().trim_start_matches('v');
        let mut parts = text.split(|c: char| !c.is_ascii_digit());
        let number = |part: Option<&str>| part.and_then(|p| p.parse::<u64>().ok());
        match (number(parts.next()), number(parts.next())) {
            (Some(a), Some(b)) => (a, b) >= (major, minor),
            _ => false,
        }
    }

    /// The newest API version both the engine and hallmark (`newest`) speak, or none if the
    /// engine did not say or needs a newer one than hallmark speaks.
    pub fn usable_api(&self, newest: &bollard::ClientVersion) -> Option<String> {
        let ours = (newest.major_version, newest.minor_version);
        let theirs = api_number(&self.api_version)?;
        let chosen = ours.min(theirs);
        if let Some(floor) = api_number(&self.min_api_version)
            && chosen < floor
        {
            return None;
        }
        Some(format!("{}.{}", chosen.0, chosen.1))
    }
}

/// `GET /info`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct EngineInfo {
    #[serde(rename = "Driver", deserialize_with = "nullable")]
    pub driver: String,
    #[serde(rename = "DriverStatus", deserialize_with = "nullable")]
    driver_status: Vec<Vec<Value>>,
    #[serde(rename = "Images")]
    pub images: Option<i64>,
    #[serde(rename = "DockerRootDir", deserialize_with = "nullable")]
    pub docker_root_dir: String,
    /// The engine's host name (`--parallel` counts the nodes on the builder's machine).
    #[serde(rename = "Name", default, deserialize_with = "nullable")]
    pub name: String,
    /// `name=seccomp,profile=builtin`, `name=userns`, `name=rootless`...
    #[serde(rename = "SecurityOptions", default, deserialize_with = "nullable")]
    pub security_options: Vec<String>,
    /// The runtimes it knows by name (`runc`, `nvidia`...).
    #[serde(rename = "Runtimes", default, deserialize_with = "nullable")]
    pub runtimes: std::collections::BTreeMap<String, Value>,
    /// Where it reads CDI specs (Docker 25+, with CDI on: by default since 28.3).
    #[serde(rename = "CDISpecDirs", default, deserialize_with = "nullable")]
    pub cdi_spec_dirs: Vec<String>,
    /// The CDI devices it found (Docker 28.3+): `{"Source": "cdi", "ID": "nvidia.com/gpu=0"}`.
    #[serde(rename = "DiscoveredDevices", default, deserialize_with = "nullable")]
    pub discovered_devices: Vec<Value>,
}

impl EngineInfo {
    /// Docker's image store: containerd's when the driver reports a containerd snapshotter,
    /// else the classic one. (Podman's is known by its version: [`crate::engine::Engine::store`].)
    pub fn docker_store(&self) -> ImageStore {
        let containerd = self
            .driver_status
            .iter()
            .flatten()
            .filter_map(Value::as_str)
            .any(|v| v.starts_with("io.containerd.snapshotter"));
        if containerd {
            ImageStore::Containerd
        } else {
            ImageStore::Classic
        }
    }

    /// The value of the storage driver's status line `key` (`Native Overlay Diff`: `true`).
    pub fn status(&self, key: &str) -> Option<&str> {
        self.driver_status
            .iter()
            .find(|pair| pair.first().and_then(Value::as_str) == Some(key))
            .and_then(|pair| pair.get(1)?.as_str())
    }
}

/// `POST /containers/create`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ContainerCreated {
    #[serde(rename = "Id", deserialize_with = "nullable")]
    pub id: String,
}

/// `POST /containers/{id}/wait`. A missing `StatusCode` is 0: engines that drop empty
/// fields drop a zero.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct ContainerExit {
    #[serde(rename = "StatusCode", deserialize_with = "nullable")]
    pub status_code: i64,
    #[serde(rename = "Error", deserialize_with = "nullable")]
    error: WaitError,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
struct WaitError {
    #[serde(rename = "Message", deserialize_with = "nullable")]
    message: String,
}

impl ContainerExit {
    /// What the engine says went wrong waiting for the container, if anything.
    pub fn error(&self) -> Option<&str> {
        Some(self.error.message.as_str()).filter(|m| !m.is_empty())
    }
}

/// The message of an engine's error answer (`{"message": "..."}`), or its text.
pub fn error_message(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct Refusal {
        message: String,
    }
    match serde_json::from_slice::<Refusal>(body) {
        Ok(refusal) => refusal.message,
        Err(_) => String::from_utf8_lossy(body).trim().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn podman_names_itself_in_the_version_components() {
        let podman: EngineVersion = serde_json::from_str(
            r#"{"Components":[{"Name":"Podman Engine","Version":"5.8.6","Details":{}}],"Version":"5.8.6","ApiVersion":"1.41","Os":"linux","Arch":"amd64"}"#,
        )
        .unwrap();
        assert_eq!(podman.podman().as_deref(), Some("Podman Engine 5.8.6"));
        assert_eq!(podman.platform(), "linux/amd64");
        let docker: EngineVersion = serde_json::from_str(
            r#"{"Components":[{"Name":"Engine","Version":"28.5.2"},{"Name":"containerd","Version":"2.1.9"}],"Version":"28.5.2","Components2":null}"#,
        )
        .unwrap();
        assert_eq!(docker.podman(), None);
    }

    fn recorded(name: &str) -> ImageAnswer {
        let path = format!(
            "{}/tests/fixtures/answers/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn a_stub_image_reads_as_an_image_without_content() {
        let image = recorded("docker-28-containerd-stub.json");
        assert!(image.id().is_some());
        assert!(image.layers().is_empty());
        assert_eq!(image.label("hallmark.checksum"), None);
        assert_eq!(image.strings("Cmd"), None);
        assert!(image.is_stub());
        // bollard's own model refuses the same answer.
        let text = include_str!("../../tests/fixtures/answers/docker-28-containerd-stub.json");
        assert!(serde_json::from_str::<bollard::models::ImageInspect>(text).is_err());
    }

    #[test]
    fn missing_and_null_fields_read_as_absent() {
        let layers = ["sha256:e5e2c34635aae1307de6c24114942d8c1e6bcb2af645619c6ea28e15b8a08438"];
        for name in [
            "docker-20.10-image.json",
            "docker-26-containerd-image.json",
            "docker-29-sparse-image.json",
        ] {
            let image = recorded(name);
            assert_eq!(image.layers(), layers, "{name}");
            assert_eq!(image.label("hallmark.checksum"), None, "{name}");
            assert_eq!(image.strings("Entrypoint"), None, "{name}");
            assert_eq!(image.strings("Cmd"), Some(vec!["sh".to_string()]), "{name}");
            assert!(!image.is_stub(), "{name}");
        }
        assert!(recorded("docker-20.10-image.json").repo_digests.is_empty());
        for odd in [
            "{}",
            r#"{"Id":null,"Config":null,"RootFS":null,"RepoDigests":null,"Size":null}"#,
            r#"{"Config":{"Labels":null},"RootFS":{"Layers":null}}"#,
            r#"{"Config":{"Labels":{"k":1}},"Unknown":{"x":[1]}}"#,
        ] {
            let image: ImageAnswer =
                serde_json::from_str(odd).unwrap_or_else(|e| panic!("{odd}: {e}"));
            assert_eq!(image.id(), None, "{odd}");
            assert!(image.layers().is_empty(), "{odd}");
            assert_eq!(image.label("k"), None, "{odd}");
        }
    }

    #[test]
    fn list_entries_and_containers_read_without_their_empty_fields() {
        // Docker 29: no Labels, RepoDigests, ParentId or SharedSize when empty.
        let listed: Vec<ImageListed> =
            serde_json::from_str(r#"[{"Id":"sha256:aaaa","Created":1,"Size":3,"Containers":0}]"#)
                .unwrap();
        assert_eq!(listed[0].id, "sha256:aaaa");
        assert!(
            serde_json::from_str::<Vec<bollard::models::ImageSummary>>(
                r#"[{"Id":"sha256:aaaa","Created":1,"Size":3,"Containers":0}]"#
            )
            .is_err()
        );
        let created: ContainerCreated = serde_json::from_str(r#"{"Id":"c0ffee"}"#).unwrap();
        assert_eq!(created.id, "c0ffee");
        let exit: ContainerExit = serde_json::from_str(r#"{"StatusCode":3}"#).unwrap();
        assert_eq!((exit.status_code, exit.error()), (3, None));
        let exit: ContainerExit =
            serde_json::from_str(r#"{"StatusCode":0,"Error":{"Message":"boom"}}"#).unwrap();
        assert_eq!(exit.error(), Some("boom"));
        let exit: ContainerExit = serde_json::from_str(r#"{"Error":null}"#).unwrap();
        assert_eq!((exit.status_code, exit.error()), (0, None));
    }

    #[test]
    fn an_engine_version_is_compared_by_its_numbers() {
        let version = |v: &str| EngineVersion {
            version: v.into(),
            ..EngineVersion::default()
        };
        assert!(version("28.5.2+dfsg4").at_least(28, 3));
        assert!(version("28.3.0").at_least(28, 3));
        assert!(!version("28.2.2").at_least(28, 3));
        assert!(!version("26.1.5+dfsg1").at_least(28, 3));
        assert!(version("v29.0.1").at_least(28, 3));
        assert!(!version("").at_least(28, 3));
    }

    #[test]
    fn the_api_version_is_the_newest_both_speak() {
        let newest = bollard::ClientVersion {
            major_version: 1,
            minor_version: 53,
        };
        let engine = |api: &str, min: &str| EngineVersion {
            api_version: api.into(),
            min_api_version: min.into(),
            ..Default::default()
        };
        assert_eq!(
            engine("1.41", "1.12").usable_api(&newest).as_deref(),
            Some("1.41")
        );
        assert_eq!(
            engine("1.51", "1.44").usable_api(&newest).as_deref(),
            Some("1.51")
        );
        assert_eq!(
            engine("1.60", "1.44").usable_api(&newest).as_deref(),
            Some("1.53")
        );
        assert_eq!(engine("1.60", "1.54").usable_api(&newest), None);
        assert_eq!(engine("", "").usable_api(&newest), None);
        let info: EngineInfo = serde_json::from_str(
            r#"{"Driver":"overlayfs","DriverStatus":[["driver-type","io.containerd.snapshotter.v1"]],"Images":3}"#,
        )
        .unwrap();
        assert_eq!(info.docker_store(), ImageStore::Containerd);
        let info: EngineInfo = serde_json::from_str(r#"{"DriverStatus":null}"#).unwrap();
        assert_eq!(info.docker_store(), ImageStore::Classic);
    }

    #[test]
    fn an_error_answer_gives_its_message() {
        assert_eq!(
            error_message(br#"{"message":"No such image: x"}"#),
            "No such image: x"
        );
        assert_eq!(error_message(b"plain text\n"), "plain text");
    }
}
