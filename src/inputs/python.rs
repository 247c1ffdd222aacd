//! The Python a wheel is for: the interpreter and platform pip matches a wheel's tags
//! against (PEP 425), as pinned by hand (`[python]` in `pins/<image>.toml`) or probed in the
//! image; where the image's Python keeps things (`sysconfig`); and wheel file names
//! (PEP 427), which say which interpreters a wheel fits.

use serde::{Deserialize, Serialize};

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

/// Why an interpreter's description, a probe's answer or a wheel's name is refused.
#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    #[error("python version `{0}` is not `<major>.<minor>`")]
    Version(String),
    #[error("python {key} `{value}` is not a word of letters, digits and `_`")]
    NotAWord { key: &'static str, value: String },
    #[error("libc `{0}` is not `glibc 2.<N>`, `musl 1.<N>` or `none`")]
    Libc(String),
    #[error("not the answer hallmark's probe prints ({0})")]
    NotTheProbe(serde_json::Error),
    #[error("`{key}` is `{path}`, not a clean absolute path")]
    UncleanPath { key: &'static str, path: String },
    #[error("`{0}` is not a wheel (an sdist cannot be installed without a build)")]
    NotAWheel(String),
    #[error("`{0}` is not a wheel file name")]
    NotAWheelName(String),
    #[error(
        "the wheel is for {python}-{abi}-{platform}, which pip would not install on the parent's {parent}"
    )]
    Incompatible {
        python: String,
        abi: String,
        platform: String,
        parent: String,
    },
}

impl Interpreter {
    /// Checks the values (they come from inside an image, or from a hand-written pin).
    pub fn check(&self) -> Result<(), PythonError> {
        let number =
            |n: &str| !n.is_empty() && n.len() <= 3 && n.bytes().all(|b| b.is_ascii_digit());
        if !self
            .version
            .split_once('.')
            .is_some_and(|(major, minor)| number(major) && number(minor))
        {
            return Err(PythonError::Version(self.version.clone()));
        }
        let word =
            |w: &str| !w.is_empty() && w.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        for (key, value) in [
            ("implementation", &self.implementation),
            ("abi", &self.abi),
            ("machine", &self.machine),
        ] {
            if !word(value) {
                return Err(PythonError::NotAWord {
                    key,
                    value: value.clone(),
                });
            }
        }
        self.parsed_libc().map(drop)
    }

    pub fn parsed_libc(&self) -> Result<Libc, PythonError> {
        let bad = || PythonError::Libc(self.libc.clone());
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
pub fn parse_probe_answer(text: &str) -> Result<PythonTarget, PythonError> {
    let target: PythonTarget =
        serde_json::from_str(text.trim()).map_err(PythonError::NotTheProbe)?;
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
            return Err(PythonError::UncleanPath {
                key,
                path: path.clone(),
            });
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

pub fn parse_name(file: &str) -> Result<WheelName, PythonError> {
    let stem = file
        .strip_suffix(".whl")
        .ok_or_else(|| PythonError::NotAWheel(file.to_string()))?;
    let parts: Vec<&str> = stem.split('-').collect();
    let (distribution, version, tags) = match parts.as_slice() {
        [d, v, py, abi, plat] => (d, v, [py, abi, plat]),
        [d, v, _build, py, abi, plat] => (d, v, [py, abi, plat]),
        _ => return Err(PythonError::NotAWheelName(file.to_string())),
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
pub fn check_compatible(name: &WheelName, target: &PythonTarget) -> Result<(), PythonError> {
    let interpreter = &target.interpreter;
    if interpreter.accepts(name) {
        Ok(())
    } else {
        Err(PythonError::Incompatible {
            python: name.python.clone(),
            abi: name.abi.clone(),
            platform: name.platform.clone(),
            parent: interpreter.describe(),
        })
    }
}
