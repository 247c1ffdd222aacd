//! The registry hallmark starts when hallmark.toml names none: Docker's own `docker-registry`
//! on 127.0.0.1, one storage under the cache, held by a lock while it runs; the port it
//! listens on, and `prune`'s garbage collection of that storage under the same lock.

use crate::error::{Error, Result};
use crate::inputs::config::RegistryConfig;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A registry the builder and the nodes can reach.
pub struct Registry {
    /// `host:port`, as the builder and the nodes name it.
    pub address: String,
    /// The port on 127.0.0.1 of a registry hallmark started (ssh nodes get it by `ssh -R`).
    pub(super) local_port: Option<u16>,
    /// The storage folder of a registry hallmark started (`seed::link_stored` fills it).
    pub(super) storage: Option<PathBuf>,
    /// Killed when the registry is dropped.
    process: Option<tokio::process::Child>,
    /// Held while the registry hallmark started runs: one storage, one user at a time.
    _lock: Option<std::fs::File>,
    /// What the docker CLI here would send to the operator's registry (docker config and its
    /// credential helpers); none for the registry hallmark starts.
    pub(super) credentials: Option<crate::engine::credentials::Credentials>,
}

impl Registry {
    /// The operator's registry, or one started here on `config.port` (default: a free port)
    /// with its storage under `cache/registry`.
    pub async fn open(config: &RegistryConfig, cache: &Path) -> Result<Registry> {
        if let Some(address) = &config.address {
            return Ok(Registry {
                address: address.clone(),
                local_port: None,
                storage: None,
                process: None,
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
        let binary = which(REGISTRY_BINARIES).ok_or_else(|| Error::Usage {
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
            storage: Some(storage),
            process: Some(child),
            _lock: Some(lock),
            credentials: None,
        })
    }
}

impl Registry {
    /// Stops the registry hallmark started and waits until it is gone, so that the next
    /// image's registry finds the port free (dropped, it is only sent SIGKILL: on a loaded
    /// machine it still held the port when the next image's started, and every node failed).
    pub async fn stop(mut self) {
        // SIGKILL, then the wait for its end, within the answer deadline: a process stuck
        // in the kernel is left to the drop (the next image then says its port is taken).
        if let Some(mut child) = self.process.take() {
            let _ = tokio::time::timeout(crate::engine::answer_timeout(), child.kill()).await;
        }
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
    let reserved = RESERVED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, file)) = reserved.as_ref().filter(|(held, _)| held == root) {
        return file
            .try_clone()
            .map_err(|e| Error::io(root.join("lock"), e));
    }
    drop(reserved);
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
pub fn collect_garbage(cache: &Path, wait: bool, kept: &dyn Fn(&str) -> bool) -> Result<Garbage> {
    let root = cache.join("registry");
    let config = root.join("config.yml");
    if !config.is_file() {
        return Ok(Garbage::NoRegistry);
    }
    let Some(_lock) = take_lock(&root, wait)? else {
        return Ok(Garbage::Busy);
    };
    stop_leftover(&root);
    // Without the collector nothing can be collected, which is no failure of prune: said.
    let Some(binary) = which(REGISTRY_BINARIES) else {
        return Ok(Garbage::Collected(
            "the registry's storage left as it is: neither `docker-registry` nor `registry` is on PATH to collect its garbage".into(),
        ));
    };
    let storage = cache.join("registry/storage");
    // The collector fails on a storage nothing was ever pushed to.
    if !storage.join("docker/registry/v2/repositories").is_dir() {
        return Ok(Garbage::Collected(format!(
            "nothing pushed to the registry's storage ({}) yet",
            storage.display()
        )));
    }
    let untagged = untag_dropped(&storage, kept);
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
        "removed {} bytes from the registry's storage ({} bytes left in {}; {untagged} tags of images the layer store no longer holds removed first)",
        before.saturating_sub(after),
        after,
        storage.display()
    )))
}

