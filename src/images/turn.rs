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
        use sha2::Digest as _;
        let dir = cache.join("locks");
        fs_err::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let hash = hex::encode(sha2::Sha256::digest(key));
        let path = dir.join(format!("{kind}-{}.lock", &hash[..24]));
        let file = lock_file(&path)?;
        match file.try_lock() {
            Ok(()) => return Ok(Turn { _lock: file }),
            Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&path, e)),
            Err(std::fs::TryLockError::WouldBlock) => {}
        }
        waiting(&path);
        tokio::task::spawn_blocking(move || file.lock().map(|()| file))
            .await
            .expect("the lock task does not panic")
            .map(|file| Turn { _lock: file })
            .map_err(|e| Error::io(&path, e))
    }
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
