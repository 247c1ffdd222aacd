//! Whether an engine can run code of another platform than its own: an x86_64 builder runs
//! an arm64 image's RUN steps and smoke tests through QEMU once the kernel's binfmt_misc has
//! an emulator registered for arm64 (Debian's qemu-user-static and binfmt-support register
//! one with the F flag, so it works inside containers too). The engine's own word (`/info`)
//! does not say so, so it is asked the only way that answers: a probe container of that
//! platform, which exits 0 when its program ran. The answer is kept per engine.

use super::Engine;
use crate::error::{Error, Result};

/// Whether platform `have` satisfies `want`: the same os and architecture, and the same
/// variant when `want` names one (`linux/arm64` is `linux/arm64/v8`).
pub fn same_platform(have: &str, want: &str) -> bool {
    let canonical = |p: &str| {
        let mut parts: Vec<String> = p.split('/').map(str::to_ascii_lowercase).collect();
        if parts.len() == 2 && parts[1] == "arm64" {
            parts.push("v8".into());
        }
        parts
    };
    let (have, want) = (canonical(have), canonical(want));
    have.len() >= 2
        && want.len() >= 2
        && have[..2] == want[..2]
        && (want.len() < 3 || have.get(2) == want.get(2))
}

/// How code of a platform runs on an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Execution {
    /// The engine's own platform.
    Native,
    /// Another one, through an emulator the engine's kernel runs it with.
    Emulated,
}

/// The tag the probe image of `platform` is loaded under.
fn probe_tag(platform: &str) -> String {
    format!("hallmark-probe:{}", platform.replace('/', "-"))
}

