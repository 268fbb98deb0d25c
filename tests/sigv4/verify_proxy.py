"""A reverse proxy that checks AWS Signature Version 4 with botocore before forwarding,
so that lockgate's signing is checked against an independent implementation.

    verify_proxy.py --upstream http://127.0.0.1:PORT --region eu-west-1 --service es|aoss
                    --credentials FILE [--port 0] [--no-stdin] [--verbose]

Binds 127.0.0.1:PORT (0: a free port), prints one line `listening http://127.0.0.1:NNNN`
once ready, and exits when its stdin closes (so spawn it with a piped stdin; --no-stdin
turns that off for use by hand).

FILE is JSON, re-read on every request:
    [{"access_key_id": "...", "secret_access_key": "...",
      "session_token": null or "...", "not_after": epoch seconds or null}]

A request is accepted when it carries `Authorization: AWS4-HMAC-SHA256 Credential=...,
SignedHeaders=..., Signature=...` from one of those keys (not past not_after when the
request arrives), scoped to the x-amz-date's day, --region, --service and aws4_request,
with `x-amz-security-token` equal to the key's token when it has one (and signed), an
x-amz-date within 5 minutes of now, an `x-amz-content-sha256` equal to the body's hex
SHA-256 (required for aoss; checked when present for es), and a signature equal to the one
botocore's SigV4Auth computes for the request rebuilt as an AWSRequest: the method, the
URL as received, the signed headers with the values received, the body bytes as received
(compressed ones included) and the request's x-amz-date as botocore's clock.

The query string is canonicalized as the service does: decoded (form-urlencoded, `+` is a
space), then botocore URI-encodes and sorts the pairs (`_canonical_query_string_params`,
the same canonical form aws-sigv4 builds). A signature over the raw, non-canonical query
would be refused by AWS, so it is refused here too (the refusal says so).

Accepted requests go to --upstream (method, path, query, body; headers but hop-by-hop ones,
Host, Authorization and x-amz-*), and the upstream's answer comes back. Refused ones get
403 and the JSON body AWS gives. `GET /_sigv4/stats` (unsigned) answers
    {"accepted": N, "refused": N, "refusals": [last 20 reasons], "keys_used": {key id: N},
     "last_refusal": {...botocore's canonical request and string to sign, when computed}}
and `POST /_sigv4/reset` zeroes those counters.
"""

import argparse
import datetime
import hashlib
import hmac
import http.client
import http.server
import json
import os
import sys
import threading
import time
import urllib.parse

import botocore.auth
from botocore.auth import SIGNED_HEADERS_BLACKLIST, SIGV4_TIMESTAMP, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

MAX_SKEW_SECONDS = 5 * 60
ALGORITHM = "AWS4-HMAC-SHA256"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()

MSG_MISMATCH = (
    "The request signature we calculated does not match the signature you provided. "
    "Check your AWS Secret Access Key and signing method. Consult the service "
    "documentation for details."
)
MSG_EXPIRED_TOKEN = "The security token included in the request is expired"
MSG_INVALID_TOKEN = "The security token included in the request is invalid."
MSG_MISSING_AUTH = (
    "Authorization header requires 'Credential' parameter. Authorization header requires "
    "'Signature' parameter. Authorization header requires 'SignedHeaders' parameter. "
    "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header."
)

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
}

# ---------------------------------------------------------------------------------------
# botocore at a fixed time
#
# SigV4Auth.add_auth takes its timestamp from botocore.auth.get_current_datetime(). It is
# replaced, once, by a function that answers a per-thread fixed time when one is set (and
# the real clock otherwise), so that concurrent verifications do not race.
# ---------------------------------------------------------------------------------------

_clock = threading.local()
_real_get_current_datetime = botocore.auth.get_current_datetime


def _get_current_datetime(*args, **kwargs):
    fixed = getattr(_clock, "fixed", None)
    if fixed is not None:
        return fixed
    return _real_get_current_datetime(*args, **kwargs)


botocore.auth.get_current_datetime = _get_current_datetime


