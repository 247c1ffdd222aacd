//! `hallmark lock`: turns every moving reference of a spec into a pin. Existing pins that
//! still match the spec are kept unless `--update`; nothing else changes in the file.

use crate::error::{Error, Invalid, Result};
use crate::images::store::{LayerStore, finished};
use crate::inputs::apt::Requested;
use crate::inputs::pins::{self, AptPin, BasePin, Pins, SourcePin, WheelPin, wheel_stem};
use crate::inputs::project::Project;
use crate::inputs::python;
use crate::inputs::python::Interpreter;
use crate::inputs::spec::{LoadedSpec, Parent};
use crate::inputs::values::{Name, Sha256Hex};
use crate::plan::fetch;

/// What `lock` asks the builder's engine: the digest of an external base, and the Python of
/// an image (for its wheels).
pub trait BaseResolver {
    /// `Ok(None)` when no engine is reachable or it does not hold the image.
    fn resolve(&self, reference: &str) -> Result<Option<BasePin>>;
    /// The Python in the image `reference` names, asked in a container from it; `Ok(None)`
    /// when no engine holds it or it cannot run there (another machine, no python3).
    fn interpreter(&self, reference: &str) -> Result<Option<Interpreter>>;
    /// The platform of the image `reference` names and its files at `paths` (folders with
    /// what is under them), by path; `Ok(None)` when no engine holds it. Read from a container
    /// that is created, never started: an image for another machine is read as well.
    fn files(&self, reference: &str, paths: &[&str]) -> Result<Option<ImageFiles>>;
    /// True when the engine was reached and has no image `reference` (an id hallmark
    /// recorded that was removed since); false when it holds it or could not be asked.
    fn lacks(&self, reference: &str) -> bool;
    /// `Ok` if the engine asked can be reached, else the engine's error: said instead of "no
    /// engine holds it" when nothing was found because nothing could be asked.
    fn reached(&self) -> Result<()> {
        Ok(())
    }
}

/// Regular files of an image, by their absolute path, and its platform.
pub struct ImageFiles {
    pub platform: String,
    pub files: std::collections::BTreeMap<String, Vec<u8>>,
}

/// One line of what `lock` did, for the operator.
pub struct LockReport {
    pub image: Name,
    pub changes: Vec<String>,
}

pub fn lock(
    project: &Project,
    image: &Name,
    update: bool,
    bases: &dyn BaseResolver,
    cache: &std::path::Path,
) -> Result<LockReport> {
    let loaded = project.load_spec(image)?;
    let old = pins::read(&project.root, image)?;
    let mut locking = Locking {
        project,
        image,
        update,
        bases,
        old: &old,
        changes: Vec::new(),
    };
    let mut new = Pins::default();
    if let Parent::External(reference) = loaded.spec.parent() {
        new.base = Some(locking.base(reference)?);
    }
    for stage in &loaded.spec.compiles {
        let Some(reference) = stage.toolchain.as_ref().map(|t| t.get_ref()) else {
            continue;
        };
        if !new
            .toolchains
            .iter()
            .any(|t| t.reference == reference.as_str())
        {
            let pin = locking.toolchain(reference, stage.name.get_ref().as_str())?;
            new.toolchains.push(pin);
        }
    }
    for source in &loaded.spec.sources {
        new.sources.push(locking.source(source)?);
    }
    let store = LayerStore::open(cache);
    if !loaded.spec.wheels.is_empty() {
        new.python = interpreter(
            project,
            &loaded,
            &old,
            update,
            (bases, &store),
            &mut locking.changes,
        )?;
    }
    for wheel in &loaded.spec.wheels {
        let pin = locking.wheel(wheel, new.python.as_ref(), cache)?;
        new.wheels.push(pin);
    }
    let asked = (bases, &store);
    let (chain, platform) = parent_chain(project, &loaded, asked, &mut locking.changes)?;
    let parent_line = parent_line(project, &loaded, &new)?;
    if !loaded.spec.build.apt.is_empty() {
        let build_apt = &loaded.spec.build.apt;
        let target = (None, parent_line.as_str());
        let pins = locking.apt(target, &chain, build_apt, platform.as_deref(), cache)?;
        new.apt.extend(pins);
        new.apt_against
            .insert(pins::apt_target(None), parent_line.clone());
    }
    for stage in loaded.spec.compiles.iter().filter(|s| !s.apt.is_empty()) {
        let (into, line) = stage_target(
            project,
            stage,
            &new,
            (&chain, &parent_line),
            asked,
            &mut locking.changes,
        )?;
        let name = stage.name.get_ref();
        let target = (Some(name), line.as_str());
        let pins = locking.apt(target, &into, &stage.apt, platform.as_deref(), cache)?;
        new.apt.extend(pins);
        new.apt_against
            .insert(pins::apt_target(Some(name)), line.clone());
    }

    if new != old {
        pins::write(&project.root, image, &new)?;
    }
    Ok(LockReport {
        image: image.clone(),
        changes: locking.changes,
    })
}

