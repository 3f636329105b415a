//! The model's own tokenizer, in process: a request's prompt token ids exactly as vLLM computes
//! them, so that precise prefix-cache routing can match them against the token blocks each pod
//! reports holding in its KV-cache events.
//!
//! [`ModelTokenizer`] loads a Hugging Face tokenizer directory (`tokenizer.json`,
//! `tokenizer_config.json`, and `chat_template.jinja` where newer transformers saves the template;
//! a mounted ConfigMap is such a directory) or explicit files ([`TokenizerFiles`]), and encodes:
//! - a completions prompt as vLLM's `/v1/completions` does: the tokenizer with its special tokens
//!   (`add_special_tokens=True`, so a BOS where the tokenizer's post-processor adds one);
//! - a chat request as vLLM's `/v1/chat/completions` does: the messages converted as vLLM
//!   converts them, the chat template rendered as transformers renders it (generation prompt,
//!   `bos_token`/`eos_token`, ...), and the text encoded without special tokens (vLLM 0.32:
//!   `renderers/online_renderer.py` renders with `tokenize=False`, then tokenizes with the
//!   request's `add_special_tokens`, false by default).
//!
//! Ids go into a caller's `Vec<u32>`, so a hot path can keep one buffer per worker. The type is
//! `Send + Sync` and encodes through `&self`; inputs are bounded by [`Limits`].
//!
//! Layout:
//! - [`chat`] — [`ChatRequest`] / [`ChatMessage`] (the OpenAI shapes), vLLM's message conversion,
//!   [`ContentFormat`] and its detection.
//! - `template` — the chat template environment (transformers' Jinja settings and globals).
//! - [`error`] — [`Error`].

pub mod chat;
pub mod error;
mod template;

use std::path::{Path, PathBuf};

pub use chat::{ChatMessage, ChatRequest, Content, ContentFormat, ContentPart};
pub use error::Error;

use template::ChatTemplate;

/// Bounds on what one request may make the tokenizer do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes of text to encode: the prompt, the messages' text, and the rendered chat.
    pub max_input_bytes: usize,
    /// Most tokens a prompt may have.
    pub max_tokens: usize,
}

impl Default for Limits {
    /// 4 MiB of text and 262,144 tokens: above any context window served today, so only
    /// hostile input is refused.
    fn default() -> Self {
        Self {
            max_input_bytes: 4 << 20,
            max_tokens: 262_144,
        }
    }
}

/// Loading options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    /// Input bounds.
    pub limits: Limits,
    /// The template's content format; `None` detects it as vLLM does
    /// ([`chat::detect_content_format`]). Set it where the engine runs with
    /// `--chat-template-content-format`.
    pub content_format: Option<ContentFormat>,
}

/// The files a tokenizer is loaded from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizerFiles {
    /// `tokenizer.json` (required).
    pub tokenizer_json: PathBuf,
    /// `tokenizer_config.json`: special tokens and, in the older layout, `chat_template`.
    pub tokenizer_config: Option<PathBuf>,
    /// `special_tokens_map.json` (older layout): special tokens the config does not name.
    pub special_tokens_map: Option<PathBuf>,
    /// A chat template file (`chat_template.jinja`); it takes precedence over the config's.
    pub chat_template: Option<PathBuf>,
}

impl TokenizerFiles {
    /// The files of a Hugging Face directory: `tokenizer.json` must exist, the others are used
    /// when present.
    pub fn in_dir(dir: &Path) -> Result<Self, Error> {
        if !dir.exists() {
            return Err(Error::NoDirectory {
                dir: dir.to_owned(),
            });
        }
        if !dir.is_dir() {
            return Err(Error::NotADirectory {
                path: dir.to_owned(),
            });
        }
        let tokenizer_json = dir.join("tokenizer.json");
        if !tokenizer_json.is_file() {
            return Err(Error::NoTokenizerJson {
                dir: dir.to_owned(),
            });
        }
        let present = |name: &str| Some(dir.join(name)).filter(|p| p.is_file());
        Ok(Self {
            tokenizer_json,
            tokenizer_config: present("tokenizer_config.json"),
            special_tokens_map: present("special_tokens_map.json"),
            chat_template: present("chat_template.jinja"),
        })
    }
}

/// The special-token variables transformers gives a chat template (`special_tokens_map`).
const SPECIAL_KEYS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// A model's tokenizer and chat template. `Send + Sync`; every method takes `&self`.
#[derive(Debug)]
pub struct ModelTokenizer {
    tokenizer: tokenizers::Tokenizer,
    template: Option<ChatTemplate>,
    content_format: ContentFormat,
    knows_developer: bool,
    limits: Limits,
}

impl ModelTokenizer {
    /// Loads a Hugging Face tokenizer directory (or a mounted ConfigMap holding its files).
    pub fn from_dir(dir: impl AsRef<Path>, options: Options) -> Result<Self, Error> {
        Self::from_files(&TokenizerFiles::in_dir(dir.as_ref())?, options)
    }

