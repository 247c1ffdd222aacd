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

use crate::oci::Hashing;
use crate::oci::tar;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::Path;

/// Where Python puts things in the target image, as its `sysconfig` says, and which
/// interpreter it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PythonTarget {
    pub purelib: String,
    pub scripts: String,
    pub data: String,
    pub include: String,
    pub executable: String,
    pub interpreter: Interpreter,
}

/// What pip matches a wheel's tags against (PEP 425): the interpreter and the platform it
/// runs on. Probed in the image, or written by hand as `[python]` in `pins/<image>.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Interpreter {
    /// `3.11`
    pub version: String,
    /// `sys.implementation.name`: `cpython`, `pypy`, ...
    pub implementation: String,
    /// The ABI tag of its extension modules: `cp311`, `cp313t` (free-threaded),
    /// `pypy310_pp73`.
    pub abi: String,
    /// `x86_64`, `aarch64`, as `platform.machine()` says.
    pub machine: String,
    /// The C library: `glibc 2.36`, `musl 1.2`, or `none` (then only `linux_<machine>` and
    /// pure wheels fit, as pip sees it).
    pub libc: String,
}

/// The C library of an image, which decides its manylinux and musllinux tags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Libc {
    Glibc(u32),
    Musl(u32),
    None,
}

impl Interpreter {
    /// Checks the values (they come from inside an image, or from a hand-written pin).
    pub fn check(&self) -> Result<(), String> {
        let number =
            |n: &str| !n.is_empty() && n.len() <= 3 && n.bytes().all(|b| b.is_ascii_digit());
        if !self
            .version
            .split_once('.')
            .is_some_and(|(major, minor)| number(major) && number(minor))
        {
            return Err(format!(
                "python version `{}` is not `<major>.<minor>`",
                self.version
            ));
        }
        let word =
            |w: &str| !w.is_empty() && w.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        for (key, value) in [
            ("implementation", &self.implementation),
            ("abi", &self.abi),
            ("machine", &self.machine),
        ] {
            if !word(value) {
                return Err(format!(
                    "python {key} `{value}` is not a word of letters, digits and `_`"
                ));
            }
        }
        self.parsed_libc().map(drop)
    }

    pub fn parsed_libc(&self) -> Result<Libc, String> {
        let bad = || {
            format!(
                "libc `{}` is not `glibc 2.<N>`, `musl 1.<N>` or `none`",
                self.libc
            )
        };
        let minor = |version: &str, major: &str| {
            version
                .strip_prefix(major)
                .and_then(|m| m.strip_prefix('.'))
                .and_then(|m| m.split('.').next())
                .and_then(|m| m.parse::<u32>().ok())
        };
        match self.libc.split_once(' ') {
            None if self.libc == "none" => Ok(Libc::None),
            Some(("glibc", version)) => minor(version, "2").map(Libc::Glibc).ok_or_else(bad),
            Some(("musl", version)) => minor(version, "1").map(Libc::Musl).ok_or_else(bad),
            _ => Err(bad()),
        }
    }

    fn major_minor(&self) -> (u32, u32) {
        let (major, minor) = self.version.split_once('.').unwrap_or_default();
        (major.parse().unwrap_or(0), minor.parse().unwrap_or(0))
    }

    /// `cp`, `pp`: packaging's `interpreter_name`.
    fn short_name(&self) -> &str {
        match self.implementation.as_str() {
            "cpython" => "cp",
            "pypy" => "pp",
            "ironpython" => "ip",
            "jython" => "jy",
            other => other,
        }
    }

    /// `cp311`, `pp310`: the interpreter tag.
    fn interpreter_tag(&self) -> String {
        let (major, minor) = self.major_minor();
        format!("{}{major}{minor}", self.short_name())
    }

