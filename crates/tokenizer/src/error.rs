//! [`Error`]: everything loading a tokenizer or encoding a request can refuse, each saying what
//! was wrong and where.

use std::path::PathBuf;

/// The `tokenizers` crate's error type (a boxed error).
type TokenizersError = Box<dyn std::error::Error + Send + Sync>;

/// Why a tokenizer could not be loaded or a request could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("cannot read {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The tokenizer directory does not exist.
    #[error("the tokenizer directory {dir} does not exist")]
    NoDirectory {
        /// The path given.
        dir: PathBuf,
    },
    /// A file was given where the tokenizer's directory was expected (`tokenizer.json` itself,
    /// say).
    #[error(
        "{path} is a file, not a directory: give the directory that holds tokenizer.json (and \
         tokenizer_config.json, chat_template.jinja where present)"
    )]
    NotADirectory {
        /// The path given.
        path: PathBuf,
    },
    /// The directory has no `tokenizer.json` (the Hugging Face "fast" tokenizer file).
    #[error(
        "no tokenizer.json in {dir} (expected a Hugging Face model or tokenizer directory, or a \
         mounted ConfigMap holding tokenizer.json and tokenizer_config.json)"
    )]
    NoTokenizerJson {
        /// The directory looked in.
        dir: PathBuf,
    },
    /// `tokenizer.json` did not load.
    #[error("{path} is not a tokenizer the `tokenizers` library can load")]
    TokenizerJson {
        /// The file.
        path: PathBuf,
        /// The library's reason.
        #[source]
        source: TokenizersError,
    },
    /// A JSON side file is valid JSON but not an object (the settings it holds are keys).
    #[error("{path} holds JSON {found}, not an object of settings")]
    ConfigNotObject {
        /// The file.
        path: PathBuf,
        /// What it holds instead (`an array`, `a string`, …).
        found: &'static str,
    },
    /// A JSON side file (`tokenizer_config.json`, `special_tokens_map.json`) is not valid JSON.
    #[error("{path} is not valid JSON")]
    ConfigJson {
        /// The file.
        path: PathBuf,
        /// The parser's reason.
        #[source]
        source: serde_json::Error,
    },
    /// A field of a side file has a shape this loader does not know.
    #[error("{path}: `{field}` must be {expected}")]
    ConfigField {
        /// The file.
        path: PathBuf,
        /// The field.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// The chat template does not compile.
    #[error("the chat template from {origin} does not compile")]
    TemplateSyntax {
        /// Where the template came from.
        origin: String,
        /// The template engine's reason (with the line).
        #[source]
        source: minijinja::Error,
    },
    /// A chat request was given but the model has no chat template (vLLM answers such a request
    /// with 400 as well).
    #[error(
        "the tokenizer has no chat template (neither chat_template.jinja nor `chat_template` in \
         tokenizer_config.json), so a chat request cannot be tokenized"
    )]
    NoChatTemplate,
    /// The chat template refused the conversation with `raise_exception` (vLLM answers 400 with
    /// the same message).
    #[error("the chat template refused the conversation: {message}")]
    TemplateRefused {
        /// The template's message.
        message: String,
    },
    /// Rendering the chat template failed for another reason.
    #[error("rendering the chat template failed")]
    Render {
        /// The template engine's reason.
        #[source]
        source: minijinja::Error,
    },
    /// The tokenizer failed on the text.
    #[error("the tokenizer could not encode the text")]
    Encode {
        /// The library's reason.
        #[source]
        source: TokenizersError,
    },
    /// The tokenizer failed to decode token ids.
    #[error("the tokenizer could not decode the token ids")]
    Decode {
        /// The library's reason.
        #[source]
        source: TokenizersError,
    },
    /// The text to encode is longer than [`Limits::max_input_bytes`](crate::Limits).
    #[error("the text to tokenize is {bytes} bytes, over the limit of {limit}")]
    InputTooLarge {
        /// Bytes of text (prompt, message texts or rendered chat).
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// The encoded prompt has more tokens than [`Limits::max_tokens`](crate::Limits).
    #[error("the prompt is {tokens} tokens, over the limit of {limit}")]
    TooManyTokens {
        /// Tokens produced.
        tokens: usize,
        /// The limit.
        limit: usize,
    },
    /// A message's content part is not text (an image, audio, ...): its tokens depend on the
    /// engine's multimodal processor, which is not reproduced here.
    #[error(
        "message {message}: content part {part} has type `{kind}`; only text parts can be tokenized"
    )]
    UnsupportedContent {
        /// Index of the message.
        message: usize,
        /// Index of the part in the message's content.
        part: usize,
        /// The part's `type`.
        kind: String,
    },
    /// The request uses a feature whose rendering is not reproduced here, so its ids would not
    /// be the engine's.
    #[error("`{field}` is not supported for in-process tokenization ({why})")]
    Unsupported {
        /// The request field.
        field: &'static str,
        /// Why it is refused.
        why: &'static str,
    },
    /// A chat request body or message list is not the OpenAI shape.
    #[error("not an OpenAI chat request (an object with `messages`, or an array of messages)")]
    ChatJson {
        /// The parser's reason (with the position).
        #[source]
        source: serde_json::Error,
    },
}
