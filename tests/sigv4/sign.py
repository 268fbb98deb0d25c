"""Signs one request with botocore's SigV4Auth at a given time, for a Rust-side cross-check.

Reads a JSON object from stdin:
    {"method": "POST", "url": "http://host:9200/_bulk?refresh=true",
     "headers": {"content-type": "application/json", ...}, "body_base64": "...",
     "region": "eu-west-1", "service": "es", "access_key_id": "...",
     "secret_access_key": "...", "session_token": null or "...",
     "amz_date": "20260305T093000Z"}
and prints
    {"authorization": "...", "canonical_request": "...", "string_to_sign": "...",
     "signed_headers": "...", "signature": "...", "headers": [[name, value], ...]}
as botocore computes them (verify_proxy.botocore_sign: the same computation the proxy
checks against). botocore signs every header given (host from the URL when absent, and
X-Amz-Date, X-Amz-Security-Token it adds itself) but user-agent and the other headers of
botocore.auth.SIGNED_HEADERS_BLACKLIST; pass x-amz-content-sha256 in "headers" to have it
signed (botocore then takes the payload hash from it). The query is canonicalized as the
proxy does: decoded, then URI-encoded and sorted by botocore.
"""

import base64
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from verify_proxy import botocore_sign  # noqa: E402


def main():
    req = json.load(sys.stdin)
    headers = req.get("headers") or {}
    pairs = list(headers.items()) if isinstance(headers, dict) else [tuple(h) for h in headers]
    out = botocore_sign(
        req["method"],
        req["url"],
        pairs,
        base64.b64decode(req.get("body_base64") or ""),
        req["region"],
        req["service"],
        req["access_key_id"],
        req["secret_access_key"],
        req.get("session_token"),
        req["amz_date"],
    )
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
