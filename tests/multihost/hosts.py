"""Hosts for multi-host tests: Linux network namespaces joined by veth pairs and bridges, each
running real recallq processes (`ip netns exec`), so a worker host can be cut off, slowed down
or made to vanish while the others go on.

                     switch (a namespace of its own: two bridges, the data links' wires)
     ┌──────────────────────── br-data 10.213.1.0/24 ────────────────────────┐
     │ veth                   wire ─ veth               wire ─ veth           │
   db 10.213.1.1          w1 10.213.1.11            w2 10.213.1.12   ...      │
   Postgres :5432,          recallq worker            recallq worker          │
   Redis :6379, API         (Celery, threads)         (Celery, threads)       │
     │                        │ veth                      │ veth              │
     └───────────── br-judge 10.213.2.0/24 ───────────────┴── judge 10.213.2.1
                                                             stub LLM :8080

A worker host has two links: its data link (to Redis and Postgres) and its judge link. The data
link runs through a wire (tests/multihost/wire.py: a userspace cable, as this kernel has no
netem) that can hold the frames towards Postgres for a delay. `cut()` takes the data link down
at the switch (both directions dead, no RST: frames are dropped, not refused), so its judge
calls in flight are still answered while it cannot reach the broker or the database; `heal()`
brings it back; `vanish()` takes both links down, SIGKILLs the host's processes and deletes its
namespace, leaving every TCP connection of it open at the other end.

The test process stays in its own namespace and never changes it (no interface, address or
route is added there): it reaches Postgres and Redis through their Unix sockets, and the API and
the stub through relays (tests/multihost/relay.py) listening on Unix sockets. Namespaces are
named `rqmh-<pid>-<random>-<host>`, unique per test session; `Network.close()` ends every
process in them and deletes them (the bridges, veths and TAP devices go with them), and a
session reaps the namespaces of sessions whose process is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
DATA_NET = "10.213.1"
JUDGE_NET = "10.213.2"
DB_ADDRESS = f"{DATA_NET}.1"
JUDGE_ADDRESS = f"{JUDGE_NET}.1"
POSTGRES_PORT = 5432
REDIS_PORT = 6379
API_PORT = 8000
STUB_PORT = 8080
_NAMESPACE = re.compile(r"^rqmh-(\d+)-[0-9a-f]+-")
_PR_SET_PDEATHSIG = 1


def unavailable() -> str | None:
    """Why this machine cannot make the tests' hosts, or None when it can."""
    if sys.platform != "linux":
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "making network namespaces needs root (CI runs as root)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if not os.access("/dev/net/tun", os.R_OK | os.W_OK):
        return "no /dev/net/tun for the data links' wires"
    probe = f"rqmh-{os.getpid()}-{secrets.token_hex(3)}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    return None


