#!/usr/bin/env python3
"""End-to-end tests of `cisa serve` with the official `openai` Python client as the client.

Starts `cisa serve` processes on 127.0.0.1 (free ports) and checks, against independent
references: completions and chat (streamed and not) through the openai client; greedy outputs of 8
concurrent requests equal the same prompts run alone through `cisa run`; malformed JSON, wrong
types, an unknown model, a huge body, a prompt longer than the context, a full queue and a client
that disconnects mid-stream get clear HTTP errors (or a cancelled request whose KV pages are freed)
while the server keeps serving; a bounded load test (64 requests at concurrency 16) where every
response is complete and well-formed.

    python3 tests/server/test_openai.py --cisa build/cisa [--models models]

Exit status 77 (ctest SKIP_RETURN_CODE) when `openai` is not importable or the models are absent.
Every server is killed at the end; every request has a timeout.
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import re
import select
import socket
import subprocess
import sys
import time
import unittest

SKIP = 77
ARGS = None
SERVERS = {}
GEMMA = "gemma-3-270m-q4_k_m.gguf"
SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = [
    "Once upon a time", "The capital of France is", "def fibonacci(n):", "The quick brown fox",
    "In 1969, astronauts", "Water boils at", "My favourite colour is", "The best way to learn",
]


class Server:
    """One `cisa serve` process; its port is read from its first line of output."""

    def __init__(self, model, extra):
        cmd = [ARGS.cisa, "serve", "-m", model, "--port", "0", "--threads", "2", "--quiet"] + extra
        self.log = open(os.path.join(ARGS.tmp, "serve_%d.log" % len(SERVERS)), "w+")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 120)
        line = self.proc.stdout.readline() if ready else ""
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if not m:
            self.stop()
            raise RuntimeError("cisa serve did not start: %r (%s)" % (line, " ".join(cmd)))
        self.port = int(m.group(1))
        self.url = "http://127.0.0.1:%d/v1" % self.port

    def request(self, method, path, body=None, headers=None, timeout=120):
        """(status, parsed JSON or text) of one raw HTTP request."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read().decode("utf-8", "replace")
        c.close()
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, data

    def metrics(self):
        _, text = self.request("GET", "/metrics")
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def healthy(self):
        return self.proc.poll() is None and self.request("GET", "/health")[0] == 200

    def stop(self):
        self.proc.stdout.close()
        self.log.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def hang_up(conn, response):
    """Closes a connection at once, mid-response (the fd goes, not just Python's reference)."""
    conn.sock.shutdown(socket.SHUT_RDWR)
    response.close()
    conn.close()


def client(server):
    import openai
    return openai.OpenAI(base_url=server.url, api_key="none", timeout=300, max_retries=0)


def cisa_run(model, prompt, n, extra=()):
    out = subprocess.run([ARGS.cisa, "run", "-m", model, "-p", prompt, "-n", str(n), "--greedy",
                          "--threads", "2", "--quiet", "--json"] + list(extra),
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout)["text"]


