"""What an API key and ACL check costs per request: ``python -m bench.auth``.

Measures, in one process, the work the auth middleware does per request (parse
the Authorization header, authenticate the key, find the endpoint's rule, check
the ACLs of a principal with 50 ACLs) against a baseline measured in the same
run: decoding the JSON body of a one-record produce request with msgspec (the
least the server does for any produce). Prints a table, writes JSON.
"""

from __future__ import annotations

import base64
import tempfile
import timeit
from pathlib import Path

import msgspec

from bench.report import print_table, write_json
from ingest_api.broker.security import Acl, SecurityStore, parse_credentials
from ingest_api.http.auth import rule_for
from ingest_api.http.models import ProduceRecord

N = 50_000


def main() -> None:
    store = SecurityStore(Path(tempfile.mkdtemp(prefix="lakelog-bench-auth-")))
    key, secret = store.create_key("alice")
    for i in range(50):
        store.add_acl(Acl("alice", "topic", f"t{i}", "literal", "produce"))
    header = "Basic " + base64.b64encode(f"{key.key_id}:{secret}".encode()).decode()
    path = "/v3/clusters/lakelog/topics/t49/records"

    def check() -> None:
        creds = parse_credentials(header)
        assert creds is not None
        principal = store.authenticate(*creds)
        rule, name = rule_for("POST", path)
        assert principal and rule.resource_type
        assert store.allowed(principal, rule.resource_type, name, rule.operation)

    body = msgspec.json.encode({"key": {"type": "STRING", "data": "k" * 16},
                                "value": {"type": "STRING", "data": "v" * 100}})
    decoder = msgspec.json.Decoder(ProduceRecord)

    def baseline() -> None:
        decoder.decode(body)

    auth_us = min(timeit.repeat(check, number=N, repeat=3)) / N * 1e6
    base_us = min(timeit.repeat(baseline, number=N, repeat=3)) / N * 1e6
    rows = [{"case": "auth check (50 ACLs)", "us_per_request": round(auth_us, 2),
             "ratio_to_baseline": round(auth_us / base_us, 2)},
            {"case": "baseline: decode a 1-record produce body", "us_per_request": round(base_us, 2),
             "ratio_to_baseline": 1.0}]
    print_table(rows, ["case", "us_per_request", "ratio_to_baseline"])
    print(f"wrote {write_json('auth', rows)}")


if __name__ == "__main__":
    main()
