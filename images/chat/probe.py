"""The operator's probe after a new image: a chat answer, then a tool call."""

import json
import urllib.request


def ask(body):
    request = urllib.request.Request(
        "http://127.0.0.1:8000/v1/chat/completions", json.dumps(body).encode(),
        {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request, timeout=30))


chat = ask({"model": "stand-in", "messages": [{"role": "user", "content": "Say ok."}]})
print("chat:", chat["choices"][0]["message"]["role"])
tool = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
called = ask({"model": "stand-in", "tools": [tool], "tool_choice": "required",
              "messages": [{"role": "user", "content": "What time is it? Use the tool."}]})
print("tool:", called["choices"][0]["message"]["tool_calls"][0]["function"]["name"])