class _CapturingSigV4Auth(SigV4Auth):
    """botocore's SigV4Auth, keeping the canonical request and string to sign it computed."""

    canonical_request_text = None
    string_to_sign_text = None

    def canonical_request(self, request):
        text = super().canonical_request(request)
        self.canonical_request_text = text
        return text

    def string_to_sign(self, request, canonical_request):
        text = super().string_to_sign(request, canonical_request)
        self.string_to_sign_text = text
        return text


def botocore_sign(
    method,
    url,
    headers,
    body,
    region,
    service,
    access_key_id,
    secret_access_key,
    session_token,
    amz_date,
    raw_query=False,
):
    """Signs with botocore's SigV4Auth.add_auth at `amz_date` (YYYYMMDDTHHMMSSZ).

    `headers` is a list of (name, value) pairs (repeated names allowed); `body` bytes.
    The query of `url` is passed decoded as AWSRequest params (botocore then URI-encodes
    and sorts it), unless raw_query, where botocore takes it from the URL as it is.
    Returns authorization, canonical_request, string_to_sign, signed_headers, signature
    and the request's headers after signing."""
    fixed = datetime.datetime.strptime(amz_date, SIGV4_TIMESTAMP)
    parts = urllib.parse.urlsplit(url)
    if raw_query:
        request_url, params = url, None
    else:
        request_url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
        params = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    request = AWSRequest(method=method, url=request_url, data=body or b"", params=params)
    for name, value in headers:
        request.headers[name] = value  # HTTPHeaders appends: repeated names are kept
    signer = _CapturingSigV4Auth(
        Credentials(access_key_id, secret_access_key, session_token), service, region
    )
    _clock.fixed = fixed
    try:
        signer.add_auth(request)
    finally:
        _clock.fixed = None
    authorization = request.headers["Authorization"]
    fields = _parse_authorization(authorization)
    return {
        "authorization": authorization,
        "canonical_request": signer.canonical_request_text,
        "string_to_sign": signer.string_to_sign_text,
        "signed_headers": fields.get("SignedHeaders"),
        "signature": fields.get("Signature"),
        "headers": [[k, v] for k, v in request.headers.items()],
    }


def _parse_authorization(value):
    """`AWS4-HMAC-SHA256 Credential=a/b, SignedHeaders=c;d, Signature=e` -> dict (plus
    the algorithm under "algorithm")."""
    algorithm, _, rest = value.strip().partition(" ")
    fields = {"algorithm": algorithm}
    for part in rest.split(","):
        key, sep, val = part.strip().partition("=")
        if sep:
            fields[key.strip()] = val.strip()
    return fields


# ---------------------------------------------------------------------------------------
# Verification
# ---------------------------------------------------------------------------------------


class Refusal(Exception):
    def __init__(self, message, reason, error_type, detail=None):
        super().__init__(reason)
        self.message = message  # what AWS answers
        self.reason = reason  # for the stats, more precise
        self.error_type = error_type
        self.detail = detail


def _load_keys(path):
    with open(path, "rb") as f:
        keys = json.load(f)
    if isinstance(keys, dict):
        keys = [keys]
    return {k["access_key_id"]: k for k in keys}


def _header_values(headers, name):
    """Values of a received header, as UTF-8 text where the bytes are UTF-8
    (http.server decodes header lines as ISO-8859-1)."""
    out = []
    for value in headers.get_all(name) or []:
        try:
            value = value.encode("iso-8859-1").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            pass
        out.append(value)
    return out


