//! What ships beside the code: the chart, the image, the docs, the quick
//! start and the alert rules. Each module was a test file of its own; one
//! binary per concern.

#[path = "../common/mod.rs"]
mod common;

mod dockerfile;
mod docs;
mod helm;
mod monitoring;
mod quickstart;
