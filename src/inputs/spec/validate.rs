//! The cross-field rules checked right after parsing, each error at the line of the offending
//! key: one parent, unique names, nested sources after the one they nest in, files, wheels,
//! labels, env and apt packages.

use super::*;

/// The last `source-date-epoch` engines keep as a file time: they set times in nanoseconds
/// in an i64, and a later time comes out as 1970.
pub const MAX_SOURCE_DATE: u64 = 9_223_372_036;

/// Why `value` cannot be written in a Dockerfile `ENV`, `ARG` or `LABEL` (a line break ends
/// the instruction; other control characters do not survive the engines' parsers alike).
/// A tab is kept as it is, inside the quotes.
pub(super) fn unwritable(value: &str) -> Option<String> {
    value
        .chars()
        .find(|&c| c.is_control() && c != '\t')
        .map(|c| format!("{c:?} is a control character, which a Dockerfile cannot hold in a value"))
}

/// The checks the TOML types cannot make, one group of keys at a time; the first problem is
/// reported at its key.
pub(super) fn validate(loaded: &LoadedSpec) -> Result<()> {
    validate_image(loaded)?;
    validate_sources(loaded)?;
    validate_wheels(loaded)?;
    validate_files(loaded)?;
    validate_container_and_name(loaded)?;
    validate_labels_and_env(loaded)?;
    validate_build(loaded)
}

/// `from` and `[image]`: the parent, the tag, the source date.
pub(super) fn validate_image(loaded: &LoadedSpec) -> Result<()> {
    let spec = &loaded.spec;
    let from = spec.from.get_ref();
    match (&from.image, &from.reference) {
        (Some(_), Some(_)) | (None, None) => {
            return loaded.invalid(
                spec.from.span(),
                "from",
                "name exactly one parent: `image` (another spec) or `ref` (an external image)"
                    .into(),
            );
        }
        (Some(parent), None) if *parent == loaded.name => {
            // The caret on the value, not on `[from]`.
            return loaded.invalid_at(
                &["from", "image"],
                "from.image",
                "an image cannot be its own parent".into(),
            );
        }
        (None, Some(reference)) => {
            if reference.contains('@') {
                return loaded.invalid(
                    spec.from.span(),
                    "from.ref",
                    format!("`{reference}` carries a digest; write the tag here, the digest belongs in pins/ (`hallmark lock`)"),
                );
            }
            if let Err(why) = Reference::parse(reference) {
                return loaded.invalid(spec.from.span(), "from.ref", why.to_string());
            }
        }
        _ => {}
    }
    if let Some(why) = reference::tag_error(&spec.image.tag) {
        return loaded.invalid_at(&["image", "tag"], "image.tag", why);
    }
    if spec.image.source_date_epoch > MAX_SOURCE_DATE {
        return loaded.invalid_at(
            &["image", "source-date-epoch"],
            "image.source-date-epoch",
            format!(
                "{} is past {MAX_SOURCE_DATE} (2262-04-11T23:47:16Z), the last second engines can give a file as its time",
                spec.image.source_date_epoch
            ),
        );
    }

    Ok(())
}

/// `[[source]]`: unique names, usable git revisions, destinations that do not overwrite
/// each other.
pub(super) fn validate_sources(loaded: &LoadedSpec) -> Result<()> {
    let spec = &loaded.spec;
    let mut names = BTreeSet::new();
    for (i, source) in spec.sources.iter().enumerate() {
        if !names.insert(source.name.get_ref().clone()) {
            return loaded.invalid(
                source.name.span(),
                "source.name",
                format!("source `{}` is named twice", source.name.get_ref()),
            );
        }
        if source.git.trim().is_empty() {
            return loaded.invalid(source.name.span(), "source.git", "is empty".into());
        }
        if source.git.chars().any(char::is_control) {
            // The URL is stamped as a label, and a Dockerfile line cannot hold these.
            return loaded.invalid(
                source.name.span(),
                "source.git",
                "has control characters".into(),
            );
        }
        if source.rev.trim().is_empty() || source.rev.starts_with('-') {
            return loaded.invalid(
                source.name.span(),
                "source.rev",
                format!("`{}` is not a git revision", source.rev),
            );
        }
        if source.dest.get_ref().as_str() == "/" {
            return loaded.invalid(
                source.dest.span(),
                "source.dest",
                "a source cannot replace the image root".into(),
            );
        }
        // A nested source (cutlass inside vLLM's build tree) is copied after its container,
        // so it must come later in the spec; the reverse would be silently overwritten.
        for later in &spec.sources[i + 1..] {
            if source.dest.get_ref().is_within(later.dest.get_ref()) {
                return loaded.invalid(
                    source.dest.span(),
                    "source.dest",
                    format!(
                        "`{}` lies inside source `{}` ({}), which is listed later and would overwrite it; list the outer source first",
                        source.dest.get_ref(),
                        later.name.get_ref(),
                        later.dest.get_ref()
                    ),
                );
            }
        }
        let mut sets = BTreeSet::new();
        for set in &source.patches {
            if !sets.insert(set.get_ref().clone()) {
                return loaded.invalid(
                    set.span(),
                    "source.patches",
                    format!("patch set `{}` is listed twice", set.get_ref()),
                );
            }
        }
    }
    Ok(())
}

