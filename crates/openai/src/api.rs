//! Which OpenAI API a request path names.

use std::fmt;

use crate::error::ApiError;

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

/// What a front door (the gateway, the global router) does with a request, by method and path.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// `POST` on an API path: read the body and route it by its model.
    Api(ApiKind),
    /// `GET /v1/models` (or `HEAD`, answered as `GET` without the body): answer with the
    /// served models.
    Models,
    /// `GET /v1/models/{model}` (or `HEAD`): answer with that model's entry, as OpenAI's
    /// "retrieve model" does ([`model_id`] reads the name from the path).
    Model,
    /// `OPTIONS` on a path the front door serves, or `OPTIONS *` (the server as a whole): answer
    /// 204 with `Allow: {allow}` (RFC 9110 §9.3.7). The answer depends on the path alone, so a
    /// front door gives it before authentication (a browser's CORS preflight carries no
    /// credentials).
    Options {
        /// The methods the target takes, `OPTIONS` included: the `Allow` header's value.
        allow: &'static str,
    },
}

/// The methods an API path takes: the `Allow` of its `OPTIONS` and of its 405.
const API_METHODS: &str = "POST, OPTIONS";
/// The methods the model list and a model take.
const MODELS_METHODS: &str = "GET, HEAD, OPTIONS";
/// Every method a front door serves somewhere: the `Allow` of `OPTIONS *`.
const SERVER_METHODS: &str = "GET, HEAD, POST, OPTIONS";

/// The model a `/v1/models/{model}` (or `/models/{model}`) path names, percent-decoded; the
/// rest of the path is the name, slashes included (`/v1/models/meta-llama/Llama-3.1-8B` names
/// `meta-llama/Llama-3.1-8B`, as the `openai` SDKs put it in the path). `None` for any other
/// path, for the list itself (`/v1/models/`) and for a name that is not UTF-8 once decoded.
pub fn model_id(path: &str) -> Option<std::borrow::Cow<'_, str>> {
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    let rest = path
        .strip_prefix("/v1/models/")
        .or_else(|| path.strip_prefix("/models/"))?;
    if rest.is_empty() {
        return None;
    }
    percent_encoding::percent_decode_str(rest)
        .decode_utf8()
        .ok()
}

impl Route {
    /// Routes a request: an API path takes `POST`, the model list (`/v1/models`, `/v1/models/`,
    /// `/models`) and a model (`/v1/models/{model}`) `GET` and `HEAD` (RFC 9110 §9.3.2: a server
    /// answers `HEAD` wherever it answers `GET`; the HTTP layer leaves the body out), and each of
    /// them `OPTIONS` ([`Route::Options`]), as does `*` (the request target of `OPTIONS *`,
    /// RFC 9112 §3.2.4). Another method on one of those is [`ApiError::MethodNotAllowed`] naming
    /// the ones allowed, `OPTIONS` included; any other path (and `*` with another method) is
    /// [`ApiError::NotFound`].
    pub fn of(method: &str, path: &str) -> Result<Route, ApiError> {
        let (route, takes, allowed) = match ApiKind::from_path(path) {
            Some(kind) => (Route::Api(kind), method == "POST", API_METHODS),
            None if matches!(path, "/v1/models" | "/v1/models/" | "/models") => (
                Route::Models,
                matches!(method, "GET" | "HEAD"),
                MODELS_METHODS,
            ),
            None if model_id(path).is_some() => (
                Route::Model,
                matches!(method, "GET" | "HEAD"),
                MODELS_METHODS,
            ),
            None if path == "*" && method == "OPTIONS" => {
                return Ok(Route::Options {
                    allow: SERVER_METHODS,
                });
            }
            None => {
                return Err(ApiError::NotFound {
                    path: path.chars().take(200).collect(),
                });
            }
        };
        if takes {
            Ok(route)
        } else if method == "OPTIONS" {
            Ok(Route::Options { allow: allowed })
        } else {
            Err(ApiError::MethodNotAllowed {
                method: method.to_owned(),
                allowed,
            })
        }
    }
}

/// Refuses a compressed request body. `value` is the request's `Content-Encoding` header, if
/// any: none, or only `identity` codings, pass; any other coding (`gzip`, `br`, …) is
/// [`ApiError::UnsupportedEncoding`] — the front doors read the body as JSON to route it, and
/// model servers take request bodies uncompressed, so a compressed one would otherwise be
/// refused as invalid JSON, or forwarded to a server that cannot read it.
pub fn check_content_encoding(value: Option<&[u8]>) -> Result<(), ApiError> {
    match value {
        Some(v) if !only_coding(v, b"identity") => Err(ApiError::UnsupportedEncoding {
            encoding: echoed(v),
        }),
        _ => Ok(()),
    }
}

/// Whether every comma-separated coding of a header `value` is `allowed` (ASCII case ignored)
/// or empty.
fn only_coding(value: &[u8], allowed: &[u8]) -> bool {
    value.split(|b| *b == b',').all(|coding| {
        let coding = coding.trim_ascii();
        coding.is_empty() || coding.eq_ignore_ascii_case(allowed)
    })
}

/// A header value as an error names it: lossy UTF-8, at most 100 characters.
fn echoed(value: &[u8]) -> String {
    String::from_utf8_lossy(value).chars().take(100).collect()
}

