//! The image config's normalisation: volatile fields removed or clamped, the diff ids of the
//! canonical layers, and the checksum label (pending while the image is unfinished).

use super::*;

/// The value of the checksum label while an image is unfinished (built, but not yet
/// normalised, smoke-tested and stamped). It never equals a checksum, so no lookup by label
/// finds such an image: a re-run after a failure or an interrupt builds again.
pub fn pending_label(checksum: &str) -> String {
    format!("pending-{checksum}")
}

/// Stamps a finished image's config: the checksum label takes the checksum's value, and the
/// build's LABEL step in the history says what the image now carries.
pub fn finish_config(config: &mut Value, key: &str, checksum: &str) {
    let pending = pending_label(checksum);
    if let Some(runtime) = config.get_mut("config").and_then(Value::as_object_mut) {
        let labels = runtime.entry("Labels").or_insert_with(|| json!({}));
        if !labels.is_object() {
            *labels = json!({});
        }
        labels[key] = json!(checksum);
    }
    if let Some(history) = config.get_mut("history").and_then(Value::as_array_mut) {
        for entry in history.iter_mut().filter_map(Value::as_object_mut) {
            if let Some(Value::String(step)) = entry.get_mut("created_by") {
                *step = step.replace(&pending, checksum);
            }
        }
    }
}

/// Removes what only says when and where the build ran (public for the fuzzer).
pub fn normalize_config(config: &mut Value, layers: &[StoredLayer], source_date: u64) {
    let Some(object) = config.as_object_mut() else {
        return;
    };
    let date = rfc3339(source_date);
    object.insert("created".into(), json!(date));
    for volatile in ["container", "container_config", "docker_version"] {
        object.remove(volatile);
    }
    if let Some(runtime) = object.get_mut("config").and_then(Value::as_object_mut) {
        runtime.remove("Hostname");
        runtime.remove("Image");
        // Docker 20.10 writes every field, the containerd store leaves the empty ones out.
        runtime.retain(|_, value| !is_empty(value));
    }
    if let Some(history) = object.get_mut("history").and_then(Value::as_array_mut) {
        for entry in history.iter_mut().filter_map(Value::as_object_mut) {
            // RFC 3339 in UTC with a Z sorts as text: clamp, never move a date forward.
            let later = entry
                .get("created")
                .and_then(Value::as_str)
                .is_some_and(|c| c > date.as_str());
            if later {
                entry.insert("created".into(), json!(date));
            }
        }
    }
    let diff_ids: Vec<&str> = layers.iter().map(|l| l.diff_id.as_str()).collect();
    object.insert(
        "rootfs".into(),
        json!({"type": "layers", "diff_ids": diff_ids}),
    );
}

/// `null`, `false`, `0`, `""`, `[]` or `{}`: what a runtime config field holds when unset.
pub(super) fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}
