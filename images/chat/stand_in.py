"""A tiny OpenAI-compatible stand-in for a served model: /v1/models and /v1/chat/completions
(a chat answer, or a call of the first tool when tools are offered). Standard library only:
the example's smoke test boots it and asks it as the operator asks vLLM after a new image."""

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

MODEL = "stand-in"


class Handler(BaseHTTPRequestHandler):
    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            return self.answer(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        self.answer(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self):
        if self.path != "/v1/chat/completions":
            return self.answer(404, {"error": {"message": f"no route {self.path}"}})
        asked = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        message = {"role": "assistant", "content": "ok"}
        tools = asked.get("tools") or []
        if tools:
            name = tools[0]["function"]["name"]
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call-0", "type": "function",
                                "function": {"name": name, "arguments": "{}"}}],
            }
        self.answer(200, {"object": "chat.completion", "model": MODEL,
                          "choices": [{"index": 0, "message": message,
                                       "finish_reason": "tool_calls" if tools else "stop"}]})

    def log_message(self, format, *args):
        sys.stderr.write("stand-in: " + (format % args) + "\n")


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    print(f"stand-in serving {MODEL} on 127.0.0.1:{port}", flush=True)
    HTTPServer(("127.0.0.1", port), Handler).serve_forever()