/// The probe program for `arch` (OCI names): a static ELF executable of a few instructions
/// that exits 0, or `None` for an architecture hallmark has no probe for. Written by hand:
/// no crate makes an executable for another architecture, and a toolchain per architecture
/// is far more than three instructions need.
pub fn probe_program(arch: &str) -> Option<Vec<u8>> {
    // (ELF machine, the code: exit(0) by the architecture's syscall convention)
    let (machine, code): (u16, Vec<u8>) = match arch {
        // xor edi, edi; mov eax, 60; syscall
        "amd64" => (62, vec![0x31, 0xff, 0xb8, 0x3c, 0, 0, 0, 0x0f, 0x05]),
        // mov x0, #0; mov x8, #93; svc #0
        "arm64" => (183, words(&[0xd280_0000, 0xd280_0ba8, 0xd400_0001])),
        // li a0, 0; li a7, 93; ecall
        "riscv64" => (243, words(&[0x0000_0513, 0x05d0_0893, 0x0000_0073])),
        _ => return None,
    };
    const BASE: u64 = 0x40_0000;
    const HEADERS: u64 = 64 + 56;
    let total = HEADERS + code.len() as u64;
    let mut elf = b"\x7fELF".to_vec();
    // 64-bit, little-endian, ELF version 1, System V ABI, padding.
    elf.extend_from_slice(&[2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    for half in [2u16, machine] {
        elf.extend_from_slice(&half.to_le_bytes()); // ET_EXEC, the machine
    }
    elf.extend_from_slice(&1u32.to_le_bytes());
    for quad in [BASE + HEADERS, 64, 0] {
        elf.extend_from_slice(&quad.to_le_bytes()); // entry, program headers, no sections
    }
    elf.extend_from_slice(&0u32.to_le_bytes());
    for half in [64u16, 56, 1, 0, 0, 0] {
        elf.extend_from_slice(&half.to_le_bytes()); // sizes, one program header
    }
    // One PT_LOAD segment, readable and executable, of the whole file.
    elf.extend_from_slice(&1u32.to_le_bytes());
    elf.extend_from_slice(&5u32.to_le_bytes());
    for quad in [0, BASE, BASE, total, total, 0x1000] {
        elf.extend_from_slice(&quad.to_le_bytes());
    }
    elf.extend_from_slice(&code);
    Some(elf)
}

fn words(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// A `docker load` archive of one image of `platform` (`os/arch`) holding `/probe`.
pub fn probe_archive(platform: &str, program: &[u8]) -> Result<Vec<u8>> {
    use sha2::Digest;
    let (os, arch) = platform.split_once('/').unwrap_or(("linux", platform));
    let arch = arch.split('/').next().unwrap_or(arch);
    // Through the project's one deterministic tar writer, as every archive hallmark writes.
    use crate::oci::tar::{self, EntryType};
    let tar = |entries: &[(&str, &[u8], u32)]| -> std::io::Result<Vec<u8>> {
        let mut builder = tar::Builder::new(Vec::new());
        for (path, data, mode) in entries {
            let header = tar::header(EntryType::Regular, *mode, data.len() as u64, 0);
            tar::append(&mut builder, header, path, *data)?;
        }
        builder.into_inner()
    };
    let io = |e: std::io::Error| Error::usage(format!("making the {platform} probe image: {e}"));
    let layer = tar(&[("probe", program, 0o755)]).map_err(io)?;
    let diff_id = hex::encode(sha2::Sha256::digest(&layer));
    let config = serde_json::json!({
        "architecture": arch,
        "os": os,
        "config": {"Entrypoint": ["/probe"], "Labels": {"hallmark.probe": platform}},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
    })
    .to_string();
    let config_id = hex::encode(sha2::Sha256::digest(config.as_bytes()));
    let manifest = serde_json::json!([{
        "Config": format!("{config_id}.json"),
        "RepoTags": [probe_tag(platform)],
        "Layers": [format!("{diff_id}/layer.tar")],
    }])
    .to_string();
    tar(&[
        (&format!("{diff_id}/layer.tar"), &layer, 0o644),
        (&format!("{config_id}.json"), config.as_bytes(), 0o644),
        ("manifest.json", manifest.as_bytes(), 0o644),
    ])
    .map_err(io)
}

impl Engine {
    /// How this engine runs code of `platform`: natively, emulated, or an error saying why it
    /// cannot (no emulator registered: how to register one). Asked once per engine.
    pub async fn runs_platform(&self, platform: &str) -> Result<Execution> {
        if same_platform(&self.platform(), platform) {
            return Ok(Execution::Native);
        }
        let mut asked = self.platforms.lock().await;
        if let Some(answer) = asked.get(platform) {
            return answer.clone().map_err(|message| self.error(message));
        }
        let answer = self.probe(platform).await;
        asked.insert(platform.to_string(), answer.clone());
        answer.map_err(|message| self.error(message))
    }

    /// Loads the probe image of `platform` and runs it: `Emulated` when it exits 0.
    async fn probe(&self, platform: &str) -> std::result::Result<Execution, String> {
        let own = self.platform();
        let arch = platform.split('/').nth(1).unwrap_or_default();
        let register = format!(
            "register an emulator on the engine's machine: `apt-get install qemu-user-static binfmt-support` (Debian, Ubuntu), or `docker run --privileged --rm tonistiigi/binfmt --install {arch}`"
        );
        let Some(program) = probe_program(arch) else {
            return Err(format!(
                "the engine is {own} and cannot be asked whether it runs {platform}: hallmark has a probe for linux/amd64, linux/arm64 and linux/riscv64 only"
            ));
        };
        let archive = probe_archive(platform, &program).map_err(|e| e.to_string())?;
        let body = futures_util::stream::once(async move { bytes::Bytes::from(archive) });
        super::follow(self.import(body, true), |_| {})
            .await
            .map_err(|e| format!("loading the {platform} probe image: {e}"))?;
        let tag = probe_tag(platform);
        match self.run_once(&tag, &["/probe".to_string()]).await {
            Ok((0, _)) => Ok(Execution::Emulated),
            Ok((code, output)) => Err(format!(
                "the engine is {own} and cannot run {platform} code (a {platform} probe exited {code}: {}); {register}",
                output.trim()
            )),
            Err(e) => Err(format!(
                "the engine is {own} and cannot run {platform} code ({e}); {register}"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe for this machine's own architecture runs here and exits 0 (the others are
    /// run by the engine tests, through the testbed's emulators).
    #[test]
    fn the_probe_of_this_machines_architecture_exits_0() {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "riscv64" => "riscv64",
            other => panic!("no probe for {other}"),
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("probe");
        std::fs::write(&path, probe_program(arch).unwrap()).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let status = std::process::Command::new(&path).status().unwrap();
        assert_eq!(status.code(), Some(0));
        assert!(probe_program("s390x").is_none());
    }

    #[test]
    fn the_probe_archive_names_its_platform_and_holds_the_program() {
        let archive = probe_archive("linux/arm64", b"program").unwrap();
        let mut entries = tar::Archive::new(archive.as_slice());
        let names: Vec<String> = entries
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names.len(), 3);
        assert!(names.iter().any(|n| n == "manifest.json"));
        let text = String::from_utf8_lossy(&archive);
        assert!(
            text.contains("\"architecture\":\"arm64\"")
                && text.contains("hallmark-probe:linux-arm64")
        );
    }
}
