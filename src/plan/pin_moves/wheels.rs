//! Which versions of a wheel a pin may move to, as PEP 440 defines versions: epochs, pre-,
//! post- and dev releases in pip's order, and a local label (`+cu126`, `+rocm6.3`, `+cpu`)
//! taken for what it is, a build flavour, not a step in the order. A pin keeps its flavour
//! unless the operator names another (`--wheel-local`), and moves to a pre- or dev release only
//! when asked (`--pre`): a bump that crosses from a CUDA build to a ROCm one, or onto a release
//! candidate, with exit 0, is a wrong pin nobody sees until the image fails on the nodes.

use super::glob_matches;
use pep440_rs::Version;
use std::str::FromStr;

/// What the operator allows a wheel to move to.
#[derive(Debug, Clone, Default)]
pub struct WheelRules {
    /// Take pre-releases and dev releases too (`--pre`).
    pub pre: bool,
    /// The local labels allowed (`--wheel-local GLOB`, `cu12*`; `""` for none); without it,
    /// the pin's own label only.
    pub local: Option<String>,
}

/// The versions a wheel may move to, oldest first, and why the others listed were left out.
#[derive(Debug, Default)]
pub struct WheelMoves {
    pub newer: Vec<String>,
    /// One sentence per reason (`3 pre-releases (0.7.2rc6, ...): --pre takes them`).
    pub skipped: Vec<String>,
}

/// The pin's local label, as PEP 440 normalises it (`+CU126` is `cu126`), `""` for none.
pub fn local_label(version: &Version) -> String {
    version
        .local()
        .iter()
        .map(|segment| segment.to_string().to_ascii_lowercase())
        .collect::<Vec<_>>()
        .join(".")
}

/// The versions of `listed` (as an index lists them, in any order) that `current` may move
/// to under `rules`, oldest first. Equal versions (`1.0` and `1.0.0`) count once. An error
/// names the pin when it is no PEP 440 version: there is no order to place it in.
pub fn wheel_moves(
    listed: &[String],
    current: &str,
    rules: &WheelRules,
) -> Result<WheelMoves, String> {
    let pin = Version::from_str(current)
        .map_err(|e| format!("the pin's version `{current}` is not a PEP 440 version ({e})"))?;
    let flavour = local_label(&pin);
    let allowed = |label: &str| match &rules.local {
        Some(glob) => glob_matches(glob, label),
        None => label == flavour,
    };
    let (mut newer, mut pre, mut others, mut invalid): (Vec<(Version, &str)>, _, _, _) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for text in listed {
        let Ok(version) = Version::from_str(text) else {
            invalid.push(text.as_str());
            continue;
        };
        let label = local_label(&version);
        // A move is to a later public version; another flavour of the same one is a move
        // only when the operator asks for flavours (`--wheel-local`).
        let later = match version
            .clone()
            .without_local()
            .cmp(&pin.clone().without_local())
        {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Equal => rules.local.is_some() && label != flavour,
            std::cmp::Ordering::Less => false,
        };
        if !later {
            continue;
        }
        if !allowed(&label) {
            others.push((text.as_str(), label));
        } else if version.any_prerelease() && !rules.pre {
            pre.push(text.as_str());
        } else if !newer.iter().any(|(seen, _)| *seen == version) {
            newer.push((version, text.as_str()));
        }
    }
    newer.sort_by(|(a, _), (b, _)| a.cmp(b));
    let mut skipped = Vec::new();
    if !pre.is_empty() {
        skipped.push(format!(
            "{} pre- or dev release(s) after {current} left out ({}): --pre takes them",
            pre.len(),
            sample(&pre)
        ));
    }
    if !others.is_empty() {
        let mut labels: Vec<String> = others
            .iter()
            .map(|(_, label)| match label.is_empty() {
                true => "none".to_string(),
                false => format!("+{label}"),
            })
            .collect();
        labels.sort();
        labels.dedup();
        let versions: Vec<&str> = others.iter().map(|(text, _)| *text).collect();
        skipped.push(format!(
            "{} version(s) of another build flavour left out ({}; local label {}): the pin's is {}; --wheel-local GLOB names the flavours to take",
            others.len(),
            sample(&versions),
            labels.join(", "),
            match flavour.is_empty() {
                true => "none".to_string(),
                false => format!("+{flavour}"),
            }
        ));
    }
    if !invalid.is_empty() {
        skipped.push(format!(
            "{} listed version(s) that are not PEP 440 left out ({})",
            invalid.len(),
            sample(&invalid)
        ));
    }
    Ok(WheelMoves {
        newer: newer
            .into_iter()
            .map(|(_, text)| text.to_string())
            .collect(),
        skipped,
    })
}

