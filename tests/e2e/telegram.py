"""A stand-in for the Telegram Bot API, so that OpenClaw's bundled telegram channel runs in the
e2e tests with real group chats and direct messages and no network.

OpenClaw points the channel at it with `channels.telegram.apiRoot` (its setting for a
self-hosted Bot API). It answers the calls OpenClaw 2026.9.6 makes — `getMe`, `deleteWebhook`,
the command-menu calls, `getUpdates` (long polling) and `sendMessage` — from memory: a test
posts a message as any user into any chat with `post`, and reads what the bot sent with
`sent` / `wait_sent`.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

from tests.e2e.server import free_port

TOKEN = "123456:ctxbudget-test-token"
BOT = {
    "id": 123456,
    "is_bot": True,
    "first_name": "ctxbudget test bot",
    "username": "ctxbudget_test_bot",
    "can_join_groups": True,
    "can_read_all_group_messages": True,
    "supports_inline_queries": False,
}
POLL_SECONDS = 2.0
"""The longest a `getUpdates` call is held open (OpenClaw asks for more; shorter stops fast)."""


@dataclass
class FakeTelegram:
    port: int = field(default_factory=free_port)
    calls: list[str] = field(default_factory=list)
    """The Bot API methods called, in order."""
    _updates: list[dict[str, Any]] = field(default_factory=list)
    _sent: list[dict[str, Any]] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _server: ThreadingHTTPServer | None = None

    @property
    def api_root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def post(self, chat_id: int, user_id: int, text: str) -> int:
        """`user_id` sends `text` to the chat `chat_id` (negative: a supergroup; the user's
        own id: the direct chat with the bot); the message's id. A leading `/word` is marked
        as a bot command, as Telegram's apps do."""
        chat: dict[str, Any] = (
            {"id": chat_id, "type": "supergroup", "title": "ctxbudget test group"}
            if chat_id < 0
            else {"id": chat_id, "type": "private", "first_name": f"user{user_id}"}
        )
        with self._changed:
            update_id = len(self._updates) + 1
            message: dict[str, Any] = {
                "message_id": update_id,
                "date": int(time.time()),
                "chat": chat,
                "from": {"id": user_id, "is_bot": False, "first_name": f"user{user_id}"},
                "text": text,
            }
            if text.startswith("/"):
                length = len(text.split()[0])
                message["entities"] = [{"type": "bot_command", "offset": 0, "length": length}]
            self._updates.append({"update_id": update_id, "message": message})
            self._changed.notify_all()
        return update_id

    def sent(self, chat_id: int) -> list[str]:
        """The texts the bot sent to `chat_id`, in order."""
        with self._changed:
            return [m["text"] for m in self._sent if str(m.get("chat_id")) == str(chat_id)]

    def wait_sent(self, chat_id: int, count: int, timeout: float = 60) -> list[str]:
        """`sent(chat_id)` once it holds at least `count` messages (AssertionError after
        `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(texts := self.sent(chat_id)) < count:
                left = deadline - time.monotonic()
                assert left > 0, f"the bot sent {texts!r} to {chat_id}, expected {count}"
                self._changed.wait(left)
        return texts

    def wait_polling(self, timeout: float = 120) -> None:
        """Until OpenClaw's channel polls for updates."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while "getUpdates" not in self.calls:
                left = deadline - time.monotonic()
                assert left > 0, f"OpenClaw never polled; Bot API calls: {self.calls}"
                self._changed.wait(left)

    def start(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length).decode() if length else ""
                if "json" in self.headers.get("content-type", ""):
                    params = json.loads(raw or "{}")
                else:
                    params = dict(parse_qsl(raw) + parse_qsl(self.path.partition("?")[2]))
                prefix, _, method = self.path.partition("?")[0].strip("/").rpartition("/")
                if prefix != f"bot{TOKEN}":
                    self._answer(404, {"ok": False, "error_code": 404, "description": "Not Found"})
                    return
                self._answer(200, {"ok": True, "result": fake._call(method, params)})

            do_GET = do_POST

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # OpenClaw stopped waiting (a long poll cut at shutdown)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        server.block_on_close = False
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _call(self, method: str, params: dict[str, Any]) -> Any:
        with self._changed:
            self.calls.append(method)
            self._changed.notify_all()
            if method == "getMe":
                return BOT
            if method == "getUpdates":
                offset = int(params.get("offset") or 0)
                deadline = time.monotonic() + min(float(params.get("timeout") or 0), POLL_SECONDS)
                while not (new := [u for u in self._updates if u["update_id"] >= offset]):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._changed.wait(left)
                return new
            if method == "sendMessage":
                self._sent.append(params)
                self._changed.notify_all()
                chat_id = int(params["chat_id"])
                chat = {"id": chat_id, "type": "supergroup" if chat_id < 0 else "private"}
                return {
                    "message_id": 10_000 + len(self._sent),
                    "date": int(time.time()),
                    "chat": chat,
                    "from": BOT,
                    "text": params.get("text", ""),
                }
            if method == "getMyCommands":
                return []
            return True  # deleteWebhook, setMyCommands, sendChatAction, …
