//! End-to-end tests live beside this file; see `[[test]]` in Cargo.toml.
