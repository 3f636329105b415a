"""A minimal Envoy stand-in for ext_proc: one gRPC stream per HTTP request, FULL_DUPLEX_STREAMED
body mode, messages built with envoy-data-plane (betterproto2) and sent with grpcio."""
import queue

import grpc
from envoy_data_plane.envoy.config.core.v3 import HeaderMap, HeaderValue
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import ProcessingModeBodySendMode
from envoy_data_plane.envoy.service.ext_proc.v3 import (
    HttpBody,
    HttpHeaders,
    ProcessingRequest,
    ProcessingResponse,
    ProtocolConfiguration,
)

METHOD = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"


def header_map(headers):
    return HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in headers])


class Stream:
    """One ext_proc stream. send() queues a message; recv() waits for the next answer."""

    def __init__(self, channel, timeout=30.0):
        self._q = queue.Queue()

        def gen():
            while True:
                m = self._q.get()
                if m is None:
                    return
                yield m

        call = channel.stream_stream(METHOD, request_serializer=lambda m: bytes(m),
                                     response_deserializer=ProcessingResponse.parse)
        self._it = call(gen(), timeout=timeout)

    def send(self, msg):
        self._q.put(msg)

    def recv(self):
        return next(self._it)

    def close(self):
        self._q.put(None)
        # drain so the call completes cleanly (bounded by the call's timeout)
        try:
            for _ in self._it:
                pass
        except grpc.RpcError:
            pass


def which(resp):
    """Name of the oneof field set in a ProcessingResponse."""
    for f in ("request_headers", "request_body", "request_trailers", "response_headers",
              "response_body", "response_trailers", "immediate_response"):
        if getattr(resp, f, None) is not None:
            return f
    return "?"


def set_headers(common):
    out = {}
    if common is None or common.header_mutation is None:
        return out
    for opt in common.header_mutation.set_headers:
        h = opt.header
        out[h.key.lower()] = h.raw_value.decode() if h.raw_value else h.value
    return out


def struct_to_py(s):
    """google.protobuf.Struct (betterproto2) to plain Python."""
    if s is None:
        return None
    try:
        return s.to_dict()
    except Exception:  # noqa: BLE001
        return s.to_pydict() if hasattr(s, "to_pydict") else str(s)


def request(channel, path, body, headers=(), chunk=16384, announce_mode=True, timeout=30.0):
    """Send one request the way Envoy does in FULL_DUPLEX_STREAMED: headers (no end_of_stream),
    then the body in chunks, the last with end_of_stream. Collect answers until the body has been
    re-sent with end_of_stream (or an immediate response). Returns (stream, result dict)."""
    st = Stream(channel, timeout=timeout)
    hdrs = [(":method", "POST"), (":path", path), (":authority", "gateway"),
            (":scheme", "http"), ("content-type", "application/json"),
            ("content-length", str(len(body)))] + list(headers)
    first = ProcessingRequest(request_headers=HttpHeaders(headers=header_map(hdrs),
                                                          end_of_stream=False))
    if announce_mode:
        first.protocol_config = ProtocolConfiguration(
            request_body_mode=ProcessingModeBodySendMode.FULL_DUPLEX_STREAMED,
            response_body_mode=ProcessingModeBodySendMode.FULL_DUPLEX_STREAMED)
    st.send(first)
    pieces = [body[i:i + chunk] for i in range(0, len(body), chunk)] or [b""]
    for i, p in enumerate(pieces):
        st.send(ProcessingRequest(request_body=HttpBody(body=p,
                                                        end_of_stream=i == len(pieces) - 1)))
    res = {"headers": {}, "metadata": None, "body": b"", "body_chunks": [], "kinds": [],
           "immediate": None, "clear_route_cache": False}
    for _ in range(10000):  # bounded: a body of 620 MB at most
        r = st.recv()
        kind = which(r)
        res["kinds"].append(kind)
        if kind == "immediate_response":
            ir = r.immediate_response
            res["immediate"] = {"status": int(ir.status.code) if ir.status else None,
                                "headers": set_headers_from_mutation(ir.headers),
                                "body": ir.body}
            break
        if kind == "request_headers":
            common = r.request_headers.response
            res["headers"].update(set_headers(common))
            res["clear_route_cache"] = bool(common and common.clear_route_cache)
            if r.dynamic_metadata is not None:
                res["metadata"] = struct_to_py(r.dynamic_metadata)
        elif kind == "request_body":
            common = r.request_body.response
            bm = common.body_mutation if common else None
            if bm is not None and bm.streamed_response is not None:
                sr = bm.streamed_response
                res["body_chunks"].append(len(sr.body))
                res["body"] += sr.body
                if sr.end_of_stream:
                    break
            else:
                # no mutation: the body passes as sent
                res["body"] = body
                break
    return st, res


def set_headers_from_mutation(m):
    out = {}
    if m is None:
        return out
    for opt in m.set_headers:
        h = opt.header
        out[h.key.lower()] = h.raw_value.decode() if h.raw_value else h.value
    return out


def response(st, status, body, content_type="application/json", chunk=16384):
    """The response half: response headers, then body chunks; returns the body as the
    processor re-sent it."""
    st.send(ProcessingRequest(response_headers=HttpHeaders(
        headers=header_map([(":status", str(status)), ("content-type", content_type)]),
        end_of_stream=False)))
    r = st.recv()
    assert which(r) == "response_headers", which(r)
    pieces = [body[i:i + chunk] for i in range(0, len(body), chunk)] or [b""]
    for i, p in enumerate(pieces):
        st.send(ProcessingRequest(response_body=HttpBody(body=p,
                                                         end_of_stream=i == len(pieces) - 1)))
    out = b""
    for _ in range(10000):
        r = st.recv()
        if which(r) != "response_body":
            break
        bm = r.response_body.response.body_mutation if r.response_body.response else None
        if bm is not None and bm.streamed_response is not None:
            out += bm.streamed_response.body
            if bm.streamed_response.end_of_stream:
                break
        else:
            out = body
            break
    st.close()
    return out
