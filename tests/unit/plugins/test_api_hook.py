"""StatetableApiHook quotes a key whole (issue 66): `/`, `?`, `=`, `&` and `#` in a key used to
reach the API as path segments, a query or a fragment, so the hook asked for another row."""
from __future__ import annotations

import http.server
import json
import threading
import urllib.parse
from types import SimpleNamespace

from plugins.statetable_airflow.hooks import StatetableApiHook


def test_a_key_with_path_and_query_characters_reaches_the_api_as_one_key(monkeypatch):
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):       # noqa: N802 - http.server's name
            seen.append((self.path, self.headers.get("Authorization")))
            body = json.dumps({"ok": True}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        conn = SimpleNamespace(schema="http", host="127.0.0.1", port=server.server_port, password="t0ken",
                               extra_dejson={"path": "/statetable"})
        hook = StatetableApiHook()
        monkeypatch.setattr(hook, "get_connection", lambda conn_id: conn)
        key = "a/b?c=d&e#f %é"
        assert hook.row("movies", key) == {"ok": True}
    finally:
        server.shutdown()
    path, auth = seen[0]
    assert auth == "Bearer t0ken"
    prefix = "/statetable/tables/movies/rows/"
    assert path.startswith(prefix) and "?" not in path and "#" not in path
    assert urllib.parse.unquote(path[len(prefix):]) == key
