"""A private PostgreSQL server for the shared history store's tests (issue 29), started the way the
Slurm test bed is: Debian's `postgresql` installed when missing (as root, apt-get), a fresh database
cluster initialised in a folder of ours, the server started as a plain background process (no
systemd) on a free localhost port, stopped and its folder removed at the end. As root the server
runs as Debian's `postgres` user (it refuses root); otherwise as whoever we are.

    server = PostgresServer()
    server.start()                      # Unavailable (with the reason) when it cannot be provided
    url = server.create_database("n1")  # postgresql://suite:<password>@127.0.0.1:<port>/n1
    server.stop()
"""
from __future__ import annotations

import ctypes
import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from . import system

PACKAGE = "postgresql"
USER = "suite"                      # the role the suite connects as (a password login over TCP)
START_TIMEOUT_S = 60.0
PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent() -> None:
    """preexec_fn: the server goes when the test process dies (a crashed or killed session)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def server_binaries() -> Path | None:
    """The bin folder of the newest PostgreSQL installed (Debian keeps them off PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parent.parent.name))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("postgres")
    return Path(on_path).parent if on_path else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """One server, one superuser over its private socket, and the role USER with a password."""

    def __init__(self) -> None:
        self.port = 0
        self.password = secrets.token_hex(12)
        self.root: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.bin: Path | None = None
        self.install_s: float | None = None   # None: the package was there already
        self.start_s = 0.0

    @property
    def data(self) -> Path:
        assert self.root is not None
        return self.root / "data"

    def _as_owner(self) -> dict:
        """subprocess arguments that run a program as the server's owner."""
        if os.geteuid() != 0:
            return {}
        entry = pwd.getpwnam("postgres")
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}

    def _run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=self.root,
                                **self._as_owner())
        if result.returncode != 0:
            raise system.Unavailable(f"{Path(argv[0]).name} failed (rc {result.returncode}): "
                                     f"{(result.stderr or result.stdout).strip()[-1500:]}")
        return result

    def start(self) -> None:
        began = time.monotonic()
        self.bin = server_binaries()
        if self.bin is None:
            self.install_s = system.install_packages([PACKAGE], {}, timeout_s=600)
            self.bin = server_binaries()
            if self.bin is None:
                raise system.Unavailable(f"apt-get installed {PACKAGE} but no postgres binary is found")
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise system.Unavailable("running as root, and there is no `postgres` user to run the server "
                                         "as (Debian's postgresql package makes it)") from None
        # /tmp, not pytest's folder: the server's user must be able to reach its data and socket
        self.root = Path(tempfile.mkdtemp(prefix="suite-pg-"))
        owner = self._as_owner()
        if owner:
            os.chown(self.root, owner["user"], owner["group"])
        self.root.chmod(0o755)
        self.port = _free_port()
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth-local=trust",
                  "--auth-host=scram-sha-256", "--encoding=UTF8", "--no-instructions", timeout=120)
        log = open(self.root / "server.log", "w")
        self.proc = subprocess.Popen(
            [str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port), "-k", str(self.root),
             "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=50"],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.root, preexec_fn=_die_with_parent, **owner)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise system.Unavailable(f"postgres exited (rc {self.proc.returncode}) on start:\n"
                                         f"{system.tail(self.root / 'server.log')}")
            ready = subprocess.run([str(self.bin / "pg_isready"), "-h", str(self.root), "-p", str(self.port)],
                                   capture_output=True)
            if ready.returncode == 0:
                break
            if time.monotonic() > deadline:
                self.stop()
                raise system.Unavailable(f"postgres not ready in {START_TIMEOUT_S:.0f} s")
            time.sleep(0.1)
        self.sql(f"CREATE ROLE {USER} LOGIN CREATEDB PASSWORD '{self.password}'")
        self.start_s = time.monotonic() - began

    def sql(self, statement: str, database: str = "postgres") -> str:
        """Run one statement as the superuser over the private socket; its output (tuples only)."""
        assert self.bin is not None
        return self._run(str(self.bin / "psql"), "-h", str(self.root), "-p", str(self.port), "-U", "postgres",
                         "-d", database, "-v", "ON_ERROR_STOP=1", "-At", "-c", statement).stdout.strip()

    def url(self, database: str, password: str | None = None, port: int | None = None) -> str:
        """The SQLAlchemy URL a user of the store gives (password and port overridable, to get them wrong)."""
        return (f"postgresql://{USER}:{self.password if password is None else password}@127.0.0.1:"
                f"{self.port if port is None else port}/{database}")

    def create_database(self, name: str) -> str:
        """A new empty database owned by USER; its URL."""
        self.sql(f"CREATE DATABASE {name} OWNER {USER}")
        return self.url(name)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)      # "fast shutdown": roll back, disconnect, stop
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
