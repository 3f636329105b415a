#!/usr/bin/env python3
"""Writes the seeds of the ext_proc, rewriter and configuration fuzz targets into seeds/<target>/.

The ext_proc seeds are real request and response bodies (the openai_request and openai_response
seeds) framed as Envoy's message sequences in the input layout documented in src/lib.rs. The
configuration seeds are the gateway's documented configurations (docs/gateway.md, the config
module's own example, benches/nginx/gateway.yaml), each with `auth: none`, and scheduler
configurations from docs/scheduler.md's presets. Run from fuzz/: python3 make_seeds.py
"""

import pathlib
import struct

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
SEEDS = HERE / "seeds"

# Request paths (PATHS in src/lib.rs) and statuses (STATUSES).
CHAT, COMPLETIONS, RESPONSES, EMBEDDINGS, MODELS = 0, 1, 2, 3, 4
S200, S500, S503 = 0, 2, 3

# setup byte: behaviour bits 0-1, rewrite bit 2, explain bit 3, request mode bits 4-5,
# response mode bits 6-7 (0 none, 1 full duplex, 2 buffered, 3 streamed).
ROUTE, SHED, NO_ENDPOINTS = 0, 2, 3
REWRITE, EXPLAIN = 4, 8


def modes(request, response):
    return (request << 4) | (response << 6)


FULL_DUPLEX = modes(1, 1)
BUFFERED = modes(2, 2)
HEADERS_ONLY = modes(3, 3)


def limits(cap, endpoints):
    """cap: 0 = 64 B, 1 = 1 KiB, 2 = 64 KiB, 3 = 4 MiB."""
    return cap | ((endpoints - 1) << 2)


def req_headers(path, eos=False, model=None, base=None, explain=False, upper=False, subset=0):
    flags = 0
    values = b""
    if model is not None:
        flags |= 1
        values += bytes([len(model)]) + model
    if base is not None:
        flags |= 2
        values += bytes([len(base)]) + base
    if explain:
        flags |= 4
    if upper:
        flags |= 8
    flags |= subset << 4
    return bytes([0 | (eos << 3) | (path << 4), flags]) + values


def body(op, data, eos):
    out = b""
    chunks = [data[i : i + 65535] for i in range(0, len(data), 65535)] or [b""]
    for i, c in enumerate(chunks):
        last = i + 1 == len(chunks)
        out += bytes([op | ((eos and last) << 3)]) + struct.pack("<H", len(c)) + c
    return out


