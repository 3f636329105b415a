//! Criterion benchmarks of one pick and of the prefix index.

fn main() {}
