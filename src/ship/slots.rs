//! How many nodes `--parallel` serves at once. Without it, one after another. With it, every
//! node that needs a transfer at once, except nodes whose engine runs on this machine (the
//! builder's: its host name is ours, as on a testbed or a builder that is also a node): their
//! loads unpack on the same cores that write the archives, so at most as many of them as this
//! machine has cores load at the same time. More would only share those cores (measured on
//! 2 cores: 8 loads at once gained 1.2-1.7x over serial, each load slowing down), and on one
//! core this is serial: `--parallel` is never slower than without.

use crate::engine::Engine;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::Semaphore;

pub struct Slots {
    /// How many nodes' work runs at once.
    pub at_once: usize,
    /// Per node: whether its engine runs on this machine (and so takes one of `cores`).
    local: Vec<bool>,
    cores: Arc<Semaphore>,
}

impl Slots {
    /// The slots for `nodes` (`needing`: how many of them need a transfer).
    pub async fn new(parallel: bool, nodes: &[Engine], needing: usize) -> Slots {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let local = if parallel {
            let here = host_name();
            futures_util::future::join_all(nodes.iter().map(|node| async {
                // A node that cannot say where it runs is taken to run here: the safe side.
                node.info()
                    .await
                    .map_or(true, |info| Some(info.name) == here)
            }))
            .await
        } else {
            vec![false; nodes.len()]
        };
        Slots {
            at_once: if parallel { needing.max(1) } else { 1 },
            local,
            cores: Arc::new(Semaphore::new(cores)),
        }
    }

    /// Runs node `i`'s `work`, holding one of this machine's cores if the node runs here.
    pub async fn hold<T>(&self, i: usize, work: impl Future<Output = T>) -> T {
        let _core = match self.local.get(i) {
            Some(true) => Some(self.cores.acquire().await.expect("never closed")),
            _ => None,
        };
        work.await
    }
}

/// This machine's host name, as Docker reports it in `/info` (`Name`).
fn host_name() -> Option<String> {
    let name = fs_err::read_to_string("/proc/sys/kernel/hostname").ok()?;
    Some(name.trim().to_string()).filter(|n| !n.is_empty())
}