/// `[[wheel]]`: each once, at an exact version.
pub(super) fn validate_wheels(loaded: &LoadedSpec) -> Result<()> {
    let spec = &loaded.spec;
    let mut wheels = BTreeSet::new();
    for wheel in &spec.wheels {
        let normalized = wheel
            .name
            .get_ref()
            .as_str()
            .to_lowercase()
            .replace(['-', '.'], "_");
        if !wheels.insert(normalized) {
            return loaded.invalid(
                wheel.name.span(),
                "wheel.name",
                format!("wheel `{}` is listed twice", wheel.name.get_ref()),
            );
        }
        // PEP 440's grammar, as pip and bump read it (an epoch, pre/post/dev, a local label).
        if wheel.version.parse::<pep440_rs::Version>().is_err() {
            return loaded.invalid(
                wheel.name.span(),
                "wheel.version",
                format!(
                    "`{}` is not an exact version (write `1.3.0` or `1.3.0+cu126`, not a range)",
                    wheel.version
                ),
            );
        }
    }
    Ok(())
}

/// `[[file]]` and `[[smoke]]`: one file per destination, smoke tests named once.
pub(super) fn validate_files(loaded: &LoadedSpec) -> Result<()> {
    let spec = &loaded.spec;
    let mut dests = BTreeSet::new();
    for file in &spec.files {
        if file.dest.get_ref().as_str().ends_with('/') {
            return loaded.invalid(
                file.dest.span(),
                "file.dest",
                format!(
                    "`{}` must name the file or folder to create, without a trailing `/`",
                    file.dest.get_ref()
                ),
            );
        }
        if !dests.insert(file.dest.get_ref().clone()) {
            return loaded.invalid(
                file.dest.span(),
                "file.dest",
                format!("`{}` is the destination of two files", file.dest.get_ref()),
            );
        }
    }
    let mut smokes = BTreeSet::new();
    for smoke in &spec.smokes {
        if !smokes.insert(smoke.name.get_ref().clone()) {
            return loaded.invalid(
                smoke.name.span(),
                "smoke.name",
                format!("smoke test `{}` is named twice", smoke.name.get_ref()),
            );
        }
        if smoke.name.get_ref().trim().is_empty() {
            return loaded.invalid(smoke.name.span(), "smoke.name", "is blank".into());
        }
        if smoke.run.get_ref().is_empty() {
            return loaded.invalid(
                smoke.name.span(),
                "smoke.run",
                "is empty: give the command as a list, e.g. [\"python3\", \"-c\", \"import b12x\"]"
                    .into(),
            );
        }
        if smoke.run.get_ref()[0].trim().is_empty() {
            return loaded.invalid(
                smoke.name.span(),
                "smoke.run",
                "names a blank program: its first item is what runs".into(),
            );
        }
        smoke_keys_hold(loaded, smoke)?;
    }
    Ok(())
}

