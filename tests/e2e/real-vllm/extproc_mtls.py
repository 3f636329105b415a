"""Mutual TLS on the picker's ext_proc port, from an independent client: grpcio (BoringSSL) with
the envoy-data-plane messages of extproc_client.py, against `infergate picker --tls-cert-file
--tls-key-file --tls-client-ca-file` in front of one emulated pod (`infergate sim`), so no vLLM is
needed. The certificates are made with the openssl commands docs/extproc.md gives.

  python extproc_mtls.py --bin target/debug/infergate --work target/extproc-mtls

Checks: a client presenting a certificate of the client CA has a chat request routed to the pod
(grpc.secure_channel with root_certificates, private_key, certificate_chain); one presenting
none, and one presenting another CA's certificate, get UNAVAILABLE and no answer; the picker
counts the refusals in infergate_tls_handshake_failures_total{reason="client_certificate"}.
Exit 0 when every check holds, 1 otherwise."""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import grpc

import extproc_client as xp
from util import LOCAL, free_port, log

REFUSALS = 'infergate_tls_handshake_failures_total{reason="client_certificate"}'


FAILED = []


def expect(cond, what):
    print(f"    {'ok  ' if cond else 'FAIL'} {what}", flush=True)
    if not cond:
        FAILED.append(what)


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)


def make_ca(d, name, cn):
    """A CA: name.key and name.crt (self-signed, CA:TRUE), as docs/extproc.md makes one."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-days", "2", "-subj", f"/CN={cn}", "-keyout", f"{name}.key", "-out", f"{name}.crt",
            cwd=d)


def issue(d, ca, name, cn, extensions):
    """name.key and name.crt signed by ca (X.509 v3 with `extensions`)."""
    with open(os.path.join(d, f"{name}.ext"), "w") as f:
        f.write(extensions)
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-subj", f"/CN={cn}", "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt",
            cwd=d)


def read(d, name):
    with open(os.path.join(d, name), "rb") as f:
        return f.read()


def get(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except Exception:  # noqa: BLE001 - not up yet
        return None, ""


def sample(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


class Procs:
    def __init__(self, logdir):
        self.logdir = logdir
        self.procs = []

    def start(self, name, argv):
        logf = open(os.path.join(self.logdir, f"{name}.log"), "wb")
        p = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
                             env=dict(os.environ, RUST_LOG="info"))
        logf.close()
        self.procs.append((name, p))
        return p

    def stop_all(self):
        for _, p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for _, p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)

    def tail(self, name):
        with open(os.path.join(self.logdir, f"{name}.log"), "rb") as f:
            return f.read().decode(errors="replace")[-3000:]


def chat(channel):
    body = json.dumps({"model": "llama", "messages": [{"role": "user", "content": "hi"}]}).encode()
    st, res = xp.request(channel, "/v1/chat/completions", body, timeout=10.0)
    st.close()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    certs = os.path.join(a.work, "certs")
    logs = os.path.join(a.work, "logs")
    os.makedirs(certs)
    os.makedirs(logs)

    t0 = time.monotonic()
    make_ca(certs, "server-ca", "ext_proc server CA")
    issue(certs, "server-ca", "picker", "picker",
          "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
          "basicConstraints=CA:FALSE\n")
    make_ca(certs, "client-ca", "ext_proc clients CA")
    issue(certs, "client-ca", "envoy", "envoy",
          "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n")
    make_ca(certs, "other-ca", "another CA")
    issue(certs, "other-ca", "stranger", "envoy",
          "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n")
    log(f"certificates made with openssl in {time.monotonic() - t0:.2f} s")

    pod_port, grpc_port, health, metrics = free_port(), free_port(), free_port(), free_port()
    fleet = os.path.join(a.work, "fleet.yaml")
    with open(fleet, "w") as f:
        f.write("pods: [{ name: pod, profile: llama-3.1-8b/a10g, engine: vllm, replicas: 1, "
                f"port: {pod_port} }}]\n")
    eps = os.path.join(a.work, "endpoints.yaml")
    with open(eps, "w") as f:
        f.write(f"engine: vllm\nendpoints:\n  - {{ address: '{LOCAL}:{pod_port}', name: pod }}\n")
    procs = Procs(logs)
    try:
        procs.start("sim", [a.bin, "sim", "--fleet", fleet])
        procs.start("picker", [
            a.bin, "picker", "--pool-name", "llama", "--listen-address", LOCAL,
            "--endpoints-file", eps, "--grpc-port", str(grpc_port),
            "--grpc-health-port", str(health), "--metrics-port", str(metrics),
            "--tls-cert-file", os.path.join(certs, "picker.crt"),
            "--tls-key-file", os.path.join(certs, "picker.key"),
            "--tls-client-ca-file", os.path.join(certs, "client-ca.crt")])
        deadline = time.monotonic() + 30
        while get(f"http://{LOCAL}:{metrics}/readyz")[0] != 200:
            if time.monotonic() > deadline:
                print(procs.tail("sim"), procs.tail("picker"), sep="\n", file=sys.stderr)
                expect(False, "the picker became ready within 30 s")
                return 1
            time.sleep(0.1)
        log(f"picker ready (sim and picker started) in {time.monotonic() - t0:.2f} s")

        server_ca = read(certs, "server-ca.crt")
        target = f"{LOCAL}:{grpc_port}"
        creds = grpc.ssl_channel_credentials(root_certificates=server_ca,
                                             private_key=read(certs, "envoy.key"),
                                             certificate_chain=read(certs, "envoy.crt"))
        with grpc.secure_channel(target, creds) as ch:
            t1 = time.monotonic()
            res = chat(ch)
            ms = (time.monotonic() - t1) * 1000
            dest = res["headers"].get("x-gateway-destination-endpoint")
            expect(dest == f"{LOCAL}:{pod_port}",
                   f"client certificate of the client CA: routed to {dest!r} "
                   f"(handshake and exchange {ms:.1f} ms)")

        for what, key, chain in [
            ("no client certificate", None, None),
            ("a certificate of another CA", read(certs, "stranger.key"),
             read(certs, "stranger.crt")),
        ]:
            creds = grpc.ssl_channel_credentials(root_certificates=server_ca, private_key=key,
                                                 certificate_chain=chain)
            with grpc.secure_channel(target, creds) as ch:
                try:
                    res = chat(ch)
                    expect(False, f"{what}: refused (it was answered: {res['kinds']})")
                except grpc.RpcError as e:
                    expect(e.code() == grpc.StatusCode.UNAVAILABLE,
                           f"{what}: refused, {e.code().name}: {e.details()!r}")

        refused = sample(get(f"http://{LOCAL}:{metrics}/metrics")[1], REFUSALS)
        # grpcio may retry a refused connection within the call: at least one refusal each.
        expect(refused is not None and refused >= 2, f"{REFUSALS} = {refused} (want >= 2)")
    finally:
        procs.stop_all()
    log(f"{len(FAILED)} failed, {time.monotonic() - t0:.1f} s in all")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
