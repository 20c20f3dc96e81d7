"""The API served by uvicorn in a thread of this process (schemathesis and the /docs tests)."""

from __future__ import annotations

import threading
import time

import uvicorn

from rsched.api.app import create_app
from rsched.api.server import ServerLimits, protocol
from rsched.core.settings import Settings
from support.redis_server import free_port

MAX_EXAMPLES = 15  # per operation: the suite stays fast, every route is still fuzzed


class LiveAPI:
    """The app served by uvicorn in a thread of this process, on a free loopback port."""

    def __init__(self, settings: Settings) -> None:
        self.port = free_port()
        # The protocol `rsched api` serves with (rsched.api.server), so what the tests see of
        # malformed requests is what a client of the real server sees.
        config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=self.port,
                                log_level="warning", lifespan="on",
                                http=protocol(ServerLimits()), ws="none")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveAPI:
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
