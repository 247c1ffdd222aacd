//! Turns: two hallmark processes that would do the same work on one engine at once take
//! turns instead. A turn is an exclusive lock (flock) on a file in the cache,
//! `locks/<kind>-<hash of key>.lock`, held for as long as the turn is kept; a process that
//! ends, however, releases it.

use crate::error::{Error, Result};
use std::path::Path;

pub struct Turn {
    /// Held, never read: the lock lasts as long as the file is open.
    _lock: std::fs::File,
}

impl Turn {
    /// Takes the turn `kind`/`key`, waiting for another process holding it; `waiting` is told
    /// the lock's path first if it must wait.
    pub async fn take(
        cache: &Path,
        kind: &str,
        key: &str,
        waiting: impl FnOnce(&Path),
    ) -> Result<Turn> {
        let path = turn_path(cache, kind, key)?;
        let file = lock_file(&path)?;
        match file.try_lock() {
            Ok(()) => return Ok(Turn { _lock: file }),
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&path, e)),
            Err(std::fs::TryLockError::WouldBlock) => {}
        }
        waiting(&path);
        // Asked again every quarter second rather than waited for in a blocking task: a
        // Ctrl-C drops this wait at once, where the runtime's end waited for the blocking
        // lock (an interrupted distribute hung until the other run ended).
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            match file.try_lock() {
                Ok(()) => return Ok(Turn { _lock: file }),
                Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&path, e)),
                Err(std::fs::TryLockError::WouldBlock) => {}
            }
        }
    }

    /// `take` for code that is not async (the git cache's fetches): the same lock, waited for
    /// by [`lock_blocking`].
    pub fn take_blocking(cache: &Path, kind: &str, key: &str, waiting: &str) -> Result<Turn> {
        let path = turn_path(cache, kind, key)?;
        let file = lock_file(&path)?;
        let told = || tracing::info!(lock = %path.display(), "{waiting}");
        lock_blocking(&file, &path, told, waiting)?;
        Ok(Turn { _lock: file })
    }
}

/// Takes the flock on `file` (at `path`, named in errors) for code that is not async, asking
/// again every quarter second; `told` is called once if it must wait. A stop asked for
/// (Ctrl-C, SIGTERM) ends the wait, `stopping` saying what was waiting.
pub fn lock_blocking(
    file: &std::fs::File,
    path: &Path,
    told: impl FnOnce(),
    stopping: &str,
) -> Result<()> {
    let mut told = Some(told);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(path, e)),
            Err(std::fs::TryLockError::WouldBlock) => {}
        }
        if let Some(told) = told.take() {
            told();
        }
        crate::interrupt::check(stopping)?;
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// `locks/<kind>-<hash of key>.lock` in the cache, its folder made.
fn turn_path(cache: &Path, kind: &str, key: &str) -> Result<std::path::PathBuf> {
    use sha2::Digest as _;
    let dir = cache.join("locks");
    fs_err::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let hash = hex::encode(sha2::Sha256::digest(key));
    Ok(dir.join(format!("{kind}-{}.lock", &hash[..24])))
}

/// The file at `path`, created if missing and never truncated, to hold an flock on (what it
/// holds is not read).
pub fn lock_file(path: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error::io(path, e))
}