def verify(config, method, raw_target, headers, body, arrival):
    """Returns the access key id on success; raises Refusal otherwise."""
    authorization = headers.get("Authorization")
    if not authorization:
        raise Refusal(MSG_MISSING_AUTH, "missing Authorization header", "IncompleteSignatureException")
    fields = _parse_authorization(authorization)
    if fields["algorithm"] != ALGORITHM:
        raise Refusal(
            f"Authorization header requires '{ALGORITHM}' algorithm.",
            f"unsupported algorithm {fields['algorithm']!r}",
            "IncompleteSignatureException",
        )
    missing = [p for p in ("Credential", "SignedHeaders", "Signature") if p not in fields]
    amz_date = headers.get("X-Amz-Date")
    if missing or not amz_date:
        msgs = [f"Authorization header requires '{p}' parameter." for p in missing]
        if not amz_date:
            msgs.append(
                "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header."
            )
        raise Refusal(
            " ".join(msgs),
            "incomplete Authorization: missing " + ", ".join(missing + ([] if amz_date else ["x-amz-date"])),
            "IncompleteSignatureException",
        )

    scope = fields["Credential"].split("/")
    if len(scope) != 5:
        raise Refusal(
            "Credential should be scoped to a valid region.",
            f"malformed credential scope {fields['Credential']!r}",
            "IncompleteSignatureException",
        )
    key_id, scope_date, scope_region, scope_service, scope_term = scope

    try:
        signed_at = datetime.datetime.strptime(amz_date, SIGV4_TIMESTAMP).replace(
            tzinfo=datetime.timezone.utc
        )
    except ValueError:
        raise Refusal(
            f"Date must be in ISO-8601 'basic format'. Got '{amz_date}'.",
            f"bad x-amz-date {amz_date!r}",
            "IncompleteSignatureException",
        )
    now = datetime.datetime.fromtimestamp(arrival, datetime.timezone.utc)
    if abs((now - signed_at).total_seconds()) > MAX_SKEW_SECONDS:
        fmt = lambda d: d.strftime(SIGV4_TIMESTAMP)  # noqa: E731
        if signed_at < now:
            msg = (
                f"Signature expired: {amz_date} is now earlier than "
                f"{fmt(now - datetime.timedelta(minutes=5))} ({fmt(now)} - 5 min.)"
            )
        else:
            msg = (
                f"Signature not yet current: {amz_date} is still later than "
                f"{fmt(now + datetime.timedelta(minutes=5))} ({fmt(now)} + 5 min.)"
            )
        raise Refusal(msg, f"x-amz-date {amz_date} more than 5 minutes from now", "InvalidSignatureException")

    if scope_date != amz_date[:8]:
        raise Refusal(
            f"Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP: "
            f"'{scope_date}' != '{amz_date[:8]}', from '{amz_date}'.",
            f"credential scope date {scope_date} is not the x-amz-date's day",
            "InvalidSignatureException",
        )
    if scope_region != config.region:
        raise Refusal(
            f"Credential should be scoped to a valid region, not '{scope_region}'. ",
            f"credential scope region {scope_region!r}, expected {config.region!r}",
            "InvalidSignatureException",
        )
    if scope_service != config.service:
        raise Refusal(
            f"Credential should be scoped to correct service: '{config.service}'. ",
            f"credential scope service {scope_service!r}, expected {config.service!r}",
            "InvalidSignatureException",
        )
    if scope_term != "aws4_request":
        raise Refusal(
            "Credential should be scoped with a valid terminator: 'aws4_request', "
            f"not '{scope_term}'.",
            f"credential scope terminator {scope_term!r}",
            "InvalidSignatureException",
        )

    try:
        keys = _load_keys(config.credentials)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise Refusal("Internal failure", f"credentials file unreadable: {e}", "InternalFailure")
    key = keys.get(key_id)
    if key is None:
        raise Refusal(MSG_INVALID_TOKEN, f"unknown access key {key_id}", "UnrecognizedClientException")
    not_after = key.get("not_after")
    if not_after is not None and arrival > float(not_after):
        raise Refusal(
            MSG_EXPIRED_TOKEN,
            f"key {key_id} expired {arrival - float(not_after):.1f}s before the request",
            "ExpiredTokenException",
        )

    signed_names = fields["SignedHeaders"].split(";")
    token = key.get("session_token")
    sent_token = headers.get("X-Amz-Security-Token")
    if token:
        if sent_token is None:
            raise Refusal(MSG_INVALID_TOKEN, f"key {key_id}: no x-amz-security-token", "UnrecognizedClientException")
        if not hmac.compare_digest(sent_token.encode(), token.encode()):
            raise Refusal(MSG_INVALID_TOKEN, f"key {key_id}: wrong x-amz-security-token", "UnrecognizedClientException")
        if "x-amz-security-token" not in signed_names:
            raise Refusal(
                MSG_MISMATCH, f"key {key_id}: x-amz-security-token not in SignedHeaders", "InvalidSignatureException"
            )
    elif sent_token is not None:
        raise Refusal(
            MSG_INVALID_TOKEN,
            f"key {key_id} has no session token but x-amz-security-token was sent",
            "UnrecognizedClientException",
        )

    body_sha256 = hashlib.sha256(body).hexdigest()
    content_sha = headers.get("X-Amz-Content-SHA256")
    if content_sha is None:
        if config.service == "aoss":
            raise Refusal(
                "Missing required header x-amz-content-sha256 (OpenSearch Serverless requires it).",
                "aoss: no x-amz-content-sha256 header",
                "InvalidSignatureException",
            )
    elif content_sha.strip() != body_sha256:
        raise Refusal(
            "The provided 'x-amz-content-sha256' header does not match what was computed.",
            f"x-amz-content-sha256 {content_sha.strip()[:16]}... is not the body's {body_sha256[:16]}... "
            f"({len(body)} bytes)",
            "InvalidSignatureException",
        )

    for name in signed_names:
        if name != name.lower() or not name:
            raise Refusal(MSG_MISMATCH, f"SignedHeaders not lower case: {fields['SignedHeaders']!r}", "InvalidSignatureException")
        if name in SIGNED_HEADERS_BLACKLIST:
            raise Refusal(
                MSG_MISMATCH,
                f"SignedHeaders includes {name!r}, a header proxies change (botocore never signs it)",
                "InvalidSignatureException",
            )
        if headers.get(name) is None:
            raise Refusal(MSG_MISMATCH, f"signed header {name!r} is not in the request", "InvalidSignatureException")
    if "host" not in signed_names:
        raise Refusal(MSG_MISMATCH, "host is not in SignedHeaders", "InvalidSignatureException")

    signed_headers = [(n, v) for n in signed_names for v in _header_values(headers, n)]
    host = headers.get("Host")
    path, _, query = raw_target.partition("?")
    url = f"http://{host}{path}" + (f"?{query}" if query else "")
    computed = botocore_sign(
        method, url, signed_headers, body, config.region, config.service,
        key_id, key["secret_access_key"], token or None, amz_date,
    )
    expected_sig = computed["signature"]
    if computed["signed_headers"] != fields["SignedHeaders"] or not hmac.compare_digest(
        expected_sig, fields["Signature"]
    ):
        reason = f"key {key_id}: signature mismatch"
        if computed["signed_headers"] != fields["SignedHeaders"]:
            reason += f" (SignedHeaders {fields['SignedHeaders']!r}, botocore {computed['signed_headers']!r})"
        elif query:
            raw = botocore_sign(
                method, url, signed_headers, body, config.region, config.service,
                key_id, key["secret_access_key"], token or None, amz_date, raw_query=True,
            )
            if hmac.compare_digest(raw["signature"], fields["Signature"]):
                reason += " (it signs the raw query string, not its canonical URI-encoded form)"
        # As Amazon OpenSearch Service answers: the canonical request it expected
        # (with every signed header, the session token included) follows the message.
        full = (
            MSG_MISMATCH
            + "\n\nThe Canonical String for this request should have been\n'"
            + computed["canonical_request"]
            + "'\n\nThe String-to-Sign should have been\n'"
            + computed["string_to_sign"]
            + "'\n"
        )
        raise Refusal(
            full,
            reason,
            "InvalidSignatureException",
            detail={
                "canonical_request": computed["canonical_request"],
                "string_to_sign": computed["string_to_sign"],
                "authorization_received": authorization,
            },
        )
    return key_id


