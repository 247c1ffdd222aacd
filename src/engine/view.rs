//! What verification asks of an engine, as a trait: the narrow seam through which the
//! decisions on what a node holds (current, stale, mismatch, missing, incomplete) are tested
//! in memory, in milliseconds ([`fake`]). [`Engine`] is the one real implementation; the
//! real-engine tests (tests/it) stay what proves it.

use super::{Engine, ImageAnswer, ImageListed, ImageStore};
use crate::error::{Error, Result};
use std::future::Future;

pub trait ImageView: Sync {
    /// The node's name, for rows and errors.
    fn node(&self) -> &str;
    /// An error of this engine, naming it.
    fn error(&self, message: String) -> Error;
    fn store(&self) -> impl Future<Output = Result<ImageStore>> + Send;
    /// `Ok(None)` when the engine does not hold the image.
    fn inspect(&self, reference: &str) -> impl Future<Output = Result<Option<ImageAnswer>>> + Send;
    /// What a client's `run REFERENCE` runs here, asked as a client asks, where that may be
    /// another image than the full name's: Podman resolves a short name its own way
    /// (`localhost/` names first, then any local name ending so). `Ok(None)` where the
    /// engine reads names one way (Docker: a short name is Docker Hub's) or nothing answers.
    fn run_as_typed(
        &self,
        _reference: &str,
    ) -> impl Future<Output = Result<Option<ImageAnswer>>> + Send {
        async { Ok(None) }
    }
    /// The ids of the images the engine lists under `reference`.
    fn ids_named(&self, reference: &str) -> impl Future<Output = Result<Vec<String>>> + Send;
    /// The images the engine lists under any of `references`.
    fn listed_images_named(
        &self,
        references: &[&str],
    ) -> impl Future<Output = Result<Vec<ImageListed>>> + Send;
}

impl ImageView for Engine {
    fn node(&self) -> &str {
        &self.node
    }

    fn error(&self, message: String) -> Error {
        Engine::error(self, message)
    }

    fn store(&self) -> impl Future<Output = Result<ImageStore>> + Send {
        Engine::store(self)
    }

    fn inspect(&self, reference: &str) -> impl Future<Output = Result<Option<ImageAnswer>>> + Send {
        Engine::inspect(self, reference)
    }

    fn run_as_typed(
        &self,
        reference: &str,
    ) -> impl Future<Output = Result<Option<ImageAnswer>>> + Send {
        Engine::run_as_typed(self, reference)
    }

    fn ids_named(&self, reference: &str) -> impl Future<Output = Result<Vec<String>>> + Send {
        Engine::ids_named(self, reference)
    }

    fn listed_images_named(
        &self,
        references: &[&str],
    ) -> impl Future<Output = Result<Vec<ImageListed>>> + Send {
        Engine::listed_images_named(self, references)
    }
}

/// An engine in memory: images by tag, each listed or not (a containerd store may hold a tag
/// it does not list), and a count of the inspects asked.
#[cfg(test)]
pub mod fake {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    pub struct FakeEngine {
        pub store: ImageStore,
        /// (tag as the engine spells it, the image, whether the list names it)
        pub images: Vec<(String, ImageAnswer, bool)>,
        pub inspects: AtomicUsize,
    }

    impl FakeEngine {
        pub fn new(store: ImageStore) -> FakeEngine {
            FakeEngine {
                store,
                images: Vec::new(),
                inspects: AtomicUsize::new(0),
            }
        }

        /// Holds `image` under `tag`; `listed`: whether the image list names it.
        pub fn holding(mut self, tag: &str, image: serde_json::Value, listed: bool) -> FakeEngine {
            let image = serde_json::from_value(image).expect("an inspect answer");
            self.images.push((tag.to_string(), image, listed));
            self
        }

        fn find(&self, reference: &str) -> Option<&(String, ImageAnswer, bool)> {
            self.images
                .iter()
                .find(|(tag, image, _)| tag == reference || image.id() == Some(reference))
        }
    }

    impl ImageView for FakeEngine {
        fn node(&self) -> &str {
            "fake"
        }

        fn error(&self, message: String) -> Error {
            Error::Engine {
                node: "fake".into(),
                endpoint: "memory".into(),
                message,
                hint: None,
            }
        }

        async fn store(&self) -> Result<ImageStore> {
            Ok(self.store)
        }

        async fn inspect(&self, reference: &str) -> Result<Option<ImageAnswer>> {
            self.inspects.fetch_add(1, Ordering::SeqCst);
            Ok(self.find(reference).map(|(_, image, _)| image.clone()))
        }

        async fn ids_named(&self, reference: &str) -> Result<Vec<String>> {
            Ok(self
                .find(reference)
                .filter(|(_, _, listed)| *listed)
                .and_then(|(_, image, _)| image.id().map(str::to_string))
                .into_iter()
                .collect())
        }

        async fn listed_images_named(&self, references: &[&str]) -> Result<Vec<ImageListed>> {
            let listed = self
                .images
                .iter()
                .filter(|(tag, _, listed)| *listed && references.contains(&tag.as_str()))
                .map(|(tag, image, _)| {
                    serde_json::from_value(serde_json::json!({
                        "Id": image.id(),
                        "RepoTags": [tag],
                        "Labels": image.config.get("Labels"),
                    }))
                    .expect("a list entry")
                })
                .collect();
            Ok(listed)
        }
    }
}