/// What the apt pins of `[build]` are resolved against, as the pins file records it: the
/// base and its digest, or the parent and its checksum; empty when nothing needs it.
fn parent_line(project: &Project, loaded: &LoadedSpec, new: &Pins) -> Result<String> {
    let needs_lines =
        !loaded.spec.build.apt.is_empty() || loaded.spec.compiles.iter().any(|s| !s.apt.is_empty());
    Ok(match (needs_lines, loaded.spec.parent()) {
        (false, _) => String::new(),
        (true, Parent::External(reference)) => {
            let base = new.base.as_ref().expect("pinned above");
            format!("base {reference} {}", base.digest)
        }
        (true, Parent::Image(parent)) => {
            let planned = crate::plan::Plan::new(project, std::slice::from_ref(parent))?;
            format!("parent {parent} {}", planned.get(parent).checksum)
        }
    })
}

/// What a compile stage's apt pins are resolved against: its toolchain (pinned above, or an
/// image of the project and its chain), else the image's parent chain; and the line the
/// pins file records for it.
fn stage_target(
    project: &Project,
    stage: &crate::inputs::spec::compile::CompileStage,
    new: &Pins,
    (chain, parent_line): (&[Link], &str),
    asked: (&dyn BaseResolver, &LayerStore),
    changes: &mut Vec<String>,
) -> Result<(Vec<Link>, String)> {
    Ok(match (&stage.toolchain, &stage.toolchain_image) {
        (Some(reference), _) => {
            let pin = new
                .toolchains
                .iter()
                .find(|t| t.reference == reference.get_ref().as_str())
                .expect("pinned above");
            let line = format!("toolchain {} {}", pin.reference, pin.digest);
            (vec![Link::external(reference.get_ref().as_str())], line)
        }
        (None, Some(name)) => {
            let name = name.get_ref();
            let toolchain = project.load_spec(name)?;
            let planned = crate::plan::Plan::new(project, std::slice::from_ref(name))?;
            let line = format!("toolchain image {name} {}", planned.get(name).checksum);
            let mut into = built(project, &toolchain, asked, changes);
            into.extend(parent_chain(project, &toolchain, asked, changes)?.0);
            (into, line)
        }
        (None, None) => (chain.to_vec(), format!("toolchain {parent_line}")),
    })
}

/// One image's locking: the pins it had, and what changed so far.
struct Locking<'a> {
    project: &'a Project,
    image: &'a Name,
    update: bool,
    bases: &'a dyn BaseResolver,
    old: &'a Pins,
    changes: Vec<String>,
}

