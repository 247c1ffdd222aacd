//! What a container or an exec printed, kept in bounded memory: a smoke test that prints
//! 300 MB (a model's weights dumped by mistake, a loop) must not take 300 MB of hallmark's
//! memory, twice. The last bytes are kept, which is where a failure says why; how much was cut
//! is said in front of them.

/// How much of a test's interleaved output is kept: its last 64 KiB.
pub const OUTPUT_TAIL: usize = 64 * 1024;
/// How much of its standard output `expect` is matched against: its last MiB.
pub const STDOUT_TAIL: usize = 1024 * 1024;

/// The last `keep` bytes of a stream, and how many came before them.
#[derive(Debug)]
pub struct Tail {
    keep: usize,
    bytes: Vec<u8>,
    cut: u64,
}

impl Tail {
    pub fn new(keep: usize) -> Tail {
        Tail {
            keep,
            bytes: Vec::new(),
            cut: 0,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        // Trimmed once it holds twice what it keeps: each byte is moved at most once more.
        if self.bytes.len() > 2 * self.keep.max(1) {
            let excess = self.bytes.len() - self.keep;
            self.bytes.drain(..excess);
            self.cut += excess as u64;
        }
    }

    /// The bytes kept, as text, after a line saying how much was cut before them, if any.
    pub fn into_text(mut self) -> String {
        if self.bytes.len() > self.keep {
            let excess = self.bytes.len() - self.keep;
            self.bytes.drain(..excess);
            self.cut += excess as u64;
        }
        let text = String::from_utf8_lossy(&self.bytes).into_owned();
        match self.cut {
            0 => text,
            cut => format!(
                "[{} cut: the last {} follow]\n{text}",
                indicatif::HumanBytes(cut),
                indicatif::HumanBytes(self.keep as u64)
            ),
        }
    }
}

/// A container's or exec's output as it streams: interleaved, and standard output alone.
#[derive(Debug)]
pub struct Captured {
    pub output: Tail,
    pub stdout: Tail,
}

impl Default for Captured {
    fn default() -> Captured {
        Captured {
            output: Tail::new(OUTPUT_TAIL),
            stdout: Tail::new(STDOUT_TAIL),
        }
    }
}

impl Captured {
    pub fn push(&mut self, chunk: &bollard::container::LogOutput) {
        use bollard::container::LogOutput;
        if let LogOutput::StdOut { message } | LogOutput::Console { message } = chunk {
            self.stdout.push(message);
        }
        self.output.push(chunk.as_ref());
    }

    /// The interleaved output and standard output, as text.
    pub fn into_texts(self) -> (String, String) {
        (self.output.into_text(), self.stdout.into_text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_keeps_the_last_bytes_and_says_how_much_was_cut() {
        let mut tail = Tail::new(10);
        for _ in 0..1000 {
            tail.push(b"0123456789abcdef");
            assert!(tail.bytes.len() <= 2 * 10 + 16, "memory stays bounded");
        }
        let text = tail.into_text();
        assert!(text.ends_with("\n6789abcdef"), "{text}");
        assert!(
            text.starts_with("[15.62 KiB cut: the last 10 B follow]"),
            "{text}"
        );
        let mut short = Tail::new(10);
        short.push(b"all of it");
        assert_eq!(short.into_text(), "all of it");
    }
}
