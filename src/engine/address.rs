//! Where an engine listens, parsed once where hallmark learns it (the cluster file, or the
//! docker CLI's `DOCKER_HOST` and contexts) so that nothing downstream matches prefixes of a
//! string. The text stays as written: messages and `nodes` show the address the user gave.

use std::fmt;
use std::path::{Path, PathBuf};

/// An engine address: `unix:///path`, `tcp://host:port` (with TLS when the docker CLI's
/// files are given) or `ssh://[user@]host[:port]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    written: String,
    kind: Kind,
}

/// How an engine is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A unix socket on this machine.
    Unix(PathBuf),
    /// `host:port`, plain HTTP.
    Tcp(String),
    /// `host:port` over TLS, with the folder of the client's `ca.pem`, `cert.pem` and
    /// `key.pem` (as `docker --tlsverify` finds them).
    Tls { address: String, certs: PathBuf },
    /// The user's ssh to `[user@]host`, on `port` if given.
    Ssh {
        destination: String,
        port: Option<String>,
    },
}

/// Why a text is not an engine address: put after the node's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("`{text}` is not an engine address: it names no {what}")]
    Empty { text: String, what: &'static str },
    #[error("`{text}` is not an engine address (unix://, tcp:// or ssh://)")]
    Scheme { text: String },
}

impl Address {
    /// Parses `text`; `tls` is the docker CLI's TLS folder for a `tcp://` engine (other
    /// engines do not use it). `Err` says why, to be put after the node's name.
    pub fn parse(text: &str, tls: Option<&Path>) -> Result<Address, AddressError> {
        let empty = |what: &'static str| AddressError::Empty {
            text: text.to_string(),
            what,
        };
        let kind = if let Some(path) = text.strip_prefix("unix://") {
            if path.is_empty() {
                return Err(empty("socket"));
            }
            Kind::Unix(PathBuf::from(path))
        } else if let Some(address) = text.strip_prefix("tcp://") {
            let address = address.trim_end_matches('/').to_string();
            if address.is_empty() {
                return Err(empty("host"));
            }
            match tls {
                Some(certs) => Kind::Tls {
                    address,
                    certs: certs.to_path_buf(),
                },
                None => Kind::Tcp(address),
            }
        } else if let Some(host) = text.strip_prefix("ssh://") {
            let (destination, port) = match host.rsplit_once(':') {
                Some((h, p)) if !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()) => {
                    (h.to_string(), Some(p.to_string()))
                }
                _ => (host.to_string(), None),
            };
            if destination.is_empty() {
                return Err(empty("host"));
            }
            Kind::Ssh { destination, port }
        } else {
            return Err(AddressError::Scheme {
                text: text.to_string(),
            });
        };
        Ok(Address {
            written: text.to_string(),
            kind,
        })
    }

    pub fn kind(&self) -> &Kind {
        &self.kind
    }

    /// The address as written.
    pub fn as_str(&self) -> &str {
        &self.written
    }

    /// Whether the engine is a unix socket on this machine, so it reaches this machine's
    /// loopback addresses.
    pub fn is_local_socket(&self) -> bool {
        matches!(self.kind, Kind::Unix(_))
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.written)
    }
}

/// Written as the user wrote it (`nodes --json`).
impl serde::Serialize for Address {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_address_is_parsed_once() {
        let kind = |text: &str, tls: Option<&Path>| Address::parse(text, tls).unwrap().kind;
        assert_eq!(
            kind("unix:///var/run/docker.sock", None),
            Kind::Unix("/var/run/docker.sock".into())
        );
        assert_eq!(
            kind("tcp://10.0.0.1:2375/", None),
            Kind::Tcp("10.0.0.1:2375".into())
        );
        assert_eq!(
            kind("tcp://10.0.0.1:2376", Some(Path::new("/certs"))),
            Kind::Tls {
                address: "10.0.0.1:2376".into(),
                certs: "/certs".into()
            }
        );
        // TLS files name how to reach a TCP port; a socket or ssh has no use for them.
        assert_eq!(
            kind("unix:///x.sock", Some(Path::new("/certs"))),
            Kind::Unix("/x.sock".into())
        );
        assert_eq!(
            kind("ssh://ops@dgx1:2222", None),
            Kind::Ssh {
                destination: "ops@dgx1".into(),
                port: Some("2222".into())
            }
        );
        assert_eq!(
            kind("ssh://hmtb-node4", None),
            Kind::Ssh {
                destination: "hmtb-node4".into(),
                port: None
            }
        );
        let address = Address::parse("tcp://h:1/", None).unwrap();
        assert_eq!(address.to_string(), "tcp://h:1/");
        assert_eq!(serde_json::to_value(&address).unwrap(), "tcp://h:1/");
        assert!(
            Address::parse("unix:///x.sock", None)
                .unwrap()
                .is_local_socket()
        );
        assert!(!Address::parse("ssh://h", None).unwrap().is_local_socket());
    }

    #[test]
    fn a_bad_address_says_why() {
        for (text, says) in [
            (
                "npipe:////./pipe/docker_engine",
                "`npipe:////./pipe/docker_engine` is not an engine address (unix://, tcp:// or ssh://)",
            ),
            (
                "/var/run/docker.sock",
                "`/var/run/docker.sock` is not an engine address (unix://, tcp:// or ssh://)",
            ),
            (
                "",
                "`` is not an engine address (unix://, tcp:// or ssh://)",
            ),
            (
                "unix://",
                "`unix://` is not an engine address: it names no socket",
            ),
            (
                "tcp:///",
                "`tcp:///` is not an engine address: it names no host",
            ),
            (
                "ssh://:22",
                "`ssh://:22` is not an engine address: it names no host",
            ),
        ] {
            assert_eq!(
                Address::parse(text, None).unwrap_err().to_string(),
                says,
                "{text:?}"
            );
        }
    }
}