def req_body(data, eos=True, pieces=1):
    step = max(1, -(-len(data) // pieces))
    parts = [data[i : i + step] for i in range(0, len(data), step)] or [b""]
    return b"".join(body(1, p, eos and i + 1 == len(parts)) for i, p in enumerate(parts))


def resp_headers(status=S200, sse=False, eos=False, served=0):
    arg = status | (sse << 3)
    return bytes([3 | (eos << 3) | (arg << 4), served])


def resp_body(data, eos=True, pieces=1):
    step = max(1, -(-len(data) // pieces))
    parts = [data[i : i + step] for i in range(0, len(data), step)] or [b""]
    return b"".join(body(4, p, eos and i + 1 == len(parts)) for i, p in enumerate(parts))


REQ_TRAILERS = bytes([2])
RESP_TRAILERS = bytes([5])


def spaces(n4k, eos=False):
    return bytes([6 | (eos << 3), n4k])


def seed(name):
    return (SEEDS / "openai_request" / name).read_bytes()[1:]


def response(name):
    return (SEEDS / "openai_response" / name).read_bytes()[1:]


CHAT_BODY = seed("chat")
CHAT_STREAM = seed("chat-stream")
COMPLETIONS_BODY = seed("completions")
RESPONSES_BODY = seed("responses")
EMBEDDINGS_BODY = seed("embeddings")
JSON_RESPONSE = response("json")
CHAT_SSE = response("chat-sse")
RESPONSES_SSE = response("responses-sse")

LLAMA_CHAT = (
    b'{"model": "llama-3-8b", "messages": [{"role": "system", "content": "You are terse."}, '
    b'{"role": "user", "content": "Name three GPUs."}], "max_tokens": 64}'
)
LORA_CHAT = (
    b'{"model": "sql-lora", "stream": true, "messages": [{"role": "user", '
    b'"content": "SELECT the top five customers by revenue"}]}'
)
REWRITTEN_RESPONSE = (
    b'{"id":"cmpl-1","object":"chat.completion","model":"meta/llama-3-8b-instruct",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"H100, A10G, L4"}}],'
    b'"usage":{"prompt_tokens":21,"completion_tokens":9,"total_tokens":30}}'
)
REWRITTEN_SSE = (
    b'data: {"id":"1","model": "meta/llama-3-8b-instruct","choices":[{"delta":{"content":"H"}}]}\n\n'
    b'data: {"id":"1","model":"meta/llama-3-8b-instruct","choices":[{"delta":{"content":"100"}}]}\n\n'
    b'data: {"id":"1","model":"meta/llama-3-8b-instruct","choices":[],"usage":'
    b'{"prompt_tokens":21,"completion_tokens":2}}\n\ndata: [DONE]\n\n'
)

PICKER = {
    # The EPP protocol: full duplex both ways, body in chunks, JSON answer with usage.
    "chat-full-duplex": bytes([FULL_DUPLEX, limits(3, 3)])
    + req_headers(CHAT)
    + req_body(CHAT_BODY, pieces=3)
    + resp_headers(served=2)
    + resp_body(JSON_RESPONSE, pieces=2),
    # No announcement (the default mode), SSE answer ending in trailers.
    "chat-sse-trailers": bytes([ROUTE, limits(3, 4)])
    + req_headers(CHAT)
    + req_body(CHAT_STREAM)
    + resp_headers(sse=True)
    + resp_body(CHAT_SSE, eos=False, pieces=4)
    + RESP_TRAILERS,
    # A LoRA adapter named by the body-based router's headers, with a subset hint.
    "lora-subset": bytes([FULL_DUPLEX, limits(3, 6)])
    + req_headers(CHAT, model=b"sql-lora", base=b"llama-3-8b", subset=2)
    + req_body(LORA_CHAT, pieces=2)
    + resp_headers(sse=True, served=1)
    + resp_body(CHAT_SSE, pieces=3),
    # Model rewrite on the way in, and back on the way out, JSON and SSE.
    "rewrite-json": bytes([FULL_DUPLEX | REWRITE, limits(3, 2)])
    + req_headers(CHAT)
    + req_body(LLAMA_CHAT)
    + resp_headers()
    + resp_body(REWRITTEN_RESPONSE, pieces=5),
    "rewrite-sse": bytes([ROUTE | REWRITE, limits(3, 2)])
    + req_headers(CHAT)
    + req_body(LLAMA_CHAT, pieces=2)
    + resp_headers(sse=True)
    + resp_body(REWRITTEN_SSE, eos=False, pieces=7)
    + RESP_TRAILERS,
    "rewrite-buffered": bytes([BUFFERED | REWRITE, limits(3, 2)])
    + req_headers(CHAT)
    + req_body(LLAMA_CHAT)
    + resp_headers()
    + resp_body(REWRITTEN_RESPONSE),
    # Buffered mode: one body message, one answer per message.
    "completions-buffered": bytes([BUFFERED, limits(2, 2)])
    + req_headers(COMPLETIONS)
    + req_body(COMPLETIONS_BODY)
    + resp_headers()
    + resp_body(JSON_RESPONSE),
    # Request trailers end the body.
    "responses-trailers": bytes([FULL_DUPLEX, limits(3, 2)])
    + req_headers(RESPONSES)
    + req_body(RESPONSES_BODY, eos=False, pieces=2)
    + REQ_TRAILERS
    + resp_headers(sse=True)
    + resp_body(RESPONSES_SSE),
    # No body: routed on the headers alone.
    "headers-only-get": bytes([ROUTE, limits(1, 3)])
    + req_headers(MODELS, eos=True, model=b"llama-3-8b")
    + resp_headers(eos=True),
    "streamed-mode": bytes([HEADERS_ONLY, limits(1, 2)])
    + req_headers(EMBEDDINGS)
    + req_body(EMBEDDINGS_BODY)
    + resp_headers()
    + resp_body(JSON_RESPONSE),
    # A body over 62,000 bytes (re-sent in several chunks).
    "large-body": bytes([FULL_DUPLEX, limits(3, 3)])
    + req_headers(CHAT)
    + req_body(LLAMA_CHAT[:-1], eos=False)
    + spaces(20)
    + req_body(b"}")
    + resp_headers(status=S500)
    + resp_body(b'{"error":{"message":"boom"}}'),
    # Rejections: shed (429), no endpoint (503), empty subset (503), over the cap (413),
    # unparsable body (400).
    "shed": bytes([SHED | EXPLAIN, limits(3, 2)])
    + req_headers(CHAT, explain=True)
    + req_body(CHAT_BODY),
    "no-endpoints": bytes([NO_ENDPOINTS, limits(3, 2)]) + req_headers(CHAT) + req_body(CHAT_BODY),
    "empty-subset": bytes([FULL_DUPLEX, limits(3, 2)])
    + req_headers(CHAT, subset=1)
    + req_body(CHAT_BODY),
    "too-large": bytes([FULL_DUPLEX, limits(0, 2)])
    + req_headers(CHAT)
    + req_body(CHAT_BODY, pieces=4),
    "bad-json": bytes([FULL_DUPLEX, limits(3, 2)])
    + req_headers(CHAT)
    + req_body(b'{"model": "llama-3-8b", "messages": [', pieces=2),
    # Explained decision on the response headers; the served endpoint differs from the pick.
    "explain": bytes([FULL_DUPLEX | EXPLAIN, limits(3, 3)])
    + req_headers(CHAT, explain=True)
    + req_body(CHAT_BODY)
    + resp_headers(served=3)
    + resp_body(JSON_RESPONSE),
}

BBR = {
    "chat-full-duplex": bytes([FULL_DUPLEX, limits(3, 1)])
    + req_headers(CHAT)
    + req_body(LLAMA_CHAT, pieces=3)
    + resp_headers()
    + resp_body(JSON_RESPONSE),
    "lora-stream": bytes([ROUTE, limits(3, 1)])
    + req_headers(CHAT)
    + req_body(LORA_CHAT, pieces=2)
    + resp_headers(sse=True)
    + resp_body(CHAT_SSE, eos=False, pieces=3)
    + RESP_TRAILERS,
    # A client that sets the routing headers itself (they are removed or overwritten).
    "spoofed-headers": bytes([FULL_DUPLEX, limits(3, 1)])
    + req_headers(CHAT, model=b"qwen-2.5-7b", base=b"qwen-2.5-7b", upper=True)
    + req_body(LLAMA_CHAT),
    "spoofed-not-routed": bytes([FULL_DUPLEX, limits(3, 1)])
    + req_headers(MODELS, eos=True, model=b"llama-3-8b"),
    "buffered": bytes([BUFFERED, limits(2, 1)])
    + req_headers(COMPLETIONS)
    + req_body(b'{"model": "qwen-2.5-7b", "prompt": "Once upon a time", "max_tokens": 16}')
    + resp_headers()
    + resp_body(JSON_RESPONSE),
    "trailers": bytes([FULL_DUPLEX, limits(3, 1)])
    + req_headers(RESPONSES)
    + req_body(b'{"model": "chat-lora", "input": "hello"}', eos=False)
    + REQ_TRAILERS,
    "unknown-model": bytes([FULL_DUPLEX, limits(3, 1)]) + req_headers(CHAT) + req_body(CHAT_BODY),
    "too-large": bytes([FULL_DUPLEX, limits(0, 1)])
    + req_headers(CHAT)
    + req_body(LLAMA_CHAT, pieces=3),
    "large-body": bytes([FULL_DUPLEX, limits(3, 1)])
    + req_headers(CHAT)
    + req_body(LLAMA_CHAT[:-1], eos=False)
    + spaces(20)
    + req_body(b"}"),
    "bad-json": bytes([FULL_DUPLEX, limits(3, 1)]) + req_headers(CHAT) + req_body(b'{"model": 7}'),
}

REWRITE = {
    # selector (PAIRS index in model_rewrite.rs), cut byte, body
    "json": bytes([0, 3]) + REWRITTEN_RESPONSE,
    "sse": bytes([0, 11]) + REWRITTEN_SSE,
    "longer-name": bytes([1, 5]) + b'{"model":"llama","choices":[]}',
    "escaped": bytes([3, 1]) + b'data: {"model":"m\\"q\\\\","x":1}\n\n',
    "requested-contains-pattern": bytes([7, 2])
    + b'{"model":"model","n":1}{"model": "model"}model":"model"',
}

AUTH = "auth: none\n"


def gateway_configs():
    out = {}
    doc = (ROOT / "docs" / "gateway.md").read_text()
    start = doc.index("## Configuration reference")
    block = doc[doc.index("```yaml\n", start) + 8 :]
    block = block[: block.index("```")]
    out["docs-reference"] = AUTH + block
    nginx = (ROOT / "benches" / "nginx" / "gateway.yaml").read_text()
    out["bench-nginx"] = nginx + AUTH
    out["minimal"] = AUTH + "models:\n  - name: m\n    endpoints: [127.0.0.1:8001]\n"
    out["json"] = (
        '{"auth": "none", "models": [{"name": "llama", "engine": "sglang", '
        '"endpoints": ["[::1]:30000", {"address": "10.0.0.2:30000", "name": "b"}]}]}'
    )
    out["api-keys"] = (
        "auth:\n  apiKeys:\n    keys:\n      - { sha256: "
        + "ab" * 32
        + ", tenant: team-a, models: [llama-3-8b] }\nmodels:\n  - name: llama-3-8b\n"
        "    loraAdapters: [sql-lora, chat-lora]\n    scheduler: { preset: gie-default }\n"
        "    endpoints: [127.0.0.1:8001, 127.0.0.1:8002]\n"
    )
    out["jwt"] = (
        "auth:\n  jwt:\n    issuer: https://issuer.example.com\n"
        "    remoteJWKS: { uri: https://issuer.example.com/.well-known/jwks.json }\n"
        "    audiences: [infergate]\n    requiredClaims: [{ name: org.team, values: [ml] }]\n"
        "models:\n  - name: qwen\n    engine: tgi\n    endpoints: [127.0.0.1:8080]\n"
        "    scheduler:\n      preset: infergate\n      weights: { queue: 2, kvCache: 0, prefix: 3 }\n"
        "      returnedEndpoints: 8\n      maxMetricsAgeMs: 500\n"
    )
    out["invalid-endpoint"] = AUTH + "models:\n  - name: m\n    endpoints: [nope]\n"
    return out


def scheduler_configs():
    return {
        "infergate": "preset: infergate\n",
        "gie-default": "preset: gie-default\n",
        "round-robin": "preset: round-robin\nreturnedEndpoints: 1\n",
        "weights": (
            "preset: infergate\nweights: { queue: 2, kvCache: 2, prefix: 3, loraAffinity: 1, "
            "runningRequests: 0.5, inflightTokens: 0.25, estimatedWait: 4 }\n"
            "saturation: { queueDepth: 8, kvCache: 0.9 }\noverload: { queueDepth: 32, kvCache: 0.98 }\n"
            "retryAfterMinMs: 2000\nretryAfterMaxMs: 30000\nshedding: true\n"
        ),
        "prefix": (
            "preset: gie-default\nprefix: { blockChars: 16, maxBlocks: 4096, byteBudget: 4096, "
            "defaultEndpointBlocks: 1, charsPerToken: 3.5 }\n"
            "rates: { prefillTokensPerSec: 1e9, decodeTokensPerSec: 0.001, minAlpha: 1 }\n"
        ),
        "json": '{"preset": "least-request", "maxMetricsAgeMs": 1, "onAllFiltered": "reject"}',
    }


def write(target, seeds):
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    for name, data in seeds.items():
        if isinstance(data, str):
            data = data.encode()
        (d / name).write_bytes(data)


def main():
    write("extproc_picker", PICKER)
    write("extproc_bbr", BBR)
    write("model_rewrite", REWRITE)
    write("gateway_config", gateway_configs())
    write("scheduler_config", scheduler_configs())


if __name__ == "__main__":
    main()
