//! Workload generators, scenario runner and reports.
