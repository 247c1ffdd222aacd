//! A spec's `[[smoke]]` tests: the keys (command, GPU requests, a served process, mounts), the
//! sizes they take, and the rules that hold between them.

use super::*;

/// A smoke test: a command run in a container of the built image, or, with `serve`, a
/// process kept running while probes run inside it (a served model, asked three things).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Smoke {
    pub name: Spanned<String>,
    /// The command; with `serve`, the probe run inside the served container once ready.
    pub run: Spanned<Vec<String>>,
    /// A process to keep running: its argv, or `true` for the image's own entrypoint and
    /// cmd (`args` replacing the cmd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve: Option<Spanned<Serve>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Spanned<Vec<String>>>,
    /// With `serve`: run inside the container until it exits 0, within `timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<Spanned<Vec<String>>>,
    /// A regular expression `run`'s standard output must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<Spanned<String>>,
    /// Seconds: how long a served process may take to be ready (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Spanned<u64>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Paths of the node the container sees.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Spanned<SmokeMount>>,
    /// `/dev/shm`'s size: `16g`, `512m`, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_size: Option<Spanned<String>>,
    /// `host`, `private`, `shareable` or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipc: Option<Spanned<String>>,
    /// `{ memlock = -1, stack = 67108864 }`: soft and hard limits alike.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ulimits: BTreeMap<String, i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Where it runs: `everywhere` (default), `builder` (at build only) or `nodes` (not at
    /// build: the builder may have no GPU; `smoke --node`/`--all-nodes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<Spanned<String>>,
    /// `"all"`, a count, or CDI device names (`["nvidia.com/gpu=0"]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<Spanned<GpuRequest>>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum GpuRequest {
    Count(u32),
    All(String),
    Named(Vec<String>),
}

#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Serve {
    Own(bool),
    Argv(Vec<String>),
}

// By hand rather than `#[serde(untagged)]`: serde's untagged enums answer any wrong value
// with "data did not match any variant of untagged enum", which names neither the forms a
// key takes nor what was written. These visitors say both ("invalid type: floating point
// `1.5`, expected ...").
impl<'de> Deserialize<'de> for GpuRequest {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Forms;
        impl<'de> serde::de::Visitor<'de> for Forms {
            type Value = GpuRequest;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("\"all\", a count of GPUs (1 or more), or a list of CDI device names ([\"nvidia.com/gpu=0\"])")
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<GpuRequest, E> {
                u32::try_from(n)
                    .map(GpuRequest::Count)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(n), &self))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<GpuRequest, E> {
                u32::try_from(n)
                    .map(GpuRequest::Count)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(n), &self))
            }
            fn visit_str<E: serde::de::Error>(self, word: &str) -> Result<GpuRequest, E> {
                Ok(GpuRequest::All(word.to_string()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<GpuRequest, A::Error> {
                let mut names = Vec::new();
                while let Some(name) = seq.next_element::<String>()? {
                    names.push(name);
                }
                Ok(GpuRequest::Named(names))
            }
        }
        deserializer.deserialize_any(Forms)
    }
}

impl<'de> Deserialize<'de> for Serve {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Forms;
        impl<'de> serde::de::Visitor<'de> for Forms {
            type Value = Serve;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("`true` (the image's own entrypoint) or a command as a list of strings ([\"python3\", \"-m\", \"server\"])")
            }
            fn visit_bool<E: serde::de::Error>(self, own: bool) -> Result<Serve, E> {
                Ok(Serve::Own(own))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Serve, A::Error> {
                let mut argv = Vec::new();
                while let Some(word) = seq.next_element::<String>()? {
                    argv.push(word);
                }
                Ok(Serve::Argv(argv))
            }
        }
        deserializer.deserialize_any(Forms)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmokeMount {
    pub source: String,
    pub target: String,
    #[serde(default)]
    pub readonly: bool,
}

impl Smoke {
    /// Whether the test runs on the builder (`builder: true`) or on a node.
    pub fn runs_on(&self, builder: bool) -> bool {
        match self.on.as_ref().map(|o| o.get_ref().as_str()) {
            Some("builder") => builder,
            Some("nodes") => !builder,
            _ => true,
        }
    }

