"""Two apps with one no-op handler each (job types a and b), for workers that share a queue
(loadtest/bench_shared_queue.py)."""

from noop_app import noop

from rsched import App

a = App("a")
a.job("a")(noop)
b = App("b")
b.job("b")(noop)