class Completions(unittest.TestCase):
    def setUp(self):
        self.s = SERVERS["gemma"]
        self.c = client(self.s)

    def test_plain_and_streamed_agree_with_usage(self):
        r = self.c.completions.create(model="gemma", prompt="Once upon a time", max_tokens=12,
                                      temperature=0)
        self.assertEqual(r.object, "text_completion")
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 12)
        self.assertEqual(r.usage.prompt_tokens + 12, r.usage.total_tokens)
        chunks = list(self.c.completions.create(
            model="gemma", prompt="Once upon a time", max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        self.assertEqual(text, r.choices[0].text)
        self.assertEqual([ch.choices[0].finish_reason for ch in chunks if ch.choices][-1], "length")
        self.assertEqual(chunks[-1].usage.completion_tokens, 12)
        self.assertGreater(len([ch for ch in chunks if ch.choices and ch.choices[0].text]), 3)

    def test_stop_string_and_seeded_sampling(self):
        r = self.c.completions.create(model="gemma", prompt="Once upon a time", max_tokens=30,
                                      temperature=0, stop=[" was"])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertNotIn(" was", r.choices[0].text)
        a, b = [self.c.completions.create(model="gemma", prompt="Hello", max_tokens=10,
                                          temperature=1.0, top_p=0.9, seed=7,
                                          extra_body={"top_k": 20}).choices[0].text
                for _ in range(2)]
        self.assertEqual(a, b)

    def test_per_request_cisa_settings(self):
        long_prompt = " ".join(["The river runs to the sea and the sea is never full."] * 40)
        r = self.c.completions.create(model="gemma", prompt=long_prompt, max_tokens=4,
                                      temperature=0,
                                      extra_body={"cisa": {"budget": 2, "window": 1, "qshare": 4}})
        self.assertEqual(r.usage.completion_tokens, 4)
        m = self.s.metrics()
        self.assertLess(m["cisa_attention_read_fraction"], 1.0)
        status, body = self.s.request("POST", "/v1/completions", json.dumps(
            {"prompt": "Hi", "cisa": {"budget": -1}}))
        self.assertEqual(status, 400)
        self.assertIn("budget", body["error"]["message"])


class Errors(unittest.TestCase):
    def setUp(self):
        self.s = SERVERS["gemma"]

    def expect(self, status, body, needle, path="/v1/completions"):
        got, j = self.s.request("POST", path, body, {"Content-Type": "application/json"})
        self.assertEqual(got, status, j)
        self.assertIn(needle, j["error"]["message"])
        self.assertTrue(self.s.healthy())

    def test_bad_requests(self):
        self.expect(400, "{not json", "not valid JSON")
        self.expect(400, "[1, 2]", "JSON object")
        self.expect(400, json.dumps({"prompt": "Hi", "max_tokens": "ten"}), "max_tokens")
        self.expect(400, json.dumps({"prompt": "Hi", "temperature": 5}), "temperature")
        self.expect(400, json.dumps({"prompt": "Hi", "n": 2}), "'n' must be 1")
        self.expect(400, json.dumps({"prompt": 12}), "prompt")
        self.expect(400, json.dumps({"prompt": [1, 2, 10**9]}), "vocabulary")
        self.expect(400, json.dumps({"prompt": list(range(1000, 1700))}), "context")
        self.expect(404, json.dumps({"prompt": "Hi", "model": "gpt-4"}), "does not exist")

    def test_openai_client_raises_the_status(self):
        import openai
        c = client(self.s)
        with self.assertRaises(openai.NotFoundError):
            c.completions.create(model="gpt-4", prompt="Hi", max_tokens=2)
        with self.assertRaises(openai.BadRequestError):
            c.completions.create(model="gemma", prompt="Hi", max_tokens=0)

    def test_huge_body_and_unknown_route(self):
        got, j = self.s.request("POST", "/v1/completions", "x" * (9 << 20))
        self.assertEqual(got, 413)
        self.assertIn("--max-body-kib", j["error"]["message"])
        # A 60 KiB JSON body (mostly indentation) is served when labelled JSON; labelled form-encoded (curl -d's
        # default) the HTTP library caps it at 8 KiB, and the 413 says which header to send.
        body = json.dumps({"prompt": "Hello", "max_tokens": 1, "temperature": 0}, indent=20000)
        got, j = self.s.request("POST", "/v1/completions", body,
                                {"Content-Type": "application/json"})
        self.assertEqual(got, 200, j)
        got, j = self.s.request("POST", "/v1/completions", body,
                                {"Content-Type": "application/x-www-form-urlencoded"})
        self.assertEqual(got, 413)
        self.assertIn("Content-Type: application/json", j["error"]["message"])
        got, j = self.s.request("GET", "/v1/nothing")
        self.assertEqual(got, 404)
        self.assertTrue(self.s.healthy())

    def test_disconnect_mid_stream_frees_pages(self):
        before = self.s.metrics().get('cisa_requests_total{outcome="cancelled"}', 0)
        c = http.client.HTTPConnection("127.0.0.1", self.s.port, timeout=60)
        c.request("POST", "/v1/completions", json.dumps(
            {"prompt": "Once upon a time", "max_tokens": 3000, "ignore_eos": True,
             "stream": True}), {"Content-Type": "application/json"})
        r = c.getresponse()
        self.assertEqual(r.status, 200)
        self.assertTrue(r.readline().startswith(b"data: "))
        hang_up(c, r)  # gone mid-stream
        deadline = time.time() + 30
        while time.time() < deadline:
            m = self.s.metrics()
            if m.get('cisa_requests_total{outcome="cancelled"}', 0) > before and \
                    m["cisa_requests_running"] == 0:
                break
            time.sleep(0.2)
        self.assertGreater(m['cisa_requests_total{outcome="cancelled"}'], before)
        self.assertEqual(m["cisa_kv_pages_used"], 0)
        r = client(self.s).completions.create(model="gemma", prompt="Hi", max_tokens=3)
        self.assertEqual(r.usage.completion_tokens, 3)


class Concurrency(unittest.TestCase):
    def test_greedy_concurrent_equal_cisa_run_alone(self):
        # SmolLM2's Q4_1 products do not depend on the rows of a step. (Gemma's K-quants follow
        # llama.cpp, whose products of >= 8 rows add in another order: batched greedy text can
        # then differ from a request run alone, as in llama.cpp itself; docs/server.md.)
        c = client(SERVERS["smol"])

        def one(p):
            return c.completions.create(model="smol", prompt=p, max_tokens=16,
                                        temperature=0).choices[0].text
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            served = list(ex.map(one, PROMPTS))
        alone = [cisa_run(os.path.join(ARGS.models, SMOL), p, 16) for p in PROMPTS]
        self.assertEqual(served, alone)
        self.assertEqual(len(set(served)), len(PROMPTS))


class Chat(unittest.TestCase):
    def test_chat_plain_and_streamed(self):
        s = SERVERS["smol"]
        c = client(s)
        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        r = c.chat.completions.create(model="smol", messages=msgs, max_tokens=24, temperature=0)
        self.assertEqual(r.choices[0].message.role, "assistant")
        # The same prompt written out in SmolLM2's ChatML (its default system turn included),
        # run alone through `cisa run`, which stops at <|im_end|> (an end-of-generation token).
        chatml = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                  "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?"
                  "<|im_end|>\n<|im_start|>assistant\n")
        self.assertEqual(r.choices[0].message.content,
                         cisa_run(os.path.join(ARGS.models, SMOL), chatml, 24))
        self.assertNotIn("<|im_end|>", r.choices[0].message.content)
        chunks = list(c.chat.completions.create(model="smol", messages=msgs, max_tokens=24,
                                                temperature=0, stream=True))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        self.assertEqual(text, r.choices[0].message.content)
        self.assertEqual(chunks[-1].choices[0].finish_reason, r.choices[0].finish_reason)

    def test_bench_serve_honors_eos_on_request(self):
        # `cisa bench serve --honor-eos` lets requests end at EOS and reports their mean length
        # (the verbosity measure); without it every request generates exactly --output-len.
        s = SERVERS["smol"]
        msgs = [{"role": "user", "content": "What is 2+2?"}]
        r = client(s).chat.completions.create(model="smol", messages=msgs, max_tokens=64,
                                              temperature=0)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        prompts = os.path.join(ARGS.tmp, "bench_prompts.txt")
        with open(prompts, "w") as f:
            f.write("What is 2+2?\n")

        def bench(extra):
            out = subprocess.run([ARGS.cisa, "bench", "serve", "--port", str(s.port),
                                  "--endpoint", "chat", "--prompt-file", prompts,
                                  "--num-prompts", "2", "--concurrency", "2", "--output-len",
                                  "64", "--json", "--quiet", "--timeout", "120"] + extra,
                                 capture_output=True, text=True, timeout=300, check=True)
            return json.loads(out.stdout)
        honored = bench(["--honor-eos"])
        self.assertTrue(honored["honor_eos"])
        self.assertEqual(honored["failed_requests"], 0)
        self.assertEqual(honored["mean_output_tokens"], r.usage.completion_tokens)
        fixed = bench([])
        self.assertFalse(fixed["honor_eos"])
        self.assertEqual(fixed["mean_output_tokens"], 64)

    def test_bad_messages(self):
        for body, needle in [({"messages": "hi"}, "messages"),
                             ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
                             ({"messages": [{"role": "user"}]}, "content"),
                             ({"messages": [{"role": "user", "content": 3}]}, "content")]:
            got, j = SERVERS["smol"].request("POST", "/v1/chat/completions", json.dumps(body))
            self.assertEqual(got, 400, j)
            self.assertIn(needle, j["error"]["message"])

    def test_no_template_is_a_clear_400(self):
        got, j = SERVERS["gemma"].request("POST", "/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": "Hi"}]}))
        self.assertEqual(got, 400)
        self.assertIn("chat template", j["error"]["message"])

    def test_full_queue_is_503(self):
        s = SERVERS["smol_q"]  # --parallel 2 --max-waiting 0
        conns = []
        for _ in range(2):
            c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
            c.request("POST", "/v1/completions", json.dumps(
                {"prompt": "Hello", "max_tokens": 3000, "ignore_eos": True, "stream": True}))
            r = c.getresponse()
            r.readline()
            conns.append((c, r))
        deadline = time.time() + 30
        while time.time() < deadline and s.metrics()["cisa_requests_running"] < 2:
            time.sleep(0.1)
        got, j = s.request("POST", "/v1/completions", json.dumps({"prompt": "Hi"}))
        self.assertEqual(got, 503)
        self.assertIn("queue is full", j["error"]["message"])
        for c, r in conns:
            hang_up(c, r)
        deadline = time.time() + 30
        while time.time() < deadline and s.metrics()["cisa_requests_running"] > 0:
            time.sleep(0.2)
        self.assertTrue(s.healthy())