    /// Whether a process is served and probed (`serve` set, and not `false`).
    pub fn served(&self) -> bool {
        !matches!(
            self.serve.as_ref().map(Spanned::get_ref),
            None | Some(Serve::Own(false))
        )
    }
}

/// `16g`, `512m`, `64k` or bytes, as `docker run --shm-size` takes them.
pub fn byte_size(text: &str) -> Option<i64> {
    let text = text.trim().to_ascii_lowercase();
    let text = text.strip_suffix('b').unwrap_or(&text);
    let (number, unit) = match text.char_indices().last()? {
        (at, 'k') => (&text[..at], 1i64 << 10),
        (at, 'm') => (&text[..at], 1 << 20),
        (at, 'g') => (&text[..at], 1 << 30),
        _ => (text, 1),
    };
    number
        .parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .and_then(|n| n.checked_mul(unit))
}

/// A smoke test's keys, each refused at its line: a probe or argument without `serve`, an
/// empty argv, a regular expression that does not compile, a size, an IPC mode or a mount
/// that is not one.
pub(super) fn smoke_keys_hold(loaded: &LoadedSpec, smoke: &Smoke) -> Result<()> {
    serve_keys_hold(loaded, smoke)?;
    limits_hold(loaded, smoke)?;
    gpus_hold(loaded, smoke)?;
    placement_holds(loaded, smoke)
}

/// `serve`, `ready` and `args`: a probe or argument only with a served process, no empty
/// argv.
fn serve_keys_hold(loaded: &LoadedSpec, smoke: &Smoke) -> Result<()> {
    let served = smoke.served();
    if let Some(serve) = &smoke.serve
        && matches!(serve.get_ref(), Serve::Argv(argv) if argv.is_empty())
    {
        return loaded.invalid(
            serve.span(),
            "smoke.serve",
            "is empty: name a command, or `true` for the image's own".into(),
        );
    }
    if let Some(ready) = &smoke.ready {
        if !served {
            return loaded.invalid(
                ready.span(),
                "smoke.ready",
                "probes a served process: it needs `serve`".into(),
            );
        }
        if ready.get_ref().is_empty() {
            return loaded.invalid(
                ready.span(),
                "smoke.ready",
                "is empty: name a command".into(),
            );
        }
    }
    if let Some(args) = &smoke.args
        && !matches!(
            smoke.serve.as_ref().map(Spanned::get_ref),
            Some(Serve::Own(true))
        )
    {
        return loaded.invalid(args.span(), "smoke.args", "goes with `serve = true` (the image's own entrypoint): with an argv, write them in `serve`".into());
    }
    Ok(())
}

/// `timeout`, `expect` and `shm_size`: a second at least, a regular expression, a size.
fn limits_hold(loaded: &LoadedSpec, smoke: &Smoke) -> Result<()> {
    if let Some(timeout) = &smoke.timeout {
        let seconds = *timeout.get_ref();
        let longest = crate::engine::LONGEST_DEADLINE_SECS;
        let wrong = if seconds == 0 {
            Some("must be at least 1 second".to_string())
        } else if seconds > longest {
            Some(format!(
                "{seconds} seconds is past the longest deadline hallmark sets, {longest} (a week)"
            ))
        } else if !smoke.served() {
            // Only a served process waits for readiness; a plain test's container is bounded
            // by HALLMARK_SMOKE_TIMEOUT, and a key that changes nothing must not look as if it did.
            Some(format!(
                "bounds how long a served process may take to be ready, and this test serves none (no `serve`): its run is bounded by {} (default 1800 s)",
                crate::engine::SMOKE_TIMEOUT_ENV
            ))
        } else {
            None
        };
        if let Some(wrong) = wrong {
            return loaded.invalid(timeout.span(), "smoke.timeout", wrong);
        }
    }
    names_hold(loaded, smoke)?;
    if let Some(expect) = &smoke.expect
        && let Err(e) = regex::Regex::new(expect.get_ref())
    {
        // regex's own message draws the pattern over three lines: its last says what is wrong.
        let why = e.to_string();
        let why = why.lines().last().unwrap_or_default();
        return loaded.invalid(
            expect.span(),
            "smoke.expect",
            format!(
                "is no regular expression ({})",
                why.trim_start_matches("error: ")
            ),
        );
    }
    if let Some(size) = &smoke.shm_size
        && byte_size(size.get_ref()).is_none()
    {
        return loaded.invalid(
            size.span(),
            "smoke.shm_size",
            format!(
                "`{}` is no size: write bytes, or a number with k, m or g (`16g`)",
                size.get_ref()
            ),
        );
    }
    Ok(())
}

/// The resource limits engines know by name (Docker's `--ulimit`, Podman's alike).
const ULIMITS: &[&str] = &[
    "core",
    "cpu",
    "data",
    "fsize",
    "locks",
    "memlock",
    "msgqueue",
    "nice",
    "nofile",
    "nproc",
    "rss",
    "rtprio",
    "rttime",
    "sigpending",
    "stack",
];

/// `env` and `ulimits`: names the engines take (an env name without `=` or NUL, not empty;
/// a known limit), values they take (no NUL; a limit of -1 for unlimited, or 0 and more).
fn names_hold(loaded: &LoadedSpec, smoke: &Smoke) -> Result<()> {
    let span = smoke.name.span();
    for (name, value) in &smoke.env {
        if name.is_empty() || name.contains(['=', '\0']) || value.contains('\0') {
            return loaded.invalid(
                span,
                "smoke.env",
                format!(
                    "`{}` is no environment variable an engine sets: a name is not empty and holds no `=` or NUL, a value no NUL",
                    name.escape_debug()
                ),
            );
        }
    }
    for (name, limit) in &smoke.ulimits {
        if !ULIMITS.contains(&name.as_str()) {
            return loaded.invalid(
                span,
                "smoke.ulimits",
                format!(
                    "`{name}` is no resource limit the engines know: write one of {}",
                    ULIMITS.join(", ")
                ),
            );
        }
        if *limit < -1 {
            return loaded.invalid(
                span,
                "smoke.ulimits",
                format!("`{name} = {limit}`: a limit is -1 (unlimited) or 0 and more"),
            );
        }
    }
    Ok(())
}

/// `gpus`: a count of 1 or more, "all", or CDI device names.
fn gpus_hold(loaded: &LoadedSpec, smoke: &Smoke) -> Result<()> {
    if let Some(gpus) = &smoke.gpus {
        let wrong = match gpus.get_ref() {
            GpuRequest::Count(0) => Some("asks for no GPU: write a count of 1 or more, \"all\", or device names".to_string()),
            GpuRequest::All(word) if word != "all" => Some(format!("`{word}`: write \"all\", a count, or CDI device names (`[\"nvidia.com/gpu=0\"]`)")),
            GpuRequest::Named(names) if names.is_empty() => Some("is empty: name a CDI device (`nvidia.com/gpu=0`)".into()),
            GpuRequest::Named(names) => names
                .iter()
                .find(|n| !n.split_once('=').is_some_and(|(kind, name)| kind.contains('/') && !name.is_empty()))
                .map(|n| format!("`{n}` is no CDI device name: write `vendor/class=name` (`nvidia.com/gpu=0`)")),
            _ => None,
        };
        if let Some(wrong) = wrong {
            return loaded.invalid(gpus.span(), "smoke.gpus", wrong);
        }
    }
    Ok(())
}

/// `on`, `ipc` and `mounts`: one of the words each takes, absolute paths.
fn placement_holds(loaded: &LoadedSpec, smoke: &Smoke) -> Result<()> {
    if let Some(on) = &smoke.on
        && !["everywhere", "builder", "nodes"].contains(&on.get_ref().as_str())
    {
        return loaded.invalid(
            on.span(),
            "smoke.on",
            format!(
                "`{}`: write `everywhere`, `builder` or `nodes`",
                on.get_ref()
            ),
        );
    }
    if let Some(ipc) = &smoke.ipc
        && !["host", "private", "shareable", "none"].contains(&ipc.get_ref().as_str())
    {
        return loaded.invalid(
            ipc.span(),
            "smoke.ipc",
            format!(
                "`{}`: write `host`, `private`, `shareable` or `none`",
                ipc.get_ref()
            ),
        );
    }
    for mount in &smoke.mounts {
        let m = mount.get_ref();
        if !m.source.starts_with('/') || !m.target.starts_with('/') {
            return loaded.invalid(mount.span(), "smoke.mounts", format!("`{}` on `{}`: both must be absolute paths (a path on the node, one in the container)", m.source, m.target));
        }
    }
    Ok(())
}
