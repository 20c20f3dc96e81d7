"""The proxy host, a process of its own: `python -m chaos.proxyd <upstream port> <n>`.

Starts n support.tcp_proxy.TcpProxy instances (tests/support) in front of the Redis under test
(one per rsched process, so one process's connections can be frozen alone) and prints their
ports as one JSON line.  Then reads commands from stdin, one a line: ``freeze <i>``,
``thaw <i>``, ``drop <i>``, answering ``ok`` to each.  A process of its own, so the proxies'
threads never compete with the nemesis for the controller's GIL.
"""

from __future__ import annotations

import json
import sys

from support.tcp_proxy import TcpProxy  # tests/support, found by chaos/__init__.py


def main(argv: list[str]) -> int:
    upstream, n = int(argv[0]), int(argv[1])
    proxies = [TcpProxy(upstream).start() for _ in range(n)]
    print(json.dumps([p.port for p in proxies]), flush=True)
    for line in sys.stdin:
        verb, _, index = line.strip().partition(" ")
        proxy = proxies[int(index)]
        {"freeze": proxy.freeze, "thaw": proxy.thaw, "drop": proxy.drop}[verb]()
        print("ok", flush=True)
    for p in proxies:
        p.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
