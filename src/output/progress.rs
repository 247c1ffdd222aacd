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

/// A progress bar for one node's transfer.
pub fn transfer_bar(node: &str) -> indicatif::ProgressBar {
    indicatif::ProgressBar::new(0)
        .with_style(transfer_style())
        .with_prefix(node.to_string())
}