impl Locking<'_> {
    fn unpinnable(&self, what: String) -> Error {
        Error::Pin {
            image: self.image.to_string(),
            path: pins::path_for(&self.project.root, self.image),
            what,
        }
    }

    /// `Ok` if the builder could be reached; else its error, saying first what could not be
    /// pinned for it (`what`).
    fn reached(&self, what: String) -> Result<()> {
        self.bases.reached().map_err(|e| match e {
            Error::Engine {
                node,
                endpoint,
                message,
                hint,
            } => Error::Engine {
                node,
                endpoint,
                message: format!("{what}: {message}"),
                hint,
            },
            other => other,
        })
    }

    /// The external base: the digest pinned (unless `--update`), else the engine's, else
    /// the one written by hand.
    fn base(&mut self, reference: &str) -> Result<BasePin> {
        let current = self.old.base.as_ref().filter(|b| b.reference == reference);
        Ok(match (current, self.update) {
            (Some(base), false) => {
                self.changes.push(format!("base {reference}: kept the digest written in pins/ ({}); `--update` asks the engine", base.digest));
                base.clone()
            }
            _ => match (self.bases.resolve(reference)?, current) {
                (Some(base), _) => {
                    self.changes
                        .push(format!("base {reference} -> {}", base.digest));
                    base
                }
                (None, Some(hand)) => {
                    self.changes.push(format!("base {reference}: no engine holds it; kept the digest written in pins/ ({})", hand.digest));
                    hand.clone()
                }
                (None, None) => {
                    self.reached(format!("cannot pin the base `{reference}`"))?;
                    return Err(self.unpinnable(format!(
                        "cannot pin the base `{reference}`: no reachable engine holds it; load it on the builder, or write `[base]` with `ref` and `digest` in this file by hand"
                    )));
                }
            },
        })
    }

    /// A compile stage's toolchain image, pinned as a base is.
    fn toolchain(&mut self, reference: &str, stage: &str) -> Result<BasePin> {
        let current = self
            .old
            .toolchains
            .iter()
            .find(|t| t.reference == reference);
        Ok(match (current, self.update) {
            (Some(pin), false) => pin.clone(),
            _ => match (self.bases.resolve(reference)?, current) {
                (Some(pin), _) => {
                    self.changes
                        .push(format!("toolchain {reference} -> {}", pin.digest));
                    pin
                }
                (None, Some(hand)) => hand.clone(),
                (None, None) => {
                    self.reached(format!("cannot pin the toolchain `{reference}`"))?;
                    return Err(self.unpinnable(format!(
                        "cannot pin the toolchain `{reference}` of compile stage `{stage}`: no reachable engine holds it; load it on the builder, or write `[[toolchain]]` with `ref` and `digest` in this file by hand"
                    )));
                }
            },
        })
    }

    /// A source's commit: the one pinned for the same repository and rev (unless
    /// `--update`), else the rev resolved now.
    fn source(&mut self, source: &crate::inputs::spec::Source) -> Result<SourcePin> {
        let name = source.name.get_ref();
        let kept = self
            .old
            .sources
            .iter()
            .find(|p| &p.name == name && p.git == source.git && p.rev == source.rev)
            .filter(|_| !self.update);
        if let Some(pin) = kept {
            return Ok(pin.clone());
        }
        let commit = fetch::resolve_rev(&source.git, &source.rev)?;
        self.changes
            .push(format!("source {name}: {} -> {commit}", source.rev));
        Ok(SourcePin {
            name: name.clone(),
            git: source.git.clone(),
            rev: source.rev.clone(),
            commit,
        })
    }

    /// A wheel's file: the one pinned for the same version that fits `python` (unless
    /// `--update`: a pin chosen for another Python or machine is chosen again), else the one
    /// pip downloads for `python` now.
    fn wheel(
        &mut self,
        wheel: &crate::inputs::spec::Wheel,
        python: Option<&Interpreter>,
        cache: &std::path::Path,
    ) -> Result<WheelPin> {
        let name = wheel.name.get_ref();
        let fits = |pin: &WheelPin| match (python, python::parse_name(&pin.file)) {
            (Some(python), Ok(file)) => python.accepts(&file),
            (None, _) => true,
            (Some(_), Err(_)) => false,
        };
        let kept = self
            .old
            .wheels
            .iter()
            .find(|p| {
                wheel_stem(p.name.as_str()) == wheel_stem(name.as_str())
                    && p.version == wheel.version
                    && fits(p)
            })
            .filter(|_| !self.update);
        if let Some(pin) = kept {
            return Ok(pin.clone());
        }
        let target = python.map(Interpreter::pip_options).unwrap_or_default();
        let path = fetch::download_wheel(
            cache,
            self.image.as_str(),
            name.as_str(),
            &wheel.version,
            &target,
        )?;
        let sha = path
            .parent()
            .and_then(|d| d.file_name())
            .expect("cache layout <sha>/<file>");
        let pin = WheelPin {
            name: name.clone(),
            version: wheel.version.clone(),
            file: path
                .file_name()
                .expect("a file")
                .to_string_lossy()
                .into_owned(),
            sha256: Sha256Hex::try_from(sha.to_string_lossy().into_owned())
                .expect("cache dirs are sha256"),
        };
        check_wheel_fits(
            self.image,
            &pins::path_for(&self.project.root, self.image),
            &pin,
            python,
        )?;
        self.changes.push(format!(
            "wheel {name}=={}: {} sha256 {}",
            wheel.version, pin.file, pin.sha256
        ));
        Ok(pin)
    }
}

