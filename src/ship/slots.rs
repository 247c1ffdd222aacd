//! How many nodes `--parallel` serves at once. Without it, one after another. With it, every
//! node that needs a transfer at once, except heavy loads into engines that run on this
//! machine (the builder's: the engine's host name is ours, as on a testbed or a builder that
//! is also a node): unpacking and hashing a big archive takes the same cores that write it,
//! so at most as many of those as this machine has cores load at the same time (measured on
//! 2 cores: eight 1 GiB loads at once gained only 1.2-1.7x over serial, each slowed down;
//! on one core they are serial, so `--parallel` is never slower than without). A light load
//! (under [`LIGHT`]: small images, however many) waits on the engine's disk writes, not on a
//! core (a load of 60 small images kept its dockerd 6% busy): those all run at once.

use crate::engine::Engine;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::Semaphore;

/// Bytes under which a node's load takes no core of its own.
pub const LIGHT: u64 = 64 << 20;

pub struct Slots {
    /// How many nodes' work runs at once.
    pub at_once: usize,
    /// Per node: whether its load takes one of this machine's `cores` (heavy, and here).
    heavy_here: Vec<bool>,
    cores: Arc<Semaphore>,
}

impl Slots {
    /// The slots for `nodes`, given the bytes each will be sent (`loads`, 0: nothing).
    pub async fn new(parallel: bool, nodes: &[Engine], loads: &[u64]) -> Slots {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let needing = loads.iter().filter(|l| **l > 0).count();
        let here = host_name();
        let heavy_here =
            futures_util::future::join_all(nodes.iter().zip(loads).map(|(node, load)| {
                let here = here.clone();
                async move {
                    // A node that cannot say where it runs is taken to run here: the safe side.
                    parallel
                        && *load >= LIGHT
                        && node
                            .info()
                            .await
                            .map_or(true, |info| Some(info.name) == here)
                }
            }))
            .await;
        Slots {
            at_once: if parallel { needing.max(1) } else { 1 },
            heavy_here,
            cores: Arc::new(Semaphore::new(cores)),
        }
    }

    /// Runs node `i`'s `work`, holding one of this machine's cores if the node runs here.
    pub async fn hold<T>(&self, i: usize, work: impl Future<Output = T>) -> T {
        let _core = match self.heavy_here.get(i) {
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
