"""A cable with a delay: forwards Ethernet frames between two TAP devices it creates, holding
the frames of one TCP flow direction (`--delay-to ADDR:PORT`) for `--delay-ms` first.

tc's netem would do this in the kernel, but this machine's kernel (and so CI's) is built
without it (CONFIG_NET_SCH_NETEM is not set), so the worker hosts' data links go through this
process: the same effect as `tc qdisc add dev <worker's link> root netem delay 200ms` behind
a filter for Postgres (frames towards ADDR:PORT wait, in order; every other frame, the answers
included, passes at once). The delay changes on SIGHUP, read from `--delay-file` (a number of
milliseconds; 0 or a missing file: none). On SIGUSR1 it writes how many sends of data
(statements: see `ends_a_send`) went towards ADDR:PORT (delayed or not) to the delay file's
name with `.stats` for a suffix.

Run in the switch's namespace (`ip netns exec SW python -m tests.multihost.wire ...`); it
prints ``WIRE_READY`` once both TAP devices exist. They are this process's: they vanish with it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import ipaddress
import os
import select
import signal
import struct
import time
from pathlib import Path

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
ETH_IPV4 = 0x0800
TCP = 6
PSH = 0x08
MAX_FRAME = 65536


def open_tap(name: str) -> int:
    """A TAP device of this process (it goes when the file descriptor does)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TAP | IFF_NO_PI))
    return fd


def flow_payload(frame: bytes, address: bytes, port: int) -> int | None:
    """The TCP payload's length of an Ethernet frame carrying IPv4 TCP to `address` (4 bytes)
    and `port`; None for any other frame."""
    found = _flow_segment(frame, address, port)
    return None if found is None else found[0]


def ends_a_send(frame: bytes, address: bytes, port: int) -> bool:
    """Whether the frame carries the last piece of data the client sent at once (TCP's PSH
    flag, which Linux sets on the last segment of a write): one statement, however many
    frames its text takes."""
    found = _flow_segment(frame, address, port)
    return found is not None and found[0] > 0 and bool(found[1] & PSH)


def _flow_segment(frame: bytes, address: bytes, port: int) -> tuple[int, int] | None:
    """(payload length, TCP flags) of a frame of the flow; None for any other frame."""
    if len(frame) < 34 or struct.unpack_from("!H", frame, 12)[0] != ETH_IPV4:
        return None
    header = (frame[14] & 0x0F) * 4
    if frame[23] != TCP or frame[30:34] != address or len(frame) < 14 + header + 14:
        return None
    if struct.unpack_from("!H", frame, 14 + header + 2)[0] != port:
        return None
    total = struct.unpack_from("!H", frame, 16)[0]
    return total - header - (frame[14 + header + 12] >> 4) * 4, frame[14 + header + 13]


def read_delay(path: Path | None) -> float:
    try:
        return float(path.read_text().strip() or 0) / 1000 if path else 0.0
    except (OSError, ValueError):
        return 0.0


def forward(fd: int, frame: bytes) -> None:
    # the other end down (a partition): the frame is lost, as on a cable
    with contextlib.suppress(OSError):
        os.write(fd, frame)


def run(host_side: str, switch_side: str, to: str, delay_file: Path | None) -> None:
    address, port = to.rsplit(":", 1)
    flow = (ipaddress.IPv4Address(address).packed, int(port))
    a, b = open_tap(host_side), open_tap(switch_side)
    delay = read_delay(delay_file)
    reread, signal_out = os.pipe()
    os.set_blocking(signal_out, False)
    signal.set_wakeup_fd(signal_out)
    for signum in (signal.SIGHUP, signal.SIGUSR1):
        signal.signal(signum, lambda *_: None)
    held: collections.deque[tuple[float, bytes]] = collections.deque()
    sent = 0
    print("WIRE_READY", flush=True)
    while True:
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else None
        ready, _, _ = select.select([a, b, reread], [], [], timeout)
        if reread in ready:
            signals = os.read(reread, 512)
            if signal.SIGHUP in signals:
                delay = read_delay(delay_file)
            if signal.SIGUSR1 in signals and delay_file is not None:
                stats = delay_file.with_suffix(".stats")
                stats.with_suffix(".part").write_text(f"{sent}\n")
                stats.with_suffix(".part").rename(stats)
        for source in (s for s in (a, b) if s in ready):
            while True:
                try:
                    frame = os.read(source, MAX_FRAME)
                except BlockingIOError:
                    break
                except OSError:  # its side is down
                    break
                payload = flow_payload(frame, *flow) if source == a else None
                if payload and ends_a_send(frame, *flow):
                    sent += 1
                if payload is not None and delay:
                    held.append((time.monotonic() + delay, frame))
                elif source == a:
                    forward(b, frame)
                else:
                    forward(a, frame)
        now = time.monotonic()
        while held and held[0][0] <= now:
            forward(b, held.popleft()[1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("host_side", help="TAP device towards the host")
    parser.add_argument("switch_side", help="TAP device towards the switch")
    parser.add_argument("--delay-to", required=True, help="ADDR:PORT whose frames wait")
    parser.add_argument("--delay-file", type=Path, help="milliseconds of delay, read on SIGHUP")
    args = parser.parse_args(argv)
    run(args.host_side, args.switch_side, args.delay_to, args.delay_file)


if __name__ == "__main__":
    main()
