//! Where the operator works: every namespace (the default, with a ClusterRole), or only the
//! namespaces `--watch-namespaces` lists (with a Role in each of them).
//!
//! In a list of namespaces every watch, list, read and write, the start-up check and the
//! uninstall path go through namespaced API paths for exactly those namespaces: a config
//! elsewhere is never seen, and nothing asks the API server for a path across namespaces, which
//! the namespaced Roles would refuse.

use std::collections::BTreeSet;
use std::fmt;

use kube::core::NamespaceResourceScope;
use kube::{Api, Client, Resource};

/// Longest namespace name (a DNS-1123 label).
const MAX_NAMESPACE_LEN: usize = 63;

/// The namespaces the operator watches and writes in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum WatchScope {
    /// Every namespace of the cluster (a ClusterRole grants the operator's rules).
    #[default]
    Cluster,
    /// Only these namespaces, never empty (a Role in each grants the operator's rules).
    Namespaces(BTreeSet<String>),
}

/// Why a `--watch-namespaces` entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    /// An empty entry (`--watch-namespaces=` or `a,,b`).
    #[error(
        "an empty namespace name: list namespaces separated by commas, or leave the flag out to watch every namespace"
    )]
    Empty,
    /// Not a DNS-1123 label, so no namespace can have it.
    #[error(
        "`{0}` is not a namespace name (at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit)"
    )]
    NotAName(String),
}

impl WatchScope {
    /// The scope of `names`: every namespace when there are none, else exactly those (a name
    /// given twice counts once). Each name must be a namespace name ([`check_namespace`]).
    pub fn from_names(names: impl IntoIterator<Item = String>) -> Result<Self, ScopeError> {
        let mut set = BTreeSet::new();
        for name in names {
            check_namespace(&name)?;
            set.insert(name);
        }
        Ok(if set.is_empty() {
            Self::Cluster
        } else {
            Self::Namespaces(set)
        })
    }

    /// What the operator addresses one by one: `[None]` (every namespace at once) or each
    /// namespace, in order.
    pub fn targets(&self) -> Vec<Option<String>> {
        match self {
            Self::Cluster => vec![None],
            Self::Namespaces(set) => set.iter().cloned().map(Some).collect(),
        }
    }

    /// Whether the config in namespace `ns` is the operator's.
    pub fn contains(&self, ns: &str) -> bool {
        match self {
            Self::Cluster => true,
            Self::Namespaces(set) => set.contains(ns),
        }
    }
}

impl fmt::Display for WatchScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cluster => f.write_str("every namespace"),
            Self::Namespaces(set) => {
                let names: Vec<&str> = set.iter().map(String::as_str).collect();
                write!(f, "namespaces {}", names.join(", "))
            }
        }
    }
}

/// An API of `K` in namespace `ns`, or across every namespace with `None`.
pub fn api_in<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// `in namespace NS`, or `in every namespace` for `None`: where an API call of [`api_in`] went.
pub fn where_(ns: Option<&str>) -> String {
    match ns {
        Some(ns) => format!("in namespace {ns}"),
        None => "in every namespace".to_owned(),
    }
}

/// Whether `name` can be a namespace's name (a DNS-1123 label): the flag's entries are checked
/// at start, since a misspelt one would only ever watch nothing.
pub fn check_namespace(name: &str) -> Result<(), ScopeError> {
    if name.is_empty() {
        return Err(ScopeError::Empty);
    }
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if name.len() > MAX_NAMESPACE_LEN
        || !name.chars().all(ok_char)
        || !edge(name.chars().next())
        || !edge(name.chars().last())
    {
        return Err(ScopeError::NotAName(name.to_owned()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

    use super::*;

    #[test]
    fn no_names_is_every_namespace_and_names_are_kept_once_in_order() {
        assert_eq!(WatchScope::from_names([]).unwrap(), WatchScope::Cluster);
        assert_eq!(WatchScope::Cluster.targets(), vec![None]);
        let scope =
            WatchScope::from_names(["team-b", "team-a", "team-b"].map(String::from)).unwrap();
        assert_eq!(
            scope.targets(),
            vec![Some("team-a".to_owned()), Some("team-b".to_owned())]
        );
        assert_eq!(scope.to_string(), "namespaces team-a, team-b");
        assert!(scope.contains("team-a") && !scope.contains("team-c"));
        assert!(WatchScope::Cluster.contains("anything"));
    }

    #[test]
    fn what_cannot_be_a_namespace_is_refused_by_name() {
        assert_eq!(
            WatchScope::from_names(["a".to_owned(), String::new()]),
            Err(ScopeError::Empty)
        );
        for bad in ["Team-A", "-a", "a-", "a_b", "a.b", "a b", &"a".repeat(64)] {
            assert_eq!(
                check_namespace(bad),
                Err(ScopeError::NotAName(bad.to_owned())),
                "{bad}"
            );
        }
        for good in ["a", "0", "team-a", "a1-2b", &"a".repeat(63)] {
            assert_eq!(check_namespace(good), Ok(()), "{good}");
        }
        let text = ScopeError::NotAName("Team-A".to_owned()).to_string();
        assert!(text.contains("`Team-A` is not a namespace name"), "{text}");
    }
}
