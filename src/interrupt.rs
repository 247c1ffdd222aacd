//! Ctrl-C (SIGINT) and SIGTERM (a CI cancel, `timeout`, a systemd stop) mean the same to
//! every verb: stop, clean up, say what was done, exit 130.
//!
//! One thread waits for both from the start of a verb ([`watch`]). Code that can end its own
//! way listens ([`listening`], then [`requested`] or [`check`]): the engine verbs print the
//! rows they have, the rest `interrupted`, and remove the containers they started. While
//! nothing listens, the thread ends the process itself, once no file is half written
//! ([`writing`]), after stopping the programs hallmark started (git, pip), so that none runs
//! on after it. A second signal ends the process at once (writes still finish).

use std::sync::{Condvar, Mutex, OnceLock};

/// Whether a stop was asked for, for async code to wait on ([`requested`]).
fn asked() -> &'static tokio::sync::watch::Sender<bool> {
    static ASKED: OnceLock<tokio::sync::watch::Sender<bool>> = OnceLock::new();
    ASKED.get_or_init(|| tokio::sync::watch::Sender::new(false))
}

/// Who holds the process up, under one lock so that the signal thread's choice (leave the
/// signal to listening code, or end the process) and a new holder never cross.
struct Holders {
    /// Pieces of code that listen: while one does, the first signal is theirs.
    listening: usize,
    /// Writes under way: the process ends after them, never between their files.
    writes: usize,
    /// The process is ending: no write and no listening starts.
    ending: bool,
}

static HOLDERS: Mutex<Holders> = Mutex::new(Holders {
    listening: 0,
    writes: 0,
    ending: false,
});
static WRITES_DONE: Condvar = Condvar::new();

fn holders() -> std::sync::MutexGuard<'static, Holders> {
    HOLDERS.lock().unwrap_or_else(|e| e.into_inner())
}

std::thread_local! {
    /// Writes this thread has under way: its own code must go on until they end (a child
    /// it runs for them is not stopped, a listener it starts is not refused).
    static WRITES_HERE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn writing_here() -> bool {
    WRITES_HERE.with(|w| w.get() > 0)
}

/// Waits for the end of the process, which the signal thread is bringing.
fn wait_for_the_end() -> ! {
    loop {
        std::thread::park();
    }
}

/// Starts the thread that waits for SIGINT and SIGTERM, once a process; `verb` names what
/// is stopped in the line said when the thread ends the process.
pub fn watch(verb: &str) {
    static STARTED: OnceLock<()> = OnceLock::new();
    let verb = verb.to_string();
    STARTED.get_or_init(|| {
        use signal_hook::consts::{SIGINT, SIGTERM};
        // Without the thread the signals keep their default (the process ends, 143 or 130).
        let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                for (n, signal) in signals.forever().enumerate() {
                    asked().send_replace(true);
                    stop_stoppable();
                    let name = if signal == SIGINT { "SIGINT" } else { "SIGTERM" };
                    tracing::debug!("{name} arrived");
                    // Decided under the lock a new listener or write takes.
                    let mut holding = holders();
                    if n == 0 && holding.listening > 0 {
                        continue;
                    }
                    holding.ending = true;
                    let said = match n {
                        0 => format!("{verb} stopped"),
                        _ => format!("a second {name}: {verb} stopped at once; containers it started may remain (`docker ps -a`)"),
                    };
                    end_process(holding, &format!("interrupted ({name}): {said}; no file is left half written"));
                }
            });
        if spawned.is_err() {
            tracing::warn!("no thread to wait for SIGINT and SIGTERM");
        }
        tracing::debug!("watching SIGINT and SIGTERM");
    });
}

/// Waits for the writes under way (no new one starts), stops the children, says `line` and
/// ends the process with 130.
fn end_process(mut holders: std::sync::MutexGuard<'static, Holders>, line: &str) -> ! {
    while holders.writes > 0 {
        holders = WRITES_DONE.wait(holders).unwrap_or_else(|e| e.into_inner());
    }
    // Kept until the end: no stoppable child starts after this look.
    let _no_more_children = SPAWNING.lock().unwrap_or_else(|e| e.into_inner());
    stop_children();
    crate::output::stderr_exactly(&format!("{line}\n"));
    std::process::exit(130)
}

/// Sends SIGTERM to every process whose parent is this one: a `git fetch` or `pip download`
/// must not run on into a cache after hallmark ended. Read from /proc: the children are
/// started in many places (std and tokio commands), and a registry of them would be one more
/// thing each must remember.
fn stop_children() {
    let me = std::process::id().to_string();
    let Ok(entries) = fs_err::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = fs_err::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1));
        if parent == Some(me.as_str()) {
            // SAFETY: kill with a pid read from /proc and a constant signal.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }
}

