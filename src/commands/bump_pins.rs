//! `hallmark bump IMAGE --base | --wheel NAME | --apt`: moves the other pins of an image, as
//! the source bump moves a source's (docs/patches.md, "Moving the other pins"). The search
//! and the writes are `plan/bump/pins.rs`'s; here the flags become a `Which` and an `Asked`,
//! and the builder's resolver and the build are handed down.

use crate::cli::BumpArgs;
use crate::commands::settings::Settings;
use crate::error::{Error, ExitStatus, Result};
use crate::make::base::BuilderResolver;
use crate::plan::Plan;
use crate::plan::bump::pins::{Asked, Env, Moving, Which};
use crate::plan::pin_moves::{TagRules, WheelRules};

pub(super) fn run(settings: &Settings, args: &BumpArgs) -> Result<ExitStatus> {
    if args.bisect && !args.build {
        return Err(Error::usage(
            "--bisect bisects failed builds: it needs --build",
        ));
    }
    if args.tags.is_some() && !args.base {
        return Err(Error::usage(
            "--tags names the tags to walk: with --base (a base's tags) or a source bump",
        ));
    }
    let name = settings.project.image_name(&args.image)?;
    let plan = Plan::new(&settings.project, std::slice::from_ref(&name))?;
    let planned = plan.get(&name);
    let spec_path = settings
        .project
        .images_dir()
        .join(name.as_str())
        .join("image.toml");
    let text = fs_err::read_to_string(&spec_path).map_err(|e| Error::io(&spec_path, e))?;
    if planned.loaded.path != spec_path || crate::inputs::spec::variant::is_variant(&text) {
        return Err(Error::usage(format!(
            "image `{name}` is a variant: its base, wheels and apt packages are those of the spec it varies; bump that image"
        )));
    }
    let runtime = super::runtime()?;
    let resolver = BuilderResolver {
        builder: &settings.config.builder,
        ssh_config: settings.config.ssh_config.as_deref(),
        cache: &settings.cache,
        runtime: &runtime,
    };
    let build = || super::build::build_one(settings, &name);
    let env = Env {
        output: &settings.output,
        project: &settings.project,
        cache: &settings.cache,
        builder: &settings.config.builder,
        ssh_config: settings.config.ssh_config.as_deref(),
        runtime: &runtime,
        resolver: &resolver,
        build: &build,
    };
    if args.pre && !args.base && args.wheel.is_none() {
        return Err(Error::usage(
            "--pre takes pre-releases of a base's tags or a wheel's versions: with --base or --wheel",
        ));
    }
    let which = match (&args.wheel, args.base) {
        (_, true) => Which::Base(TagRules {
            include: args.tags.clone().unwrap_or_else(|| "*".into()),
            exclude: args.exclude_tags.clone(),
            pre: args.pre,
        }),
        (Some(wheel), false) => Which::Wheel(
            wheel,
            WheelRules {
                pre: args.pre,
                local: args.wheel_local.clone(),
            },
        ),
        (None, false) => Which::Apt,
    };
    let asked = Asked {
        dry_run: args.dry_run,
        build: args.build,
        bisect: args.bisect,
    };
    let moving = Moving::new(env, &name, spec_path)?;
    let (search, tried) = moving.search(&planned.loaded, &which)?;
    let result = moving.bump(&asked, search, tried);
    // Whatever happened after the files were written, a failure or a signal leaves them as
    // they were (a build failure is an answer, not a failure: it comes back as `Ok`).
    if result.is_err() || crate::interrupt::requested() {
        let _writing = crate::interrupt::writing();
        moving.originals.put_back()?;
    }
    result
}