/// Refuses a request body sent with a transfer coding other than `chunked`. `value` is the
/// request's `Transfer-Encoding` header, if any (HTTP/1.1 only; hyper already refuses one that
/// does not end in `chunked`, and drops `Content-Length` when it is present, so callers need
/// to look only when the request declared no length): `chunked` alone passes; anything else
/// (`gzip, chunked`) is [`ApiError::UnsupportedTransferEncoding`], which RFC 9112 suggests
/// answering with 501 — decoded as plain chunks, the body would fail as JSON without saying why.
pub fn check_transfer_encoding(value: Option<&[u8]>) -> Result<(), ApiError> {
    match value {
        Some(v) if !only_coding(v, b"chunked") => {
            Err(ApiError::UnsupportedTransferEncoding { coding: echoed(v) })
        }
        _ => Ok(()),
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
    fn only_an_uncompressed_body_passes() {
        for ok in [
            None,
            Some(&b"identity"[..]),
            Some(b"Identity"),
            Some(b" identity , "),
            Some(b""),
        ] {
            assert!(check_content_encoding(ok).is_ok(), "{ok:?}");
        }
        for bad in [&b"gzip"[..], b"identity, gzip", b"br", b"x-gzip"] {
            let e = check_content_encoding(Some(bad)).unwrap_err();
            assert_eq!(e.status(), 415);
            assert!(
                e.to_string().contains(&*String::from_utf8_lossy(bad)),
                "{e}"
            );
        }
    }

    #[test]
    fn only_chunked_transfer_coding_passes() {
        for ok in [
            None,
            Some(&b"chunked"[..]),
            Some(b"Chunked"),
            Some(b" chunked "),
        ] {
            assert!(check_transfer_encoding(ok).is_ok(), "{ok:?}");
        }
        for bad in [
            &b"gzip, chunked"[..],
            b"deflate,chunked",
            b"x-custom, chunked",
        ] {
            let e = check_transfer_encoding(Some(bad)).unwrap_err();
            assert_eq!(e.status(), 501);
            assert_eq!(e.metric_label(), "unsupported_transfer_encoding");
            assert!(
                e.to_string().contains(&*String::from_utf8_lossy(bad)),
                "{e}"
            );
        }
    }

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

    #[test]
    fn a_known_path_with_the_wrong_method_names_the_right_one() {
        assert_eq!(
            Route::of("POST", "/v1/chat/completions").ok(),
            Some(Route::Api(ApiKind::ChatCompletions))
        );
        assert_eq!(Route::of("GET", "/v1/models").ok(), Some(Route::Models));
        assert_eq!(
            Route::of("GET", "/v1/models/llama").ok(),
            Some(Route::Model)
        );
        assert_eq!(Route::of("HEAD", "/models/llama").ok(), Some(Route::Model));
        assert_eq!(
            Route::of("DELETE", "/v1/models/llama")
                .unwrap_err()
                .status(),
            405
        );
        assert_eq!(model_id("/v1/models/llama").as_deref(), Some("llama"));
        assert_eq!(
            model_id("/v1/models/meta-llama/Llama-3.1-8B?x=1").as_deref(),
            Some("meta-llama/Llama-3.1-8B")
        );
        assert_eq!(
            model_id("/v1/models/meta-llama%2FLlama%203").as_deref(),
            Some("meta-llama/Llama 3")
        );
        assert_eq!(model_id("/v1/models/"), None);
        assert_eq!(model_id("/v1/models/%FF"), None);
        assert_eq!(model_id("/v1/chat/completions"), None);
        assert_eq!(Route::of("GET", "/models").ok(), Some(Route::Models));
        assert_eq!(Route::of("HEAD", "/v1/models").ok(), Some(Route::Models));
        assert!(Route::of("HEAD", "/v1/chat/completions").is_err());
        for (method, path, allowed) in [
            ("GET", "/v1/chat/completions", "POST, OPTIONS"),
            ("POST", "/v1/models", "GET, HEAD, OPTIONS"),
            ("DELETE", "/v1/models/", "GET, HEAD, OPTIONS"),
            ("PUT", "/v1/models/llama", "GET, HEAD, OPTIONS"),
        ] {
            let e = Route::of(method, path).unwrap_err();
            assert_eq!((e.status(), e.allow()), (405, Some(allowed)), "{e}");
            assert!(
                e.to_string().contains(&format!("which takes {allowed}")),
                "{e}"
            );
        }
        let e = Route::of("POST", "/v2/whatever").unwrap_err();
        assert_eq!((e.status(), e.allow()), (404, None));
    }

    /// `OPTIONS` names, for each target, the methods its other requests route with (and for
    /// `*` every one of them), the same list a 405 there names.
    #[test]
    fn options_names_the_methods_the_target_takes() {
        for (path, allow) in [
            ("*", "GET, HEAD, POST, OPTIONS"),
            ("/v1/chat/completions", "POST, OPTIONS"),
            ("/v1/embeddings/?x=1", "POST, OPTIONS"),
            ("/v1/models", "GET, HEAD, OPTIONS"),
            ("/models", "GET, HEAD, OPTIONS"),
            ("/v1/models/meta-llama/Llama-3.1-8B", "GET, HEAD, OPTIONS"),
        ] {
            assert_eq!(
                Route::of("OPTIONS", path).ok(),
                Some(Route::Options { allow }),
                "{path}"
            );
            if path == "*" {
                // The asterisk form is for `OPTIONS` alone (RFC 9112 §3.2.4).
                continue;
            }
            let taken: Vec<&str> = allow.split(", ").collect();
            for method in ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH"] {
                match Route::of(method, path) {
                    Ok(_) => assert!(taken.contains(&method), "{method} {path}"),
                    Err(e) => {
                        assert!(!taken.contains(&method), "{method} {path}");
                        assert_eq!(
                            (e.status(), e.allow()),
                            (405, Some(allow)),
                            "{method} {path}"
                        );
                    }
                }
            }
        }
        for (method, path) in [("OPTIONS", "/v2/whatever"), ("OPTIONS", ""), ("GET", "*")] {
            let e = Route::of(method, path).unwrap_err();
            assert_eq!((e.status(), e.allow()), (404, None), "{method} {path}");
        }
    }
}
