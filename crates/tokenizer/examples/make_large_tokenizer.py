"""Train a realistic tokenizer for the cost example (not committed: it is written under target/).

usage: <venv>/bin/python crates/tokenizer/examples/make_large_tokenizer.py OUT_DIR [VOCAB]

A byte-level BPE shaped like Llama 3's: the Llama 3 pre-tokenizer regex split, byte-level
mapping, a BOS post-processor, Llama 3's special tokens and its chat template, trained to VOCAB
(default 32,000) on text found on this machine (the Python venv's sources and documents, the
system's licence texts). Also writes OUT_DIR/expected.json: the ids the Python Hugging Face stack
computes for prompts and chats cut from that text and for mixed-script text, in the format of
tests/fixtures/*/expected.json, so the cost example checks its tokenizer agrees before it times.
"""
import glob
import json
import os
import random
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|eot_id|>"]
# Llama 3 Instruct's template.
TEMPLATE = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
            "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
            "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
            "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
            "{% endif %}")
MIXED = ["Grüße aus München — naïve façade, coöperate", "日本語の文章とカタカナ、ひらがな。中文句子。",
         "Ελληνικά και русский текст, עברית ועברית, العربية", "emoji 🦀🚀👩‍💻 and flags 🇩🇪🇯🇵",
         "tabs\tand\r\nwindows lines\n\n\n  indented 12345678 3.14159e-10",
         "I'm sure they'll say it's 'fine' — won't they? DON'T SHOUT", "e\u0301\u0301 a\u0308 \u200b"]


def corpus_files():
    venv = os.path.dirname(os.path.dirname(sys.executable))
    pats = [os.path.join(venv, "lib", "python3.12", "site-packages", "**", e)
            for e in ("*.md", "*.rst", "*.txt", "*.py")]
    files = sorted(set(f for p in pats for f in glob.glob(p, recursive=True)))
    files += sorted(glob.glob("/usr/share/common-licenses/*"))
    return files


def texts(limit_bytes=60_000_000):
    total = 0
    for f in corpus_files():
        try:
            with open(f, encoding="utf-8") as fh:
                t = fh.read()
        except (UnicodeDecodeError, OSError):
            continue
        total += len(t)
        yield t
        if total > limit_bytes:
            return


def main(out, vocab):
    os.makedirs(out, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    docs = list(texts())
    tok.train_from_iterator(docs, trainer=trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                   eos_token="<|eot_id|>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(out)
    hf = AutoTokenizer.from_pretrained(out)
    rnd = random.Random(1)
    cases = []
    for i in range(40):
        d = docs[rnd.randrange(len(docs))]
        start = rnd.randrange(max(1, len(d) - 4000))
        prompt = d[start:start + rnd.choice([50, 500, 4000])]
        if i < len(MIXED):
            prompt = MIXED[i] + " " + prompt
        cases.append({"name": f"prompt_{i}", "prompt": prompt, "ids": hf(prompt)["input_ids"]})
    for i in range(10):
        d = docs[rnd.randrange(len(docs))]
        start = rnd.randrange(max(1, len(d) - 3000))
        messages = [{"role": "system", "content": "  You answer briefly.  "},
                    {"role": "user", "content": MIXED[i % len(MIXED)] + d[start:start + 3000]}]
        text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        cases.append({"name": f"chat_{i}", "messages": messages, "rendered": text,
                      "ids": hf(text, add_special_tokens=False)["input_ids"]})
    with open(os.path.join(out, "expected.json"), "w") as f:
        f.write('{"content_format": "string", "cases": [\n')
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n]}\n")
    print(json.dumps({"dir": out, "vocab_size": len(hf), "corpus_bytes": sum(map(len, docs)),
                      "cases": len(cases)}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 32000)
