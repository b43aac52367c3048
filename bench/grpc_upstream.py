#!/usr/bin/python3
# sluice - bench/grpc_upstream.py: the gRPC upstream of bench rows 17 and 18
# (issue 21). Debian's python3-grpcio serving one unary method,
# /bench.Bench/Echo, on raw bytes (a generic handler, no generated code):
# h2c on 127.0.0.1:PORT, answering every call with a fixed 2-byte message
# and grpc-status 0. Run by bench/run.py, stopped by PID.

import argparse
import asyncio
import signal

import grpc

REPLY = b"\x08\x01"         # a protobuf message: field 1 = 1


async def echo(request, context):
    return REPLY


async def serve(port):
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "bench.Bench", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}),))
    if server.add_insecure_port("127.0.0.1:%d" % port) != port:
        raise SystemExit("grpc_upstream: cannot listen on 127.0.0.1:%d" % port)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(0)


def main():
    ap = argparse.ArgumentParser(description="bench gRPC upstream")
    ap.add_argument("--port", type=int, required=True)
    asyncio.run(serve(ap.parse_args().port))


if __name__ == "__main__":
    main()