# ---------------------------------------------------------------------------------------
# Server
# ---------------------------------------------------------------------------------------


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        self.accepted = 0
        self.refused = 0
        self.refusals = []
        self.keys_used = {}
        self.last_refusal = None
        self.upstream_errors = 0

    def snapshot(self):
        with self.lock:
            return {
                "accepted": self.accepted,
                "refused": self.refused,
                "refusals": list(self.refusals),
                "keys_used": dict(self.keys_used),
                "last_refusal": self.last_refusal,
                "upstream_errors": self.upstream_errors,
            }


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sigv4-verify-proxy"
    sys_version = ""

    def log_message(self, fmt, *args):
        if self.server.config.verbose:
            sys.stderr.write("verify_proxy: " + (fmt % args) + "\n")

    def _read_body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status, headers, body, head=False, content_length=None):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        if status >= 200 and status not in (204, 304):
            self.send_header("Content-Length", str(len(body) if content_length is None else content_length))
        self.end_headers()
        if not head and body:
            self.wfile.write(body)
        self.wfile.flush()

    def _json(self, status, obj, extra=()):
        body = json.dumps(obj).encode()
        self._send(status, [("Content-Type", "application/json")] + list(extra), body, head=self.command == "HEAD")

    def _handle(self):
        arrival = time.time()
        body = self._read_body()
        stats = self.server.stats
        path = self.path.partition("?")[0]
        if path == "/_sigv4/stats" and self.command == "GET":
            return self._json(200, stats.snapshot())
        if path == "/_sigv4/reset" and self.command == "POST":
            with stats.lock:
                stats.reset()
            return self._json(200, {"reset": True})

        try:
            key_id = verify(self.server.config, self.command, self.path, self.headers, body, arrival)
        except Refusal as refusal:
            with stats.lock:
                stats.refused += 1
                stats.refusals = (stats.refusals + [refusal.reason])[-20:]
                stats.last_refusal = dict(refusal.detail or {}, reason=refusal.reason)
            sys.stderr.write(f"verify_proxy: refused {self.command} {self.path}: {refusal.reason}\n")
            status = 500 if refusal.error_type == "InternalFailure" else 403
            return self._json(status, {"message": refusal.message}, [("x-amzn-ErrorType", refusal.error_type)])

        with stats.lock:
            stats.accepted += 1
            stats.keys_used[key_id] = stats.keys_used.get(key_id, 0) + 1
        self._forward(body)

    def _forward(self, body):
        upstream = self.server.config.upstream_parts
        headers = {}
        for name, value in self.headers.items():
            lname = name.lower()
            if lname in HOP_BY_HOP or lname in ("host", "authorization", "content-length", "expect"):
                continue
            if lname.startswith("x-amz-"):
                continue
            headers.setdefault(name, []).append(value)
        conn = http.client.HTTPConnection(upstream.hostname, upstream.port or 80, timeout=300)
        try:
            conn.putrequest(self.command, upstream.path.rstrip("/") + self.path, skip_accept_encoding=True)
            for name, values in headers.items():
                for value in values:
                    conn.putheader(name, value)
            if body or self.command not in ("GET", "HEAD", "DELETE", "OPTIONS"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body or None)
            resp = conn.getresponse()
            resp_body = resp.read()
            out = []
            content_length = None
            for name, value in resp.getheaders():
                lname = name.lower()
                if lname == "content-length":
                    content_length = value
                    continue
                if lname in HOP_BY_HOP or lname in ("server", "date"):
                    continue
                out.append((name, value))
            is_head = self.command == "HEAD"
            self._send(
                resp.status, out, resp_body, head=is_head,
                content_length=content_length if is_head and content_length is not None else None,
            )
        except (OSError, http.client.HTTPException) as e:
            with self.server.stats.lock:
                self.server.stats.upstream_errors += 1
            sys.stderr.write(f"verify_proxy: upstream error for {self.command} {self.path}: {e!r}\n")
            self._json(502, {"message": f"upstream error: {e!r}"})
        finally:
            conn.close()

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = _handle


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def _watch_stdin():
    try:
        while sys.stdin.buffer.read(65536):
            pass
    except (OSError, ValueError):
        pass
    os._exit(0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT")
    ap.add_argument("--region", required=True)
    ap.add_argument("--service", required=True, choices=["es", "aoss"])
    ap.add_argument("--credentials", required=True, help="JSON file of keys, re-read per request")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--no-stdin", action="store_true", help="do not exit when stdin closes")
    ap.add_argument("--verbose", action="store_true", help="log every request to stderr")
    config = ap.parse_args(argv)
    config.upstream_parts = urllib.parse.urlsplit(config.upstream)
    if config.upstream_parts.scheme != "http":
        ap.error("--upstream must be http://")

    server = Server(("127.0.0.1", config.port), Handler)
    server.config = config
    server.stats = Stats()
    if not config.no_stdin:
        threading.Thread(target=_watch_stdin, daemon=True).start()
    print(f"listening http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
