//! Installing a wheel as pip does (PEP 427), straight into a layer tar: the root of the wheel
//! and its `.data/purelib|platlib` into the target's site-packages, `.data/scripts` into its
//! scripts folder (a `#!python` shebang rewritten to the target's interpreter), `.data/headers`
//! and `.data/data` under its prefix, console scripts from `entry_points.txt`, and a fresh
//! `RECORD`, `INSTALLER` (`hallmark`) and `REQUESTED` in the `.dist-info` folder, so
//! `pip show -f` and `pip uninstall` work in the image. Byte code is not compiled ahead: Python
//! writes it on first import (pip's `--no-compile`).
//!
//! uv's installer (`install-wheel-rs`) was considered: it installs into a directory on disk,
//! not into a stream, and is not published for use outside uv; writing a layer directly keeps
//! the layer deterministic and never touches the host's filesystem.

use crate::inputs::python::{PythonTarget, WheelName, parse_name};
use crate::oci::Hashing;
use crate::oci::tar;
use base64::Engine as _;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::Path;

fn record_hash(bytes_hash: &[u8]) -> String {
    format!(
        "sha256={}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes_hash)
    )
}

/// `rel` from `from` (both absolute folders/paths): what RECORD lists for files outside
/// site-packages, e.g. `../../../bin/tool`.
fn relative(from: &str, to: &str) -> String {
    let from: Vec<&str> = from.trim_matches('/').split('/').collect();
    let to: Vec<&str> = to.trim_matches('/').split('/').collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<&str> = std::iter::repeat_n("..", from.len() - common).collect();
    parts.extend(&to[common..]);
    parts.join("/")
}

/// A path in a wheel that would land outside its install folder.
#[derive(Debug, thiserror::Error)]
#[error("`{0}` would land outside its install folder")]
struct Outside(String);

fn safe_relative(path: &str) -> Result<(), Outside> {
    if path.starts_with('/')
        || path.split('/').any(|p| p == ".." || p.is_empty())
        || path.contains('\\')
    {
        return Err(Outside(path.to_string()));
    }
    Ok(())
}

struct LayerWriter<'a, W: Write> {
    tar: &'a mut tar::Builder<W>,
    mtime: u64,
    dirs: BTreeSet<String>,
    /// Folders under which new folders get their own entries (site-packages and the like).
    roots: Vec<String>,
}

impl<W: Write> LayerWriter<'_, W> {
    fn parents(&mut self, path: &str) -> std::io::Result<()> {
        let Some(root) = self
            .roots
            .iter()
            .find(|r| path.starts_with(&format!("{r}/")))
            .cloned()
        else {
            return Ok(());
        };
        let below = &path[root.len() + 1..];
        let mut current = root;
        let parts: Vec<&str> = below.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            current = format!("{current}/{part}");
            if self.dirs.insert(current.clone()) {
                let mut header = tar::owned(tar::EntryType::Directory, 0o755, 0, self.mtime, 0, 0);
                self.tar.append_data(
                    &mut header,
                    format!("{}/", current.trim_start_matches('/')),
                    std::io::empty(),
                )?;
            }
        }
        Ok(())
    }

    /// Writes a file at absolute `path`; returns its RECORD hash and size.
    fn file(
        &mut self,
        path: &str,
        mode: u32,
        size: u64,
        data: &mut dyn Read,
    ) -> std::io::Result<(String, u64)> {
        self.parents(path)?;
        let mut header = tar::owned(tar::EntryType::Regular, mode, size, self.mtime, 0, 0);
        let mut hashing = Hashing::new(data);
        self.tar
            .append_data(&mut header, path.trim_start_matches('/'), &mut hashing)?;
        Ok((record_hash(&hashing.sha256()), size))
    }
}

fn invalid(message: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message.to_string())
}

