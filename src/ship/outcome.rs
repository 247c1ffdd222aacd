//! What a distribute did at one node, as `--json` and the table report it.

use crate::output::{self, Column};
use serde::{Serialize, Serializer};

/// What crossed the wire to a node.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Transfer {
    /// Layer bytes sent (what the node lacked); `archive_bytes` adds the metadata.
    pub layer_bytes: u64,
    pub archive_bytes: u64,
    pub layers_sent: usize,
    /// A thin archive was refused and a full one sent instead (remembered for next time).
    pub fell_back_to_full: bool,
    /// The engine took the image but not all of its content (a containerd store that had
    /// unpacked a layer without keeping its blob under the digest the manifest names), and
    /// an archive with every layer completed it in the same run.
    pub completed: bool,
}

/// What a node got. All but `Failed` mean the node now holds the image, verified.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// It held the image already.
    Skipped,
    /// An archive with only the layers it lacked.
    Thin(Transfer),
    /// An archive with every layer.
    Full(Transfer),
    /// The image from a registry (and, if it could not read all of it, the layers it lacked
    /// from the layer store).
    Pulled(Transfer),
    /// It does not hold the image; `transfer` is what was sent before that was found.
    Failed { error: String, transfer: Transfer },
    /// SIGINT or SIGTERM arrived before the node's shipment ended: what it holds is not
    /// known (`hallmark verify` says), and nothing it held was removed.
    Interrupted,
}

impl Action {
    /// Its name in `--json` and in the table.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Skipped => "skipped",
            Action::Thin(_) => "thin",
            Action::Full(_) => "full",
            Action::Pulled(_) => "pulled",
            Action::Failed { .. } => "failed",
            Action::Interrupted => "interrupted",
        }
    }

    /// What crossed the wire (nothing for a skipped node).
    pub fn transfer(&self) -> Transfer {
        match self {
            Action::Skipped | Action::Interrupted => Transfer::default(),
            Action::Thin(t) | Action::Full(t) | Action::Pulled(t) => *t,
            Action::Failed { transfer, .. } => *transfer,
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

#[derive(Debug, Clone)]
pub struct NodeOutcome {
    pub node: String,
    pub action: Action,
    pub seconds: f64,
}

impl NodeOutcome {
    pub fn new(node: &str, action: Action) -> NodeOutcome {
        NodeOutcome {
            node: node.to_string(),
            action,
            seconds: 0.0,
        }
    }

    pub fn failed(node: &str, error: String) -> NodeOutcome {
        let transfer = Transfer::default();
        NodeOutcome::new(node, Action::Failed { error, transfer })
    }

    /// Whether the node now holds the image (checked by label and content fingerprint).
    pub fn verified(&self) -> bool {
        !matches!(self.action, Action::Failed { .. } | Action::Interrupted)
    }

    pub fn error(&self) -> Option<&str> {
        match &self.action {
            Action::Failed { error, .. } => Some(error),
            _ => None,
        }
    }

    pub fn archive_bytes(&self) -> u64 {
        self.action.transfer().archive_bytes
    }
}

/// The outcomes a distribute has settled so far, by image reference and node: what an
/// interrupted distribute reports for the nodes it finished (the others are `interrupted`),
/// so the operator sees that a re-run has only those left to do.
#[derive(Debug, Default)]
pub struct Settled(std::sync::Mutex<Vec<(String, NodeOutcome)>>);

impl Settled {
    pub fn note(&self, reference: &str, outcome: &NodeOutcome) {
        let mut settled = self.0.lock().unwrap_or_else(|e| e.into_inner());
        settled.push((reference.to_string(), outcome.clone()));
    }

    /// `node`'s outcome for the image `reference`, if it was settled.
    pub fn of(&self, reference: &str, node: &str) -> Option<NodeOutcome> {
        let settled = self.0.lock().unwrap_or_else(|e| e.into_inner());
        (settled.iter().rev())
            .find(|(r, o)| r == reference && o.node == node)
            .map(|(_, o)| o.clone())
    }
}

/// One node's row of `distribute --json`: the fields and names scripts read.
#[derive(Serialize)]
struct Row<'a> {
    node: &'a str,
    /// `skipped`, `thin`, `full`, `pulled` (from a registry), `failed` or `interrupted`.
    action: &'static str,
    layer_bytes: u64,
    archive_bytes: u64,
    layers_sent: usize,
    seconds: f64,
    verified: bool,
    fell_back_to_full: bool,
    completed: bool,
    error: Option<&'a str>,
}

impl Serialize for NodeOutcome {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let transfer = self.action.transfer();
        Row {
            node: &self.node,
            action: self.action.name(),
            layer_bytes: transfer.layer_bytes,
            archive_bytes: transfer.archive_bytes,
            layers_sent: transfer.layers_sent,
            seconds: self.seconds,
            verified: self.verified(),
            fell_back_to_full: transfer.fell_back_to_full,
            completed: transfer.completed,
            error: self.error(),
        }
        .serialize(serializer)
    }
}