impl Locking<'_> {
    /// The packages `requested` for `stage` (`None`: `[build]`) and all they need that the
    /// image they go into lacks: the pins kept while the spec asks for the same packages
    /// (unless `--update`), else resolved now against the archives it names. `chain` is that
    /// image and the images below it, nearest first: the first one the builder holds is read
    /// (a spec's image not built yet is read as its parent, which lacks no more than it).
    fn apt(
        &mut self,
        (stage, line): (Option<&Name>, &str),
        chain: &[Link],
        requested: &[String],
        platform: Option<&str>,
        cache: &std::path::Path,
    ) -> Result<Vec<AptPin>> {
        let old: Vec<&AptPin> = self
            .old
            .apt
            .iter()
            .filter(|p| p.stage.as_ref() == stage)
            .collect();
        let (wanted, kept) = wanted_and_kept(requested, &old);
        let target = match stage {
            None => "[build]".to_string(),
            Some(stage) => format!("compile stage `{stage}`"),
        };
        let against = self.old.apt_against.get(&pins::apt_target(stage));
        if !self.update && kept == wanted && against.is_some_and(|a| a == line) {
            return Ok(old.into_iter().cloned().collect());
        }
        if let Some(against) = against.filter(|a| *a != line && !old.is_empty()) {
            self.changes.push(format!(
                "apt {}: resolved again: they were resolved against `{against}`, they go into `{line}` now",
                match stage {
                    None => "[build]".to_string(),
                    Some(stage) => format!("compile stage `{stage}`"),
                }
            ));
        }
        let fail = |message: String| Error::Apt {
            image: self.image.to_string(),
            package: requested.join(" "),
            message,
            hint: None,
        };
        let mut found = None;
        for link in chain {
            if let Some(image) = self
                .bases
                .files(&link.asked, crate::plan::apt::SYSTEM_PATHS)?
            {
                found = Some((link.shown.as_str(), image));
                break;
            }
        }
        let Some((into, image)) = found else {
            self.reached(format!("cannot pin the apt packages of {target}"))?;
            return Err(self.unpinnable(format!(
                "cannot pin the apt packages of {target}: no reachable engine holds `{}`, which they go into, or an image below it; build or load it on the builder",
                chain.first().map_or("", |l| l.shown.as_str())
            )));
        };
        let read = crate::inputs::apt::debian_architecture(&image.platform);
        if let Some(wanted) =
            platform.filter(|p| crate::inputs::apt::debian_architecture(p) != read)
        {
            return Err(fail(format!(
                "the spec is for {wanted}, and the image the packages go into, `{into}`, is {} on the builder: its installed packages are another architecture's; load the {wanted} variant on the builder, or lock on a builder of that platform",
                image.platform
            )));
        }
        let platform = platform.unwrap_or(&image.platform);
        let architecture = crate::inputs::apt::debian_architecture(platform).ok_or_else(|| {
            fail(format!(
                "Debian has no architecture for the platform {platform}"
            ))
        })?;
        let system = crate::plan::apt::System::from_files(architecture, image.files)
            .map_err(|e| fail(format!("reading `{into}`: {e}")))?;
        let pins = crate::plan::apt::lock_packages(&system, requested, stage, cache).map_err(
            |unpinned| Error::Apt {
                image: self.image.to_string(),
                package: unpinned.package.unwrap_or_else(|| requested.join(" ")),
                message: unpinned.reason.to_string(),
                hint: None,
            },
        )?;
        self.changes
            .push(resolved(&target, architecture, (&pins, &system), into));
        Ok(pins)
    }
}

/// An image up a spec's parent chain, as `lock` reads it: how it is named to a person, and
/// how the builder is asked for it.
#[derive(Clone)]
struct Link {
    shown: String,
    asked: String,
}

impl Link {
    fn external(reference: &str) -> Link {
        Link {
            shown: reference.to_string(),
            asked: reference.to_string(),
        }
    }