/// `[container]` and the image's repository name (`[image] name` or the folder's).
pub(super) fn validate_container_and_name(loaded: &LoadedSpec) -> Result<()> {
    let spec = &loaded.spec;
    // `[]` clears what the base set; an entrypoint whose program is blank fails only when
    // it runs (a `cmd` may start with an empty argument to an entrypoint).
    if let Some(program) = spec.container.entrypoint.as_ref().and_then(|e| e.first())
        && program.trim().is_empty()
    {
        return loaded.invalid_at(
            &["container", "entrypoint"],
            "container.entrypoint",
            "names a blank program: its first item is what runs (`[]` clears the base's)".into(),
        );
    }
    if let Some(user) = &spec.container.user {
        let ok = !user.is_empty()
            && user
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'));
        if !ok {
            return loaded.invalid_at(
                &["container", "user"],
                "container.user",
                format!("`{user}` is not a user: write `name`, `uid` or `uid:gid`"),
            );
        }
    }
    let repository = loaded.repository();
    let named = reference::repository_error(repository).or_else(|| {
        Reference::tagged(repository, &spec.image.tag)
            .err()
            .map(|why| format!("`{repository}` cannot be tagged: {why}"))
    });
    if let Some(message) = named {
        // Where `name` is set; a folder name has no place in the text.
        return Err(Error::from(Invalid {
            path: loaded.path.clone(),
            location: locate(&loaded.text, &["image", "name"]),
            key: Some("image.name".into()),
            message,
            hint: Some("rename the folder or set `name` in [image]".into()),
        }));
    }
    Ok(())
}

/// `[labels]`, `[env]`, `[build.args]`: keys and values a Dockerfile line can carry.
pub(super) fn validate_labels_and_env(loaded: &LoadedSpec) -> Result<()> {
    let spec = &loaded.spec;
    for key in spec.labels.keys() {
        if key.is_empty()
            || key
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '=')
        {
            return loaded.invalid_at(
                &["labels", key],
                &format!("labels.{key}"),
                format!("`{key}` is not a label key"),
            );
        }
    }
    for (key, value) in &spec.labels {
        if let Some(why) = unwritable(value) {
            return loaded.invalid_at(&["labels", key], &format!("labels.{key}"), why);
        }
    }
    for (key, path, table) in [
        ("env", &["env"][..], &spec.env),
        ("build.args", &["build", "args"], &spec.build.args),
    ] {
        for (name, value) in table {
            let at = [path, &[name.as_str()]].concat();
            if let Some(why) = unwritable(value) {
                return loaded.invalid_at(&at, &format!("{key}.{name}"), why);
            }
        }
        for name in table.keys() {
            let ok = !name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !ok {
                return loaded.invalid_at(
                    &[path, &[name.as_str()]].concat(),
                    &format!("{key}.{name}"),
                    format!("`{name}` is not a valid variable name"),
                );
            }
        }
    }
    Ok(())
}

/// An apt package name (with an optional `=version` or `:arch`) as it may be written unquoted
/// into a shell command: a safe alphabet, no leading `-` or `~`.
pub fn is_apt_package(package: &str) -> bool {
    package.starts_with(|c: char| c.is_ascii_alphanumeric())
        && package.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'-' | b':' | b'=' | b'~')
        })
}

/// The first problem of an `apt` list: a package that is not a name, an empty `=version`,
/// a package named twice.
pub fn apt_problems(packages: &[String]) -> Option<(&String, String)> {
    let mut seen = std::collections::BTreeSet::new();
    for package in packages {
        if !is_apt_package(package) {
            return Some((package, format!("`{package}` is not a package name")));
        }
        let requested = crate::inputs::apt::Requested::parse(package);
        if requested.version.as_deref() == Some("") || requested.arch.as_deref() == Some("") {
            return Some((
                package,
                format!("`{package}`: an empty version or architecture"),
            ));
        }
        if !seen.insert(requested.name.clone()) {
            return Some((package, format!("`{}` is named twice", requested.name)));
        }
    }
    None
}

/// `[build]`: steps and apt packages.
pub(super) fn validate_build(loaded: &LoadedSpec) -> Result<()> {
    let spec = &loaded.spec;
    for step in &spec.build.run {
        if step.trim().is_empty() {
            return loaded.invalid_at(
                &["build", "run", step],
                "build.run",
                "a step is blank: give it a command or remove it".into(),
            );
        }
        if step.contains('\0') {
            return loaded.invalid_at(
                &["build", "run", step],
                "build.run",
                "a step holds a NUL character, which no command line can carry".into(),
            );
        }
    }
    if let Some((package, message)) = apt_problems(&spec.build.apt) {
        return loaded.invalid_at(&["build", "apt", package], "build.apt", message);
    }
    crate::inputs::spec::compile::validate(loaded)
}
