"""A rule-based judge behind an OpenAI-compatible ``/v1/chat/completions`` on a thread of the test process: it
answers ``Score: 10`` when the response holds the reference answer, else ``Score: 0``; it records every request
(its body and headers) and can be told to fail the next requests or to answer something else."""

import contextlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class RuleJudge:
    def __init__(self):
        self.requests: list[dict] = []
        self.fail_next: list[int] = []  # HTTP codes to answer the next requests with
        self.answer: str | None = None  # a fixed answer instead of the rule's
        self.lock = threading.Lock()

    def reply(self, body: dict) -> tuple[int, dict]:
        with self.lock:
            self.requests.append(body)
            if self.fail_next:
                return self.fail_next.pop(0), {"error": {"message": "planted failure"}}
        prompt = body["messages"][-1]["content"]
        if self.answer is not None:
            text = self.answer
        else:
            reference = re.search(r"Reference answer: (.*)", prompt).group(1).strip()
            response = re.search(r"Response: (.*?)\n\nReply", prompt, flags=re.S).group(1)
            text = "Score: 10" if reference and reference in response else "Score: 0"
        return 200, {
            "id": "x",
            "object": "chat.completion",
            "model": body.get("model", "judge"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        }


@contextlib.contextmanager
def rule_judge():
    """(url up to /v1, the RuleJudge) for the duration of the block."""
    judge = RuleJudge()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            body["_auth"] = self.headers.get("Authorization")
            code, reply = judge.reply(body)
            data = json.dumps(reply).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", judge
    finally:
        server.shutdown()
        server.server_close()