class Load(unittest.TestCase):
    def test_64_requests_at_concurrency_16(self):
        s = SERVERS["gemma"]
        c = client(s)

        def one(i):
            body = {"attention": "dense"} if i % 3 == 0 else {}  # two attention groups
            chunks = list(c.completions.create(
                model="gemma", prompt=PROMPTS[i % 8] + " " * (i % 5), max_tokens=6,
                temperature=0.7, seed=i, stream=True, stream_options={"include_usage": True},
                extra_body=dict(body, ignore_eos=True)))
            return chunks
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            results = list(ex.map(one, range(64)))
        self.assertLess(time.time() - t0, 600)
        for chunks in results:
            self.assertEqual(chunks[-1].usage.completion_tokens, 6)
            finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
            self.assertEqual(finals[-1], "length")
            self.assertTrue(all(f is None for f in finals[:-1]))
        # The gauges are published after the step that ended the last request: wait for it.
        deadline = time.time() + 10
        while time.time() < deadline:
            m = s.metrics()
            if m["cisa_requests_running"] == 0 and m["cisa_kv_pages_used"] == 0:
                break
            time.sleep(0.1)
        self.assertEqual(m["cisa_requests_running"], 0)
        self.assertEqual(m["cisa_kv_pages_used"], 0)
        self.assertEqual(m['cisa_requests_total{outcome="error"}'], 0)
        self.assertTrue(s.healthy())


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--cisa", required=True)
    p.add_argument("--models", default=os.path.join(os.path.dirname(__file__), "..", "..", "models"))
    p.add_argument("--tmp", default="/tmp")
    ARGS, rest = p.parse_known_args()
    try:
        import openai  # noqa: F401
    except ImportError:
        print("SKIP: the openai Python package is not installed (scripts/install_deps.sh)")
        return SKIP
    gemma, smol = (os.path.join(ARGS.models, f) for f in (GEMMA, SMOL))
    if not (os.path.exists(gemma) and os.path.exists(smol)):
        print("SKIP: models absent (%s, %s); scripts/pull_model.py fetches them" % (gemma, smol))
        return SKIP
    try:
        SERVERS["gemma"] = Server(gemma, ["--served-model-name", "gemma", "--attention", "cisa",
                                          "--parallel", "16", "--context", "640",
                                          "--prefill-chunk", "64"])
        SERVERS["smol"] = Server(smol, ["--served-model-name", "smol", "--parallel", "8",
                                        "--context", "1024"])
        SERVERS["smol_q"] = Server(smol, ["--served-model-name", "smol", "--parallel", "2",
                                          "--max-waiting", "0", "--context", "256"])
        prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
        return 0 if prog.result.wasSuccessful() else 1
    finally:
        for s in SERVERS.values():
            s.stop()


if __name__ == "__main__":
    sys.exit(main())