    /// The platform tags of a Linux image, best first, as pip (packaging) lists them:
    /// `manylinux_2_<N>` from the image's glibc down (with the legacy `manylinux2014`,
    /// `manylinux2010` and `manylinux1` names at 2.17, 2.12 and 2.5), or `musllinux_1_<N>`
    /// from its musl down, then `linux_<machine>`.
    pub fn platforms(&self) -> Vec<String> {
        let arch = match self.machine.as_str() {
            "arm64" => "aarch64",
            "amd64" => "x86_64",
            other => other,
        };
        let mut platforms = Vec::new();
        match self.parsed_libc() {
            Ok(Libc::Glibc(minor)) => {
                // manylinux starts at glibc 2.5 on x86, at 2.17 (manylinux2014) elsewhere.
                let oldest = if matches!(arch, "x86_64" | "i686") {
                    5
                } else {
                    17
                };
                for glibc in (oldest..=minor).rev() {
                    platforms.push(format!("manylinux_2_{glibc}_{arch}"));
                    let legacy = match glibc {
                        17 => Some("manylinux2014"),
                        12 => Some("manylinux2010"),
                        5 => Some("manylinux1"),
                        _ => None,
                    };
                    if let Some(legacy) = legacy {
                        platforms.push(format!("{legacy}_{arch}"));
                    }
                }
            }
            Ok(Libc::Musl(minor)) => {
                for musl in (0..=minor).rev() {
                    platforms.push(format!("musllinux_1_{musl}_{arch}"));
                }
            }
            Ok(Libc::None) | Err(_) => {}
        }
        platforms.push(format!("linux_{arch}"));
        platforms
    }

    /// Every `python-abi-platform` tag the interpreter installs, best first: packaging's
    /// `sys_tags()` for it (what pip uses), so the order is pip's preference.
    pub fn supported_tags(&self) -> Vec<String> {
        let (major, minor) = self.major_minor();
        let platforms = self.platforms();
        let interpreter = self.interpreter_tag();
        let mut tags = Vec::new();
        let mut each = |python: &str, abi: &str, platforms: &[String]| {
            for platform in platforms {
                tags.push(format!("{python}-{abi}-{platform}"));
            }
        };
        if self.implementation == "cpython" {
            each(&interpreter, &self.abi, &platforms);
            // abi3 is the stable ABI of CPython 3.2 and later; a free-threaded build has none.
            let abi3 = major == 3 && minor >= 2 && !self.abi.ends_with('t');
            if abi3 {
                each(&interpreter, "abi3", &platforms);
            }
            each(&interpreter, "none", &platforms);
            if abi3 {
                for older in (2..minor).rev() {
                    each(&format!("cp{major}{older}"), "abi3", &platforms);
                }
            }
        } else {
            each(&interpreter, &self.abi, &platforms);
            each(&interpreter, "none", &platforms);
        }
        // Then pure-Python-by-version wheels: py311, py3, py310 ... py30.
        let mut pythons = vec![format!("py{major}{minor}"), format!("py{major}")];
        pythons.extend((0..minor).rev().map(|older| format!("py{major}{older}")));
        for python in &pythons {
            each(python, "none", &platforms);
        }
        let any = ["any".to_string()];
        each(&interpreter, "none", &any);
        for python in &pythons {
            each(python, "none", &any);
        }
        tags
    }

    /// Whether the wheel named `name` installs here: one of its (compressed) tags is among
    /// the supported ones.
    pub fn accepts(&self, name: &WheelName) -> bool {
        let supported: std::collections::HashSet<String> =
            self.supported_tags().into_iter().collect();
        name.python.split('.').any(|python| {
            name.abi.split('.').any(|abi| {
                name.platform
                    .split('.')
                    .any(|platform| supported.contains(&format!("{python}-{abi}-{platform}")))
            })
        })
    }

    /// `Python 3.11 (cpython, cp311) on x86_64 with glibc 2.36`
    pub fn describe(&self) -> String {
        format!(
            "Python {} ({}, {}) on {} with {}",
            self.version, self.implementation, self.abi, self.machine, self.libc
        )
    }

    /// The `pip download` options that make pip choose for this interpreter rather than the
    /// host's: implementation, version, ABI and every platform tag (pip needs
    /// `--only-binary=:all:` with them).
    pub fn pip_options(&self) -> Vec<String> {
        let (major, minor) = self.major_minor();
        let mut options = vec![
            "--implementation".to_string(),
            self.short_name().to_string(),
            "--python-version".to_string(),
            format!("{major}.{minor}"),
            "--abi".to_string(),
            self.abi.clone(),
        ];
        for platform in self.platforms() {
            options.push("--platform".into());
            options.push(platform);
        }
        options
    }
}

/// The machine of an `os/arch[/variant]` platform, as `platform.machine()` names it.
pub fn machine_of_platform(platform: &str) -> Option<&'static str> {
    let mut parts = platform.split('/');
    if parts.next() != Some("linux") {
        return None;
    }
    Some(match (parts.next()?, parts.next()) {
        ("amd64", _) => "x86_64",
        ("arm64", _) => "aarch64",
        ("arm", Some("v7")) => "armv7l",
        ("386", _) => "i686",
        ("ppc64le", _) => "ppc64le",
        ("s390x", _) => "s390x",
        ("riscv64", _) => "riscv64",
        _ => return None,
    })
}

