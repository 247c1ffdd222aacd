//! `transport = "registry"`: the builder pushes the image once to a registry and the nodes
//! pull it, several at a time. For clusters where one stream per node from the builder is
//! the bottleneck (docs/shipping.md has the arithmetic).
//!
//! Without an operator's `[registry] address`, hallmark runs Docker's own registry
//! (`docker-registry` from Debian, distribution 2.8) on 127.0.0.1 of the machine it runs on,
//! which must be the builder's, for the length of the distribute; its storage stays in the
//! cache so a second push sends nothing. ssh nodes reach it through `ssh -R` to the same
//! port on their own loopback: engines pull from 127.0.0.0/8 over plain HTTP without any
//! insecure-registry setting, and the tunnel rides the connection whose host key is checked.

mod seed;

use crate::engine::{self, Engine};
use crate::error::{Error, Result};
use crate::images::store::{LayerStore, StoredImage};
use crate::images::transfer;
use crate::inputs::config::RegistryConfig;
use crate::oci::Reference;
use crate::output::progress::{self, Phases};
use crate::ship::node;
use crate::ship::verify::Holding;
use crate::ship::{Action, NodeOutcome, ShipSettings, Shipment, Transfer};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A registry the builder and the nodes can reach.
pub struct Registry {
    /// `host:port`, as the builder and the nodes name it.
    pub address: String,
    /// The port on 127.0.0.1 of a registry hallmark started (ssh nodes get it by `ssh -R`).
    local_port: Option<u16>,
    /// Killed when the registry is dropped.
    _process: Option<tokio::process::Child>,
    /// Held while the registry hallmark started runs: one storage, one user at a time.
    _lock: Option<std::fs::File>,
    /// What the docker CLI here would send to the operator's registry (docker config and its
    /// credential helpers); none for the registry hallmark starts.
    credentials: Option<crate::engine::credentials::Credentials>,
}

impl Registry {
    /// The operator's registry, or one started here on `config.port` (default: a free port)
    /// with its storage under `cache/registry`.
    pub async fn open(config: &RegistryConfig, cache: &Path) -> Result<Registry> {
        if let Some(address) = &config.address {
            return Ok(Registry {
                address: address.clone(),
                local_port: None,
                _process: None,
                _lock: None,
                credentials: crate::engine::credentials::for_registry(address)?,
            });
        }
        crate::images::store::mark_cache(cache);
        let root = cache.join("registry");
        fs_err::create_dir_all(&root).map_err(|e| Error::io(&root, e))?;
        let lock = hold_lock(&root)?;
        stop_leftover(&root);
        let port = chosen_port(config, cache)?;
        let storage = root.join("storage");
        fs_err::create_dir_all(&storage).map_err(|e| Error::io(&storage, e))?;
        let config_path = root.join("config.yml");
        fs_err::write(&config_path, registry_config(&storage, port))
            .map_err(|e| Error::io(&config_path, e))?;
        let log_path = root.join("registry.log");
        let log = fs_err::File::create(&log_path).map_err(|e| Error::io(&log_path, e))?;
        let binary = which(&["docker-registry", "registry"]).ok_or_else(|| Error::Usage {
            message: "transport = \"registry\" needs a registry to start, and neither `docker-registry` nor `registry` is on PATH".into(),
            hint: Some("install Debian's docker-registry, or name a running one in hallmark.toml: [registry] address = \"host:port\"".into()),
        })?;
        let command = format!("{} serve {}", binary.display(), config_path.display());
        let mut child = tokio::process::Command::new(&binary)
            .arg("serve")
            .arg(&config_path)
            .stdin(std::process::Stdio::null())
            .stdout(
                log.try_clone()
                    .map_err(|e| Error::io(&log_path, e))?
                    .into_parts()
                    .0,
            )
            .stderr(log.into_parts().0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::Command {
                command: command.clone(),
                context: None,
                stderr: e.to_string(),
            })?;
        if let Some(pid) = child.id() {
            let pid_path = root.join("pid");
            fs_err::write(&pid_path, pid.to_string()).map_err(|e| Error::io(&pid_path, e))?;
        }
        wait_until_listening(&mut child, port, &log_path, command).await?;
        Ok(Registry {
            address: format!("127.0.0.1:{port}"),
            local_port: Some(port),
            _process: Some(child),
            _lock: Some(lock),
            credentials: None,
        })
    }
}

