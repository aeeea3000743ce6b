#!/usr/bin/env python3
"""The official `openai` and `anthropic` Python clients against a local upstream that answers in each API's
format (JSON and streamed, the streams cut into awkward pieces), optionally through a gateway.

    pip install openai anthropic
    python3 bench/llm_clients.py                          # clients -> upstream: the answers parse as the clients expect
    python3 bench/llm_clients.py --write-fixtures tests/fixtures/llm
                                                          # and keeps what the clients sent and were answered
    python3 bench/llm_clients.py --upstream-port 18080 --via http://127.0.0.1:8080
                                                          # clients -> tollgate (routed to 127.0.0.1:18080) -> upstream
    python3 bench/llm_clients.py --refusals --tollgate target/debug/tollgate
                                                          # starts tollgate (REFUSALS_CONFIG) and checks that each
                                                          # client shows its refusals as the provider's errors

It checks that each client reads the usage the answer carries and prints what each client sent (body and the
headers that matter to reading usage). With --refusals it checks instead what each client makes of tollgate's
refusals (status, the error's code and type, the message) and that a client allowed one retry waits what
`retry-after-ms` says. No network: everything is on 127.0.0.1; the API keys are dummies.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# === What the upstream answers (written after each API's documented examples) ===

CHAT_JSON = {
    "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
    "object": "chat.completion",
    "created": 1741569952,
    "model": "gpt-4.1-2025-04-14",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello! How can I assist you today?", "refusal": None, "annotations": []},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {
        "prompt_tokens": 19,
        "completion_tokens": 10,
        "total_tokens": 29,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
    },
    "service_tier": "default",
}


def chat_stream(include_usage):
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1741569952, "model": "gpt-4.1-2025-04-14", "system_fingerprint": "fp_1"}
    chunks = []
    for delta, finish in [({"role": "assistant", "content": ""}, None), ({"content": "Hello"}, None), ({"content": "! \"usage\": {}"}, None), ({}, "stop")]:
        chunk = dict(base, choices=[{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}])
        if include_usage:
            chunk["usage"] = None
        chunks.append(chunk)
    if include_usage:
        chunks.append(dict(base, choices=[], usage={"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16, "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0}}))
    text = "".join("data: " + json.dumps(chunk, separators=(",", ":")) + "\n\n" for chunk in chunks)
    return text + "data: [DONE]\n\n"


RESPONSE = {
    "id": "resp_67ccd2bed1ec8190",
    "object": "response",
    "created_at": 1741476542,
    "status": "completed",
    "error": None,
    "incomplete_details": None,
    "instructions": None,
    "max_output_tokens": None,
    "model": "gpt-4.1-2025-04-14",
    "output": [
        {
            "type": "message",
            "id": "msg_67ccd2bf17f08190",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "In a peaceful grove beneath a silver moon...", "annotations": []}],
        }
    ],
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "reasoning": {"effort": None, "summary": None},
    "store": True,
    "temperature": 1.0,
    "text": {"format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [],
    "top_p": 1.0,
    "truncation": "disabled",
    "usage": {"input_tokens": 36, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 87, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 123},
    "user": None,
    "metadata": {},
}


def responses_stream():
    pending = dict(RESPONSE, status="in_progress", output=[], usage=None)
    item = RESPONSE["output"][0]
    part = item["content"][0]
    events = [
        ("response.created", {"response": pending}),
        ("response.in_progress", {"response": pending}),
        ("response.output_item.added", {"output_index": 0, "item": dict(item, status="in_progress", content=[])}),
        ("response.content_part.added", {"item_id": item["id"], "output_index": 0, "content_index": 0, "part": dict(part, text="")}),
        ("response.output_text.delta", {"item_id": item["id"], "output_index": 0, "content_index": 0, "delta": "In a peaceful grove", "logprobs": []}),
        ("response.output_text.delta", {"item_id": item["id"], "output_index": 0, "content_index": 0, "delta": " beneath a silver moon...", "logprobs": []}),
        ("response.output_text.done", {"item_id": item["id"], "output_index": 0, "content_index": 0, "text": part["text"], "logprobs": []}),
        ("response.content_part.done", {"item_id": item["id"], "output_index": 0, "content_index": 0, "part": part}),
        ("response.output_item.done", {"output_index": 0, "item": item}),
        ("response.completed", {"response": RESPONSE}),
    ]
    out = []
    for number, (kind, fields) in enumerate(events):
        data = dict({"type": kind, "sequence_number": number}, **fields)
        out.append("event: " + kind + "\n" + "data: " + json.dumps(data, separators=(",", ":")) + "\n\n")
    return "".join(out)


MESSAGE = {
    "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5-20250929",
    "content": [{"type": "text", "text": "Hi! My name is Claude."}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 2095, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 1000, "output_tokens": 503, "service_tier": "standard"},
}


def anthropic_stream():
    start = dict(MESSAGE, content=[], stop_reason=None, usage={"input_tokens": 25, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 300, "output_tokens": 1})
    events = [
        ("message_start", {"type": "message_start", "message": start}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("ping", {"type": "ping"}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "!"}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 15}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    # Anthropic's streams end lines with LF; CRLF here proves the clients and the reader take either.
    return "".join("event: " + kind + "\r\ndata: " + json.dumps(data, separators=(",", ":")) + "\r\n\r\n" for kind, data in events)


def answer_for(path, request):
    """(content type, body text) for a request."""
    stream = request.get("stream") is True
    if path.endswith("/chat/completions"):
        if stream:
            include = (request.get("stream_options") or {}).get("include_usage") is True
            return "text/event-stream; charset=utf-8", chat_stream(include)
        return "application/json", json.dumps(CHAT_JSON)
    if path.endswith("/responses"):
        return ("text/event-stream; charset=utf-8", responses_stream()) if stream else ("application/json", json.dumps(RESPONSE))
    if path.endswith("/messages"):
        return ("text/event-stream; charset=utf-8", anthropic_stream()) if stream else ("application/json", json.dumps(MESSAGE))
    return None


# === The upstream ===

class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen = []
    answered = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        request = json.loads(body)
        Upstream.seen.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
        answer = answer_for(self.path.split("?")[0], request)
        if answer is None:
            self.send_response(404)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        content_type, text = answer
        data = text.encode()
        Upstream.answered.append(data)
        self.send_response(200)
        self.send_header("content-type", content_type)
        if content_type.startswith("text/event-stream"):
            # Chunked in awkward pieces: 7 bytes each, so events, field names and CRLFs are split across writes.
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for at in range(0, len(data), 7):
                piece = data[at:at + 7]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)


# === The clients ===

def expected(usage, anthropic=False):
    """The usage as tollgate counts it: Anthropic's cached prompt is input."""
    if anthropic:
        total_in = usage["input_tokens"] + usage.get("cache_creation_input_tokens", 0) + usage.get("cache_read_input_tokens", 0)
        return {"input_tokens": total_in, "output_tokens": usage["output_tokens"], "total_tokens": total_in + usage["output_tokens"]}
    if "prompt_tokens" in usage:
        return {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"], "total_tokens": usage["total_tokens"]}
    return {"input_tokens": usage["input_tokens"], "output_tokens": usage["output_tokens"], "total_tokens": usage["total_tokens"]}


def run_clients(base):
    import anthropic
    import openai

    oai = openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)
    ant = anthropic.Anthropic(base_url=base, api_key="sk-ant-test", max_retries=0)
    messages = [{"role": "user", "content": "Say hello"}]
    results = {}

    completion = oai.chat.completions.create(model="gpt-4.1", messages=messages, max_completion_tokens=50)
    results["openai_chat"] = completion.usage.model_dump()

    usage = None
    for chunk in oai.chat.completions.create(model="gpt-4.1", messages=messages, max_tokens=50, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
    results["openai_chat_stream"] = usage

    usage = "absent"
    for chunk in oai.chat.completions.create(model="gpt-4.1", messages=messages, stream=True):
        if getattr(chunk, "usage", None) is not None:
            usage = chunk.usage.model_dump()
    results["openai_chat_stream_without_usage"] = usage

    response = oai.responses.create(model="gpt-4.1", input="Tell me a story", max_output_tokens=200)
    results["openai_responses"] = response.usage.model_dump()

    usage = None
    for event in oai.responses.create(model="gpt-4.1", input="Tell me a story", stream=True):
        if event.type == "response.completed":
            usage = event.response.usage.model_dump()
    results["openai_responses_stream"] = usage

    message = ant.messages.create(model="claude-sonnet-4-5", max_tokens=1024, messages=messages)
    results["anthropic_messages"] = message.usage.model_dump()

    with ant.messages.stream(model="claude-sonnet-4-5", max_tokens=1024, messages=messages) as stream:
        final = stream.get_final_message()
    results["anthropic_messages_stream"] = final.usage.model_dump()
    return results


# === Refusals, as the clients show them ===

REFUSALS_CONFIG = """\
listen: 127.0.0.1:{gateway_port}
store: {{ backend: memory }}
consumers:
  # anthropic 2.x sends its key as `Authorization: Bearer`, earlier versions as `x-api-key`: either names `ant`.
  identify: [ {{ api_key: {{ header: x-api-key }} }}, {{ api_key: {{ header: authorization }} }} ]
  keys: [ {{ key: sk-ant-test, consumer: ant }}, {{ key: "Bearer sk-ant-test", consumer: ant }} ]
upstreams:
  llm: {{ targets: ["http://127.0.0.1:{upstream_port}"] }}
routes:
  - name: anthropic
    match: {{ path_prefix: /v1/messages }}
    upstream: llm
    consumers: required
    usage: {{ format: anthropic, reserve: {{ completion_cap: 4096 }} }}
    limits:
      - {{ name: rps, key: consumer, algorithm: gcra, rate: 1/1s, burst: 1 }}
  - name: openai
    match: {{ path_prefix: /v1 }}
    upstream: llm
    consumers: off
    usage: {{ format: openai, reserve: {{ completion_default: 1024, completion_cap: 4096 }}, max_request_bytes: 8192 }}
    limits:
      - {{ name: rps, key: ip, algorithm: gcra, rate: 1/1s, burst: 1 }}
      - {{ name: tph, key: ip, algorithm: fixed_window, limit: 3000, period: 1h, counts: total_tokens }}
"""


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_tollgate(binary, upstream_port):
    """tollgate on a free port with REFUSALS_CONFIG; (process, base URL)."""
    port = free_port()
    config = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    config.write(REFUSALS_CONFIG.format(gateway_port=port, upstream_port=upstream_port))
    config.close()
    process = subprocess.Popen([binary, "--config", config.name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return process, "http://127.0.0.1:%d" % port
        except OSError:
            time.sleep(0.1)
    process.kill()
    sys.exit("tollgate did not start")


class Timeline:
    """The requests a client sent and the answers it got, with their times (httpx event hooks)."""

    def __init__(self):
        self.events = []

    def request(self, request):
        self.events.append(("request", time.monotonic(), None))

    def response(self, response):
        self.events.append(("response", time.monotonic(), response))

    def retry_wait(self):
        """(retry-after-ms of the first 429, seconds from it to the next request, the last status)."""
        for index, (kind, at, response) in enumerate(self.events):
            if kind == "response" and response.status_code == 429:
                retried = next(t for k, t, _ in self.events[index + 1:] if k == "request")
                last = [r for k, _, r in self.events if k == "response"][-1]
                said = response.headers.get("retry-after-ms")
                return (int(said) if said is not None else None), retried - at, last.status_code
        return None


def run_refusals(base):
    import anthropic
    import openai

    messages = [{"role": "user", "content": "Say hello"}]
    rows = []

    def caught(name, call, check):
        try:
            call()
            rows.append((name, "no error", False))
        except (openai.APIStatusError, anthropic.APIStatusError) as error:
            seen = {"status_code": error.status_code, "message": error.message}
            if isinstance(error, openai.APIStatusError):
                seen.update(code=error.code, type=error.type)
            else:
                seen.update(body_error_type=anthropic_type(error))
            seen.update(headers={k: error.response.headers.get(k) for k in ("retry-after", "retry-after-ms")})
            seen["class"] = type(error).__name__
            rows.append((name, seen, check(error)))

    def anthropic_type(error):
        """`e.body["error"]["type"]`, or None where the body is not in Anthropic's shape."""
        inner = error.body.get("error") if isinstance(error.body, dict) else None
        return inner.get("type") if isinstance(inner, dict) else None

    oai = openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)
    chat = lambda **extra: oai.chat.completions.create(model="gpt-4.1", messages=messages, **extra)
    chat(max_completion_tokens=50)
    caught("openai: a rate limit", lambda: chat(max_completion_tokens=50),
           lambda e: isinstance(e, openai.RateLimitError) and e.status_code == 429 and e.code == "rate_limit_exceeded"
           and e.type == "rate_limit_exceeded" and e.response.headers.get("retry-after-ms") is not None)
    caught("openai: more tokens than the limit holds", lambda: chat(max_completion_tokens=4000),
           lambda e: e.status_code == 413 and e.code == "reservation_too_large" and e.type == "invalid_request_error"
           and "3000" in e.message)
    caught("openai: a body past max_request_bytes", lambda: oai.embeddings.create(model="e", input="x" * 10000),
           lambda e: e.status_code == 413 and e.code == "body_too_large" and e.type == "invalid_request_error")

    timeline = Timeline()
    retrying = openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=1,
                             http_client=openai.DefaultHttpxClient(event_hooks={"request": [timeline.request], "response": [timeline.response]}))
    retrying.chat.completions.create(model="gpt-4.1", messages=messages, max_completion_tokens=50)
    retrying.chat.completions.create(model="gpt-4.1", messages=messages, max_completion_tokens=50)
    waits = {"openai": timeline.retry_wait()}

    ant = anthropic.Anthropic(base_url=base, api_key="sk-ant-test", max_retries=0)
    stranger = anthropic.Anthropic(base_url=base, api_key="sk-ant-unknown", max_retries=0)
    message = lambda client: client.messages.create(model="claude-sonnet-4-5", max_tokens=100, messages=messages)
    caught("anthropic: an unknown key", lambda: message(stranger),
           lambda e: isinstance(e, anthropic.AuthenticationError) and anthropic_type(e) == "authentication_error")
    message(ant)
    caught("anthropic: a rate limit", lambda: message(ant),
           lambda e: isinstance(e, anthropic.RateLimitError) and e.status_code == 429
           and anthropic_type(e) == "rate_limit_error" and e.response.headers.get("retry-after-ms") is not None)

    timeline = Timeline()
    retrying = anthropic.Anthropic(base_url=base, api_key="sk-ant-test", max_retries=1,
                                   http_client=anthropic.DefaultHttpxClient(event_hooks={"request": [timeline.request], "response": [timeline.response]}))
    message(retrying)
    waits["anthropic"] = timeline.retry_wait()
    return rows, waits


def report_refusals(rows, waits):
    failures = 0
    for name, seen, ok in rows:
        print("== %s: %s" % (name, "ok" if ok else "FAIL"))
        print("   " + json.dumps(seen))
        failures += not ok
    for client, wait in waits.items():
        if wait is None:
            print("== %s with max_retries=1: FAIL, never refused" % client)
            failures += 1
            continue
        said, waited, last = wait
        # The client sleeps what the header says; the rest is its own work between the answer and the next request.
        ok = said is not None and said / 1000 <= waited <= said / 1000 + 0.25 and last == 200
        print("== %s with max_retries=1: %s" % (client, "ok" if ok else "FAIL"))
        print("   retry-after-ms said %s ms, the client sent its retry %.0f ms after the 429, which was answered %d"
              % (said, waited * 1000, last))
        failures += not ok
    return failures


NAMES = [
    "openai_chat",
    "openai_chat_stream",
    "openai_chat_stream_without_usage",
    "openai_responses",
    "openai_responses_stream",
    "anthropic_messages",
    "anthropic_messages_stream",
]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream-port", type=int, default=0)
    parser.add_argument("--via", help="the gateway's URL (routes to the upstream); default: the upstream itself")
    parser.add_argument("--write-fixtures", metavar="DIR")
    parser.add_argument("--refusals", action="store_true", help="check how the clients show tollgate's refusals")
    parser.add_argument("--tollgate", metavar="BIN", help="with --refusals: the binary to start (else --via's gateway, run with REFUSALS_CONFIG)")
    args = parser.parse_args()

    server = ThreadingHTTPServer(("127.0.0.1", args.upstream_port), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    upstream = "http://127.0.0.1:%d" % server.server_address[1]
    print("upstream on", upstream, file=sys.stderr)
    if args.refusals:
        process, base = start_tollgate(args.tollgate, server.server_address[1]) if args.tollgate else (None, args.via)
        try:
            failures = report_refusals(*run_refusals(base))
        finally:
            if process is not None:
                process.terminate()
                process.wait()
        server.shutdown()
        if failures:
            print("%d failures" % failures)
            sys.exit(1)
        print("every client showed tollgate's refusals as its provider's errors")
        return
    results = run_clients(args.via or upstream)
    server.shutdown()

    failures = 0
    for index, name in enumerate(NAMES):
        seen = Upstream.seen[index]
        got = results[name]
        print("== %s: %s" % (name, seen["path"]))
        print("   sent:", seen["body"].decode())
        print("   accept-encoding:", seen["headers"].get("accept-encoding"), " content-type:", seen["headers"].get("content-type"))
        print("   client read usage:", got)
        if name == "openai_chat_stream_without_usage":
            if got != "absent":
                failures += 1
                print("   FAIL: a stream without include_usage had usage")
            continue
        if got is None:
            failures += 1
            print("   FAIL: the client read no usage")
        if args.write_fixtures:
            os.makedirs(args.write_fixtures, exist_ok=True)
            with open(os.path.join(args.write_fixtures, name + ".request.json"), "wb") as out:
                out.write(seen["body"])
            suffix = ".sse" if name.endswith("_stream") else ".json"
            with open(os.path.join(args.write_fixtures, name + ".response" + suffix), "wb") as out:
                out.write(Upstream.answered[index])
            with open(os.path.join(args.write_fixtures, name + ".usage.json"), "w") as out:
                json.dump(expected(got, anthropic=name.startswith("anthropic")), out, sort_keys=True)
                out.write("\n")
    if failures:
        print("%d failures" % failures)
        sys.exit(1)
    print("every client read the usage its answer carried")


if __name__ == "__main__":
    main()
