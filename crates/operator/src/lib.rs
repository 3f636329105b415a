//! The infergate Kubernetes operator.