/// Held while a stoppable child is started and noted, and by the signal thread from its
/// last look for children until the process ends: no child starts unseen in between (a
/// second `git fetch`, started as the first was stopped, outlived hallmark).
static SPAWNING: Mutex<()> = Mutex::new(());

/// Starts `command` as a child that ends on the first signal ([`stoppable`]); after a
/// signal none starts (`Interrupted`), but for a write under way on this thread.
pub fn spawn_stoppable(
    command: &mut std::process::Command,
) -> std::io::Result<(std::process::Child, Stoppable)> {
    let _spawning = SPAWNING.lock().unwrap_or_else(|e| e.into_inner());
    if requested() && !writing_here() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::Interrupted,
            "interrupted (SIGINT or SIGTERM): not started",
        ));
    }
    let child = command.spawn()?;
    let stoppable = stoppable(child.id());
    Ok((child, stoppable))
}

/// Children that end on the first signal even while their parent's code listens: a `git
/// fetch` from a remote that does not answer must not hold a listening `bump` for good.
static STOPPABLE: Mutex<Vec<(u32, bool)>> = Mutex::new(Vec::new());

/// While held, the child `pid` is sent SIGTERM when a signal arrives (its caller then sees
/// it fail, and hallmark ends as interrupted). Dropped right after the child is reaped.
/// One run inside a write ([`writing`]) on the same thread is not stopped: the write it
/// serves ends first (a refresh's `git diff` stopped between a patch and its series left
/// them out of step).
pub struct Stoppable(u32);

pub fn stoppable(pid: u32) -> Stoppable {
    let mut pids = STOPPABLE.lock().unwrap_or_else(|e| e.into_inner());
    let for_a_write = writing_here();
    pids.push((pid, for_a_write));
    if requested() && !for_a_write {
        // SAFETY: kill with the pid of a child not reaped yet.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    Stoppable(pid)
}

impl Drop for Stoppable {
    fn drop(&mut self) {
        let mut pids = STOPPABLE.lock().unwrap_or_else(|e| e.into_inner());
        pids.retain(|(p, _)| *p != self.0);
    }
}

fn stop_stoppable() {
    let pids = STOPPABLE.lock().unwrap_or_else(|e| e.into_inner());
    for (pid, _) in pids.iter().filter(|(_, for_a_write)| !for_a_write) {
        // SAFETY: kill with the pid of a child its holder has not dropped (reaped) yet. The
        // window between its reaping and the drop is the holder's next statement.
        unsafe { libc::kill(*pid as i32, libc::SIGTERM) };
    }
}

/// Whether SIGINT or SIGTERM arrived.
pub fn requested() -> bool {
    *asked().borrow()
}

/// Ends when SIGINT or SIGTERM arrived (at once if one did already).
pub async fn arrived() {
    let mut asked = asked().subscribe();
    let _ = asked.wait_for(|asked| *asked).await;
}

/// `Err(Interrupted)` naming `what` once a signal arrived: for loops of listening code.
pub fn check(what: &str) -> crate::error::Result<()> {
    match requested() {
        true => Err(crate::error::Error::Interrupted {
            what: what.to_string(),
        }),
        false => Ok(()),
    }
}

/// While held, a signal is for the holder: it ends its work itself, as interrupted.
pub struct Listening(());

pub fn listening() -> Listening {
    let mut holders = holders();
    if holders.ending && !writing_here() {
        // The signal came before: the process ends without this work.
        drop(holders);
        wait_for_the_end();
    }
    holders.listening += 1;
    Listening(())
}

impl Drop for Listening {
    fn drop(&mut self) {
        holders().listening -= 1;
    }
}

/// While held, files that belong together are being written: a signal ends the process
/// after, never between them.
pub struct Writing(std::marker::PhantomData<*const ()>);

pub fn writing() -> Writing {
    let mut holders = holders();
    if holders.ending && holders.writes == 0 {
        // The process is ending: this write would be cut short (one started inside another
        // write finishes with it).
        drop(holders);
        wait_for_the_end();
    }
    holders.writes += 1;
    WRITES_HERE.with(|w| w.set(w.get() + 1));
    // Not Send: dropped on the thread that took it, which `WRITES_HERE` counts.
    Writing(std::marker::PhantomData)
}

impl Drop for Writing {
    fn drop(&mut self) {
        WRITES_HERE.with(|w| w.set(w.get() - 1));
        holders().writes -= 1;
        WRITES_DONE.notify_all();
    }
}