    fn names(chain: &[Link]) -> String {
        chain
            .iter()
            .map(|l| l.shown.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The images an image goes on, nearest first (specs' images, then the external base), and
/// the platform it is for (its own or the nearest parent's). A spec's image is read as the
/// image hallmark finished at its current checksum (by id), never by its tag, which may name
/// an older build (`lock kid` read `par:latest` from before `par` changed, and the build
/// failed later); one not built at its current spec is left out, its parent read instead
/// (which lacks no more than it), and `notes` says so.
fn parent_chain(
    project: &Project,
    loaded: &LoadedSpec,
    asked: (&dyn BaseResolver, &LayerStore),
    notes: &mut Vec<String>,
) -> Result<(Vec<Link>, Option<String>)> {
    let mut platform = loaded.spec.image.platform.clone();
    let mut chain = Vec::new();
    let mut seen = vec![loaded.name.clone()];
    let mut parents = Vec::new();
    let mut current = loaded.spec.parent();
    loop {
        match current {
            Parent::External(reference) => {
                chain.push(Link::external(reference));
                break;
            }
            Parent::Image(parent) if !seen.contains(parent) => {
                seen.push(parent.clone());
                parents.push(project.load_spec(parent)?);
                let spec = parents.last().expect("pushed");
                chain.extend(built(project, spec, asked, notes));
                platform = platform.or_else(|| spec.spec.image.platform.clone());
                current = spec.spec.parent();
            }
            // A cycle: `check` names it; the images seen so far are enough here.
            Parent::Image(_) => break,
        }
    }
    Ok((chain, platform))
}

/// The images hallmark finished for `spec` at its current checksum, by id, that the builder
/// still holds (none, with a note, when it is not built so, cannot be planned, or the
/// builder removed what was built: its ids would be asked and not found, and the image below
/// read in silence).
fn built(
    project: &Project,
    spec: &LoadedSpec,
    (bases, store): (&dyn BaseResolver, &LayerStore),
    notes: &mut Vec<String>,
) -> Vec<Link> {
    let name = &spec.name;
    let checksum = crate::plan::Plan::new(project, std::slice::from_ref(name))
        .map(|plan| plan.get(name).checksum.to_string());
    let finished = match &checksum {
        Ok(checksum) => finished::image_ids(store, checksum),
        Err(_) => Vec::new(),
    };
    let (held, gone): (Vec<String>, Vec<String>) =
        finished.into_iter().partition(|id| !bases.lacks(id));
    if held.is_empty() {
        let why = match (&checksum, gone.first()) {
            (Ok(checksum), None) => format!(
                "`{name}` is not built at its current spec (checksum {})",
                &checksum[..12.min(checksum.len())]
            ),
            (Ok(_), Some(id)) => format!(
                "`{name}` was built at its current spec, but the builder no longer holds that image ({}: removed or pruned since)",
                &id[..19.min(id.len())]
            ),
            (Err(e), _) => {
                format!("`{name}` is not built at its current spec (it cannot be planned: {e})")
            }
        };
        let note = format!(
            "{why}: its tag {} is not read (it may name an older build); the image below it is read instead; build `{name}` and lock again to resolve against it",
            spec.reference()
        );
        if !notes.contains(&note) {
            notes.push(note);
        }
    }
    held.into_iter()
        .map(|id| Link {
            shown: format!(
                "{} (`{name}` as built at its current spec)",
                spec.reference()
            ),
            asked: id,
        })
        .collect()
}

/// The Python an image's wheels are chosen for: the one pinned (unless `--update`, or it is
/// for another machine than the spec's platform), else asked of the nearest image up the
/// parent chain that the builder holds and can run. The spec's platform (its own or the
/// nearest parent's) names the machine, so an arm64 image is locked for arm64 on an x86
/// builder that holds the base's x86 variant: the Python version and C library are the same
/// across a base's platforms. `None` when nothing could be asked.
fn interpreter(
    project: &Project,
    loaded: &LoadedSpec,
    old: &Pins,
    update: bool,
    (bases, store): (&dyn BaseResolver, &LayerStore),
    changes: &mut Vec<String>,
) -> Result<Option<Interpreter>> {
    let (chain, platform) = parent_chain(project, loaded, (bases, store), changes)?;
    let machine = platform.as_deref().and_then(python::machine_of_platform);
    let for_machine = |python: &Interpreter| machine.is_none_or(|m| python.machine == m);
    if let Some(pinned) = old.python.as_ref().filter(|p| !update && for_machine(p)) {
        return Ok(Some(pinned.clone()));
    }
    for link in &chain {
        if let Some(mut python) = bases.interpreter(&link.asked)? {
            if let Some(machine) = machine {
                python.machine = machine.to_string();
            }
            changes.push(format!(
                "python: {} (asked {})",
                python.describe(),
                link.shown
            ));
            return Ok(Some(python));
        }
    }
    if let Some(pinned) = old.python.as_ref().filter(|p| for_machine(p)) {
        changes.push(format!(
            "python: no engine could run {}; kept the one written in pins/ ({})",
            Link::names(&chain),
            pinned.describe()
        ));
        return Ok(Some(pinned.clone()));
    }
    changes.push(format!(
        "python: no engine could run python3 in {}; wheels chosen by the host's pip must be pure Python",
        Link::names(&chain)
    ));
    Ok(None)
}

/// A downloaded wheel must install on the image's Python; without one known, it must be pure
/// Python, which installs anywhere.
fn check_wheel_fits(
    image: &Name,
    pins_path: &std::path::Path,
    pin: &WheelPin,
    python: Option<&Interpreter>,
) -> Result<()> {
    let file = python::parse_name(&pin.file).map_err(|message| Error::Wheel {
        image: image.to_string(),
        name: pin.name.to_string(),
        version: pin.version.clone(),
        message: message.to_string(),
        hint: None,
    })?;
    let fail = |message: String, hint: Option<String>| Error::Wheel {
        image: image.to_string(),
        name: pin.name.to_string(),
        version: pin.version.clone(),
        message,
        hint,
    };
    match python {
        Some(python) if !python.accepts(&file) => Err(fail(
            format!(
                "pip chose {}, which does not install on {}",
                pin.file,
                python.describe()
            ),
            None,
        )),
        None if !file.is_pure() => Err(Error::from(Invalid {
            path: pins_path.to_path_buf(),
            location: None,
            key: Some("python".into()),
            message: format!(
                "wheel `{}=={}`: pip offers {}, built for one Python and platform, and hallmark cannot tell which Python image `{image}` runs",
                pin.name, pin.version, pin.file
            ),
            hint: Some(format!(
                "load the base on the builder and run `hallmark lock --update {image}`, or write it in this file by hand: [python] version = \"3.12\", implementation = \"cpython\", abi = \"cp312\", machine = \"aarch64\", libc = \"glibc 2.35\" (docs/spec.md)"
            )),
        })),
        _ => Ok(()),
    }
}

/// Apt packages by name and the version asked for, if one is.
type AskedPackages = std::collections::BTreeSet<(String, Option<String>)>;

/// The packages asked for, and those the old pins hold as asked.
fn wanted_and_kept(requested: &[String], old: &[&AptPin]) -> (AskedPackages, AskedPackages) {
    let wanted: std::collections::BTreeSet<(String, Option<String>)> = requested
        .iter()
        .map(|r| {
            let r = Requested::parse(r);
            (r.name, r.version)
        })
        .collect();
    let kept: std::collections::BTreeSet<(String, Option<String>)> = old
        .iter()
        .filter(|p| p.wanted)
        .map(|p| {
            let asked = wanted
                .iter()
                .find(|(name, _)| *name == p.name)
                .and_then(|(_, version)| version.clone());
            (p.name.clone(), asked.filter(|v| *v == p.version))
        })
        .collect();
    (wanted, kept)
}

/// What `lock` says of apt packages it resolved: those asked for, for which architecture,
/// from which archives, and how many more they need.
fn resolved(
    target: &str,
    architecture: &str,
    (pins, system): (&[AptPin], &crate::plan::apt::System),
    into: &str,
) -> String {
    let needed = pins.iter().filter(|p| !p.wanted).count();
    format!(
        "apt {target}: {} for {architecture} from {}, and {needed} more {} that `{into}` lacks",
        pins.iter()
            .filter(|p| p.wanted)
            .map(AptPin::describe)
            .collect::<Vec<_>>()
            .join(" "),
        system
            .sources
            .iter()
            .map(|s| format!("{} {}", s.uri, s.suite))
            .collect::<Vec<_>>()
            .join(", "),
        if needed == 1 {
            "package it needs"
        } else {
            "packages they need"
        },
    )
}
