#!/usr/bin/python3
# sluice - tests/llm_upstream.py: an OpenAI-shaped upstream for the cost_from tests.
#
# A real HTTP/1.1 server (threads, raw writes for chunked bodies and
# trailers) that reports each answer's token usage where a limit can read
# it. The tokens come from the X-Tokens request header (default 300); an
# X-Delay-Ms header holds the answer that long first, X-Gap-Ms each chunk
# of a chunked body after the first.
#
#   POST /v1/chat/completions   JSON with "usage"; with "stream": true a
#                               text/event-stream whose last chunk carries usage
#   GET  /header                X-Usage-Tokens: N
#   GET  /trailer               chunked, with the trailer X-Usage-Tokens: N
#   GET  /nousage               JSON without usage
#   GET  /cut                   JSON whose connection closes before its end
#
#   /usr/bin/python3 tests/llm_upstream.py --port P   (0: first stdout line is the port)

import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def tokens(self):
        return int(self.headers.get("X-Tokens", "300"))

    def hold(self):
        ms = int(self.headers.get("X-Delay-Ms", "0"))
        if ms > 0:
            time.sleep(ms / 1000.0)

    def send_body(self, status, ctype, body, extra=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def chunked(self, ctype, parts, trailers=()):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Transfer-Encoding", "chunked")
        if trailers:
            self.send_header("Trailer", ", ".join(k for k, _ in trailers))
        self.end_headers()
        gap = int(self.headers.get("X-Gap-Ms", "0")) / 1000.0
        for i, p in enumerate(parts):
            if i and gap:
                time.sleep(gap)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(p), p))
            self.wfile.flush()
        self.wfile.write(b"0\r\n" + b"".join(b"%s: %s\r\n" % (k.encode(), v.encode())
                                               for k, v in trailers) + b"\r\n")

    def completion(self, req):
        n = self.tokens()
        usage = {"prompt_tokens": n // 3, "completion_tokens": n - n // 3, "total_tokens": n}
        if not req.get("stream"):
            body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1,
                    "model": req.get("model", "m"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": "hello"}}],
                    "usage": usage}
            self.send_body(200, "application/json", json.dumps(body).encode())
            return
        parts = []
        for word in ("hel", "lo"):
            chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                     "model": "m", "choices": [{"index": 0, "delta": {"content": word},
                                                "finish_reason": None}], "usage": None}
            parts.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        final = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                 "model": "m", "choices": [], "usage": usage}
        parts.append(b"data: " + json.dumps(final).encode() + b"\n\n")
        parts.append(b"data: [DONE]\n\n")
        self.chunked("text/event-stream", parts)

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(n) if n else b""
        self.hold()
        try:
            req = json.loads(raw or b"{}")
        except ValueError:
            req = {}
        if self.path.startswith("/v1/chat/completions"):
            self.completion(req)
        else:
            self.send_body(404, "application/json", b'{"error":"not found"}')

    def do_GET(self):
        self.hold()
        n = str(self.tokens())
        if self.path.startswith("/header"):
            self.send_body(200, "text/plain", b"ok\n", [("X-Usage-Tokens", n)])
        elif self.path.startswith("/trailer"):
            self.chunked("text/plain", [b"o", b"k\n"], [("X-Usage-Tokens", n)])
        elif self.path.startswith("/cut"):
            body = b'{"usage":{"total_tokens":%s}}' % n.encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body) + 100))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            self.close_connection = True
        elif self.path.startswith("/nousage"):
            self.send_body(200, "application/json", b'{"choices":[]}')
        else:
            self.send_body(404, "application/json", b'{"error":"not found"}')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    srv = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    srv.daemon_threads = True
    print(srv.server_address[1], flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
