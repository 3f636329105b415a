//! Parse benchmark.
fn main() {}