/// The command that asks a parent image for its `PythonTarget`: `sysconfig`'s paths, the
/// interpreter, and the C library as packaging finds it (glibc from `confstr`, musl from
/// its loader's banner).
pub fn probe_command() -> Vec<String> {
    let script = r#"import glob, json, os, platform, re, subprocess, sys, sysconfig
p = sysconfig.get_paths()
v = sys.version_info
impl = sys.implementation.name
if impl == 'cpython':
    abi = 'cp%d%d%s' % (v[0], v[1], 't' if sysconfig.get_config_var('Py_GIL_DISABLED') else '')
else:
    soabi = (sysconfig.get_config_var('SOABI') or impl).split('-')
    abi = '_'.join(soabi[:2]) if impl == 'pypy' else soabi[0]
libc = 'none'
try:
    glibc = os.confstr('CS_GNU_LIBC_VERSION') or ''
except (OSError, ValueError):
    glibc = ''
if glibc.startswith('glibc '):
    libc = glibc
else:
    for loader in sorted(glob.glob('/lib/ld-musl-*.so.1')):
        try:
            banner = subprocess.run([loader], stderr=subprocess.PIPE, universal_newlines=True).stderr
        except OSError:
            continue
        m = re.search(r'Version (\d+)\.(\d+)', banner)
        if m:
            libc = 'musl %s.%s' % m.groups()
            break
print(json.dumps({'purelib': p['purelib'], 'scripts': p['scripts'], 'data': p['data'],
    'include': p['include'], 'executable': sys.executable,
    'interpreter': {'version': '%d.%d' % v[:2], 'implementation': impl, 'abi': abi,
        'machine': platform.machine(), 'libc': libc}}))
"#;
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
    target.interpreter.check()?;
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

impl WheelName {
    /// Pure Python for any platform: installs wherever its Python tag fits.
    pub fn is_pure(&self) -> bool {
        self.abi == "none" && self.platform == "any"
    }

    /// The `pip download` options under which this very file fits (its implementation,
    /// version, ABIs and platforms), to fetch a pinned wheel again on any host. None for a
    /// pure wheel, which fits everywhere.
    pub fn pip_options(&self) -> Vec<String> {
        let mut options = Vec::new();
        if self.is_pure() {
            return options;
        }
        let interpreter = self.python.split('.').find_map(|tag| {
            let implementation = ["cp", "pp"].into_iter().find(|i| tag.starts_with(i))?;
            let digits = &tag[2..];
            (digits.len() >= 2 && digits.bytes().all(|b| b.is_ascii_digit())).then(|| {
                let version = format!("{}.{}", &digits[..1], &digits[1..]);
                (implementation.to_string(), version)
            })
        });
        if let Some((implementation, version)) = interpreter {
            options.extend(["--implementation".into(), implementation]);
            options.extend(["--python-version".into(), version]);
        }
        for abi in self.abi.split('.') {
            options.extend(["--abi".into(), abi.to_string()]);
        }
        for platform in self.platform.split('.').filter(|p| *p != "any") {
            options.extend(["--platform".into(), platform.to_string()]);
        }
        options
    }
}

/// Whether the wheel runs on the target, as pip decides it (PEP 425 tags).
pub fn check_compatible(name: &WheelName, target: &PythonTarget) -> Result<(), String> {
    let interpreter = &target.interpreter;
    if interpreter.accepts(name) {
        Ok(())
    } else {
        Err(format!(
            "the wheel is for {}-{}-{}, which pip would not install on the parent's {}",
            name.python,
            name.abi,
            name.platform,
            interpreter.describe()
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

fn invalid(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message)
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
        .unwrap_err();
        assert!(
            refused.contains("aarch64") && refused.contains("x86_64"),
            "{refused}"
        );
        assert!(
            parse_name("b12x-1.3.0.tar.gz")
                .unwrap_err()
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
        assert!(bad.check().unwrap_err().contains("libc"));
        bad.libc = "none".into();
        bad.version = "3".into();
        assert!(bad.check().unwrap_err().contains("version"));
        bad.version = "3.11".into();
        bad.machine = "x86 64".into();
        assert!(bad.check().unwrap_err().contains("machine"));
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
