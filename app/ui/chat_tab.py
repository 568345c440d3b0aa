"""Chat tab: try a model the swarm can serve without writing curl.

It talks to this node's own OpenAI-compatible API over HTTP (the path every local app takes, so
what it shows is what they get): a streamed /v1/chat/completions with the whole conversation,
the route badge (local / distributed / relayed, the nodes) from the response's x-swarm-* headers
and the final chunk's `x_swarm` timings (TTFT, tok/s). Stop closes the stream, which cancels the
request on the node (its in_flight returns to 0).
"""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QKeySequence, QShortcut, QTextCursor
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.host import NodeHost
from app.tasks import spawn
from app.ui import fmt
from node.errors import NodeError

log = logging.getLogger(__name__)

ROUTE_WORDS = {"local": "local", "distributed": "distributed", "relayed": "relayed", "remote": "remote"}
ROUTE_COLORS = {"local": "#1f7a3a", "distributed": "#1d5fa8", "relayed": "#8a6d00", "remote": "#5b3a99"}
MAX_TOKENS = 256
REFRESH_MS = 300  # the model picker follows swarm events at most this often


def _error_text(body: str, status: int) -> str:
    """The message of an OpenAI-shaped error body, or the body itself, or the status."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    if isinstance(error, str):
        return error
    return body.strip()[:200] or f"HTTP {status}"


class ChatTab(QWidget):
    """A model picker, the conversation, a prompt line, Send / Stop / New chat, the route badge."""

    def __init__(self, host: NodeHost, parent: QWidget | None = None):
        super().__init__(parent)
        self.host = host
        self.messages: list[dict[str, str]] = []
        self.task: asyncio.Task | None = None
        self.picker = QComboBox()
        self.picker.setAccessibleName("Model to chat with")
        self.picker.setToolTip("Models this node can serve now: its own, and those the swarm covers")
        self.picker.setMinimumContentsLength(28)
        self.transcript = QPlainTextEdit()
        self.transcript.setReadOnly(True)
        self.transcript.setAccessibleName("Conversation")
        self.prompt = QLineEdit()
        self.prompt.setPlaceholderText("Type a message and press Enter")
        self.prompt.setAccessibleName("Message")
        self.send_button = QPushButton("Send")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop the reply (the request is cancelled on the node)  [Esc]")
        self.new_button = QPushButton("New chat")
        self.route_badge = QLabel()
        self.route_badge.setToolTip("How the last reply was served: on this machine (local), split by layers across "
                                    "nodes (distributed), or through a relay")
        self.stats = QLabel()
        self.stats.setToolTip("From the request's trace: time to first token and decode speed")
        top = QHBoxLayout()
        top.addWidget(QLabel("Model:"))
        top.addWidget(self.picker)
        top.addWidget(self.new_button)
        top.addStretch(1)
        top.addWidget(self.route_badge)
        top.addWidget(self.stats)
        bottom = QHBoxLayout()
        bottom.addWidget(self.prompt, 1)
        bottom.addWidget(self.send_button)
        bottom.addWidget(self.stop_button)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.transcript, 1)
        layout.addLayout(bottom)
        self.send_button.clicked.connect(self.send)
        self.prompt.returnPressed.connect(self.send)
        self.stop_button.clicked.connect(self.stop)
        self.new_button.clicked.connect(self.new_chat)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, activated=self.stop)
        self._set_busy(False)
        self._refresh_timer = QTimer(self, singleShot=True, interval=REFRESH_MS)
        self._refresh_timer.timeout.connect(self.refresh_models)
        self.refresh_models()

    # --- models ---

    def schedule_refresh(self) -> None:
        """refresh_models at most once per REFRESH_MS (swarm events come in bursts; each refresh
        lists the node's models, a file stat per model)."""
        if not self._refresh_timer.isActive():
            self._refresh_timer.start()

    def refresh_models(self) -> None:
        """The picker's models (node events: models loaded, the swarm's coverage changed)."""
        if not self.host.is_started:
            return
        rerankers = {s.id for s in self.host.node.models.all() if s.tokenizer is not None and s.tokenizer.reranker}
        ids = [m["id"] for m in self.host.node.list_openai_models() if m["id"] not in rerankers]  # no chat models
        if ids == [self.picker.itemText(i) for i in range(self.picker.count())]:
            return
        current = self.picker.currentText()
        self.picker.blockSignals(True)
        self.picker.clear()
        self.picker.addItems(ids)
        if current in ids:
            self.picker.setCurrentText(current)
        self.picker.blockSignals(False)
        self._set_busy(self.busy)

    # --- the conversation ---

    @property
    def busy(self) -> bool:
        return self.task is not None and not self.task.done()

    def _set_busy(self, busy: bool) -> None:
        self.send_button.setEnabled(not busy and self.picker.count() > 0)
        self.stop_button.setEnabled(busy)
        self.prompt.setEnabled(not busy)
        self.picker.setEnabled(not busy)

    def new_chat(self) -> None:
        self.stop()
        self.messages = []  # a new list: the stopped reply's task appends to the old one
        self.transcript.clear()
        self._clear_route()

    def _clear_route(self) -> None:
        """No badge and no timings (its coloured background goes too, not only its text)."""
        self.route_badge.clear()
        self.route_badge.setStyleSheet("")
        self.stats.clear()

    def send(self, text: str | None = None) -> asyncio.Task | None:
        """Send the prompt line (or `text`) with the conversation so far; the reply streams in."""
        text = (text if isinstance(text, str) else self.prompt.text()).strip()
        model = self.picker.currentText()
        if not text or not model or self.busy:
            return None
        self.prompt.clear()
        self.messages.append({"role": "user", "content": text})
        self._append(("\n\n" if self.transcript.toPlainText() else "") + f"You: {text}\n\n{model}: ")
        self._clear_route()  # the badge and timings are the last reply's: this one's, or none if it fails
        self.task = spawn(self._async_reply(model), what="the chat reply", on_error=self._failed)
        self.task.add_done_callback(lambda _t: self._set_busy(False))
        self._set_busy(True)
        return self.task

    def stop(self) -> None:
        """Close the stream: the node sees the client go and cancels the request."""
        if self.busy:
            self.task.cancel()
            self._append("  [stopped]")

    def _append(self, text: str) -> None:
        self.transcript.moveCursor(QTextCursor.MoveOperation.End)
        self.transcript.insertPlainText(text)
        self.transcript.ensureCursorVisible()

    def _failed(self, message: str) -> None:
        self._append(f"\n[{message}]")

    async def _async_reply(self, model: str) -> None:
        node = self.host.node
        messages = self.messages  # this conversation (New chat starts another list)
        url = node.api_url.rstrip("/") + "/chat/completions"
        body = {"model": model, "messages": list(messages), "stream": True, "max_tokens": MAX_TOKENS,
                "stream_options": {"include_usage": True}}
        reply: list[str] = []
        finish_reason, completion_tokens = None, 0
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session, \
                    session.post(url, json=body, headers={"Authorization": f"Bearer {node.api_key}"}) as resp:
                if resp.status != 200:
                    raise NodeError(_error_text(await resp.text(), resp.status))
                self._show_route(resp.headers.get("x-swarm-route"), resp.headers.get("x-swarm-nodes"))
                async for raw in resp.content:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[5:])
                    if "error" in event:
                        raise NodeError(_error_text(line[5:], 200))
                    for choice in event.get("choices") or ():
                        delta = (choice.get("delta") or {}).get("content")
                        if delta:
                            reply.append(delta)
                            self._append(delta)
                        finish_reason = choice.get("finish_reason") or finish_reason
                    if event.get("usage"):
                        completion_tokens = event["usage"].get("completion_tokens") or completion_tokens
                    if event.get("x_swarm"):
                        self._show_timings(event["x_swarm"], event.get("usage"))
            if finish_reason == "length":  # said in the transcript only, not sent back to the model
                self._append(f"\n[reply cut at {MAX_TOKENS} tokens, the Chat tab's limit per reply]"
                             if completion_tokens >= MAX_TOKENS else
                             "\n[reply cut: the conversation fills the model's context; start a New chat]")
        except aiohttp.ClientError as exc:
            raise NodeError(f"cannot reach this node's API ({type(exc).__name__})") from exc
        except ValueError as exc:  # a chunk that is not JSON
            raise NodeError(f"the node sent an unreadable stream ({exc})") from exc
        finally:
            if reply:  # a stopped reply stays in the conversation as far as it got
                messages.append({"role": "assistant", "content": "".join(reply)})
            elif messages and messages[-1]["role"] == "user":  # failed before any text: the turn is
                messages.pop()  # not kept (the next one would follow two user turns)

    def _show_route(self, route: str | None, nodes: str | None) -> None:
        if not route:
            return
        count = len([n for n in (nodes or "").split(",") if n])
        words = ROUTE_WORDS.get(route, route)
        if count > 1:
            words += f" · {count} nodes"
        self.route_badge.setText(f" {words} ")
        self.route_badge.setStyleSheet(f"QLabel {{ color: white; background: {ROUTE_COLORS.get(route, '#555')}; "
                                       "border-radius: 4px; padding: 1px 6px; }")
        self.route_badge.setToolTip(f"route: {route}; nodes: {nodes or fmt.DASH}")

    def _show_timings(self, timings: dict, usage: dict | None) -> None:
        self._show_route(timings.get("route"), ",".join(timings.get("nodes") or []))
        parts = [f"TTFT {fmt.ms(timings.get('ttft_ms'))}", f"{fmt.rate(timings.get('tok_per_sec'))} tok/s"]
        if usage and usage.get("completion_tokens") is not None:
            parts.append(f"{usage['completion_tokens']} tokens")
        self.stats.setText(" · ".join(parts))
