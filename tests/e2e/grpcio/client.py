"""A stock grpcio client for the end-to-end tests (tests/e2e/grpc_stock.rs).

Calls `echo.Echo` (see server.py) at `--target` (plain h2c) with a 5 s deadline, and prints
one JSON object per call: its name, the gRPC status code's name, the details, the messages
received (hex) and the trailing metadata. Exits 0 whatever the statuses: the test judges.
"""

import argparse
import json

import grpc


def call(name, fn):
    result = {"call": name}
    try:
        messages, trailing = fn()
        result.update(code="OK", messages=[m.hex() for m in messages], trailing=trailing)
    except grpc.RpcError as err:
        result.update(code=err.code().name, details=err.details(), messages=[])
    print(json.dumps(result), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("calls", nargs="+")
    args = parser.parse_args()
    channel = grpc.insecure_channel(args.target)
    ident = dict(request_serializer=None, response_deserializer=None)
    unary = channel.unary_unary("/echo.Echo/Unary", **ident)
    server_stream = channel.unary_stream("/echo.Echo/ServerStream", **ident)
    client_stream = channel.stream_unary("/echo.Echo/ClientStream", **ident)
    bidi = channel.stream_stream("/echo.Echo/Bidi", **ident)
    flaky = channel.unary_unary("/echo.Echo/Flaky", **ident)
    flaky_stream = channel.stream_unary("/echo.Echo/FlakyStream", **ident)
    trailing = channel.unary_unary("/echo.Echo/Trailing", **ident)

    def with_trailers(stub, request):
        response, rpc = stub.with_call(request, timeout=5)
        return [response], [[k, v] for k, v in rpc.trailing_metadata()]

    def ping_pong():
        # Each message is sent only after the previous answer arrived: a gateway that
        # waited for the whole request before forwarding would never answer.
        import queue

        outgoing = queue.Queue()
        outgoing.put(b"ping-0")

        def requests():
            for _ in range(3):
                message = outgoing.get(timeout=5)
                if message is None:
                    return
                yield message

        received = []
        for i, answer in enumerate(bidi(requests(), timeout=5)):
            received.append(answer)
            outgoing.put(b"ping-%d" % (i + 1) if i < 2 else None)
        return received, []

    table = {
        "unary": lambda: with_trailers(unary, b"hello"),
        "server_stream": lambda: (list(server_stream(b"\x03abc", timeout=5)), []),
        "client_stream": lambda: ([client_stream(iter([b"a", b"bb", b"ccc"]), timeout=5)], []),
        "bidi": ping_pong,
        "flaky": lambda: with_trailers(flaky, b"again"),
        "flaky_stream": lambda: ([flaky_stream(iter([b"one", b"two"]), timeout=5)], []),
        "trailing": lambda: with_trailers(trailing, b"four"),
    }
    for name in args.calls:
        call(name, table[name])
    channel.close()


if __name__ == "__main__":
    main()