/// `[registry] port`, checked to be free, else the port used last time if it is free, else a
/// new one.
fn chosen_port(config: &RegistryConfig, cache: &Path) -> Result<u16> {
    match config.port {
        // Another server on the port would answer in the registry's place.
        Some(port) => match std::net::TcpListener::bind(("127.0.0.1", port)) {
            Ok(_) => Ok(port),
            Err(e) => Err(Error::Usage {
                message: format!("[registry] port {port} on 127.0.0.1 is taken: {e}"),
                hint: Some("stop what listens there (a registry left by a killed hallmark?), or choose another port".into()),
            }),
        },
        None => remembered_port(&cache.join("registry/port")),
    }
}

/// Returns once the registry `child` (started by `command`) accepts connections on `port`;
/// fails with the last lines of its log after 15 s or when it exits.
async fn wait_until_listening(
    child: &mut tokio::process::Child,
    port: u16,
    log_path: &Path,
    command: String,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        let exited = child.try_wait().ok().flatten();
        if exited.is_some() || Instant::now() > deadline {
            let log = fs_err::read_to_string(log_path).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            return Err(Error::Command {
                command,
                context: Some(match exited {
                    Some(status) => format!("exited with {status}"),
                    None => format!("not listening on 127.0.0.1:{port} after 15 s"),
                }),
                stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Takes `registry/lock`: a second hallmark distributing through the same cache would start
/// a second registry on the same storage.
fn hold_lock(root: &Path) -> Result<std::fs::File> {
    take_lock(root, false)?.ok_or_else(|| Error::Usage {
        message: format!(
            "another hallmark is distributing through the registry it started (lock {} is held)",
            root.join("lock").display()
        ),
        hint: Some("wait for it to finish, or give this one its own HALLMARK_CACHE".into()),
    })
}

/// `registry/lock`, held: by a distribute while its registry runs, by `prune` while the
/// garbage collector runs. `None` when another holds it and `wait` is false.
fn take_lock(root: &Path, wait: bool) -> Result<Option<std::fs::File>> {
    let path = root.join("lock");
    let file = crate::images::turn::lock_file(&path)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) if !wait => Ok(None),
        Err(std::fs::TryLockError::WouldBlock) => {
            file.lock().map_err(|e| Error::io(&path, e))?;
            Ok(Some(file))
        }
        Err(std::fs::TryLockError::Error(e)) => Err(Error::io(&path, e)),
    }
}

/// Stops the registry a SIGKILLed hallmark left running (`kill_on_drop` cannot run then): it
/// holds the port and writes to the storage. Called with the lock held, so a process whose
/// command line names this cache's registry config is such a leftover, not another
/// hallmark's registry; a recycled pid names something else and is left alone.
fn stop_leftover(root: &Path) {
    let config = root.join("config.yml");
    let Some(pid) = fs_err::read_to_string(root.join("pid"))
        .ok()
        .and_then(|t| t.trim().parse::<libc::pid_t>().ok())
    else {
        return;
    };
    let serves_ours = || {
        fs_err::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
            cmdline
                .split(|b| *b == 0)
                .any(|arg| arg == config.as_os_str().as_encoded_bytes())
        })
    };
    if !serves_ours() {
        return;
    }
    // Running until it is gone or every thread of it is a zombie: its sockets are closed only
    // then (its command line reads empty earlier, while it exits). The main thread alone is
    // not enough: it shows as a zombie while the others still exit holding the port, and a
    // new registry on it then failed with "address already in use" under load.
    let running = || {
        fs_err::read_dir(format!("/proc/{pid}/task")).is_ok_and(|tasks| {
            tasks.flatten().any(|task| {
                fs_err::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
                    stat.rsplit_once(')')
                        .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
                })
            })
        })
    };
    crate::output::stderr(&format!(
        "stopping the registry (pid {pid}) an earlier hallmark left running"
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    // SAFETY: kill(2) with a pid and a signal number; no memory is involved.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    while running() {
        if Instant::now() > deadline {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What `hallmark prune` did to the registry hallmark starts.
#[derive(Debug, PartialEq)]
pub enum Garbage {
    /// hallmark never started a registry with this cache.
    NoRegistry,
    /// A distribute is running it (and `wait` was false).
    Busy,
    Collected(String),
}

/// `hallmark prune`'s part for the registry hallmark starts: its garbage collector removes
/// manifests no tag names any more (older versions pushed under the same tag) and the blobs
/// only they used. It runs with the registry's lock held, so never while a distribute pushes
/// or nodes pull (waiting for that when `wait`), and after stopping a registry a killed
/// hallmark left running.
pub fn collect_garbage(cache: &Path, wait: bool) -> Result<Garbage> {
    let root = cache.join("registry");
    let config = root.join("config.yml");
    if !config.is_file() {
        return Ok(Garbage::NoRegistry);
    }
    let Some(_lock) = take_lock(&root, wait)? else {
        return Ok(Garbage::Busy);
    };
    stop_leftover(&root);
    let binary = which(&["docker-registry", "registry"]).ok_or_else(|| Error::Usage {
        message: "cannot collect the registry's garbage: neither `docker-registry` nor `registry` is on PATH".into(),
        hint: None,
    })?;
    let storage = cache.join("registry/storage");
    // The collector fails on a storage nothing was ever pushed to.
    if !storage.join("docker/registry/v2/repositories").is_dir() {
        return Ok(Garbage::Collected(format!(
            "nothing pushed to the registry's storage ({}) yet",
            storage.display()
        )));
    }
    let before = folder_bytes(&storage);
    let output = std::process::Command::new(&binary)
        .args(["garbage-collect", "--delete-untagged"])
        .arg(&config)
        .output()
        .map_err(|e| Error::Command {
            command: format!("{} garbage-collect", binary.display()),
            context: None,
            stderr: e.to_string(),
        })?;
    if !output.status.success() {
        return Err(Error::Command {
            command: format!(
                "{} garbage-collect --delete-untagged {}",
                binary.display(),
                config.display()
            ),
            context: None,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    let after = folder_bytes(&storage);
    Ok(Garbage::Collected(format!(
        "removed {} bytes from the registry's storage ({} bytes left in {})",
        before.saturating_sub(after),
        after,
        storage.display()
    )))
}

fn folder_bytes(dir: &Path) -> u64 {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

fn registry_config(storage: &Path, port: u16) -> String {
    format!(
        "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n\
         storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
         http:\n  addr: 127.0.0.1:{port}\n",
        storage.display()
    )
}

/// The port used last time if it is free, else a new free one (remembered in `file`). The
/// same port each time matters: the builder's engine remembers which layers it pushed where
/// by registry host and port; under a new name it would compress every layer again just to
/// learn that the registry has it.
fn remembered_port(file: &Path) -> Result<u16> {
    let last = fs_err::read_to_string(file)
        .ok()
        .and_then(|t| t.trim().parse::<u16>().ok())
        .filter(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok());
    if let Some(port) = last {
        return Ok(port);
    }
    let port = free_port().map_err(|e| Error::io(file, e))?;
    let dir = file.parent().expect("a folder");
    fs_err::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    fs_err::write(file, port.to_string()).map_err(|e| Error::io(file, e))?;
    Ok(port)
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port())
}

fn which(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
}

/// The shipment's reference, and the same repository and tag under the registry's address.
fn registry_reference(
    engine: &Engine,
    registry: &Registry,
    shipment: &Shipment,
) -> Result<(Reference, Reference)> {
    let reference = Reference::parse(&shipment.reference).map_err(|e| engine.error(e))?;
    let at_registry = format!(
        "{}/{}:{}",
        registry.address,
        reference.name(),
        reference.tag_or_latest()
    );
    let at_registry = Reference::parse(&at_registry).map_err(|e| engine.error(e))?;
    Ok((reference, at_registry))
}

/// Distributes one image to `nodes` (already connected) through `registry`, starting it
/// only if a node needs the image. One outcome per node, in order.
///
/// A containerd store fetches only the layers it has not unpacked: one that holds some of
/// the image's layers from a stream load (kept uncompressed) pulls a manifest naming them
/// compressed, and Docker 28 keeps an image it cannot read. Such a node is completed from
/// the layer store in the same run (the layers it lacks in the form its store needs, over
/// the stream transport).
pub async fn distribute(
    builder: &Engine,
    nodes: &[Engine],
    config: &RegistryConfig,
    cache: &Path,
    store: &Arc<LayerStore>,
    shipment: &Shipment,
    settings: &ShipSettings<'_>,
) -> Vec<NodeOutcome> {
    let phases = Phases::start(settings.verbose);
    let chains = transfer::chain_ids(&shipment.diff_ids);
    let decisions = futures_util::future::join_all(
        nodes
            .iter()
            .map(|node| node::decide(node, shipment, settings, &chains, true)),
    )
    .await;
    phases.say(format!("asked {} nodes what they hold", nodes.len()));
    let mut outcomes: Vec<Option<NodeOutcome>> = decisions
        .iter()
        .zip(nodes)
        .map(|(decision, node)| decision.settled(&node.node))
        .collect();
    if outcomes.iter().all(Option::is_some) {
        return outcomes.into_iter().flatten().collect();
    }
    let source = LayerSource {
        builder,
        store,
        stored: tokio::sync::Mutex::new(None),
    };
    let pushed = open_and_push(&source, config, cache, shipment, &phases).await;
    let (registry, seeded) = match pushed {
        Ok(pushed) => pushed,
        Err(e) => {
            let message = e.to_string();
            return outcomes
                .into_iter()
                .zip(nodes)
                .map(|(o, node)| {
                    o.unwrap_or_else(|| NodeOutcome::failed(&node.node, message.clone()))
                })
                .collect();
        }
    };
    let bars = progress::bars(settings.progress);
    let pulls = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| o.is_none())
        .map(|(i, _)| {
            let (node, registry, source, chains) = (&nodes[i], &registry, &source, &chains);
            let seeded = seeded.as_ref();
            let bar = bars.add(progress::transfer_bar(&node.node));
            let work = async move {
                let pulling = Pulling {
                    source,
                    registry,
                    shipment,
                    settings,
                    chains,
                    seeded,
                };
                let outcome = pulling.pull_and_verify(node, &bar).await;
                bar.finish_and_clear();
                outcome
            };
            (i, work)
        })
        .collect::<Vec<_>>();
    for (i, outcome) in node::run(pulls, config.pulls.unwrap_or(4), &phases).await {
        outcomes[i] = Some(outcome);
    }
    let _ = bars.clear();
    outcomes
        .into_iter()
        .map(|o| o.expect("every node has an outcome"))
        .collect()
}

/// The registry, open, holding the shipment. The registry hallmark starts is filled from the
/// layer store (`seed.rs`: the blobs as the stream sends them), and that image comes back;
/// an operator's registry gets the builder's push (its credentials are the docker CLI's).
async fn open_and_push(
    source: &LayerSource<'_>,
    config: &RegistryConfig,
    cache: &Path,
    shipment: &Shipment,
    phases: &Phases,
) -> Result<(Registry, Option<StoredImage>)> {
    let registry = Registry::open(config, cache).await?;
    phases.say(format!("registry at {}", registry.address));
    if registry.local_port.is_none() {
        let pushed = push(source.builder, &registry, shipment).await?;
        phases.say(format!(
            "pushed {}: {} layers sent, {} already there",
            shipment.reference, pushed.0, pushed.1
        ));
        return Ok((registry, None));
    }
    let image = source.image(shipment).await?;
    let (reference, at_registry) = registry_reference(source.builder, &registry, shipment)?;
    let (sent, present) = seed::push_stored(
        &registry.address,
        reference.name(),
        at_registry.tag_or_latest(),
        source.store,
        &image,
    )
    .await
    .map_err(|e| {
        source.builder.error(format!(
            "cannot put {} into the registry: {e}",
            shipment.reference
        ))
    })?;
    phases.say(format!(
        "put {} into the registry from the layer store: {sent} blobs sent, {present} already there",
        shipment.reference
    ));
    // The signed provenance, if the build kept one for this image, goes beside it.
    let envelope =
        crate::make::provenance::kept_in_store(source.store, image.config.digest.as_ref());
    if let Ok(bytes) = fs_err::read(&envelope) {
        let (digest, manifest) = crate::oci::archive::manifest(&image);
        let tag = seed::push_attestation(
            &registry.address,
            reference.name(),
            (digest.as_ref(), manifest.len()),
            &bytes,
        )
        .await
        .map_err(|e| {
            source.builder.error(format!(
                "cannot put the provenance of {} into the registry: {e}",
                shipment.reference
            ))
        })?;
        phases.say(format!("put its signed provenance beside it, at {tag}"));
    }
    Ok((registry, Some(image)))
}

/// One node's pull, with what every node's pull shares.
struct Pulling<'a> {
    source: &'a LayerSource<'a>,
    registry: &'a Registry,
    shipment: &'a Shipment,
    settings: &'a ShipSettings<'a>,
    chains: &'a [String],
    /// The image as the registry hallmark started holds it (from the layer store), if so.
    seeded: Option<&'a StoredImage>,
}

impl Pulling<'_> {
    /// One node pulls the image and is verified; a node that pulled an image it cannot read
    /// all of is completed from the layer store. A classic node that holds some of the
    /// image's layers it did not pull from this registry gets the rest by stream instead.
    async fn pull_and_verify(&self, node: &Engine, bar: &indicatif::ProgressBar) -> NodeOutcome {
        let (shipment, settings) = (self.shipment, self.settings);
        if let Some(outcome) = self.by_stream(node, bar).await {
            return outcome;
        }
        let pulled = match refuse_podman(node).await {
            Ok(()) => pull(node, self.registry, shipment, self.seeded, bar).await,
            Err(e) => Err(e),
        };
        let pulled = match pulled {
            Ok(pulled) => pulled,
            Err(e) => return NodeOutcome::failed(&node.node, e.to_string()),
        };
        let holding = node::holding(node, shipment, settings).await;
        let mut outcome = if matches!(&holding, Ok(h) if h.state == Holding::Incomplete) {
            complete(
                self.source,
                node,
                shipment,
                settings,
                self.chains,
                bar.clone(),
            )
            .await
        } else {
            let action = Action::Pulled(Transfer::default());
            node::judged(&node.node, holding, shipment, action)
        };
        if let Action::Pulled(sent) = &mut outcome.action {
            sent.layers_sent += pulled.layers;
            sent.layer_bytes += pulled.bytes;
            sent.archive_bytes += pulled.bytes;
            if let Some(image) = self.seeded {
                note_pulled(settings.cache, node, image);
            }
        }
        // Loaded means loaded, by any transport: a pull of what hallmark seeded put the layer
        // store's blobs, under their digests, into the node, as a stream load does. Noted
        // alike, a later stream update to a containerd store is thin (it sent the whole
        // image again: 20 GB a node for the cluster's images).
        if let Some(image) = self.seeded
            && outcome.verified()
        {
            let reference = &shipment.reference;
            transfer::remember_loaded(settings.cache, node, reference, image, None).await;
        }
        outcome
    }

    /// Docker's classic store skips a layer it holds only if it learned the registry's
    /// digest for it from an earlier pull or push of that blob: layers it got by stream are
    /// downloaded again (seen on Docker 20.10). So a classic node whose pull would download
    /// more of what it holds (layers it did not pull from the registry hallmark fills) than
    /// of what it lacks gets the layers it lacks as a thin archive instead: `Some` outcome;
    /// `None` when it pulls.
    async fn by_stream(&self, node: &Engine, bar: &indicatif::ProgressBar) -> Option<NodeOutcome> {
        let image = self.seeded?;
        if transfer::keeps_blobs(node).await {
            return None;
        }
        let (cache, related) = (self.settings.cache, &self.shipment.related);
        let first = transfer::held_prefix(node, cache, self.chains, related)
            .await
            .ok()?;
        let pulled = pulled_digests(cache, node);
        let again: u64 = image.layers[..first]
            .iter()
            .filter(|l| !pulled.contains(l.blob.digest.as_str()))
            .map(|l| l.blob.size)
            .sum();
        let lacking: u64 = image.layers[first..].iter().map(|l| l.blob.size).sum();
        if again <= lacking {
            return None;
        }
        let store = self.source.store;
        let settings = self.settings;
        Some(
            node::send_and_verify(
                node,
                store,
                image,
                self.shipment,
                settings,
                first,
                bar.clone(),
            )
            .await,
        )
    }
}

/// `<cache>/registry/pulled/<node>.json`: the blobs a classic node pulled from the registry
/// hallmark fills, whose digests it now knows.
fn pulled_path(cache: &Path, node: &Engine) -> PathBuf {
    cache
        .join("registry/pulled")
        .join(format!("{}.json", node.node))
}

fn pulled_digests(cache: &Path, node: &Engine) -> std::collections::BTreeSet<String> {
    fs_err::read_to_string(pulled_path(cache, node))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

/// After a verified pull of `image` by `node`: its blobs' digests are known to the node. A
/// note not written costs that node's next update a stream instead of a pull.
fn note_pulled(cache: &Path, node: &Engine, image: &StoredImage) {
    let mut digests = pulled_digests(cache, node);
    digests.extend(image.layers.iter().map(|l| l.blob.digest.to_string()));
    let path = pulled_path(cache, node);
    let text = serde_json::to_string(&digests).expect("serializes");
    let _ = fs_err::create_dir_all(path.parent().expect("a folder"))
        .and_then(|()| fs_err::write(&path, text));
}

/// Where a node that pulled an image it cannot read gets the layers it lacks: the layer
/// store, the image exported into it once, whichever node needs it first.
struct LayerSource<'a> {
    builder: &'a Engine,
    store: &'a Arc<LayerStore>,
    stored: tokio::sync::Mutex<Option<StoredImage>>,
}

impl LayerSource<'_> {
    /// The shipment in the layer store, exported into it once, by whoever asks first.
    async fn image(&self, shipment: &Shipment) -> Result<StoredImage> {
        let mut stored = self.stored.lock().await;
        if stored.is_none() {
            let on_builder = shipment.on_builder();
            *stored = transfer::in_store_completed(
                self.builder,
                self.store,
                on_builder,
                &shipment.related,
            )
            .await;
        }
        if stored.is_none() {
            let (_, image) =
                transfer::stored_image(self.builder, self.store, &shipment.reference).await?;
            *stored = Some(image);
        }
        Ok(stored.clone().expect("stored"))
    }
}

/// Sends a node that pulled an image it cannot read all of the layers its store lacks, from
/// the layer store. The outcome is `pulled` and `completed` if the node then holds the whole
/// image.
async fn complete(
    source: &LayerSource<'_>,
    node: &Engine,
    shipment: &Shipment,
    settings: &ShipSettings<'_>,
    chains: &[String],
    bar: indicatif::ProgressBar,
) -> NodeOutcome {
    let image = match source.image(shipment).await {
        Ok(image) => image,
        Err(e) => {
            return NodeOutcome::failed(
                &node.node,
                format!("pulled an image the node cannot read all of, and cannot complete it: {e}"),
            );
        }
    };
    let first = match transfer::held_prefix(node, settings.cache, chains, &shipment.related).await {
        Ok(first) => first,
        Err(e) => return NodeOutcome::failed(&node.node, e.to_string()),
    };
    let store = source.store;
    let mut outcome =
        node::send_and_verify(node, store, &image, shipment, settings, first, bar).await;
    if let Action::Thin(sent) | Action::Full(sent) = outcome.action {
        outcome.action = Action::Pulled(Transfer {
            completed: true,
            ..sent
        });
    }
    outcome
}

/// Pushes the builder's image; returns (layers sent, layers the registry had). The engine
/// sends only the layers the registry lacks.
async fn push(
    builder: &Engine,
    registry: &Registry,
    shipment: &Shipment,
) -> Result<(usize, usize)> {
    let (_, pushed) = registry_reference(builder, registry, shipment)?;
    builder.tag(&shipment.image_id, &pushed).await?;
    let stream = builder.push(
        pushed.name(),
        pushed.tag_or_latest(),
        registry.credentials.as_ref(),
    );
    let (mut sent, mut present) = (0, 0);
    let failure = engine::follow(stream, |info| match info.status.as_deref() {
        Some("Pushed") => sent += 1,
        Some("Layer already exists") => present += 1,
        _ => {}
    })
    .await;
    // The registry's name for the image is hallmark's business, not the builder's.
    untag(
        builder,
        &format!("{}:{}", pushed.name(), pushed.tag_or_latest()),
    )
    .await;
    match failure {
        Some(message) => Err(builder.error(format!(
            "push of {} to the registry at {} failed: {message}",
            shipment.reference, registry.address
        ))),
        None => Ok((sent, present)),
    }
}

struct Pulled {
    layers: usize,
    /// Compressed bytes downloaded, as the engine reports them.
    bytes: u64,
}

/// One node pulls the image, then the tag moves to it (the previous image stays under the
/// tag until the pull is whole).
async fn pull(
    node: &Engine,
    registry: &Registry,
    shipment: &Shipment,
    seeded: Option<&StoredImage>,
    bar: &indicatif::ProgressBar,
) -> Result<Pulled> {
    let tunnel = match registry.local_port {
        Some(port) => node.forward_here(port).await?.then_some(port),
        None => None,
    };
    if registry.local_port.is_some() && tunnel.is_none() && !node.address().is_local_socket() {
        return Err(node.error(format!(
            "cannot reach the registry hallmark started at {} (only ssh:// and local unix:// engines can); name one all nodes reach in hallmark.toml: [registry] address",
            registry.address
        )));
    }
    let pulled = pull_and_tag(node, registry, shipment, seeded, bar).await;
    if let Some(port) = tunnel {
        node.cancel_forward(port).await;
    }
    pulled
}

/// The bytes pulled are what the engine's progress says; a blob small enough to arrive
/// without a `Downloading` report is counted, when the registry was filled from the layer
/// store (`seeded`), by its size there (the engine names it by its digest's first 12 hex).
async fn pull_and_tag(
    node: &Engine,
    registry: &Registry,
    shipment: &Shipment,
    seeded: Option<&StoredImage>,
    bar: &indicatif::ProgressBar,
) -> Result<Pulled> {
    let (reference, pulled) = registry_reference(node, registry, shipment)?;
    let stream = node.pull(
        pulled.name(),
        pulled.tag_or_latest(),
        registry.credentials.as_ref(),
    );
    // Per layer: (bytes downloaded, bytes to download), as the engine reports them.
    let mut layer_bytes: HashMap<String, (u64, u64)> = HashMap::new();
    let mut layers = 0;
    let mut downloaded = std::collections::HashSet::new();
    let failure = engine::follow(stream, |info| match info.status.as_deref() {
        Some("Downloading") => {
            if let Some(detail) = info.progress_detail {
                let bytes = |n: Option<i64>| n.unwrap_or(0).max(0) as u64;
                let layer = info.id.unwrap_or_default();
                layer_bytes.insert(layer, (bytes(detail.current), bytes(detail.total)));
                bar.set_length(layer_bytes.values().map(|b| b.1).sum());
                bar.set_position(layer_bytes.values().map(|b| b.0).sum());
            }
        }
        Some("Pull complete") => layers += 1,
        Some("Download complete") => {
            downloaded.insert(info.id.unwrap_or_default());
        }
        _ => {}
    })
    .await;
    if let Some(message) = failure {
        return Err(node.error(format!(
            "cannot pull {} from the registry at {}: {message}",
            shipment.reference, registry.address
        )));
    }
    let pulled = pulled.to_string();
    node.tag(&pulled, &reference).await?;
    untag(node, &pulled).await;
    let reported: u64 = layer_bytes.values().map(|b| b.1).sum();
    let known: Vec<u64> = seeded
        .map(|image| {
            let short = |l: &&crate::images::store::StoredLayer| {
                let hex = l.blob.digest.as_str().trim_start_matches("sha256:");
                downloaded.contains(&hex[..12.min(hex.len())])
            };
            image
                .layers
                .iter()
                .filter(short)
                .map(|l| l.blob.size)
                .collect()
        })
        .unwrap_or_default();
    Ok(Pulled {
        layers: layers.max(known.len()),
        bytes: reported.max(known.iter().sum()),
    })
}

/// Podman's Docker-compatible API pulls and loads, but its names differ from Docker's:
/// tagging `hello` from `127.0.0.1:PORT/hello` adds no name when the short name already
/// resolves, so untagging the registry's name then deletes the image, and it refuses plain
/// HTTP registries on loopback unless configured. A Podman node is refused on this
/// transport, by name, rather than left without its image; the stream transport serves it.
async fn refuse_podman(node: &Engine) -> Result<()> {
    match node.version.podman() {
        None => Ok(()),
        Some(engine) => Err(node.error(format!(
            "{engine} is not supported on the registry transport (its tags differ from Docker's: see docs/shipping.md); give this node `transport = \"stream\"` in hallmark.toml"
        ))),
    }
}

/// Removes one name of an image, never the image (another tag still names it).
async fn untag(engine: &Engine, reference: &str) {
    engine.untag(reference).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 14 item 10: `prune` ran the registry's garbage collector without its lock, so it
    /// could delete blobs while a distribute pushed them or nodes pulled. It now runs only with
    /// the lock, which a distribute holds while its registry runs.
    #[test]
    fn garbage_is_collected_only_with_the_registrys_lock() {
        let cache = tempfile::tempdir().unwrap();
        let root = cache.path().join("registry");
        let storage = root.join("storage");
        std::fs::create_dir_all(&storage).unwrap();
        std::fs::write(root.join("config.yml"), registry_config(&storage, 5000)).unwrap();
        let distributing = hold_lock(&root).unwrap();
        assert_eq!(collect_garbage(cache.path(), false).unwrap(), Garbage::Busy);
        drop(distributing);
        // With nothing pushed, there is nothing to collect (the collector itself fails on an
        // empty storage); with a repository folder, Debian's docker-registry runs.
        let collected = collect_garbage(cache.path(), false).unwrap();
        assert!(
            matches!(&collected, Garbage::Collected(m) if m.contains("nothing pushed")),
            "{collected:?}"
        );
        std::fs::create_dir_all(storage.join("docker/registry/v2/repositories")).unwrap();
        std::fs::create_dir_all(storage.join("docker/registry/v2/blobs")).unwrap();
        let collected = collect_garbage(cache.path(), false).unwrap();
        assert!(
            matches!(&collected, Garbage::Collected(m) if m.contains("removed")),
            "{collected:?}"
        );
    }
}
