"""Lets the test process reach a server inside a host's namespace: listens on a Unix socket
(the file system is shared by every namespace) and relays each connection to ADDR:PORT as
seen from the namespace it runs in (`ip netns exec NS python -m tests.multihost.relay ...`).
The tests' own network namespace is never touched: no interface, address or route is added
to it. Prints ``RELAY_READY`` once listening."""

from __future__ import annotations

import argparse
import asyncio
import contextlib


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


async def _serve(path: str, host: str, port: int) -> None:
    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    server = await asyncio.start_unix_server(relay, path)
    print("RELAY_READY", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="the Unix socket to listen on")
    parser.add_argument("to", help="ADDR:PORT to relay to")
    args = parser.parse_args(argv)
    host, port = args.to.rsplit(":", 1)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.path, host, int(port)))


if __name__ == "__main__":
    main()
