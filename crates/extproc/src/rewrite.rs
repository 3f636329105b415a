//! Model-name rewriting on the response path: [`ModelRewriter`], shared with the standalone
//! gateway (it lives in `infergate-openai`, beside the request-side `rewrite_model`).

pub use infergate_openai::rewrite::ModelRewriter;
