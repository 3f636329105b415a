"""The official `openai` Python SDK against a running infergate gateway.

Usage: python3 test_sdk.py <base_url> [ca_file]   (e.g. http://127.0.0.1:8080)

With `ca_file` (an https:// base URL), the SDK verifies the gateway's certificate against that CA
bundle only: the SDK's own HTTP client class, `openai.DefaultHttpxClient(verify=<SSL context of
that CA file>)`.

Exit status: 0 when every check passes, 1 on a failed check, 77 when the `openai` package is not
installed (the Rust test that runs this decides whether that is a skip or a failure).
"""

import sys

try:
    import openai
    from openai import OpenAI
except ImportError:
    print("openai SDK not installed: python3 -m pip install openai", file=sys.stderr)
    sys.exit(77)


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def main(base_url, ca_file=None):
    extra = {}
    if ca_file is not None:
        import ssl

        # Only this CA: the system's trust store is not consulted.
        context = ssl.create_default_context(cafile=ca_file)
        extra["http_client"] = openai.DefaultHttpxClient(verify=context)
    client = OpenAI(
        base_url=base_url.rstrip("/") + "/v1", api_key="not-needed", max_retries=0, **extra
    )

    # Chat completion.
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8
    )
    check(raw.headers.get("x-infergate-endpoint"), "x-infergate-endpoint header")
    check(raw.headers.get("x-request-id"), "x-request-id header")
    chat = raw.parse()
    check(chat.choices[0].message.content == "hello", f"chat content: {chat}")
    check(chat.usage.completion_tokens == 3, f"chat usage: {chat.usage}")

    # Streaming chat completion with usage.
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    check(text == "hello", f"streamed text: {text!r}")
    check(usage is not None and usage.completion_tokens == 2, f"streamed usage: {usage}")

    # Completion (a LoRA adapter name routes to its base model).
    comp = client.completions.create(model="m-lora", prompt="say hi", max_tokens=4)
    check(comp.choices[0].text == "hello", f"completion: {comp}")

    # Model list.
    ids = sorted(m.id for m in client.models.list())
    check(ids == ["m", "m-lora"], f"models: {ids}")

    # One model (`GET /v1/models/{model}`), an adapter included; an unknown one is a 404.
    for name in ("m", "m-lora"):
        got = client.models.retrieve(name)
        check(got.id == name and got.object == "model", f"retrieve {name}: {got}")
    try:
        client.models.retrieve("gpt-9")
        check(False, "unknown model retrieved")
    except openai.NotFoundError as e:
        check("gpt-9" in str(e), f"unknown model retrieve message: {e}")

    # An unknown model is a typed 404 the SDK understands.
    try:
        client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
        check(False, "unknown model accepted")
    except openai.NotFoundError as e:
        check("model" in str(e), f"unknown model message: {e}")

    print(f"openai {openai.__version__}: all checks passed")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    main(*sys.argv[1:])