/// Removes the tags of the registry's `storage` whose image `kept` (by config digest) says
/// the layer store no longer holds, so that the garbage collection removes their layers;
/// returns how many. Why: `auto` pulls a first copy through the registry and streams the
/// updates, so the registry's tag stays on the first copy's version for good, and its
/// layers with it, after the layer store dropped them. Read from the storage as
/// docker-registry's filesystem driver lays it out (`seed::link_stored` writes the same):
/// `repositories/<name>/_manifests/tags/<tag>/current/link` names the manifest, whose blob
/// names the config. An attestation's tag (`sha256-<manifest hex>.att`, beside its image)
/// goes with the tag of the image it is about, and stays while that stays; a tag that
/// cannot be read so stays.
fn untag_dropped(storage: &Path, kept: &dyn Fn(&str) -> bool) -> usize {
    let v2 = storage.join("docker/registry/v2");
    let blob = |digest: &str| fs_err::read(super::seed::blob_data(storage, digest)?).ok();
    let image_config = |manifest: &[u8]| -> Option<String> {
        let manifest: serde_json::Value = serde_json::from_slice(manifest).ok()?;
        let config = manifest.get("config")?;
        let media_type = config.get("mediaType")?.as_str()?;
        let image = media_type == "application/vnd.oci.image.config.v1+json"
            || media_type == "application/vnd.docker.container.image.v1+json";
        image.then(|| config.get("digest")?.as_str().map(str::to_string))?
    };
    let links = walkdir::WalkDir::new(v2.join("repositories"))
        .into_iter()
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.file_name() == "link")
        .map(walkdir::DirEntry::into_path)
        .filter(|path| {
            let parts: Vec<_> = path.iter().rev().take(4).collect();
            parts.len() == 4 && parts[1] == "current" && parts[3] == "tags"
        });
    let (mut untagged, mut dropped, mut attestations) = (0, HashSet::new(), Vec::new());
    for link in links.collect::<Vec<_>>() {
        let Some(tag) = link.parent().and_then(Path::parent) else {
            continue;
        };
        let name = tag.file_name().unwrap_or_default().to_string_lossy();
        let subject = (name.strip_prefix("sha256-")).and_then(|n| n.strip_suffix(".att"));
        if let Some(subject) = subject {
            attestations.push((format!("sha256:{subject}"), tag.to_path_buf()));
            continue;
        }
        let Ok(manifest) = fs_err::read_to_string(&link) else {
            continue;
        };
        let manifest = manifest.trim().to_string();
        let config = blob(&manifest).and_then(|m| image_config(&m));
        if config.is_some_and(|config| !kept(&config)) && fs_err::remove_dir_all(tag).is_ok() {
            untagged += 1;
            dropped.insert(manifest);
        }
    }
    for (subject, tag) in attestations {
        if dropped.contains(&subject) && fs_err::remove_dir_all(&tag).is_ok() {
            untagged += 1;
        }
    }
    untagged
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

/// `text` as a YAML single-quoted scalar (a quote doubled): a cache path holding ` #` or
/// `: ` is read as written, not cut short (the registry then stored outside the cache).
fn yaml_quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

fn registry_config(storage: &Path, port: u16) -> String {
    format!(
        "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\n\
         storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
         http:\n  addr: 127.0.0.1:{port}\n",
        yaml_quoted(&storage.display().to_string())
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

/// The registry of a cache, held for this hallmark from `auto`'s choice to the end of its
/// distribute: the registry's own [`Registry::open`] takes the same lock (image by image),
/// and between the choice and that, or between two images, another hallmark could take
/// it, and every node that chose the registry would fail (seen in an outside test: two
/// distributes at once to disjoint nodes).
pub struct Reserved {
    root: PathBuf,
}

/// This process's reservation: the lock's file, lent to [`hold_lock`] (a clone of one open
/// file shares its lock; a second open of the file would conflict with it).
static RESERVED: std::sync::Mutex<Option<(PathBuf, std::fs::File)>> = std::sync::Mutex::new(None);

/// Holds the registry of `cache` for this hallmark until dropped; `None` when another
/// hallmark (a distribute, or `prune`'s garbage collection) holds it.
pub fn reserve(cache: &Path) -> Result<Option<Reserved>> {
    let root = cache.join("registry");
    fs_err::create_dir_all(&root).map_err(|e| Error::io(&root, e))?;
    let Some(file) = take_lock(&root, false)? else {
        return Ok(None);
    };
    *RESERVED.lock().unwrap_or_else(|e| e.into_inner()) = Some((root.clone(), file));
    Ok(Some(Reserved { root }))
}

impl Drop for Reserved {
    fn drop(&mut self) {
        let mut held = RESERVED.lock().unwrap_or_else(|e| e.into_inner());
        if held.as_ref().is_some_and(|(root, _)| *root == self.root) {
            *held = None;
        }
    }
}

/// Whether a registry can be started here (its binary is on PATH).
pub fn can_start() -> bool {
    which(REGISTRY_BINARIES).is_some()
}

/// Debian's name for distribution's registry, and upstream's.
const REGISTRY_BINARIES: &[&str] = &["docker-registry", "registry"];

fn which(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
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
        assert_eq!(
            collect_garbage(cache.path(), false, &|_| true).unwrap(),
            Garbage::Busy
        );
        drop(distributing);
        // Released, the lock is taken, waited for: a process another test starts at this
        // moment holds a copy of the lock file's descriptor until it execs (an flock follows
        // the open file, which a fork shares), so an instant try can still find it held.
        let collect = || {
            let cache = cache.path().to_path_buf();
            let (sent, answer) = std::sync::mpsc::channel();
            std::thread::spawn(move || sent.send(collect_garbage(&cache, true, &|_| true)));
            answer
                .recv_timeout(std::time::Duration::from_secs(60))
                .expect("the collector takes the lock once it is released")
                .unwrap()
        };
        // With nothing pushed, there is nothing to collect (the collector itself fails on an
        // empty storage); with a repository folder, Debian's docker-registry runs.
        let collected = collect();
        assert!(
            matches!(&collected, Garbage::Collected(m) if m.contains("nothing pushed")),
            "{collected:?}"
        );
        std::fs::create_dir_all(storage.join("docker/registry/v2/repositories")).unwrap();
        std::fs::create_dir_all(storage.join("docker/registry/v2/blobs")).unwrap();
        let collected = collect();
        assert!(
            matches!(&collected, Garbage::Collected(m) if m.contains("removed")),
            "{collected:?}"
        );
    }
}