/// The first few of `items`, then how many more.
pub(super) fn sample(items: &[&str]) -> String {
    const SHOWN: usize = 4;
    let mut text = items
        .iter()
        .take(SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > SHOWN {
        text.push_str(&format!(", and {} more", items.len() - SHOWN));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The versions of a fixture: pip's `Available versions:` line, or one per line.
    fn listed(fixture: &str) -> Vec<String> {
        match super::super::parse_pip_versions(fixture) {
            Some(versions) => versions,
            None => fixture.lines().map(str::to_string).collect(),
        }
    }

    fn moves(fixture: &str, current: &str, rules: &WheelRules) -> WheelMoves {
        wheel_moves(&listed(fixture), current, rules).unwrap()
    }

    const TORCH: &str = include_str!("fixtures/pypi-torch.txt");
    const VLLM: &str = include_str!("fixtures/pypi-vllm.txt");
    const FLASHINFER: &str = include_str!("fixtures/pypi-flashinfer-python.txt");
    const TORCH_CUDA: &str = include_str!("fixtures/torch-cuda-index.txt");

    #[test]
    fn pypi_releases_go_in_pep440_order() {
        let torch = moves(TORCH, "2.5.1", &WheelRules::default());
        assert_eq!(torch.newer.first().map(String::as_str), Some("2.6.0"));
        assert_eq!(torch.newer.last().map(String::as_str), Some("2.15.0"));
        assert!(torch.skipped.is_empty(), "{:?}", torch.skipped);
        // Post releases and four-part versions come after their release.
        let vllm = moves(VLLM, "0.8.5", &WheelRules::default());
        assert_eq!(vllm.newer[..2], ["0.8.5.post1", "0.9.0"]);
        let vllm = moves(VLLM, "0.10.1", &WheelRules::default());
        assert_eq!(vllm.newer[..2], ["0.10.1.1", "0.10.2"]);
        assert_eq!(vllm.newer.last().map(String::as_str), Some("0.34.0"));
    }

    #[test]
    fn pre_releases_are_taken_only_when_asked() {
        let plain = moves(FLASHINFER, "0.7.1", &WheelRules::default());
        assert_eq!(plain.newer, ["0.7.2", "0.7.2.post1", "0.7.4"]);
        assert_eq!(plain.skipped.len(), 1);
        assert!(
            plain.skipped[0].starts_with("3 pre- or dev release(s)"),
            "{}",
            plain.skipped[0]
        );
        assert!(plain.skipped[0].contains("--pre"));
        let pre = WheelRules {
            pre: true,
            ..WheelRules::default()
        };
        let all = moves(FLASHINFER, "0.7.1", &pre);
        assert_eq!(
            all.newer,
            [
                "0.7.2rc3",
                "0.7.2rc5",
                "0.7.2rc6",
                "0.7.2",
                "0.7.2.post1",
                "0.7.4"
            ]
        );
        // A pin on a release candidate moves to the release, not to the next candidate.
        let from_rc = moves(FLASHINFER, "0.7.2rc3", &WheelRules::default());
        assert_eq!(from_rc.newer, ["0.7.2", "0.7.2.post1", "0.7.4"]);
    }

    #[test]
    fn a_local_label_is_a_flavour_that_a_pin_keeps() {
        let cuda = moves(TORCH_CUDA, "2.6.0+cu126", &WheelRules::default());
        assert_eq!(cuda.newer, ["2.7.0+cu126", "2.7.1+cu126", "2.8.0+cu126"]);
        let other = cuda.skipped.iter().find(|s| s.contains("flavour")).unwrap();
        assert!(
            other.contains("+rocm6.4") && other.contains("+cu128") && other.contains("+cu126"),
            "{other}"
        );
        // The nightly and the release candidate of the same flavour wait for --pre.
        assert!(
            cuda.skipped.iter().any(|s| s.starts_with("2 pre- or dev")),
            "{:?}",
            cuda.skipped
        );
        let rocm = moves(TORCH_CUDA, "2.6.0+rocm6.2.4", &WheelRules::default());
        assert!(
            rocm.newer.is_empty(),
            "ROCm 6.2.4 builds stop at 2.6.0: {:?}",
            rocm.newer
        );
        // A pin without a label takes only versions without one.
        let bare = moves(TORCH_CUDA, "2.6.0", &WheelRules::default());
        assert!(bare.newer.is_empty());
        // Labels compare as PEP 440 normalises them.
        let upper = moves(TORCH_CUDA, "2.6.0+CU126", &WheelRules::default());
        assert_eq!(upper.newer, cuda.newer);
    }

    #[test]
    fn the_operator_names_the_flavours_to_cross_to() {
        let rules = |glob: &str, pre: bool| WheelRules {
            pre,
            local: Some(glob.into()),
        };
        let cu12 = moves(TORCH_CUDA, "2.6.0+cu126", &rules("cu12*", false));
        assert_eq!(cu12.newer.last().map(String::as_str), Some("2.8.0+cu129"));
        assert!(cu12.newer.iter().all(|v| v.contains("+cu12")));
        // The same release in another flavour is a move when flavours are named.
        assert_eq!(
            moves(TORCH_CUDA, "2.8.0+cu126", &rules("cu129", false)).newer,
            ["2.8.0+cu129"]
        );
        let nightly = moves(TORCH_CUDA, "2.8.0+cu128", &rules("cu128", true));
        assert_eq!(nightly.newer, ["2.9.0.dev20250801+cu128"]);
        let bare = moves(TORCH_CUDA, "2.6.0+cu126", &rules("", false));
        assert!(bare.newer.is_empty());
    }

    #[test]
    fn epochs_and_equal_spellings_follow_pep440() {
        let listed: Vec<String> = ["3.0", "1!1.0", "2.0", "2.0.0", "3.0.0"]
            .map(String::from)
            .into();
        let found = wheel_moves(&listed, "2.0", &WheelRules::default()).unwrap();
        assert_eq!(found.newer, ["3.0", "1!1.0"]);
        let error = wheel_moves(&listed, "latest", &WheelRules::default()).unwrap_err();
        assert!(
            error.contains("`latest` is not a PEP 440 version"),
            "{error}"
        );
        let odd: Vec<String> = ["2.1", "not-a-version"].map(String::from).into();
        let found = wheel_moves(&odd, "2.0", &WheelRules::default()).unwrap();
        assert_eq!(found.newer, ["2.1"]);
        assert!(found.skipped[0].contains("not-a-version"));
    }
}
