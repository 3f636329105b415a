//! Envoy ext_proc server: body-based router and endpoint picker.
