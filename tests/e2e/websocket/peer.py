"""Both ends of the WebSocket end-to-end tests, with the stock `websockets` library.

  peer.py server PORT LOG      echo server on 127.0.0.1:PORT; one JSON line per event in LOG
  peer.py echo URL N           send N messages (a window of 100 in flight), check the echoes
  peer.py wait URL SECONDS     open, then wait for the gateway to close; report the close
  peer.py tick URL SECONDS     open, send a message every 100 ms until closed; report the close

Clients print one JSON line: {"status": ..} for a refused handshake, else what happened.
Every wait is bounded. A client sends `X-Api-Key: $PEER_API_KEY` when that is set.
"""
import asyncio
import json
import os
import sys

import websockets
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve


def main():
    mode = sys.argv[1]
    if mode == "server":
        asyncio.run(server(int(sys.argv[2]), sys.argv[3]))
    else:
        print(json.dumps(asyncio.run(client(mode, sys.argv[2], sys.argv[3]))), flush=True)


async def server(port, path):
    log = open(path, "a", buffering=1)

    def note(event):
        log.write(json.dumps(event) + "\n")

    def request(connection, req):
        note({"event": "request", "path": req.path,
              "headers": [[k.lower(), v] for k, v in req.headers.raw_items()]})

    async def echo(ws):
        count = 0
        try:
            async for message in ws:
                count += 1
                await ws.send(message)
        except websockets.ConnectionClosed:
            pass
        note({"event": "closed", "messages": count,
              "code": ws.close_code, "reason": ws.close_reason})

    async with serve(echo, "127.0.0.1", port, process_request=request, max_size=2**20):
        note({"event": "listening"})
        await asyncio.Future()


async def client(mode, url, arg):
    try:
        key = os.environ.get("PEER_API_KEY")
        headers = {"X-Api-Key": key} if key else None
        ws = await asyncio.wait_for(
            connect(url, open_timeout=10, close_timeout=5, additional_headers=headers), 15)
    except websockets.InvalidStatus as err:
        return {"status": err.response.status_code}
    async with ws:
        if mode == "echo":
            n = int(arg)
            sent = 0
            received = 0
            while sent < n:
                window = min(100, n - sent)
                for i in range(sent, sent + window):
                    await ws.send(f"message {i}")
                for i in range(sent, sent + window):
                    got = await asyncio.wait_for(ws.recv(), 10)
                    if got != f"message {i}":
                        return {"error": f"expected message {i}, got {got!r}"}
                    received += 1
                sent += window
            return {"received": received}
        seconds = float(arg)
        try:
            if mode == "wait":
                await asyncio.wait_for(ws.recv(), seconds)
            else:
                async def tick():
                    while True:
                        await ws.send("tick")
                        await ws.recv()
                        await asyncio.sleep(0.1)
                await asyncio.wait_for(tick(), seconds)
        except websockets.ConnectionClosed:
            pass
        except asyncio.TimeoutError:
            return {"error": "not closed in time"}
        rcvd = ws.protocol.close_rcvd
        return {"code": rcvd.code if rcvd else None, "reason": rcvd.reason if rcvd else None}


if __name__ == "__main__":
    main()
