"""What the tests share: real redis-server, Sentinel and Cluster processes, the TCP proxy, the
apps that test workers load, and helpers for driving the engine.  Imported as ``support.*`` with
tests/ on sys.path (pytest's ``pythonpath``), by chaos/ and loadtest/ too."""
