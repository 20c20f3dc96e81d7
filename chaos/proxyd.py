"""The proxy host, a process of its own: `python -m chaos.proxyd <upstream port>[,<port>...] <n>`.

Starts n groups of support.tcp_proxy.TcpProxy instances (tests/support), one group per rsched
process and in each group one proxy per upstream (the one Redis under test, or every node of a
cluster), so one process's connections can be frozen alone, and prints their ports as one JSON
line: a list of n lists, each in the order of the upstreams.  Then reads commands from stdin,
one a line: ``freeze <i>``, ``thaw <i>``, ``drop <i>`` (every proxy of group i), answering
``ok`` to each.  A process of its own, so the proxies' threads never compete with the nemesis
for the controller's GIL.
"""

from __future__ import annotations

import json
import sys

from support.tcp_proxy import TcpProxy  # tests/support, found by chaos/__init__.py


def main(argv: list[str]) -> int:
    upstreams, n = [int(p) for p in argv[0].split(",")], int(argv[1])
    groups = [[TcpProxy(u).start() for u in upstreams] for _ in range(n)]
    print(json.dumps([[p.port for p in g] for g in groups]), flush=True)
    for line in sys.stdin:
        verb, _, index = line.strip().partition(" ")
        for proxy in groups[int(index)]:
            {"freeze": proxy.freeze, "thaw": proxy.thaw, "drop": proxy.drop}[verb]()
        print("ok", flush=True)
    for g in groups:
        for p in g:
            p.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
