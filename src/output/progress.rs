//! What a person at a terminal sees while images move, for both transports and for the loads
//! a build makes: one bar per transfer (on stderr when it is a terminal and output is not
//! quiet), and with `-v` each phase of a distribute with the seconds since it began.

use std::time::Instant;

/// `-v`: each phase of a distribute on stderr, with the seconds since it began.
pub struct Phases {
    started: Instant,
    verbose: bool,
}

impl Phases {
    pub fn start(verbose: bool) -> Phases {
        Phases {
            started: Instant::now(),
            verbose,
        }
    }

    pub fn say(&self, what: impl AsRef<str>) {
        if self.verbose {
            let seconds = self.started.elapsed().as_secs_f64();
            crate::output::stderr(&format!("{seconds:>7.2} s  {}", what.as_ref()));
        }
    }
}

/// The transfers' progress bars, drawn on stderr when `shown`, else nowhere.
pub fn bars(shown: bool) -> indicatif::MultiProgress {
    indicatif::MultiProgress::with_draw_target(if shown {
        indicatif::ProgressDrawTarget::stderr()
    } else {
        indicatif::ProgressDrawTarget::hidden()
    })
}

/// Per node on a terminal: bytes, total, rate, time left.
pub fn transfer_style() -> indicatif::ProgressStyle {
    indicatif::ProgressStyle::with_template(
        "{prefix:>10} {bytes:>10}/{total_bytes:<10} {binary_bytes_per_sec:>12} eta {eta}",
    )
    .expect("valid template")
}

/// A progress bar for one node's transfer (tracked for the [`Heartbeat`]).
pub fn transfer_bar(node: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(0)
        .with_style(transfer_style())
        .with_prefix(node.to_string());
    track(&bar);
    bar
}

/// The environment variable that sets how often a [`Heartbeat`] speaks, in seconds (10).
pub const HEARTBEAT_ENV: &str = "HALLMARK_PROGRESS_INTERVAL";

/// The transfers' bars, drawn or not, that a [`Heartbeat`] reports on (a load's, a pull's).
static TRACKED: std::sync::Mutex<Vec<indicatif::ProgressBar>> = std::sync::Mutex::new(Vec::new());

/// Notes `bar` (a transfer to a node, its prefix the node) for the [`Heartbeat`]'s lines,
/// in place of the node's earlier one.
pub fn track(bar: &indicatif::ProgressBar) {
    let mut tracked = TRACKED.lock().unwrap_or_else(|e| e.into_inner());
    let node = bar.prefix();
    tracked.retain(|b| b.prefix() != node);
    tracked.push(bar.clone());
}

/// What the tracked transfers have moved: `node1 12.0/40.0 MiB, node2 done`, the newest
/// bar of each node.
fn transfers() -> String {
    let tracked = TRACKED.lock().unwrap_or_else(|e| e.into_inner());
    let mut by_node: Vec<(String, String)> = Vec::new();
    for bar in tracked.iter() {
        let node = bar.prefix();
        if node.is_empty() {
            continue;
        }
        let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
        let said = match (bar.is_finished(), bar.length()) {
            (true, _) => "done".to_string(),
            (false, Some(total)) if total > 0 => {
                format!("{:.1}/{:.1} MiB", mib(bar.position()), mib(total))
            }
            (false, _) => format!("{:.1} MiB", mib(bar.position())),
        };
        match by_node.iter_mut().find(|(n, _)| *n == node) {
            Some(entry) => entry.1 = said,
            None => by_node.push((node, said)),
        }
    }
    by_node
        .iter()
        .map(|(node, said)| format!("{node} {said}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where stderr is no terminal (CI logs, an ssh session), bars cannot redraw: a line every
/// interval ([`HEARTBEAT_ENV`], 10 s) says the command is still at work, for how long, and
/// what the transfers under way have moved. Ends (at once) when dropped.
pub struct Heartbeat {
    stop: std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Heartbeat {
    /// Starts the lines for `verb`.
    pub fn start(verb: &str) -> Heartbeat {
        let every = std::env::var(HEARTBEAT_ENV)
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(std::time::Duration::from_secs(10), |s| {
                std::time::Duration::from_secs_f64(s.min(10.0))
            });
        let stop = std::sync::Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let (verb, flag) = (verb.to_string(), std::sync::Arc::clone(&stop));
        let started = Instant::now();
        let thread = std::thread::spawn(move || {
            let (lock, wake) = &*flag;
            let mut stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                let (guard, _) = wake
                    .wait_timeout_while(stopped, every, |s| !*s)
                    .unwrap_or_else(|e| e.into_inner());
                stopped = guard;
                if *stopped {
                    return;
                }
                let moved = transfers();
                let moved = match moved.is_empty() {
                    true => String::new(),
                    false => format!(": {moved}"),
                };
                crate::output::stderr(&format!(
                    "hallmark {verb}: still at work, {} s{moved}",
                    started.elapsed().as_secs()
                ));
            }
        });
        Heartbeat {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        let (lock, wake) = &*self.stop;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        TRACKED.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}
