//! What an engine answers, parsed as hallmark parses it: an image inspect (fingerprint and
//! label), a line of load progress, an image config (normalised), and the Python probe's
//! answer. A node or builder that sends garbage gets an error, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(image) = serde_json::from_slice::<hallmark::engine::ImageAnswer>(data) {
        let _ = hallmark::verify::fingerprint(&image);
        let _ = hallmark::verify::label(&image, "dev.hallmark.checksum");
        let _ = (image.strings("Entrypoint"), image.is_stub());
    }
    let _ = serde_json::from_slice::<hallmark::engine::EngineVersion>(data)
        .map(|v| v.usable_api(bollard::API_DEFAULT_VERSION));
    let _ = serde_json::from_slice::<hallmark::engine::EngineInfo>(data).map(|i| i.image_store());
    let _ = serde_json::from_slice::<bollard::models::BuildInfo>(data);
    if let Ok(mut config) = serde_json::from_slice::<serde_json::Value>(data) {
        hallmark::normalize::normalize_config(&mut config, &[], 0);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = hallmark::wheel::parse_probe_answer(text);
    }
});
