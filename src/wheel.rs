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

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::Path;

/// Where Python puts things in the target image, as its `sysconfig` says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PythonTarget {
    pub purelib: String,
    pub scripts: String,
    pub data: String,
    pub include: String,
    pub executable: String,
    /// `3.11`
    pub version: String,
    /// `x86_64`, `aarch64`
    pub machine: String,
}

/// The command that asks a parent image for its `PythonTarget`.
pub fn probe_command() -> Vec<String> {
    let script = "import json, platform, sys, sysconfig\n\
        p = sysconfig.get_paths()\n\
        print(json.dumps({'purelib': p['purelib'], 'scripts': p['scripts'], 'data': p['data'], \
        'include': p['include'], 'executable': sys.executable, \
        'version': '%d.%d' % sys.version_info[:2], 'machine': platform.machine()}))";
    vec!["python3".into(), "-c".into(), script.into()]
}

/// Reads the probe's answer (or its cached copy). The answer comes from inside the parent
/// image, so it is checked like any input: the paths it gives become paths in a layer.
pub fn parse_probe_answer(text: &str) -> Result<PythonTarget, String> {
    let target: PythonTarget = serde_json::from_str(text.trim())
        .map_err(|e| format!("not the answer hallmark's probe prints ({e})"))?;
    for (key, path) in [
        ("purelib", &target.purelib),
        ("scripts", &target.scripts),
        ("data", &target.data),
        ("include", &target.include),
        ("executable", &target.executable),
    ] {
        let clean = path.starts_with('/')
            && path
                .trim_end_matches('/')
                .split('/')
                .skip(1)
                .all(|part| !part.is_empty() && part != "." && part != "..")
            && !path.chars().any(|c| c.is_control() || c == '\\');
        if !clean {
            return Err(format!("`{key}` is `{path}`, not a clean absolute path"));
        }
    }
    let version_ok = target
        .version
        .split_once('.')
        .is_some_and(|(major, minor)| {
            [major, minor]
                .iter()
                .all(|n| !n.is_empty() && n.len() <= 3 && n.bytes().all(|b| b.is_ascii_digit()))
        });
    let machine_ok = !target.machine.is_empty()
        && target
            .machine
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !version_ok || !machine_ok {
        return Err(format!(
            "Python `{}` on `{}` is not a version and machine",
            target.version, target.machine
        ));
    }
    Ok(target)
}

/// `name-version(-build)?-python-abi-platform.whl`
#[derive(Debug, Clone)]
pub struct WheelName {
    pub distribution: String,
    pub version: String,
    pub python: String,
    pub abi: String,
    pub platform: String,
}

pub fn parse_name(file: &str) -> Result<WheelName, String> {
    let stem = file.strip_suffix(".whl").ok_or_else(|| {
        format!("`{file}` is not a wheel (an sdist cannot be installed without a build)")
    })?;
    let parts: Vec<&str> = stem.split('-').collect();
    let (distribution, version, tags) = match parts.as_slice() {
        [d, v, py, abi, plat] => (d, v, [py, abi, plat]),
        [d, v, _build, py, abi, plat] => (d, v, [py, abi, plat]),
        _ => return Err(format!("`{file}` is not a wheel file name")),
    };
    Ok(WheelName {
        distribution: distribution.to_string(),
        version: version.to_string(),
        python: tags[0].to_string(),
        abi: tags[1].to_string(),
        platform: tags[2].to_string(),
    })
}

/// Whether the wheel runs on the target: pure Python for Python 3, or built for its
/// Python version and machine.
pub fn check_compatible(name: &WheelName, target: &PythonTarget) -> Result<(), String> {
    let cp = format!("cp{}", target.version.replace('.', ""));
    let python_ok = name
        .python
        .split('.')
        .any(|t| t == "py3" || t == "py2.py3" || t == cp || (t == "cp3" && name.abi == "abi3"));
    let abi_ok = name
        .abi
        .split('.')
        .any(|a| a == "none" || a == "abi3" || a == cp);
    let platform_ok = name.platform.split('.').any(|p| {
        p == "any"
            || (p.starts_with("manylinux") || p.starts_with("linux"))
                && p.ends_with(&target.machine)
    });
    if python_ok && abi_ok && platform_ok {
        Ok(())
    } else {
        Err(format!(
            "the wheel is for {}-{}-{}, the parent runs Python {} on {}",
            name.python, name.abi, name.platform, target.version, target.machine
        ))
    }
}

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

fn safe_relative(path: &str) -> Result<(), String> {
    if path.starts_with('/')
        || path.split('/').any(|p| p == ".." || p.is_empty())
        || path.contains('\\')
    {
        return Err(format!("`{path}` would land outside its install folder"));
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
                let mut header = tar::Header::new_gnu();
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
                header.set_mtime(self.mtime);
                header.set_uid(0);
                header.set_gid(0);
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
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(mode);
        header.set_size(size);
        header.set_mtime(self.mtime);
        header.set_uid(0);
        header.set_gid(0);
        let mut hashing = HashingReader {
            inner: data,
            hasher: Sha256::new(),
        };
        self.tar
            .append_data(&mut header, path.trim_start_matches('/'), &mut hashing)?;
        Ok((record_hash(&hashing.hasher.finalize()), size))
    }
}