    /// Loads from explicit files.
    pub fn from_files(files: &TokenizerFiles, options: Options) -> Result<Self, Error> {
        let bytes = read(&files.tokenizer_json)?;
        let tokenizer =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|source| Error::TokenizerJson {
                path: files.tokenizer_json.clone(),
                source,
            })?;
        let config = match &files.tokenizer_config {
            Some(p) => Some((p, read_json(p)?)),
            None => None,
        };
        let map = match &files.special_tokens_map {
            Some(p) => Some((p, read_json(p)?)),
            None => None,
        };
        let mut specials = Vec::new();
        for key in SPECIAL_KEYS {
            let from_config = match &config {
                Some((p, c)) => token_string(p, c, key)?,
                None => None,
            };
            let found = match (from_config, &map) {
                (Some(t), _) => Some(t),
                (None, Some((p, m))) => token_string(p, m, key)?,
                (None, None) => None,
            };
            if let Some(t) = found {
                specials.push((key, t));
            }
        }
        let source = match (&files.chat_template, &config) {
            (Some(p), _) => Some((String::from_utf8_lossy(&read(p)?).into_owned(), p.clone())),
            (None, Some((p, c))) => config_template(p, c)?.map(|t| (t, (*p).clone())),
            (None, None) => None,
        };
        let template = match source {
            Some((src, origin)) => Some(ChatTemplate::new(
                src,
                &origin.display().to_string(),
                specials,
            )?),
            None => None,
        };
        let content_format = options.content_format.unwrap_or_else(|| {
            template.as_ref().map_or(ContentFormat::String, |t| {
                chat::detect_content_format(&t.source)
            })
        });
        let knows_developer = template
            .as_ref()
            .is_some_and(|t| chat::knows_developer(&t.source));
        Ok(Self {
            tokenizer,
            template,
            content_format,
            knows_developer,
            limits: options.limits,
        })
    }

    /// Encodes a `/v1/completions` prompt into `out` (cleared first). `add_special_tokens` is the
    /// request's field of that name (vLLM's default: true, which adds the tokenizer's BOS).
    pub fn encode_completion(
        &self,
        prompt: &str,
        add_special_tokens: bool,
        out: &mut Vec<u32>,
    ) -> Result<(), Error> {
        out.clear();
        self.encode_into(prompt, add_special_tokens, out)
    }

    /// Encodes a `/v1/chat/completions` request into `out` (cleared first): the template
    /// rendered, then encoded with the request's `add_special_tokens` (false by default).
    pub fn encode_chat(&self, request: &ChatRequest, out: &mut Vec<u32>) -> Result<(), Error> {
        out.clear();
        let text = self.render_chat(request)?;
        self.encode_into(&text, request.add_special_tokens, out)
    }

    /// The chat template rendered for `request`: the text vLLM tokenizes.
    pub fn render_chat(&self, request: &ChatRequest) -> Result<String, Error> {
        let template = self.template.as_ref().ok_or(Error::NoChatTemplate)?;
        request.check_supported()?;
        self.check_bytes(request.text_bytes())?;
        let messages = chat::conversation(request, self.content_format, self.knows_developer)?;
        let text = template.render(messages, request.add_generation_prompt)?;
        self.check_bytes(text.len())?;
        Ok(text)
    }

    /// Whether a chat template was loaded.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// The content format chat messages are given to the template in.
    pub fn content_format(&self) -> ContentFormat {
        self.content_format
    }

    /// The limits in force.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// The text of token ids, as vLLM's `/detokenize` decodes them (special tokens kept unless
    /// `skip_special_tokens`). Ids outside the vocabulary are skipped, as the library skips them:
    /// check them against [`vocab_size`](Self::vocab_size) first to refuse them.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, Error> {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|source| Error::Decode { source })
    }

    /// The vocabulary's string for token `id` (a byte-level piece such as `Ġworld`), as vLLM's
    /// `/tokenize` lists them with `return_token_strs`; `None` outside the vocabulary.
    pub fn token_str(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }

    fn check_bytes(&self, bytes: usize) -> Result<(), Error> {
        if bytes > self.limits.max_input_bytes {
            return Err(Error::InputTooLarge {
                bytes,
                limit: self.limits.max_input_bytes,
            });
        }
        Ok(())
    }

    fn encode_into(
        &self,
        text: &str,
        add_special_tokens: bool,
        out: &mut Vec<u32>,
    ) -> Result<(), Error> {
        self.check_bytes(text.len())?;
        // `encode_fast` skips the char offsets, which only the ids' positions in the text need.
        let encoding = self
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(|source| Error::Encode { source })?;
        let ids = encoding.get_ids();
        if ids.len() > self.limits.max_tokens {
            return Err(Error::TooManyTokens {
                tokens: ids.len(),
                limit: self.limits.max_tokens,
            });
        }
        out.extend_from_slice(ids);
        Ok(())
    }
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })
}

