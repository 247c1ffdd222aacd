//! An image spec and its pins file, as a person might write them: `spec \0 pins`.
//! Parsing, validation and the pins check must return errors, never panic.
#![no_main]
use hallmark::values::Name;
use libfuzzer_sys::fuzz_target;
use std::path::{Path, PathBuf};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (spec_text, pins_text) = text.split_once('\0').unwrap_or((text, ""));
    let name = Name::try_from("fuzzed".to_string()).expect("a valid name");
    let root = Path::new("/nonexistent-hallmark-fuzz");
    let dir = root.join("images/fuzzed");
    let spec = hallmark::spec::parse(&name, &dir, dir.join("image.toml"), spec_text.into());
    let pins = hallmark::pins::parse(PathBuf::from("pins/fuzzed.toml"), pins_text);
    if let (Ok(spec), Ok(pins)) = (spec, pins) {
        let _ = hallmark::pins::check(&spec, root, &pins);
    }
});
