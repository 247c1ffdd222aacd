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
            let mut tar = Vec::new();
            let read = store
                .open_layer(layer)
                .map(|mut reader| std::io::Read::read_to_end(&mut reader, &mut tar).is_ok());
            if read.unwrap_or(false) {
                // The layer itself stands in for the layers below it, so that an opaque
                // directory has something to hide.
                let lower = || {
                    let mut tree = hallmark::normalize::LowerTree::default();
                    tree.apply(tar.as_slice())?;
                    Ok(tree)
                };
                let _ = hallmark::normalize::rewrite_layer(
                    std::io::Cursor::new(&tar),
                    lower,
                    &mut std::io::sink(),
                    0,
                );
            }
        }
    }
    // Only the store's folder may have been written.
    for entry in std::fs::read_dir(dir.path()).expect("readable") {
        assert_eq!(entry.expect("an entry").file_name(), "store");
    }
});
