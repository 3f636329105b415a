//! `infergate tokenize`: prints the token ids the picker computes for a prompt or a chat request
//! with the model's own tokenizer (`infergate-tokenizer`), in the shape of vLLM's
//! `POST /tokenize` answer (`{"count": N, "tokens": [...]}`), so a user can check them against
//! the engine's.

use std::io::{Read as _, Write as _};
use std::path::PathBuf;

use anyhow::Context as _;
use infergate_tokenizer::{ChatRequest, ContentFormat, ModelTokenizer, Options};

/// Arguments of `infergate tokenize`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "chat_json"])))]
pub struct Args {
    /// The model's tokenizer directory (tokenizer.json, tokenizer_config.json, and
    /// chat_template.jinja where present), e.g. a mounted ConfigMap.
    #[arg(long)]
    pub tokenizer: PathBuf,
    /// A completions prompt, encoded as vLLM's /v1/completions does.
    #[arg(long)]
    pub prompt: Option<String>,
    /// A chat request: a /v1/chat/completions body or a JSON array of messages, from a file or
    /// `-` for standard input; encoded as vLLM's /v1/chat/completions does.
    #[arg(long, value_name = "FILE|-")]
    pub chat_json: Option<PathBuf>,
    /// Encode the prompt without the tokenizer's special tokens (the request field
    /// `add_special_tokens: false`); a chat request's body carries its own.
    #[arg(long)]
    pub no_special_tokens: bool,
    /// The chat template's content format (vLLM's `--chat-template-content-format`).
    #[arg(long, value_enum, default_value_t = Format::Auto)]
    pub content_format: Format,
    /// Also print the text that was encoded (the rendered chat template).
    #[arg(long)]
    pub with_text: bool,
}

/// `--content-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Detected from the template, as vLLM does.
    Auto,
    /// Content as one string.
    String,
    /// Content as a list of parts.
    Openai,
}

/// Runs `infergate tokenize`.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let out = tokenize(&args)?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{out}")?;
    Ok(())
}

/// The JSON line `infergate tokenize` prints.
pub fn tokenize(args: &Args) -> anyhow::Result<String> {
    let options = Options {
        content_format: match args.content_format {
            Format::Auto => None,
            Format::String => Some(ContentFormat::String),
            Format::Openai => Some(ContentFormat::OpenAi),
        },
        ..Options::default()
    };
    let tok = ModelTokenizer::from_dir(&args.tokenizer, options)
        .with_context(|| format!("loading the tokenizer in {}", args.tokenizer.display()))?;
    let mut ids = Vec::new();
    let text = if let Some(prompt) = &args.prompt {
        tok.encode_completion(prompt, !args.no_special_tokens, &mut ids)?;
        prompt.clone()
    } else if let Some(path) = &args.chat_json {
        let body = if path.as_os_str() == "-" {
            let mut b = Vec::new();
            std::io::stdin()
                .lock()
                .read_to_end(&mut b)
                .context("reading standard input")?;
            b
        } else {
            std::fs::read(path).with_context(|| format!("reading {}", path.display()))?
        };
        let request = ChatRequest::from_json(&body)?;
        let text = tok.render_chat(&request)?;
        tok.encode_chat(&request, &mut ids)?;
        text
    } else {
        anyhow::bail!("give --prompt or --chat-json");
    };
    let mut out = serde_json::json!({ "count": ids.len(), "tokens": ids });
    if args.with_text {
        out["text"] = serde_json::Value::String(text);
    }
    Ok(out.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(prompt: Option<&str>, chat: Option<PathBuf>) -> Args {
        Args {
            tokenizer: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../tokenizer/tests/fixtures/tiny-bos"),
            prompt: prompt.map(str::to_owned),
            chat_json: chat,
            no_special_tokens: false,
            content_format: Format::Auto,
            with_text: false,
        }
    }

    #[test]
    fn prints_vllm_tokenize_shape() {
        let out: serde_json::Value =
            serde_json::from_str(&tokenize(&args(Some("hello world"), None)).unwrap()).unwrap();
        // The fixture's own expected ids: BOS, then the two words.
        assert_eq!(
            out,
            serde_json::json!({"count": 3, "tokens": [0, 365, 384]})
        );
        let mut a = args(Some("hello world"), None);
        a.no_special_tokens = true;
        a.with_text = true;
        let out: serde_json::Value = serde_json::from_str(&tokenize(&a).unwrap()).unwrap();
        assert_eq!(out["tokens"], serde_json::json!([365, 384]));
        assert_eq!(out["text"], "hello world");
    }

    #[test]
    fn chat_from_a_file_and_errors_say_what() {
        let dir = tempfile::tempdir().unwrap();
        let body = dir.path().join("chat.json");
        std::fs::write(
            &body,
            br#"{"model":"m","messages":[{"role":"user","content":"hello world"}]}"#,
        )
        .unwrap();
        let out: serde_json::Value =
            serde_json::from_str(&tokenize(&args(None, Some(body.clone()))).unwrap()).unwrap();
        assert_eq!(out["count"], 17);
        std::fs::write(&body, b"{\"messages\": 1}").unwrap();
        let err = tokenize(&args(None, Some(body))).unwrap_err();
        assert!(
            format!("{err:#}").contains("not an OpenAI chat request"),
            "{err:#}"
        );
        let mut a = args(Some("x"), None);
        a.tokenizer = dir.path().into();
        let err = tokenize(&a).unwrap_err();
        assert!(format!("{err:#}").contains("no tokenizer.json"), "{err:#}");
    }
}
