"""What the local stack exposes: every listener on loopback, and Postgres behind real passwords.

Another local user, or another machine, must not reach a server around Toxiproxy, log in to
Postgres without the stack's password, or run programs through it.
"""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path

import pytest

from harness import Endpoints
from harness.clients import db
from harness.stack import topology
from harness.stack.local_state import tagged_pids
from tests.integration.test_no_leaks import tagged

pytestmark = pytest.mark.integration
SERVICES = ("toxiproxy", "postgres", "activemq", "kafka", "dtm")
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp*


@pytest.fixture
def local_stack(txchaos_stack: Endpoints) -> Endpoints:
    if txchaos_stack.provider != "local":
        pytest.skip("reads the local provider's processes")
    return txchaos_stack


def _address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """Decode a /proc/net/tcp{,6} address: 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def _listeners() -> dict[int, tuple[str, int]]:
    """Return every listening TCP socket of the host: inode -> (address, port)."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != LISTEN:
                continue
            hex_addr, hex_port = fields[1].split(":")
            found[int(fields[9])] = (str(_address(hex_addr)), int(hex_port, 16))
    return found


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir() if fd_dir.exists() else []:
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def test_every_listener_of_every_stack_process_is_on_loopback(local_stack: Endpoints) -> None:
    listeners = _listeners()
    seen: dict[str, list[tuple[str, int]]] = {}
    for service in SERVICES:
        for pid in tagged(f"stack/{local_stack.stack_id}/{service}"):
            seen.setdefault(service, []).extend(listeners[i] for i in _socket_inodes(pid) if i in listeners)
    assert set(seen) == set(SERVICES), f"found no listener for {set(SERVICES) - set(seen)}: the probe is blind"
    exposed = {s: [a for a in addrs if not _is_loopback(a[0])] for s, addrs in seen.items()}
    assert not any(exposed.values()), f"listening beyond loopback: { {s: a for s, a in exposed.items() if a} }"
    dtm_ports = {port for _, port in seen["dtm"]}
    assert local_stack.dtm is not None
    assert local_stack.dtm.upstream_port in dtm_ports, "DTM's HTTP port was not among its listeners"


def test_a_wrong_password_is_refused_over_tcp(local_stack: Endpoints) -> None:
    p = local_stack.postgres
    for host, port in ((p.host, p.port), (p.upstream_host, p.upstream_port)):  # through the proxy, and around it
        for user, password in ((local_stack.db_user, "wrong"), ("postgres", "postgres"), (topology.DB_ADMIN, "")):
            url = f"postgresql+psycopg://{user}:{password}@{host}:{port}/{local_stack.db_name}"
            with pytest.raises(Exception, match=r"password authentication failed|no password supplied"):
                db.ping(url)
    assert db.ping(local_stack.postgres_url), "the stack's own password no longer works"


def test_the_sut_role_is_no_superuser_and_cannot_run_programs(local_stack: Endpoints) -> None:
    eng = db.engine(local_stack.postgres_url, pool_size=1)
    try:
        with eng.connect() as conn:
            row = conn.exec_driver_sql(
                "SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = current_user"
            ).one()
            assert tuple(row) == (False, False, False)
        marker = Path(f"/tmp/txchaos-copy-to-program-{os.getpid()}")
        with pytest.raises(Exception, match=r"pg_execute_server_program|must be superuser"), eng.connect() as conn:
            conn.exec_driver_sql(f"COPY (SELECT 1) TO PROGRAM 'touch {marker}'")
        assert not marker.exists()
        with eng.begin() as conn:  # what a scenario needs: its own tables
            conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS exposure_probe (id int)")
            conn.exec_driver_sql("TRUNCATE exposure_probe")
            conn.exec_driver_sql("DROP TABLE exposure_probe")
    finally:
        eng.dispose()


def test_the_postgres_server_has_no_root_group(local_stack: Endpoints) -> None:
    pids = tagged_pids(f"stack/{local_stack.stack_id}/postgres")
    assert pids, "no postgres server recorded for this stack"
    for pid in pids:
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
        gids = status["Gid"].split() + status["Groups"].split()
        if os.geteuid() == 0:
            assert "0" not in gids, f"postgres pid {pid} runs with the root group: Gid {status['Gid']!r}"
        else:
            assert set(gids) <= {str(g) for g in (os.getgid(), *os.getgroups())}


def test_the_endpoints_file_is_readable_by_its_user_only(local_stack: Endpoints) -> None:
    path = Path(local_stack.state_dir) / "endpoints.json"
    mode = stat.S_IMODE(path.stat().st_mode)
    assert mode & 0o077 == 0, f"{path} holds the database password and has mode {oct(mode)}"
    assert local_stack.db_password != topology.DB_PASSWORD, "the password is the fixed one, not made per stack"
