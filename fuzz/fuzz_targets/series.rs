//! A patch series file and one patch: `series \0 patch`. The reader refuses what it cannot
//! read with an error, never a panic. (That escaping paths are refused is shown with real git
//! in tests/hostile.rs: only git knows which lines of a patch it will act on.)
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    let (series, patch) = (&data[..split], data.get(split + 1..).unwrap_or_default());
    if let Ok(series) = std::str::from_utf8(series) {
        let _ = hallmark::patches::parse_series(Path::new("patches/fuzzed/series"), series);
    }
    for strip in [0, 1, 2] {
        let _ = hallmark::patches::check_touched_paths(patch, strip);
    }
});
