"""A stand-in for the Hub API on 127.0.0.1, just the endpoints huggingface_hub 2.4 calls to create a repo,
upload a folder and read a file back. Files arrive in ``root/<namespace>/<name>/``.

Every file is answered as a "regular" (base64 in the commit) upload: the "lfs" answer would send the client
to Xet / git-LFS storage, which this server does not implement, so the test models are kept tiny.
Requests it does not know are logged and kept in ``unknown`` so that a client change shows up at once.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = r"/api/models/(?P<repo>[^/]+/[^/]+)"
REVISION = "main"
RESOLVABLE = rf"(?:{REVISION}|{'1' * 40})"


class HubStandIn(ThreadingHTTPServer):
    def __init__(self, root: Path, token: str):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root, self.token = Path(root), token
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.repos: dict[str, dict] = {}  # repo id -> {"private": bool, "commits": [summary, ...]}
        self.requests: list[str] = []  # "METHOD path", in order
        self.unknown: list[str] = []
        # A server that accepts a commit and never answers: the handler waits for `release` (set on exit).
        self.stall_commits = False
        self.release = threading.Event()

    def __enter__(self) -> HubStandIn:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.shutdown()
        self.server_close()

    def files(self, repo_id: str) -> dict[str, bytes]:
        base = self.root / repo_id
        return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


class _Handler(BaseHTTPRequestHandler):
    server: HubStandIn

    def do_POST(self) -> None:
        self._route("POST")

    def do_GET(self) -> None:
        self._route("GET")

    def do_HEAD(self) -> None:
        self._route("HEAD")

    def _route(self, method: str) -> None:
        path = self.path.split("?")[0]
        self.server.requests.append(f"{method} {path}")
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        authorized = self.headers.get("Authorization") == f"Bearer {self.server.token}"
        routes = [  # (method, path pattern, needs the token, handler)
            ("POST", r"/api/repos/create", True, self._create),
            ("POST", r"/api/validate-yaml", True, lambda m, b: self._json(200, {"errors": [], "warnings": []})),
            ("POST", REPO + rf"/preupload/{REVISION}", True, self._preupload),
            ("POST", REPO + rf"/commit/{REVISION}", True, self._commit),
            ("GET", REPO, True, self._repo_info),  # create_repo(exist_ok=True) asks after a 401/403
            # Asked once a day for the user agent (agent detection): an empty registry.
            (
                "GET",
                r"/api/agent-harnesses",
                False,
                lambda m, b: self._json(200, {"standardEnvVars": [], "harnesses": {}}),
            ),
            # Downloads name the branch first, then the commit the first answer gave (X-Repo-Commit).
            ("GET", rf"/(?P<repo>[^/]+/[^/]+)/resolve/{RESOLVABLE}/(?P<file>.+)", False, self._resolve),
            ("HEAD", rf"/(?P<repo>[^/]+/[^/]+)/resolve/{RESOLVABLE}/(?P<file>.+)", False, self._resolve),
        ]
        for verb, pattern, needs_token, handler in routes:
            match = re.fullmatch(pattern, path)
            if verb == method and match:
                if needs_token and not authorized:
                    return self._json(401, {"error": "Invalid credentials in Authorization header"})
                return handler(match, body)
        self.server.unknown.append(f"{method} {self.path}")
        print(f"hub stand-in: unknown request {method} {self.path}", file=sys.stderr)
        self._json(404, {"error": f"stand-in does not implement {method} {path}"})

    def _create(self, match, body: bytes) -> None:
        payload = json.loads(body)
        repo_id = f"{payload.get('organization') or 'user'}/{payload['name']}"
        if repo_id in self.server.repos:
            return self._json(
                409, {"error": "You already created this model repo", "url": f"{self.server.url}/{repo_id}"}
            )
        self.server.repos[repo_id] = {"private": payload.get("visibility") == "private", "commits": []}
        self._json(200, {"url": f"{self.server.url}/{repo_id}", "name": repo_id})

    def _repo_info(self, match, body: bytes) -> None:
        if match["repo"] not in self.server.repos:
            return self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        self._json(200, {"id": match["repo"], "sha": "1" * 40, "private": self.server.repos[match["repo"]]["private"]})

    def _preupload(self, match, body: bytes) -> None:
        if match["repo"] not in self.server.repos:
            return self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        files = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in json.loads(body)["files"]]
        self._json(200, {"files": files, "commitOid": "0" * 40})

    def _commit(self, match, body: bytes) -> None:
        repo_id = match["repo"]
        if self.server.stall_commits:
            self.server.release.wait(600)
            return self.close_connection_now()
        if repo_id not in self.server.repos:
            return self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        for line in body.decode().splitlines():
            item = json.loads(line)
            if item["key"] == "header":
                self.server.repos[repo_id]["commits"].append(item["value"]["summary"])
            elif item["key"] == "file" and item["value"]["encoding"] == "base64":
                target = self.server.root / repo_id / item["value"]["path"]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(base64.b64decode(item["value"]["content"]))
            else:  # lfsFile / deletions: not implemented, so fail loudly
                return self._json(400, {"error": f"stand-in does not implement commit key {item['key']!r}"})
        oid = hashlib.sha1(body).hexdigest()
        self._json(200, {"commitUrl": f"{self.server.url}/{repo_id}/commit/{oid}", "commitOid": oid})

    def close_connection_now(self) -> None:
        self.close_connection = True

    def _resolve(self, match, body: bytes) -> None:
        path = self.server.root / match["repo"] / match["file"]
        if not path.is_file():
            return self._json(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
        data = path.read_bytes()
        headers = {"X-Repo-Commit": "1" * 40, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}
        self._send(200, data, "application/octet-stream", headers)

    def _json(self, status: int, payload: dict, headers: dict | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json", headers or {})

    def _send(self, status: int, data: bytes, content_type: str, headers: dict) -> None:
        self.send_response(status)
        for key, value in {"Content-Type": content_type, "Content-Length": str(len(data)), **headers}.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, *args) -> None:  # keep pytest output quiet; `requests` has the log
        pass