/// Installs the wheel at `wheel` into `tar` for `target`, as pip would: its files under
/// their install schemes, console scripts for its entry points, and a RECORD of them all.
pub fn install<W: Write>(
    wheel: &Path,
    target: &PythonTarget,
    mtime: u64,
    tar: &mut tar::Builder<W>,
) -> std::io::Result<()> {
    let file_name = wheel
        .file_name()
        .and_then(|f| f.to_str())
        .unwrap_or_default();
    let name = parse_name(file_name).map_err(invalid)?;
    let mut archive = zip::ZipArchive::new(fs_err::File::open(wheel)?)
        .map_err(|e| invalid(format!("{}: {e}", wheel.display())))?;
    let mut entries: Vec<String> = archive
        .file_names()
        .map(|n| n.map(|n| n.into_owned()))
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(format!("{file_name}: {e}")))?;
    entries.sort();
    let wheel = Unpacked {
        dist_info: dist_info(&entries, &name, file_name)?,
        file_name,
        name: &name,
        target,
        site: target.purelib.trim_end_matches('/').to_string(),
    };
    let mut layer = LayerWriter {
        tar,
        mtime,
        dirs: BTreeSet::new(),
        roots: vec![
            wheel.site.clone(),
            target.include.trim_end_matches('/').to_string(),
        ],
    };
    let mut record = wheel.copy_files(&mut archive, &entries, &mut layer)?;
    if entries.contains(&format!("{}/entry_points.txt", wheel.dist_info)) {
        wheel.write_scripts(&mut archive, &mut layer, &mut record)?;
    }
    wheel.write_record(&mut layer, record)
}

/// The wheel's `<name>-<version>.dist-info` folder.
fn dist_info(entries: &[String], name: &WheelName, file_name: &str) -> std::io::Result<String> {
    entries
        .iter()
        .filter_map(|e| e.split('/').next())
        .find(|top| {
            top.ends_with(".dist-info")
                && crate::inputs::pins::wheel_stem(top.trim_end_matches(".dist-info"))
                    .starts_with(&crate::inputs::pins::wheel_stem(&name.distribution))
        })
        .map(str::to_string)
        .ok_or_else(|| invalid(format!("{file_name}: no .dist-info folder")))
}

/// One RECORD line: the path (relative to site-packages), its hash and size.
type RecordLine = (String, String, u64);

/// A wheel being installed, and where its files go.
struct Unpacked<'a> {
    file_name: &'a str,
    name: &'a WheelName,
    target: &'a PythonTarget,
    dist_info: String,
    /// site-packages (purelib), without a trailing `/`.
    site: String,
}

