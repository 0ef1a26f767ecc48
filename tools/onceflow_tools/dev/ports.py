"""Who holds a dev service's port, and what to say about it.

``onceflow dev up`` in a second checkout, while the first one's services listen on the
same ports, failed with pg_ctl's last line, "pg_ctl failed: Examine the log output."
(the log said "Address already in use"). :func:`port_taken` says which port, which
process holds it, whose dev services those are when they are onceflow's, and what to do.

The process is found the way ``ss -ltnp`` finds it: the listening socket's inode in
``/proc/net/tcp`` and ``tcp6``, then the process with that socket among its open files
(another user's processes are visible to root only; then the answer says so).
A PostgreSQL of the dev services is told by its ``-D`` data directory, whose parent
holds :data:`STATE_DIR_MARKER` (written by ``dev up``), a Kafka by its
``<state dir>/kafka/server.properties`` argument.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from onceflow.errors import ServiceUnavailable

#: Written beside the PostgreSQL data directory by ``dev up``: the state directory
#: (and so the checkout) whose dev services run that cluster.
STATE_DIR_MARKER = "onceflow-state-dir"

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column
_PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class Holder:
    """A process listening on a port: its pid and command line (None: unreadable)."""

    pid: int | None
    argv: tuple[str, ...] = ()

    @property
    def command(self) -> str:
        """The command line, or its program and last two arguments when long (a JVM's
        options say nothing; its main class and config file do)."""
        text = " ".join(self.argv)
        if len(text) <= 160 or len(self.argv) < 3:
            return text[:160]
        return f"{Path(self.argv[0]).name} … {' '.join(self.argv[-2:])}"[:160]


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (_PROC / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            listening = len(fields) > 9 and fields[3] == _LISTEN
            if listening and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def holder(port: int) -> Holder | None:
    """The process listening on ``port``; ``Holder(None)`` when a socket listens but its
    process cannot be seen (another user's, not root); None when nothing listens."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for proc in _PROC.iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in wanted:
                    return Holder(int(proc.name), _argv(proc))
            except OSError:
                continue
    return Holder(None)


def _argv(proc: Path) -> tuple[str, ...]:
    try:
        raw = (proc / "cmdline").read_bytes()
    except OSError:
        return ()
    return tuple(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def dev_state_dir(argv: tuple[str, ...]) -> Path | None:
    """The state directory whose dev services ``argv`` is, if it is one of them."""
    for i, arg in enumerate(argv):
        path = Path(arg)
        if path.name == "server.properties" and path.parent.name == "kafka":
            return path.parent.parent
        if arg == "-D" and i + 1 < len(argv):
            marker = Path(argv[i + 1]).parent / STATE_DIR_MARKER
            try:
                return Path(marker.read_text().strip())
            except OSError:
                return None
    return None


def _dev_postgres_data(argv: tuple[str, ...]) -> Path | None:
    """The data directory of a dev PostgreSQL started before it left its marker: the
    cluster lives in ``/var/tmp/onceflow-postgres-<hash>/data`` (as root) or
    ``<state dir>/postgres/data``."""
    for i, arg in enumerate(argv[:-1]):
        data = Path(argv[i + 1])
        if arg == "-D" and data.name == "data":
            cluster = data.parent.name
            if cluster.startswith("onceflow-postgres-") or cluster == "postgres":
                return data
    return None


def port_taken(port: int, service: str, state_dir: Path) -> ServiceUnavailable:
    """The error ``dev up`` raises when ``service``'s ``port`` is already taken."""
    found = holder(port)
    if found is None or found.pid is None:
        who = "another process" + (
            "" if found is None else " (not visible to this user; `sudo ss -ltnp` names it)"
        )
        return ServiceUnavailable(
            f"port {port} ({service}) is taken by {who}: stop it, then run `onceflow dev up` again"
        )
    who = f"pid {found.pid} ({found.command})"
    theirs = dev_state_dir(found.argv)
    unmarked = _dev_postgres_data(found.argv) if theirs is None else None
    if unmarked is not None:
        return ServiceUnavailable(
            f"port {port} ({service}) is taken by {who}: the dev PostgreSQL of another"
            f" checkout (data in {unmarked.parent}). Use it from here as it is (the same"
            ' address: `eval "$(onceflow dev env)"`), or stop it first with `onceflow dev'
            " down` in the checkout that started it, then run `onceflow dev up`"
        )
    if theirs is None:
        return ServiceUnavailable(
            f"port {port} ({service}) is taken by {who}, which onceflow did not start:"
            " stop it, then run `onceflow dev up` again"
        )
    if theirs.resolve() == state_dir.resolve():
        return ServiceUnavailable(
            f"port {port} ({service}) is taken by {who}, this checkout's own service left"
            " running without its pid file: stop that process, then run `onceflow dev up`"
        )
    return ServiceUnavailable(
        f"port {port} ({service}) is taken by {who}: the dev services of another checkout"
        f" (state directory {theirs}). Use them from here as they are (the same addresses:"
        ' `eval "$(onceflow dev env)"`), or stop them first with'
        f" `ONCEFLOW_STATE_DIR={theirs} onceflow dev down`, then run `onceflow dev up`"
    )
