//! OpenAI request bodies: `parse_request` never panics, and a body it accepts can have its model
//! rewritten into a body that parses to the same request under the new name.
#![no_main]

use infergate_openai::{ApiKind, parse_request};
use libfuzzer_sys::fuzz_target;

const NEW_MODEL: &str = "fuzz/\"quoted\"\\model\u{e9}";

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let kind = match selector % 4 {
        0 => ApiKind::ChatCompletions,
        1 => ApiKind::Completions,
        2 => ApiKind::Responses,
        _ => ApiKind::Embeddings,
    };
    let Ok(req) = parse_request(kind, body) else {
        return;
    };
    assert_eq!(
        req.segments().map(str::len).sum::<usize>(),
        req.prompt_chars()
    );
    let _ = req.estimated_prompt_tokens();

    let rewritten = req.rewrite_model(body, NEW_MODEL);
    let again = match parse_request(kind, &rewritten) {
        Ok(again) => again,
        Err(e) => panic!("a rewritten body no longer parses: {e}"),
    };
    assert_eq!(again.model, NEW_MODEL);
    assert_eq!(again.stream, req.stream);
    assert_eq!(again.include_usage, req.include_usage);
    assert_eq!(again.max_output_tokens, req.max_output_tokens);
    assert_eq!(again.prompt, req.prompt);
    assert_eq!(again.prompt_token_ids, req.prompt_token_ids);
});
