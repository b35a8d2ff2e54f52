//! Faults on either side, and the watch guarantees under them: restarts,
//! compactions, partitions, budgets. Each module was a test file of its
//! own; one binary per concern.

#[path = "../common/mod.rs"]
mod common;

mod budget;
mod guarantees;
mod resilience;