impl Unpacked<'_> {
    /// Copies every file of the wheel (but its RECORD, signatures and INSTALLER) to its
    /// install path; scripts get the target's interpreter in their `#!python` line.
    fn copy_files<W: Write>(
        &self,
        archive: &mut zip::ZipArchive<fs_err::File>,
        entries: &[String],
        layer: &mut LayerWriter<'_, W>,
    ) -> std::io::Result<Vec<RecordLine>> {
        let file_name = self.file_name;
        let dist_info = &self.dist_info;
        let skip = [
            format!("{dist_info}/RECORD"),
            format!("{dist_info}/RECORD.jws"),
            format!("{dist_info}/RECORD.p7s"),
            format!("{dist_info}/INSTALLER"),
        ];
        let mut record = Vec::new();
        for entry_name in entries {
            let mut entry = archive
                .by_name(entry_name)
                .map_err(|e| invalid(format!("{file_name}: {e}")))?;
            if entry.is_dir() || skip.contains(entry_name) {
                continue;
            }
            safe_relative(entry_name).map_err(|m| invalid(format!("{file_name}: {m}")))?;
            let executable = entry.unix_mode().is_some_and(|m| m & 0o111 != 0);
            let (path, is_script) = self.install_path(entry_name)?;
            let (hash, size) = if is_script {
                let mut bytes = Vec::new();
                entry.read_to_end(&mut bytes)?;
                if bytes.starts_with(b"#!python") {
                    let end = bytes
                        .iter()
                        .position(|&b| b == b'\n')
                        .unwrap_or(bytes.len());
                    bytes = [
                        format!("#!{}", self.target.executable).as_bytes(),
                        &bytes[end..],
                    ]
                    .concat();
                }
                layer.file(&path, 0o755, bytes.len() as u64, &mut bytes.as_slice())?
            } else {
                let size = entry.size();
                let mode = if executable { 0o755 } else { 0o644 };
                layer.file(&path, mode, size, &mut entry)?
            };
            record.push((relative(&self.site, &path), hash, size));
        }
        Ok(record)
    }

    /// Where the wheel's `entry_name` is installed, and whether it is a script.
    fn install_path(&self, entry_name: &str) -> std::io::Result<(String, bool)> {
        let (site, target, file_name) = (&self.site, self.target, self.file_name);
        let data_dir = format!("{}.data", self.dist_info.trim_end_matches(".dist-info"));
        let Some(rest) = entry_name.strip_prefix(&format!("{data_dir}/")) else {
            return Ok((format!("{site}/{entry_name}"), false));
        };
        let (scheme, below) = rest.split_once('/').ok_or_else(|| {
            invalid(format!(
                "{file_name}: `{entry_name}` is not in a scheme folder"
            ))
        })?;
        Ok(match scheme {
            "purelib" | "platlib" => (format!("{site}/{below}"), false),
            "scripts" => (
                format!("{}/{below}", target.scripts.trim_end_matches('/')),
                true,
            ),
            "headers" => (
                format!(
                    "{}/{}/{below}",
                    target.include.trim_end_matches('/'),
                    self.name.distribution
                ),
                false,
            ),
            "data" => (
                format!("{}/{below}", target.data.trim_end_matches('/')),
                false,
            ),
            other => {
                return Err(invalid(format!(
                    "{file_name}: unknown install scheme `{other}`"
                )));
            }
        })
    }

    /// Console and GUI scripts for the wheel's entry points, as pip writes them.
    fn write_scripts<W: Write>(
        &self,
        archive: &mut zip::ZipArchive<fs_err::File>,
        layer: &mut LayerWriter<'_, W>,
        record: &mut Vec<RecordLine>,
    ) -> std::io::Result<()> {
        let (file_name, target) = (self.file_name, self.target);
        let mut text = String::new();
        archive
            .by_name(&format!("{}/entry_points.txt", self.dist_info))
            .map_err(|e| invalid(e.to_string()))?
            .read_to_string(&mut text)?;
        let mut section = "";
        for line in text.lines().map(str::trim) {
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name;
                continue;
            }
            if !matches!(section, "console_scripts" | "gui_scripts") {
                continue;
            }
            let Some((script, target_spec)) = line.split_once('=') else {
                continue;
            };
            let (script, target_spec) = (
                script.trim(),
                target_spec.split('[').next().unwrap_or_default().trim(),
            );
            let Some((module, attr)) = target_spec.split_once(':') else {
                continue;
            };
            safe_relative(script)
                .map_err(|m| invalid(format!("{file_name}: console script {m}")))?;
            let import = attr.split('.').next().unwrap_or(attr);
            let body = format!(
                "#!{}\n# -*- coding: utf-8 -*-\nimport re\nimport sys\nfrom {module} import {import}\nif __name__ == \"__main__\":\n    sys.argv[0] = re.sub(r\"(-script\\.pyw|\\.exe)?$\", \"\", sys.argv[0])\n    sys.exit({attr}())\n",
                target.executable
            );
            let path = format!("{}/{script}", target.scripts.trim_end_matches('/'));
            let (hash, size) = layer.file(&path, 0o755, body.len() as u64, &mut body.as_bytes())?;
            record.push((relative(&self.site, &path), hash, size));
        }
        Ok(())
    }

    /// INSTALLER, REQUESTED and the RECORD of every file installed.
    fn write_record<W: Write>(
        &self,
        layer: &mut LayerWriter<'_, W>,
        mut record: Vec<RecordLine>,
    ) -> std::io::Result<()> {
        let (site, dist_info) = (&self.site, &self.dist_info);
        for (file, body) in [("INSTALLER", "hallmark\n"), ("REQUESTED", "")] {
            let path = format!("{site}/{dist_info}/{file}");
            let (hash, size) = layer.file(&path, 0o644, body.len() as u64, &mut body.as_bytes())?;
            record.push((relative(site, &path), hash, size));
        }
        let mut text: String = record
            .iter()
            .map(|(path, hash, size)| format!("{path},{hash},{size}\n"))
            .collect();
        text.push_str(&format!("{dist_info}/RECORD,,\n"));
        let path = format!("{site}/{dist_info}/RECORD");
        layer.file(&path, 0o644, text.len() as u64, &mut text.as_bytes())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::python::*;

    fn interpreter(version: &str, abi: &str, machine: &str, libc: &str) -> Interpreter {
        Interpreter {
            version: version.into(),
            implementation: "cpython".into(),
            abi: abi.into(),
            machine: machine.into(),
            libc: libc.into(),
        }
    }

    /// Issue 14 item 9: pip installs `cp39-abi3` on a newer Python and `py311-none-any`, and
    /// refuses a `manylinux_2_99` on glibc 2.36; hallmark said the opposite of each.
    #[test]
    // A table of pip's answers, one case a line: split, it would read worse.
    #[allow(clippy::too_many_lines)]
    fn wheel_tags_match_as_pip_matches_them() {
        let glibc311 = interpreter("3.11", "cp311", "x86_64", "glibc 2.36");
        let glibc312 = interpreter("3.12", "cp312", "x86_64", "glibc 2.36");
        let arm312 = interpreter("3.12", "cp312", "aarch64", "glibc 2.35");
        let musl312 = interpreter("3.12", "cp312", "x86_64", "musl 1.2");
        let free313 = interpreter("3.13", "cp313t", "x86_64", "glibc 2.36");
        let bare311 = interpreter("3.11", "cp311", "x86_64", "none");
        let cases: &[(&Interpreter, &str, bool)] = &[
            (&glibc311, "b12x-1.3.0-py3-none-any.whl", true),
            (
                &glibc312,
                "vllm-0.11.0-cp38-abi3-manylinux1_x86_64.whl",
                true,
            ),
            (
                &glibc312,
                "x-1-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
                true,
            ),
            (&glibc311, "x-1-cp312-abi3-manylinux_2_17_x86_64.whl", false),
            (&glibc311, "x-1-py311-none-any.whl", true),
            (&glibc312, "x-1-py311-none-any.whl", true),
            (&glibc311, "x-1-py312-none-any.whl", false),
            (&glibc311, "x-1-py2.py3-none-any.whl", true),
            (&glibc311, "x-1-py2-none-any.whl", false),
            (&glibc311, "x-1-cp311-none-any.whl", true),
            (&glibc311, "x-1-cp311-cp311-manylinux_2_17_x86_64.whl", true),
            (&glibc311, "x-1-cp311-cp311-manylinux_2_36_x86_64.whl", true),
            (
                &glibc311,
                "x-1-cp311-cp311-manylinux_2_37_x86_64.whl",
                false,
            ),
            (
                &glibc311,
                "x-1-cp311-cp311-manylinux_2_99_x86_64.whl",
                false,
            ),
            (&glibc311, "x-1-cp311-cp311-manylinux2010_x86_64.whl", true),
            (&glibc311, "x-1-cp311-cp311-linux_x86_64.whl", true),
            (
                &glibc311,
                "x-1-cp312-cp312-manylinux_2_17_x86_64.whl",
                false,
            ),
            (
                &glibc311,
                "x-1-cp311-cp311-manylinux_2_17_aarch64.whl",
                false,
            ),
            (&glibc311, "x-1-cp311-cp311-musllinux_1_1_x86_64.whl", false),
            (
                &glibc311,
                "x-1-cp311-cp311t-manylinux_2_17_x86_64.whl",
                false,
            ),
            (
                &glibc311,
                "x-1-pp310-pypy310_pp73-manylinux_2_17_x86_64.whl",
                false,
            ),
            (
                &arm312,
                "x-1-cp312-cp312-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
                true,
            ),
            (&arm312, "x-1-cp312-cp312-manylinux_2_12_aarch64.whl", false),
            (&arm312, "x-1-cp312-cp312-manylinux_2_17_x86_64.whl", false),
            (&musl312, "x-1-cp312-cp312-musllinux_1_1_x86_64.whl", true),
            (&musl312, "x-1-cp312-cp312-musllinux_1_3_x86_64.whl", false),
            (&musl312, "x-1-cp312-cp312-manylinux_2_17_x86_64.whl", false),
            (&musl312, "x-1-py3-none-any.whl", true),
            (&free313, "x-1-cp313-cp313t-manylinux_2_17_x86_64.whl", true),
            (&free313, "x-1-cp39-abi3-manylinux_2_17_x86_64.whl", false),
            (&free313, "x-1-cp313-cp313-manylinux_2_17_x86_64.whl", false),
            (&bare311, "x-1-cp311-cp311-manylinux_2_17_x86_64.whl", false),
            (&bare311, "x-1-cp311-cp311-linux_x86_64.whl", true),
        ];
        for (interpreter, file, expected) in cases {
            let name = parse_name(file).unwrap();
            assert_eq!(
                interpreter.accepts(&name),
                *expected,
                "{file} on {}",
                interpreter.describe()
            );
        }
        let refused = check_compatible(
            &parse_name("numpy-2.1.0-cp311-cp311-manylinux_2_17_aarch64.whl").unwrap(),
            &target(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            refused.contains("aarch64") && refused.contains("x86_64"),
            "{refused}"
        );
        assert!(
            parse_name("b12x-1.3.0.tar.gz")
                .unwrap_err()
                .to_string()
                .contains("sdist")
        );
    }

    /// pip's order: the interpreter's own ABI on every platform (newest glibc first), then
    /// abi3, then none, then older abi3, then pyXY, then `any`.
    #[test]
    fn supported_tags_come_in_pip_order() {
        let tags = interpreter("3.11", "cp311", "x86_64", "glibc 2.17").supported_tags();
        let position = |tag: &str| {
            tags.iter()
                .position(|t| t == tag)
                .unwrap_or_else(|| panic!("{tag} missing"))
        };
        assert_eq!(tags[0], "cp311-cp311-manylinux_2_17_x86_64");
        assert_eq!(tags[1], "cp311-cp311-manylinux2014_x86_64");
        assert_eq!(tags.last().unwrap(), "py30-none-any");
        let order = [
            "cp311-cp311-manylinux1_x86_64",
            "cp311-cp311-linux_x86_64",
            "cp311-abi3-manylinux_2_17_x86_64",
            "cp311-none-manylinux_2_17_x86_64",
            "cp310-abi3-manylinux_2_17_x86_64",
            "cp32-abi3-linux_x86_64",
            "py311-none-manylinux_2_17_x86_64",
            "py3-none-linux_x86_64",
            "cp311-none-any",
            "py311-none-any",
            "py3-none-any",
        ];
        for pair in order.windows(2) {
            assert!(position(pair[0]) < position(pair[1]), "{pair:?}");
        }
    }

    /// A pinned wheel is fetched again (cache lost) under its own tags, whatever the host.
    #[test]
    fn a_pinned_file_is_asked_for_by_its_own_tags() {
        let name = parse_name(
            "MarkupSafe-2.1.5-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl",
        )
        .unwrap();
        assert_eq!(
            name.pip_options().join(" "),
            "--implementation cp --python-version 3.11 --abi cp311 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64"
        );
        assert!(
            parse_name("b12x-1.3.0-py3-none-any.whl")
                .unwrap()
                .pip_options()
                .is_empty()
        );
        let odd = parse_name("x-1-aé3-none-linux_x86_64.whl").unwrap();
        assert_eq!(
            odd.pip_options().join(" "),
            "--abi none --platform linux_x86_64"
        );
    }

    #[test]
    fn hand_written_interpreters_are_checked() {
        let mut bad = interpreter("3.11", "cp311", "x86_64", "glibc 2.36");
        assert!(bad.check().is_ok());
        bad.libc = "glibc2.36".into();
        assert!(bad.check().unwrap_err().to_string().contains("libc"));
        bad.libc = "none".into();
        bad.version = "3".into();
        assert!(bad.check().unwrap_err().to_string().contains("version"));
        bad.version = "3.11".into();
        bad.machine = "x86 64".into();
        assert!(bad.check().unwrap_err().to_string().contains("machine"));
        assert_eq!(machine_of_platform("linux/arm64"), Some("aarch64"));
        assert_eq!(machine_of_platform("linux/arm/v7"), Some("armv7l"));
        assert_eq!(machine_of_platform("windows/amd64"), None);
    }

    fn target() -> PythonTarget {
        PythonTarget {
            purelib: "/usr/local/lib/python3.11/dist-packages".into(),
            scripts: "/usr/local/bin".into(),
            data: "/usr/local".into(),
            include: "/usr/local/include/python3.11".into(),
            executable: "/usr/bin/python3".into(),
            interpreter: interpreter("3.11", "cp311", "x86_64", "glibc 2.36"),
        }
    }

    fn wheel(dir: &Path, entries: &[(&str, &str)]) -> std::path::PathBuf {
        let path = dir.join("demo-1.0-py3-none-any.whl");
        let mut zip = zip::ZipWriter::new(fs_err::File::create(&path).unwrap());
        for (name, text) in entries {
            zip.start_file(*name, zip::write::SimpleFileOptions::default())
                .unwrap();
            zip.write_all(text.as_bytes()).unwrap();
        }
        zip.finish().unwrap();
        path
    }

    fn installed(wheel_path: &Path) -> std::io::Result<Vec<(String, Vec<u8>)>> {
        let mut tar = tar::Builder::new(Vec::new());
        install(wheel_path, &target(), 0, &mut tar)?;
        let bytes = tar.into_inner()?;
        let mut archive = tar::Archive::new(bytes.as_slice());
        let mut files = Vec::new();
        for entry in archive.entries()? {
            let mut entry = entry?;
            let mut data = Vec::new();
            entry.read_to_end(&mut data)?;
            files.push((entry.path()?.to_string_lossy().into_owned(), data));
        }
        Ok(files)
    }

    #[test]
    fn a_wheel_lands_where_pip_puts_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = wheel(
            dir.path(),
            &[
                ("demo/__init__.py", "def main(): pass\n"),
                ("demo-1.0.data/scripts/demo-tool", "#!python\nprint(1)\n"),
                ("demo-1.0.dist-info/METADATA", "Name: demo\nVersion: 1.0\n"),
                (
                    "demo-1.0.dist-info/entry_points.txt",
                    "[console_scripts]\ndemo = demo:main\n",
                ),
                ("demo-1.0.dist-info/RECORD", "stale,,\n"),
            ],
        );
        let files = installed(&path).unwrap();
        let get = |name: &str| {
            files
                .iter()
                .find(|(p, _)| p == name)
                .map(|(_, d)| String::from_utf8_lossy(d).into_owned())
        };
        assert_eq!(
            get("usr/local/lib/python3.11/dist-packages/demo/__init__.py").unwrap(),
            "def main(): pass\n"
        );
        assert_eq!(
            get("usr/local/bin/demo-tool").unwrap(),
            "#!/usr/bin/python3\nprint(1)\n"
        );
        assert!(
            get("usr/local/bin/demo")
                .unwrap()
                .contains("from demo import main")
        );
        assert_eq!(
            get("usr/local/lib/python3.11/dist-packages/demo-1.0.dist-info/INSTALLER").unwrap(),
            "hallmark\n"
        );
        let record =
            get("usr/local/lib/python3.11/dist-packages/demo-1.0.dist-info/RECORD").unwrap();
        assert!(record.contains("demo/__init__.py,sha256="), "{record}");
        assert!(record.contains("../../../bin/demo,sha256="), "{record}");
        assert!(!record.contains("stale"), "{record}");
    }

    #[test]
    fn a_wheel_entry_escaping_its_folder_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for evil in [
            "../../etc/cron.d/x",
            "/etc/passwd",
            "demo-1.0.data/scripts/../../../../etc/x",
        ] {
            let path = wheel(
                dir.path(),
                &[(evil, "x"), ("demo-1.0.dist-info/METADATA", "Name: demo\n")],
            );
            let error = installed(&path).unwrap_err().to_string();
            assert!(
                error.contains("outside") || error.contains("invalid"),
                "{evil}: {error}"
            );
        }
    }

    #[test]
    fn record_paths_are_relative_to_site_packages() {
        assert_eq!(
            relative(
                "/usr/local/lib/python3.11/dist-packages",
                "/usr/local/bin/tool"
            ),
            "../../../bin/tool"
        );
        assert_eq!(
            relative(
                "/usr/local/lib/python3.11/dist-packages",
                "/usr/local/lib/python3.11/dist-packages/b12x/__init__.py"
            ),
            "b12x/__init__.py"
        );
    }
}
