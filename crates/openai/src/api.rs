//! Which OpenAI API a request path names.

use std::fmt;

/// The OpenAI APIs infergate understands. The path decides, as in the reference endpoint picker.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ApiKind {
    /// `POST /v1/chat/completions`.
    ChatCompletions,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/responses`.
    Responses,
    /// `POST /v1/embeddings`.
    Embeddings,
}

impl ApiKind {
    /// Every kind, in a stable order.
    pub const ALL: [ApiKind; 4] = [
        ApiKind::ChatCompletions,
        ApiKind::Completions,
        ApiKind::Responses,
        ApiKind::Embeddings,
    ];

    /// The canonical path, e.g. `/v1/chat/completions`.
    pub const fn path(self) -> &'static str {
        match self {
            ApiKind::ChatCompletions => "/v1/chat/completions",
            ApiKind::Completions => "/v1/completions",
            ApiKind::Responses => "/v1/responses",
            ApiKind::Embeddings => "/v1/embeddings",
        }
    }

    /// A short label for metrics and logs.
    pub const fn label(self) -> &'static str {
        match self {
            ApiKind::ChatCompletions => "chat_completions",
            ApiKind::Completions => "completions",
            ApiKind::Responses => "responses",
            ApiKind::Embeddings => "embeddings",
        }
    }

    /// The API a request path names, ignoring any query string and one trailing slash.
    /// `None` for every other path.
    pub fn from_path(path: &str) -> Option<ApiKind> {
        let path = path.split_once('?').map_or(path, |(p, _)| p);
        let path = path.strip_suffix('/').unwrap_or(path);
        ApiKind::ALL.into_iter().find(|k| k.path() == path)
    }

    /// Whether responses of this API produce tokens (and so have a time to first token).
    pub const fn generates(self) -> bool {
        !matches!(self, ApiKind::Embeddings)
    }
}

impl fmt::Display for ApiKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_kinds() {
        for k in ApiKind::ALL {
            assert_eq!(ApiKind::from_path(k.path()), Some(k));
        }
        assert_eq!(
            ApiKind::from_path("/v1/chat/completions?x=1"),
            Some(ApiKind::ChatCompletions)
        );
        assert_eq!(
            ApiKind::from_path("/v1/completions/"),
            Some(ApiKind::Completions)
        );
        assert_eq!(ApiKind::from_path("/v1/models"), None);
        assert_eq!(ApiKind::from_path("/v1/chat/completionsX"), None);
        assert_eq!(ApiKind::from_path(""), None);
    }
}