def ip(*args: str, namespace: str | None = None) -> None:
    command = ["ip", *(["-n", namespace] if namespace else []), *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the test process dies, even by SIGKILL (kept
    through `ip netns exec`, which execs; not by what the program forks itself)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Process:
    """A program started inside a namespace, its output in a log file."""

    def __init__(self, namespace: str, args: list[str], env: dict[str, str], name: str) -> None:
        self.name = name
        self.log_path = Path(tempfile.mkstemp(prefix=f"recallq-mh-{name}-", suffix=".log")[1])
        with self.log_path.open("wb") as log:
            # `ip netns exec` execs the program: its pid is this process's
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", namespace, *args],
                env=env,
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_output(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"{self.name}: {text!r} not seen; output:\n{self.output()[-3000:]}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stop(self, timeout: float = 20) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()


class Host:
    """One namespace: its links and the processes started in it."""

    def __init__(self, network: Network, name: str) -> None:
        self.network = network
        self.name = name
        self.namespace = f"{network.prefix}-{name}"
        self.processes: list[Process] = []
        self.data_address: str | None = None
        self.judge_address: str | None = None
        self.delay_file: Path | None = None
        self.wire: Process | None = None
        self.gone = False
        ip("netns", "add", self.namespace)
        ip("link", "set", "lo", "up", namespace=self.namespace)

    def start(self, args: list[str], env: dict[str, str], name: str) -> Process:
        process = Process(self.namespace, args, env, f"{self.name}-{name}")
        self.processes.append(process)
        return process

    def run(self, args: list[str], env: dict[str, str] | None = None) -> str:
        """A command run to its end inside this host; its output."""
        done = subprocess.run(
            ["ip", "netns", "exec", self.namespace, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} on {self.name}: {done.stdout}{done.stderr}")
        return done.stdout

    # --- faults ------------------------------------------------------------------------------

    def cut(self) -> None:
        """The data link down at the switch: Redis and Postgres unreachable both ways, every
        frame dropped and none refused (no RST); its judge link stays up."""
        ip("link", "set", f"d-{self.name}", "down", namespace=self.network.switch)

    def heal(self) -> None:
        ip("link", "set", f"d-{self.name}", "up", namespace=self.network.switch)

    def delay_postgres(self, milliseconds: float) -> None:
        """Frames from this host to Postgres wait this long in its data link's wire (0: none)."""
        assert self.delay_file is not None and self.wire is not None, "no wire on this host"
        self.delay_file.write_text(f"{milliseconds}\n")
        os.kill(self.wire.pid, signal.SIGHUP)

    def queries_sent(self) -> int:
        """Sends of data that this host's wire saw going to Postgres: each statement, BEGIN and
        COMMIT one however many frames it takes (read from the wire's stats file on SIGUSR1)."""
        assert self.delay_file is not None and self.wire is not None, "no wire on this host"
        stats = self.delay_file.with_suffix(".stats")
        stats.unlink(missing_ok=True)
        os.kill(self.wire.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not stats.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return int(stats.read_text().split()[0])

    def vanish(self) -> float:
        """Gone without a word: links down first (nothing closes cleanly), then every process
        SIGKILLed, then the namespace deleted. Its TCP connections stay open at the far end.
        Returns when (unix seconds) its database link was down: nothing it did after that
        reached the database."""
        ip("link", "set", f"d-{self.name}", "down", namespace=self.network.switch)
        cut_at = time.time()
        if self.judge_address is not None:
            ip("link", "set", f"j-{self.name}", "down", namespace=self.network.switch)
        for process in self.processes:
            process.kill()
        self.network.kill_all_in(self.namespace)
        ip("netns", "delete", self.namespace)
        self.gone = True
        if self.wire is not None:
            self.wire.kill()
        return cut_at

    def close(self) -> None:
        for process in self.processes:
            process.stop(timeout=5)
        if not self.gone:
            self.network.kill_all_in(self.namespace)
            with contextlib.suppress(RuntimeError):
                ip("netns", "delete", self.namespace)
            self.gone = True


class Network:
    """The test session's switch and hosts. Use as a context manager: everything goes at the
    end, whatever happened."""

    def __init__(self, scratch: Path) -> None:
        reap_orphans()
        self.prefix = f"rqmh-{os.getpid()}-{secrets.token_hex(3)}"
        self.scratch = scratch
        self.hosts: dict[str, Host] = {}
        self.switch = f"{self.prefix}-switch"
        self.wires: list[Process] = []
        ip("netns", "add", self.switch)
        for bridge in ("br-data", "br-judge"):
            ip("link", "add", bridge, "type", "bridge", namespace=self.switch)
            ip("link", "set", bridge, "up", namespace=self.switch)

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_host(
        self, name: str, data: str | None = None, judge: str | None = None, wire: bool = False
    ) -> Host:
        """A host with a link to each network it has an address on (`data`, `judge`: the last
        byte of its address). With `wire`, its data link runs through a wire."""
        host = Host(self, name)
        self.hosts[name] = host
        if data is not None:
            host.data_address = f"{DATA_NET}.{data}"
            self._plug(host, "data0", f"d-{name}", host.data_address)
            if wire:
                self._wire(host)
            else:
                ip("link", "set", f"d-{name}", "master", "br-data", namespace=self.switch)
        if judge is not None:
            host.judge_address = f"{JUDGE_NET}.{judge}"
            self._plug(host, "judge0", f"j-{name}", host.judge_address)
            ip("link", "set", f"j-{name}", "master", "br-judge", namespace=self.switch)
        return host

    def _plug(self, host: Host, inside: str, outside: str, address: str) -> None:
        ip(
            "link", "add", inside, "netns", host.namespace, "type", "veth",
            "peer", "name", outside, "netns", self.switch,
        )  # fmt: skip
        ip("addr", "add", f"{address}/24", "dev", inside, namespace=host.namespace)
        ip("link", "set", inside, "up", namespace=host.namespace)
        ip("link", "set", outside, "up", namespace=self.switch)

    def _wire(self, host: Host) -> None:
        """switch side: d-NAME (the host's veth) and the wire's a-NAME in a bridge of the
        host's own, c-NAME; the wire's b-NAME in br-data."""
        name = host.name
        host.delay_file = self.scratch / f"wire-{name}.delay"
        host.delay_file.write_text("0\n")
        host.wire = Process(
            self.switch,
            [
                sys.executable, "-m", "tests.multihost.wire", f"a-{name}", f"b-{name}",
                "--delay-to", f"{DB_ADDRESS}:{POSTGRES_PORT}",
                "--delay-file", str(host.delay_file),
            ],
            dict(os.environ),
            f"wire-{name}",
        )  # fmt: skip
        self.wires.append(host.wire)
        host.wire.wait_for_output("WIRE_READY", timeout=30)
        ip("link", "add", f"c-{name}", "type", "bridge", namespace=self.switch)
        for port, bridge in ((f"d-{name}", f"c-{name}"), (f"a-{name}", f"c-{name}")):
            ip("link", "set", port, "master", bridge, namespace=self.switch)
        ip("link", "set", f"b-{name}", "master", "br-data", namespace=self.switch)
        for device in (f"a-{name}", f"b-{name}", f"c-{name}"):
            ip("link", "set", device, "up", namespace=self.switch)

    @staticmethod
    def kill_all_in(namespace: str) -> None:
        """SIGKILL every process left in one of this session's namespaces."""
        found = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True)
        for pid in found.stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)

    def close(self) -> None:
        for host in reversed(self.hosts.values()):
            host.close()
        for wire in self.wires:
            wire.kill()
        self.kill_all_in(self.switch)
        with contextlib.suppress(RuntimeError):
            ip("netns", "delete", self.switch)


def reap_orphans() -> None:
    """Namespaces left by a test session that died (SIGKILL, a machine reset): their processes
    are SIGKILLed and they are deleted. A session still running is never touched: its pid is
    in the name."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        match = _NAMESPACE.match(name)
        if match is None or _alive(int(match.group(1))):
            continue
        Network.kill_all_in(name)
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)


def only_child(pid: int) -> int:
    """The one process `pid` forked (a `recallq worker --processes 1` once it said ready)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert len(children) == 1, f"process {pid} has children {children}, not one"
    return int(children[0])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- the servers --------------------------------------------------------------------------


class Postgres:
    """A cluster of the tests' own on the db host: TCP for the hosts, a Unix socket in its
    directory for the test process."""

    def __init__(self, host: Host) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        self.bin = Path(found[-1]).parent if found else Path(shutil.which("initdb") or "").parent
        self.dir = Path(tempfile.mkdtemp(prefix="recallq-mh-pg-"))
        shutil.chown(self.dir, "postgres", "postgres")
        self.host = host
        data = str(self.dir / "data")
        subprocess.run(
            _as_postgres([str(self.bin / "initdb"), "-D", data, "-U", "postgres", "-A", "trust"]),
            check=True,
            capture_output=True,
        )
        with (self.dir / "data" / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {DATA_NET}.0/24 trust\n")
        self._ctl = [str(self.bin / "pg_ctl"), "-D", data, "-l", str(self.dir / "log"), "-w"]
        # room for every worker's pool (10 + 40 overflow) and the connections a vanished host
        # leaves open: Postgres finds them dead only after TCP's keepalive (hours)
        options = (
            f"-p {POSTGRES_PORT} -k {self.dir} -c listen_addresses={DB_ADDRESS},127.0.0.1 "
            "-c fsync=off -c max_connections=400 -c log_line_prefix='%m [%p] %h '"
        )
        host.run(_as_postgres([*self._ctl, "-o", options, "start"]))

    def url(self, database: str, over: str = "socket") -> str:
        """over 'socket' (the test process), 'local' (the db host) or 'network' (others)."""
        if over == "socket":
            return f"postgresql+psycopg://postgres@/{database}?host={self.dir}&port={POSTGRES_PORT}"
        address = "127.0.0.1" if over == "local" else DB_ADDRESS
        return f"postgresql+psycopg://postgres@{address}:{POSTGRES_PORT}/{database}"

    def create_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(
            host=str(self.dir), port=POSTGRES_PORT, user="postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def stop(self) -> None:
        if not self.host.gone:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.host.run(_as_postgres([*self._ctl, "-m", "immediate", "stop"]))
        shutil.rmtree(self.dir, ignore_errors=True)


def _as_postgres(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command]


def start_redis(host: Host, directory: Path) -> tuple[Process, str]:
    """redis-server on the db host, without persistence; returns it and its socket's path."""
    socket_path = str(directory / "redis.sock")
    process = host.start(
        [
            "redis-server", "--bind", DB_ADDRESS, "127.0.0.1", "--port", str(REDIS_PORT),
            "--unixsocket", socket_path, "--unixsocketperm", "700", "--save", "",
            "--appendonly", "no", "--protected-mode", "no", "--dir", str(directory),
        ],
        dict(os.environ),
        "redis",
    )  # fmt: skip
    process.wait_for_output("Ready to accept connections", timeout=30)
    return process, socket_path


def relay(host: Host, socket_path: Path, to: str) -> Process:
    """A relay on `host` from a Unix socket the test process can reach to `to`."""
    process = host.start(
        [sys.executable, "-m", "tests.multihost.relay", str(socket_path), to],
        dict(os.environ),
        f"relay-{socket_path.stem}",
    )
    process.wait_for_output("RELAY_READY", timeout=30)
    return process


def http_client(socket_path: Path, host: str, timeout: float = 30) -> httpx.Client:
    """HTTP through a relay's socket, to a server that knows itself as `host`."""
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=str(socket_path)),
        base_url=f"http://{host}",
        timeout=timeout,
    )


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.1) -> Any:
    """predicate's first truthy value within `timeout` seconds; TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"not within {timeout} s")
        time.sleep(interval)


@contextlib.contextmanager
def scratch_directory() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="recallq-mh-"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
