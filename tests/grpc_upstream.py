#!/usr/bin/python3
# sluice - tests/grpc_upstream.py: the gRPC server the gRPC tests run behind
# sluice (Debian's python3-grpcio, generic handlers on raw bytes: no
# generated code). Service demo.Echo:
#
#   Unary(msg) -> msg                    echoes the request's metadata x-*
#                                        back as initial metadata, and sets
#                                        trailing metadata x-trail: done and
#                                        x-trail-bin (binary)
#   Fail(msg)  -> INVALID_ARGUMENT "bad thing", trailing x-why: because
#   Sleep(ms)  -> waits ms (ASCII) or until cancelled; reports cancellation
#   Split(n:size)      server-streaming: n messages of size bytes
#   Join(stream)       client-streaming: total length and SHA-1 of all
#   Chat(stream)       bidirectional: each message back as it comes
#   Stats()            JSON: calls seen, cancellations seen
#
#   /usr/bin/python3 tests/grpc_upstream.py --port 0 [--tls CERT KEY]
#   (the first stdout line is the port)

import argparse
import hashlib
import json
import os
import signal
import sys
import threading
import time
from concurrent import futures

import grpc

LOCK = threading.Lock()
STATS = {"calls": 0, "cancelled": 0, "methods": []}


def seen(name):
    with LOCK:
        STATS["calls"] += 1
        STATS["methods"].append(name)


def cancelled():
    with LOCK:
        STATS["cancelled"] += 1


def unary(req, ctx):
    seen("Unary")
    md = [(k, v) for k, v in ctx.invocation_metadata() if k.startswith("x-")]
    ctx.send_initial_metadata(md)
    ctx.set_trailing_metadata((("x-trail", "done"), ("x-trail-bin", b"\x00\x01\xff")))
    return req


def fail(req, ctx):
    seen("Fail")
    ctx.set_trailing_metadata((("x-why", "because"),))
    ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad thing")


def sleep(req, ctx):
    seen("Sleep")
    done = threading.Event()
    ctx.add_callback(done.set)      # runs when the call ends, cancelled included
    ms = int(req.decode() or "0")
    done.wait(ms / 1000.0)
    if not ctx.is_active():
        cancelled()
        return b""
    return b"slept"


def split(req, ctx):
    seen("Split")
    n, size = (int(x) for x in req.decode().split(":"))
    for i in range(n):
        yield bytes([i % 256]) * size


def join(it, ctx):
    seen("Join")
    h = hashlib.sha1()
    total = 0
    for m in it:
        h.update(m)
        total += len(m)
    return ("%d:%s" % (total, h.hexdigest())).encode()


def chat(it, ctx):
    seen("Chat")
    for m in it:
        yield m


def stats(req, ctx):
    with LOCK:
        return json.dumps(STATS).encode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    ident = lambda b: b     # noqa: E731 (raw bytes both ways)
    h = grpc.method_handlers_generic_handler("demo.Echo", {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, ident, ident),
        "Fail": grpc.unary_unary_rpc_method_handler(fail, ident, ident),
        "Sleep": grpc.unary_unary_rpc_method_handler(sleep, ident, ident),
        "Split": grpc.unary_stream_rpc_method_handler(split, ident, ident),
        "Join": grpc.stream_unary_rpc_method_handler(join, ident, ident),
        "Chat": grpc.stream_stream_rpc_method_handler(chat, ident, ident),
        "Stats": grpc.unary_unary_rpc_method_handler(stats, ident, ident),
    })
    opts = [("grpc.max_receive_message_length", 64 << 20),
            ("grpc.max_send_message_length", 64 << 20)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), handlers=(h,),
                         options=opts)
    if args.tls:
        with open(args.tls[0], "rb") as f:
            cert = f.read()
        with open(args.tls[1], "rb") as f:
            key = f.read()
        creds = grpc.ssl_server_credentials(((key, cert),))
        port = server.add_secure_port("127.0.0.1:%d" % args.port, creds)
    else:
        port = server.add_insecure_port("127.0.0.1:%d" % args.port)
    server.start()
    print(port, flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
