"""A stock grpcio server for the end-to-end tests (tests/e2e/grpc_stock.rs).

Service `echo.Echo`, bytes in and out (identity serializers, so no generated code):

- `Unary`: the request back.
- `ServerStream`: the request back `n` times, `n` being the request's first byte.
- `ClientStream`: every request message joined with `|`.
- `Bidi`: each message back as it arrives (the client waits for each answer).
- `Flaky`: UNAVAILABLE for the first `--fail` calls, then the request back.
- `Trailing`: the request back with trailing metadata `x-sum: <len>`.

Every call appends one JSON line to `--log`: the method, the invocation metadata, the
number of request messages and the deadline left (seconds), so a test asserts what the
backend received. Listens on 127.0.0.1:`--port`, with TLS when `--cert`/`--key` are given.
"""

import argparse
import json
import threading
from concurrent import futures

import grpc

lock = threading.Lock()
flaky_calls = 0


def record(args, method, context, messages):
    line = {
        "method": method,
        "metadata": [[k, v if isinstance(v, str) else v.hex()] for k, v in context.invocation_metadata()],
        "messages": messages,
        "time_remaining": context.time_remaining(),
    }
    with lock:
        with open(args.log, "a", encoding="utf-8") as log:
            log.write(json.dumps(line) + "\n")


def handlers(args):
    def unary(request, context):
        record(args, "Unary", context, 1)
        return request

    def server_stream(request, context):
        record(args, "ServerStream", context, 1)
        count = request[0] if request else 0
        for _ in range(count):
            yield request

    def client_stream(requests, context):
        got = list(requests)
        record(args, "ClientStream", context, len(got))
        return b"|".join(got)

    def bidi(requests, context):
        count = 0
        for message in requests:
            count += 1
            yield message
        record(args, "Bidi", context, count)

    def flaky(request, context):
        global flaky_calls
        with lock:
            flaky_calls += 1
            calls = flaky_calls
        record(args, "Flaky", context, 1)
        if calls <= args.fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "try again")
        return request

    def flaky_stream(requests, context):
        global flaky_calls
        got = list(requests)
        with lock:
            flaky_calls += 1
            calls = flaky_calls
        record(args, "FlakyStream", context, len(got))
        if calls <= args.fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "try again")
        return b"|".join(got)

    def trailing(request, context):
        record(args, "Trailing", context, 1)
        context.set_trailing_metadata((("x-sum", str(len(request))),))
        return request

    return grpc.method_handlers_generic_handler(
        "echo.Echo",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
            "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
            "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
            "Flaky": grpc.unary_unary_rpc_method_handler(flaky),
            "FlakyStream": grpc.stream_unary_rpc_method_handler(flaky_stream),
            "Trailing": grpc.unary_unary_rpc_method_handler(trailing),
        },
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--fail", type=int, default=0)
    parser.add_argument("--cert")
    parser.add_argument("--key")
    args = parser.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((handlers(args),))
    address = f"127.0.0.1:{args.port}"
    if args.cert:
        with open(args.key, "rb") as key, open(args.cert, "rb") as cert:
            credentials = grpc.ssl_server_credentials(((key.read(), cert.read()),))
        server.add_secure_port(address, credentials)
    else:
        server.add_insecure_port(address)
    server.start()
    server.wait_for_termination()


if __name__ == "__main__":
    main()