/// A side file's JSON: an object (a file holding anything else would have its settings
/// silently ignored).
fn read_json(path: &Path) -> Result<serde_json::Value, Error> {
    let value: serde_json::Value =
        serde_json::from_slice(&read(path)?).map_err(|source| Error::ConfigJson {
            path: path.to_owned(),
            source,
        })?;
    let found = match &value {
        serde_json::Value::Object(_) => return Ok(value),
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Null => "null",
    };
    Err(Error::ConfigNotObject {
        path: path.to_owned(),
        found,
    })
}

/// A special token in a config: a string, or an added-token object with `content`.
fn token_string(
    path: &Path,
    config: &serde_json::Value,
    key: &'static str,
) -> Result<Option<String>, Error> {
    match config.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(serde_json::Value::Object(o)) => match o.get("content") {
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(Error::ConfigField {
                path: path.to_owned(),
                field: key,
                expected: "a string or an object with a string `content`",
            }),
        },
        Some(_) => Err(Error::ConfigField {
            path: path.to_owned(),
            field: key,
            expected: "a string or an object with a string `content`",
        }),
    }
}

/// `chat_template` in `tokenizer_config.json`: a string, or a list of `{name, template}` of which
/// transformers uses `default` for a request without tools.
fn config_template(path: &Path, config: &serde_json::Value) -> Result<Option<String>, Error> {
    const EXPECTED: &str = "a string or a list of {\"name\", \"template\"} with a \"default\"";
    match config.get("chat_template") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(serde_json::Value::Array(list)) => {
            for entry in list {
                if entry.get("name").and_then(|n| n.as_str()) == Some("default") {
                    return match entry.get("template").and_then(|t| t.as_str()) {
                        Some(t) => Ok(Some(t.to_owned())),
                        None => Err(Error::ConfigField {
                            path: path.to_owned(),
                            field: "chat_template",
                            expected: EXPECTED,
                        }),
                    };
                }
            }
            Err(Error::ConfigField {
                path: path.to_owned(),
                field: "chat_template",
                expected: EXPECTED,
            })
        }
        Some(_) => Err(Error::ConfigField {
            path: path.to_owned(),
            field: "chat_template",
            expected: EXPECTED,
        }),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]

    use super::*;

    const _: fn() = || {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<ModelTokenizer>();
    };

    #[test]
    fn a_missing_directory_a_file_and_a_config_that_is_no_object_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let err = TokenizerFiles::in_dir(&missing).unwrap_err();
        assert!(matches!(err, Error::NoDirectory { .. }), "{err}");
        assert!(err.to_string().contains("does not exist"), "{err}");

        let file = dir.path().join("tokenizer.json");
        std::fs::write(&file, "{}").unwrap();
        let err = TokenizerFiles::in_dir(&file).unwrap_err();
        assert!(matches!(err, Error::NotADirectory { .. }), "{err}");
        assert!(
            err.to_string().contains("is a file, not a directory"),
            "{err}"
        );

        let config = dir.path().join("tokenizer_config.json");
        for (text, found) in [("[]", "an array"), ("\"x\"", "a string"), ("null", "null")] {
            std::fs::write(&config, text).unwrap();
            let err = read_json(&config).unwrap_err();
            assert!(
                matches!(err, Error::ConfigNotObject { found: f, .. } if f == found),
                "{text}: {err}"
            );
        }
        std::fs::write(&config, "{}").unwrap();
        assert!(read_json(&config).unwrap().is_object());
    }

    #[test]
    fn config_templates_and_tokens_take_both_shapes() {
        let p = Path::new("tokenizer_config.json");
        let c = serde_json::json!({
            "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false},
            "eos_token": "</s>",
            "chat_template": [{"name": "tool_use", "template": "T"},
                              {"name": "default", "template": "D"}],
        });
        assert_eq!(
            token_string(p, &c, "bos_token").unwrap().as_deref(),
            Some("<s>")
        );
        assert_eq!(
            token_string(p, &c, "eos_token").unwrap().as_deref(),
            Some("</s>")
        );
        assert_eq!(token_string(p, &c, "unk_token").unwrap(), None);
        assert_eq!(config_template(p, &c).unwrap().as_deref(), Some("D"));
        let bad = serde_json::json!({"bos_token": 3, "chat_template": [{"name": "x"}]});
        assert!(matches!(
            token_string(p, &bad, "bos_token"),
            Err(Error::ConfigField {
                field: "bos_token",
                ..
            })
        ));
        assert!(matches!(
            config_template(p, &bad),
            Err(Error::ConfigField {
                field: "chat_template",
                ..
            })
        ));
    }
}
