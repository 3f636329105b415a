"""Helpers shared by the real-vLLM suite (harness.py) and the ext_proc mutual-TLS check
(extproc_mtls.py): standard library only, so the small venv of the latter, which has no httpx,
can import them too."""
import socket
import time

LOCAL = "127.0.0.1"


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind((LOCAL, 0))
        return s.getsockname()[1]
