"""Endpoints of a stack that is not running: what unit tests hand to code that only reads addresses."""

from __future__ import annotations

from harness.stack.base import Endpoint, Endpoints


def fake_endpoints(*, db_user: str = "u", db_password: str = "p", db_name: str = "d", dtm: bool = False) -> Endpoints:
    """Return loopback endpoints for stack ``s1`` (proxies on 2000N, upstreams on 3000N); no service answers."""

    def ep(proxy: str, port: int) -> Endpoint:
        return Endpoint("127.0.0.1", 20000 + port, proxy, "127.0.0.1", 30000 + port)

    return Endpoints(
        provider="local",
        stack_id="s1",
        postgres=ep("postgres", 1),
        stomp=ep("activemq_stomp", 2),
        kafka=ep("kafka", 3),
        toxiproxy_api="http://127.0.0.1:8474",
        db_user=db_user,
        db_password=db_password,
        db_name=db_name,
        state_dir="/tmp/s1",
        dtm=ep("dtm", 4) if dtm else None,
    )
