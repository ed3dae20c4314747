"""Issue 40 (low): a token scope that could never be used is refused where it enters, and a
revoked token's name can be used again, as the hint for a taken name says."""

from __future__ import annotations

import re
import subprocess

import pytest

from sqlkit import tokens
from tests.helpers import scalar
from tests.test_serve import COURIER


@pytest.mark.parametrize("topics, endpoints, actions, says", [
    (["ord*"], [], ["consume"], "not patterns; got 'ord*'"),
    (["orders"], ["bill*"], ["enqueue"], "not patterns; got 'bill*'"),
    ([], [], ["consume"], "topics: a token that may consume needs topics"),
    ([], ["billing"], ["publish"], "topics: a token that may publish needs topics"),
    ([], [], ["enqueue", "monitor"], "topics: a token that may enqueue needs topics"),
])
def test_a_scope_that_matches_nothing_is_refused(conn, topics, endpoints, actions, says):
    with pytest.raises(Exception, match=re.escape(says)):
        tokens.create_token(conn, "t", topics=topics, endpoints=endpoints, actions=actions)
    assert scalar(conn, "SELECT count(*) FROM courier.api_tokens") == 0


def test_scopes_that_can_be_used_are_made(conn):
    tokens.create_token(conn, "a", topics=["*"], endpoints=[], actions=["consume"])
    tokens.create_token(conn, "b", topics=[], endpoints=["billing"], actions=["enqueue"])
    tokens.create_token(conn, "c", topics=[], endpoints=[], actions=["admin"])
    assert scalar(conn, "SELECT count(*) FROM courier.api_tokens") == 3


def test_a_revoked_tokens_name_can_be_used_again(conn, dsn):
    first = tokens.create_token(conn, "ingest", topics=["orders"], endpoints=[], actions=["consume"])
    with pytest.raises(Exception, match="exists already"):
        tokens.create_token(conn, "ingest", topics=["orders"], endpoints=[], actions=["consume"])
    assert tokens.revoke_token(conn, "ingest")
    second = tokens.create_token(conn, "ingest", topics=["orders"], endpoints=[], actions=["consume"])
    assert second != first
    assert scalar(conn, "SELECT count(*) FROM courier.api_tokens WHERE name = 'ingest' AND revoked_at IS NULL") == 1
    events = [row[0] for row in conn.execute("SELECT event_type FROM courier.event_log "
                                             "WHERE event_type LIKE 'token.%' ORDER BY id")]
    assert events == ["token.created", "token.revoked", "token.created"]
    # The CLI says it in one line, with the way out.
    done = subprocess.run([str(COURIER), "token", "create", "x", "--topics", "ord*", "--can", "consume", "--dsn", dsn],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "not patterns" in done.stderr and "Traceback" not in done.stderr
