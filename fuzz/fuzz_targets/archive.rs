//! An image archive as `docker save` might send it (docker-archive or OCI layout), read into
//! a fresh layer store; then every layer the reader accepted is opened and rewritten as
//! normalisation would. Errors are fine; panics, and files written outside the store, are not.
#![no_main]
use hallmark::store::LayerStore;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let store = LayerStore::open(dir.path());
    if let Ok(image) = store.ingest(data) {
        let _ = store.read_config(&image);
        for layer in &image.layers {
            if let Ok(mut tar) = store.open_layer(layer) {
                let _ = hallmark::normalize::rewrite_layer(&mut tar, &mut std::io::sink(), 0);
            }
        }
    }
    // Only the store's folder may have been written.
    for entry in std::fs::read_dir(dir.path()).expect("readable") {
        assert_eq!(entry.expect("an entry").file_name(), "store");
    }
});
