//! What kind of engine hallmark talks to, typed once: which product it is, how it keeps
//! images, how requests reach it and which API version was agreed. Every decision that
//! depends on the engine's kind asks these values; none compares the strings engines report.

use serde::Serialize;
use std::fmt;

/// The product answering the Docker Engine API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Product {
    Docker,
    /// Podman's Docker-compatible service (`podman system service`).
    Podman,
}

/// How the engine keeps images, which decides what it lists, what an image's id is and what
/// a load needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImageStore {
    /// Docker's graph drivers: ids are config digests; every tag it holds is listed.
    Classic,
    /// Docker's containerd image store (snapshotters): ids are manifest digests; an image
    /// whose content it lacks may be held and not listed (Docker 26) or stub-inspected (28).
    Containerd,
    /// Podman's containers/storage: ids are config digests; its inspect leaves out
    /// `Healthcheck`, `Shell` and `OnBuild`, and its list filters AND several references.
    Podman,
}

impl ImageStore {
    /// Whether its image list names every tag it holds (a tag it does not list is missing).
    pub fn lists_every_tag(self) -> bool {
        matches!(self, ImageStore::Classic | ImageStore::Podman)
    }

    /// Whether its inspect reports the whole runtime config (the content fingerprint's
    /// fields); where it does not, an image is judged by its id, a content address.
    pub fn reports_whole_config(self) -> bool {
        !matches!(self, ImageStore::Podman)
    }

    /// Whether an image's id is its config digest (the one identity every store agrees on).
    pub fn ids_are_config_digests(self) -> bool {
        matches!(self, ImageStore::Classic | ImageStore::Podman)
    }

    /// Whether it keeps layer blobs as pulled or loaded (a save gives them back as they were).
    pub fn keeps_blobs(self) -> bool {
        matches!(self, ImageStore::Containerd)
    }

    pub fn name(self) -> &'static str {
        match self {
            ImageStore::Classic => "classic",
            ImageStore::Containerd => "containerd",
            ImageStore::Podman => "podman",
        }
    }
}

impl fmt::Display for ImageStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How API requests reach the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Reach {
    /// A unix socket on this machine: its files are this machine's.
    #[serde(rename = "socket")]
    Socket,
    #[serde(rename = "tcp")]
    Tcp,
    #[serde(rename = "tcp+tls")]
    TcpTls,
    /// The ssh master forwards the node's engine socket.
    #[serde(rename = "ssh forward")]
    SshForward,
    /// `docker system dial-stdio` over ssh: a remote session per connection.
    #[serde(rename = "ssh dial-stdio")]
    SshDialStdio,
}

impl Reach {
    /// Whether the engine runs on this machine, so that its data root is readable here.
    pub fn is_local(self) -> bool {
        self == Reach::Socket
    }

    pub fn name(self) -> &'static str {
        match self {
            Reach::Socket => "socket",
            Reach::Tcp => "tcp",
            Reach::TcpTls => "tcp+tls",
            Reach::SshForward => "ssh forward",
            Reach::SshDialStdio => "ssh dial-stdio",
        }
    }
}

impl fmt::Display for Reach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_what_nodes_and_the_json_documents_print() {
        assert_eq!(ImageStore::Containerd.to_string(), "containerd");
        assert_eq!(
            serde_json::to_string(&Reach::SshDialStdio).unwrap(),
            r#""ssh dial-stdio""#
        );
        assert_eq!(Reach::TcpTls.name(), "tcp+tls");
        assert!(ImageStore::Podman.lists_every_tag() && !ImageStore::Podman.reports_whole_config());
        assert!(!ImageStore::Containerd.lists_every_tag() && ImageStore::Containerd.keeps_blobs());
    }
}