struct HashingReader<'a> {
    inner: &'a mut dyn Read,
    hasher: Sha256,
}

impl Read for HashingReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

fn invalid(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message)
}

/// Installs the wheel at `wheel` into `tar` for `target`.
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
    let dist_info = entries
        .iter()
        .filter_map(|e| e.split('/').next())
        .find(|top| {
            top.ends_with(".dist-info")
                && crate::pins::wheel_stem(top.trim_end_matches(".dist-info"))
                    .starts_with(&crate::pins::wheel_stem(&name.distribution))
        })
        .ok_or_else(|| invalid(format!("{file_name}: no .dist-info folder")))?
        .to_string();
    let data_dir = format!("{}.data", dist_info.trim_end_matches(".dist-info"));
    let site = target.purelib.trim_end_matches('/').to_string();
    let mut layer = LayerWriter {
        tar,
        mtime,
        dirs: BTreeSet::new(),
        roots: vec![
            site.clone(),
            target.include.trim_end_matches('/').to_string(),
        ],
    };
    let mut record: Vec<(String, String, u64)> = Vec::new();
    let skip = [
        format!("{dist_info}/RECORD"),
        format!("{dist_info}/RECORD.jws"),
        format!("{dist_info}/RECORD.p7s"),
        format!("{dist_info}/INSTALLER"),
    ];

    for entry_name in &entries {
        let mut entry = archive
            .by_name(entry_name)
            .map_err(|e| invalid(format!("{file_name}: {e}")))?;
        if entry.is_dir() || skip.contains(entry_name) {
            continue;
        }
        safe_relative(entry_name).map_err(|m| invalid(format!("{file_name}: {m}")))?;
        let executable = entry.unix_mode().is_some_and(|m| m & 0o111 != 0);
        let (path, is_script) = match entry_name.strip_prefix(&format!("{data_dir}/")) {
            None => (format!("{site}/{entry_name}"), false),
            Some(rest) => {
                let (scheme, below) = rest.split_once('/').ok_or_else(|| {
                    invalid(format!(
                        "{file_name}: `{entry_name}` is not in a scheme folder"
                    ))
                })?;
                match scheme {
                    "purelib" | "platlib" => (format!("{site}/{below}"), false),
                    "scripts" => (
                        format!("{}/{below}", target.scripts.trim_end_matches('/')),
                        true,
                    ),
                    "headers" => (
                        format!(
                            "{}/{}/{below}",
                            target.include.trim_end_matches('/'),
                            name.distribution
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
                }
            }
        };
        let (hash, size) = if is_script {
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes)?;
            if bytes.starts_with(b"#!python") {
                let end = bytes
                    .iter()
                    .position(|&b| b == b'\n')
                    .unwrap_or(bytes.len());
                bytes = [format!("#!{}", target.executable).as_bytes(), &bytes[end..]].concat();
            }
            layer.file(&path, 0o755, bytes.len() as u64, &mut bytes.as_slice())?
        } else {
            let size = entry.size();
            layer.file(
                &path,
                if executable { 0o755 } else { 0o644 },
                size,
                &mut entry,
            )?
        };
        record.push((relative(&site, &path), hash, size));
    }

    // Console and GUI scripts, as pip writes them.
    let entry_points = format!("{dist_info}/entry_points.txt");
    if entries.contains(&entry_points) {
        let mut text = String::new();
        archive
            .by_name(&entry_points)
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
            record.push((relative(&site, &path), hash, size));
        }
    }

    for (file, body) in [("INSTALLER", "hallmark\n"), ("REQUESTED", "")] {
        let path = format!("{site}/{dist_info}/{file}");
        let (hash, size) = layer.file(&path, 0o644, body.len() as u64, &mut body.as_bytes())?;
        record.push((relative(&site, &path), hash, size));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wheel_names_and_tags() {
        let target = target();
        let pure = parse_name("b12x-1.3.0-py3-none-any.whl").unwrap();
        assert!(check_compatible(&pure, &target).is_ok());
        let native =
            parse_name("numpy-2.1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")
                .unwrap();
        assert!(check_compatible(&native, &target).is_ok());
        let arm = parse_name("numpy-2.1.0-cp311-cp311-manylinux_2_17_aarch64.whl").unwrap();
        assert!(
            check_compatible(&arm, &target)
                .unwrap_err()
                .contains("aarch64")
        );
        let other_python = parse_name("numpy-2.1.0-cp312-cp312-manylinux_2_17_x86_64.whl").unwrap();
        assert!(check_compatible(&other_python, &target).is_err());
        assert!(
            parse_name("b12x-1.3.0.tar.gz")
                .unwrap_err()
                .contains("sdist")
        );
    }

    fn target() -> PythonTarget {
        PythonTarget {
            purelib: "/usr/local/lib/python3.11/dist-packages".into(),
            scripts: "/usr/local/bin".into(),
            data: "/usr/local".into(),
            include: "/usr/local/include/python3.11".into(),
            executable: "/usr/bin/python3".into(),
            version: "3.11".into(),
            machine: "x86_64".into(),
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
