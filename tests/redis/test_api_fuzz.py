"""schemathesis against the app's own /openapi.json: valid and invalid requests of every kind to
every operation of the real API (uvicorn, auth on, real redis-server); no answer may be a 500,
and every answer must match the document (status code, content type, schema, Allow header, 401
without a key, 4xx for schema-invalid input).

One default check is left out: positive_data_acceptance, which expects every schema-valid request
to succeed.  Cron expressions, time zones and cursors are validated beyond what JSON Schema can
say (`"cron": "0"` is a string, yet not a cron expression): those get 422 naming the field.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance
from support.live_api import MAX_EXAMPLES, LiveAPI
from support.redis_server import RedisServer

from rsched import Client
from rsched.api.openapi import document
from rsched.core.settings import Settings
from rsched.service.apikeys import op_create_key


@pytest.fixture(scope="module")
def live(redis_server: RedisServer) -> Iterator[tuple[str, str]]:
    redis_server.resume()
    with redis.Redis.from_url(redis_server.url) as r:
        r.flushall()
    s = Settings.from_env(redis_url=redis_server.url)
    admin = Client(settings=s)
    _, secret = admin.run(op_create_key("schemathesis", "admin"))
    seed = admin.schedule("seed", {"n": 1}, run_at=4102444800000)  # a job paths can point at
    admin.close()
    with LiveAPI(s) as api:
        yield f"http://127.0.0.1:{api.port}", f"{secret}|{seed.id}"


# Built from the same document the app serves at /openapi.json (a test in test_api.py checks the
# served one is this one); loading it needs no server at collection time.
# The SSE streams never end on their own: their frames are tested in test_run_events.py.
schema = schemathesis.openapi.from_dict(document(auth=True)).exclude(path_regex="events$")
# Every request carries the test's key (call_and_validate's headers): a case made negative by
# leaving the key out would be sent with it, and then wrongly expected to be refused.
schema.config.generation.update(with_security_parameters=False)


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_request_yields_a_server_error_or_an_undocumented_answer(
    # type-arg: Case is generic in schemathesis' own operation type.  The annotation stays bare:
    # hypothesis seeds derandomized runs from the signature, so naming it would change the cases.
    case: schemathesis.Case, live: tuple[str, str]  # type: ignore[type-arg]
) -> None:
    base, token = live
    secret = token.split("|")[0]
    case.call_and_validate(base_url=base, headers={"Authorization": f"Bearer {secret}"},
                           excluded_checks=[positive_data_acceptance])
