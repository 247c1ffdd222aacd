//! Images on the machine hallmark runs on: the content-addressed layer store and what
//! hallmark recorded in it, moving images between an engine and the store, and the turns
//! commands take on shared state.
//!
//! Layer: above `inputs`, `engine` and `oci`; below `plan`, `make`, `ship` and the commands.

pub mod attest;
pub mod identity;
pub mod store;
pub mod transfer;
pub mod turn;
