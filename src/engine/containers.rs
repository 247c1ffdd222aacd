//! Containers and volumes as compile stages use them: a container created from a toolchain
//! with named volumes for caches, a tar streamed in, its output followed, a folder streamed
//! out, and the container removed whatever happens. Every container created here is recorded
//! in the engine's `live` list until removed, so an interrupt (Ctrl-C) removes it too.

use super::Engine;
use super::answers::{ContainerCreated, ContainerExit};
use super::progress::StreamError;
use super::transport::{AnswerError, escape};
use crate::error::Result;
use bollard::query_parameters::{
    DownloadFromContainerOptionsBuilder, LogsOptionsBuilder, RemoveVolumeOptionsBuilder,
    UploadToContainerOptionsBuilder,
};
use futures_util::{Stream, StreamExt};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A volume hallmark made, as `/system/df` reports it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct VolumeUsage {
    #[serde(rename = "Name")]
    pub name: String,
    #[serde(rename = "Labels")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(rename = "UsageData")]
    pub usage: Option<VolumeUsageData>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct VolumeUsageData {
    /// Bytes, or -1 when the engine did not measure it.
    #[serde(rename = "Size")]
    pub size: i64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct DataUsage {
    #[serde(rename = "Volumes")]
    volumes: Option<Vec<VolumeUsage>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct VolumeAnswer {
    #[serde(rename = "Name")]
    name: String,
}

/// Sets the create document's `Entrypoint` and `Cmd` so that the container runs exactly
/// `argv` (not empty), whatever the image says: its first word as the entrypoint, the rest as
/// the cmd. An empty entrypoint is never sent: Podman's Docker-compatible API takes `[]` as
/// "the image's" (a test's argv then reached the image's ENTRYPOINT as arguments, and passed
/// without running), and Docker takes an empty cmd as "the image's" unless the entrypoint is
/// set. With both set, Docker and Podman's compat API run `argv` and nothing else (libpod's
/// document says the same in its own words: `smoke::libpod_body`).
pub fn run_exactly(body: &mut serde_json::Value, argv: &[String]) {
    let (first, rest) = argv
        .split_first()
        .map_or(("", &[][..]), |(f, r)| (f.as_str(), r));
    body["Entrypoint"] = serde_json::json!([first]);
    body["Cmd"] = rest.to_vec().into();
}

impl Engine {
    /// Creates a container from `body` (the API's create document), recorded as live before
    /// the creation's future can be dropped; returns its id.
    pub async fn create_container(&self, body: serde_json::Value) -> Result<String> {
        let image = body["Image"].as_str().unwrap_or_default().to_string();
        self.create_container_at("/containers/create", body, &image)
            .await
    }

    /// `create_container` through another endpoint (`path`: Podman's own, for devices).
    pub async fn create_container_at(
        &self,
        path: &'static str,
        body: serde_json::Value,
        image: &str,
    ) -> Result<String> {
        let (transport, live) = (self.transport.clone(), Arc::clone(&self.live));
        let created = tokio::spawn(async move {
            let mut live = live.lock().await;
            let created: Option<ContainerCreated> = transport.post(path, Some(&body)).await?;
            if let Some(created) = &created {
                live.push(created.id.clone());
            }
            Ok::<_, AnswerError>(created.map(|c| c.id))
        })
        .await;
        let failed = |e: &dyn std::fmt::Display| self.error(format!("creating a container: {e}"));
        match created {
            Ok(Ok(Some(id))) => Ok(id),
            Ok(Ok(None)) => Err(failed(&format!("no such image: {image}"))),
            Ok(Err(e)) => Err(failed(&e)),
            Err(e) => Err(failed(&e)),
        }
    }

    /// Unpacks the tar `body` streams into the container's file system at `path`.
    pub async fn put_archive(
        &self,
        id: &str,
        path: &str,
        body: impl Stream<Item = bytes::Bytes> + Send + 'static,
    ) -> Result<()> {
        let options = UploadToContainerOptionsBuilder::new().path(path).build();
        self.docker
            .upload_to_container(id, Some(options), bollard::body_stream(body))
            .await
            .map_err(|e| self.error(format!("streaming files into container {id}: {e}")))
    }

    pub async fn start_container(&self, id: &str) -> Result<()> {
        let start = self
            .docker
            .start_container(id, None::<bollard::query_parameters::StartContainerOptions>);
        self.answered(&format!("starting container {id}"), start)
            .await
    }

    /// The container's output as it comes (stdout and stderr together), from its start.
    pub fn follow_logs(
        &self,
        id: &str,
    ) -> impl Stream<Item = std::result::Result<String, StreamError>> + use<> {
        let options = LogsOptionsBuilder::new()
            .stdout(true)
            .stderr(true)
            .follow(true)
            .build();
        self.docker
            .logs(id, Some(options))
            .map(|chunk| chunk.map(|c| c.to_string()).map_err(StreamError::from))
    }

    /// Waits for the container to stop; its exit code.
    pub async fn wait_container(&self, id: &str) -> Result<i64> {
        let exit: ContainerExit = self
            .transport
            .post(&format!("/containers/{}/wait", escape(id, "")), None)
            .await
            .map_err(|e| self.error(format!("waiting for container {id}: {e}")))?
            .ok_or_else(|| self.error(format!("container {id} vanished")))?;
        if let Some(error) = exit.error() {
            return Err(self.error(format!("waiting for container {id}: {error}")));
        }
        Ok(exit.status_code)
    }

    /// The tar of `path` in the container, streamed.
    pub fn get_archive(
        &self,
        id: &str,
        path: &str,
    ) -> impl Stream<Item = std::result::Result<bytes::Bytes, StreamError>> + use<> {
        let options = DownloadFromContainerOptionsBuilder::new()
            .path(path)
            .build();
        self.docker
            .download_from_container(id, Some(options))
            .map(|chunk| chunk.map_err(StreamError::from))
    }

    /// Makes an image of the stopped container `id` (its file system over its image, its
    /// config, labels included), tagged `repository:tag`; returns the image id.
    pub async fn commit_container(&self, id: &str, repository: &str, tag: &str) -> Result<String> {
        let query = format!(
            "/commit?container={}&repo={}&tag={}",
            escape(id, ""),
            escape(repository, "/:"),
            escape(tag, "")
        );
        let committed: ContainerCreated = self
            .transport
            .post(&query, Some(&serde_json::json!({})))
            .await
            .map_err(|e| self.error(format!("committing container {id}: {e}")))?
            .ok_or_else(|| self.error(format!("container {id} vanished before its commit")))?;
        Ok(committed.id)
    }

    /// Removes a container `create_container` made (forced), and forgets it.
    pub async fn remove_created(&self, id: &str) {
        self.remove_container(id).await;
    }

    /// Creates the named volume with `labels`, or finds it (creating an existing name is a
    /// no-op for the engine).
    pub async fn ensure_volume(&self, name: &str, labels: &BTreeMap<String, String>) -> Result<()> {
        let body = serde_json::json!({"Name": name, "Labels": labels});
        let _: Option<VolumeAnswer> = self
            .transport
            .post("/volumes/create", Some(&body))
            .await
            .map_err(|e| self.error(format!("creating volume {name}: {e}")))?;
        Ok(())
    }

    /// Every volume carrying the label `key`, with its size as the engine measures it.
    pub async fn volumes_labelled(&self, key: &str) -> Result<Vec<VolumeUsage>> {
        let usage: DataUsage = self
            .transport
            // Volumes only where the engine can (API 1.42+); older engines ignore the query.
            .get("/system/df?type=volume")
            .await
            .map_err(|e| self.error(format!("reading disk usage: {e}")))?
            .unwrap_or_default();
        Ok(usage
            .volumes
            .unwrap_or_default()
            .into_iter()
            .filter(|v| v.labels.as_ref().is_some_and(|l| l.contains_key(key)))
            .collect())
    }

    pub async fn remove_volume(&self, name: &str) -> Result<()> {
        let options = RemoveVolumeOptionsBuilder::new().force(true).build();
        let removal = self.docker.remove_volume(name, Some(options));
        self.answered(&format!("removing volume {name}"), removal)
            .await
    }
}