/// One image's outcome on every node, in the cluster file's order.
#[derive(Serialize)]
pub struct Shipped {
    pub image: String,
    pub nodes: Vec<NodeOutcome>,
    pub reference: String,
}

impl output::Row for Shipped {
    fn columns() -> Option<&'static [Column]> {
        const COLUMNS: [Column; 7] = [
            Column::left("image", 12),
            Column::left("node", 10),
            Column::left("action", 8),
            Column::right("bytes sent", 12),
            Column::right("seconds", 8),
            Column::right("verified", 9),
            Column::left("error", 0),
        ];
        Some(&COLUMNS)
    }

    fn cells(&self) -> Vec<Vec<String>> {
        self.nodes
            .iter()
            .map(|o| {
                vec![
                    self.image.clone(),
                    o.node.clone(),
                    o.action.name().to_string(),
                    o.archive_bytes().to_string(),
                    format!("{:.2}", o.seconds),
                    if o.verified() { "yes" } else { "no" }.to_string(),
                    o.error().unwrap_or("").to_string(),
                ]
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `distribute --json` is read by scripts: each action keeps the row it had when the
    /// outcome was a struct of strings and flags (field names, order and values).
    #[test]
    fn each_action_keeps_its_json_row() {
        let sent = Transfer {
            layer_bytes: 10,
            archive_bytes: 12,
            layers_sent: 1,
            fell_back_to_full: true,
            completed: false,
        };
        let row = |action: Action| {
            let outcome = NodeOutcome {
                seconds: 1.5,
                ..NodeOutcome::new("node1", action)
            };
            serde_json::to_string(&outcome).unwrap()
        };
        let rest = |action: &str, verified: bool, fell_back: bool, error: &str| {
            format!(
                r#"{{"node":"node1","action":"{action}","layer_bytes":{},"archive_bytes":{},"layers_sent":{},"seconds":1.5,"verified":{verified},"fell_back_to_full":{fell_back},"completed":false,"error":{error}}}"#,
                if action == "skipped" { 0 } else { 10 },
                if action == "skipped" { 0 } else { 12 },
                if action == "skipped" { 0 } else { 1 },
            )
        };
        assert_eq!(row(Action::Skipped), rest("skipped", true, false, "null"));
        assert_eq!(row(Action::Thin(sent)), rest("thin", true, true, "null"));
        assert_eq!(row(Action::Full(sent)), rest("full", true, true, "null"));
        assert_eq!(
            row(Action::Pulled(sent)),
            rest("pulled", true, true, "null")
        );
        let failed = Action::Failed {
            error: "gone".into(),
            transfer: sent,
        };
        assert_eq!(row(failed), rest("failed", false, true, r#""gone""#));
        assert_eq!(
            serde_json::to_string(&NodeOutcome::failed("node1", "x".into())).unwrap(),
            r#"{"node":"node1","action":"failed","layer_bytes":0,"archive_bytes":0,"layers_sent":0,"seconds":0.0,"verified":false,"fell_back_to_full":false,"completed":false,"error":"x"}"#
        );
        assert_eq!(format!("[{:<8}]", Action::Skipped), "[skipped ]");
    }
}
