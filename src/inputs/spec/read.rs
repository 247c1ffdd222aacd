//! Reading a spec: its text (size-capped, UTF-8), the strict TOML parse whose errors point at
//! the line and the key, and the location of a key for the rules checked after it.

use super::*;

/// Where the value at `path` stands in a TOML text: each step of `path` a table key, or for
/// an array the item with that text (a string, or a table holding it as a value).
pub(crate) fn locate(text: &str, path: &[&str]) -> Option<Location> {
    use toml::de::{DeTable, DeValue};
    fn entry<'a, 'i>(table: &'a DeTable<'i>, key: &str) -> Option<&'a Spanned<DeValue<'i>>> {
        table
            .iter()
            .find(|(k, _)| k.get_ref().as_ref() == key)
            .map(|(_, v)| v)
    }
    let root = DeTable::parse(text).ok()?;
    let (first, rest) = path.split_first()?;
    let mut value = entry(root.get_ref(), first)?;
    for step in rest {
        value = match value.get_ref() {
            DeValue::Table(table) => entry(table, step)?,
            DeValue::Array(items) => items.iter().find(|item| match item.get_ref() {
                DeValue::String(s) => s == step,
                DeValue::Table(table) => table
                    .iter()
                    .any(|(_, v)| matches!(v.get_ref(), DeValue::String(s) if s == step)),
                _ => false,
            })?,
            _ => return None,
        };
    }
    Some(Location::of_offset(text, value.span().start))
}

/// Parse a TOML document strictly, turning the parser's error into one that names file,
/// line, column and key.
pub fn parse_toml<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<T> {
    toml::from_str(text).map_err(|e| {
        let location = e.span().map(|span| Location::of_offset(text, span.start));
        let key = location.as_ref().and_then(|l| key_on_line(&l.text));
        let mut message = e.message().trim().to_string();
        // The parser says "duplicate key" and no more: the key (or the table written twice)
        // is named, as the caret alone left a reader to guess.
        if message == "duplicate key"
            && let Some(key) = &key
        {
            message = format!("duplicate key `{key}`");
        }
        Error::Parse {
            path: path.to_path_buf(),
            location,
            key,
            message,
        }
    })
}

/// The key a line of TOML sets (`key = ...`), or the table it opens (`[table]`).
pub(super) fn key_on_line(line: &str) -> Option<String> {
    let line = line.trim();
    if let Some(table) = line.strip_prefix('[').filter(|t| !t.starts_with('[')) {
        let table = table.split(']').next()?.trim();
        return (!table.is_empty()).then(|| table.to_string());
    }
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    (!key.is_empty() && !key.starts_with('[')).then(|| key.to_string())
}

pub fn load(name: &Name, dir: &Path) -> Result<LoadedSpec> {
    let path = dir.join("image.toml");
    let text = read_text(&path)?;
    if variant::is_variant(&text) {
        return variant::load(name, dir, path, text);
    }
    parse(name, dir, path, text)
}

/// The most a spec or a series file may hold: hand-written, they are kilobytes; a 42 MB spec
/// took 8 s and 1 GB to refuse (an outside test).
pub const MAX_TEXT_BYTES: u64 = 1 << 20;

/// Reads a spec or a series: at most [`MAX_TEXT_BYTES`], UTF-8.
pub fn read_text(path: &Path) -> Result<String> {
    let file = fs_err::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut bytes = Vec::new();
    // One byte past the cap says it is too big without reading the rest.
    std::io::Read::read_to_end(
        &mut std::io::Read::take(file, MAX_TEXT_BYTES + 1),
        &mut bytes,
    )
    .map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > MAX_TEXT_BYTES {
        return Err(Error::from(Invalid {
            path: path.to_path_buf(),
            location: None,
            key: None,
            message: format!(
                "is over {} MiB; a spec or a series is a hand-written file of kilobytes",
                MAX_TEXT_BYTES >> 20
            ),
            hint: None,
        }));
    }
    text_of(path, bytes)
}

/// The text of `bytes` read from `path`; bytes that are not UTF-8 are bad input (exit 2)
/// named by line and column, not an I/O error.
pub fn text_of(path: &Path, bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let lossy = String::from_utf8_lossy(e.as_bytes());
        Error::from(Invalid {
            path: path.to_path_buf(),
            location: Some(Location::of_offset(&lossy, valid)),
            key: None,
            message: "not UTF-8 text".into(),
            hint: None,
        })
    })
}

/// Parses and validates the text of `dir/image.toml` (read by [`load`]; fuzzed on its own).
pub fn parse(name: &Name, dir: &Path, path: PathBuf, text: String) -> Result<LoadedSpec> {
    let spec: ImageSpec = parse_toml(&path, &text)?;
    let loaded = LoadedSpec {
        name: name.clone(),
        dir: dir.to_path_buf(),
        path,
        text,
        spec,
    };
    validate(&loaded)?;
    Ok(loaded)
}
