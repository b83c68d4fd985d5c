#!/usr/bin/env python3
"""Server throughput: `cisa serve` against llama.cpp's server (llama-cpp-python's
`python -m llama_cpp.server`) on the same streamed /v1/completions requests, alternating the two.

Why not `cisa bench serve` alone: against llama-cpp-python 0.3.36's server it cannot measure
anything. That server's streams carry no `usage` (it ignores stream_options), so every request
ends in "no usage in the stream"; it refuses token-id prompts (422: prompt must be a string or
strings); and it has no `ignore_eos` (pydantic drops the field). Start it with
`--interrupt_requests False`: by default a new request interrupts the running stream (its
`interrupt_requests` setting), so concurrent clients cut each other off. This driver therefore sends only
standard fields ({"model", "prompt": text, "max_tokens", "temperature": 0, "stream": true}) to
both servers, counts a request's output tokens as its non-empty stream chunks and requires
`finish_reason` "length" (so every request really produced max_tokens tokens), and takes prompt
token counts from llama.cpp's tokenizer (cisa's tokenizer gives the same ids: the golden token
tests). TTFT is from sending to the first non-empty chunk, TPOT = (e2e - TTFT) / (tokens - 1), as
in cisa bench serve, whose numbers on cisa serve this driver's are checked against (README.md).

    python3 bench/llamacpp/serve_compare.py --server cisa=127.0.0.1:18431 \\
        --server llama.cpp=127.0.0.1:18432 --prompt-file P.txt --concurrency 1 4 \\
        --requests 4 8 --output-len 64 --repeats 3 --tokenizer-model MODEL --out RESULT.json

Only loopback targets are accepted; every run is bounded (requests, and --timeout per request).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import pathlib
import statistics
import sys
import threading
import time


def one_request(host: str, port: int, body: dict, timeout: float) -> dict:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        return {"ok": False, "error": f"HTTP {resp.status}: {resp.read()[:200]!r}"}
    ttft, last, chunks, finish, done = None, None, 0, None, False
    itl = []
    buf = b""
    while True:
        data = resp.read1(65536) if hasattr(resp, "read1") else resp.read(1)
        if not data:
            break
        buf += data
        while b"\n\n" in buf or b"\r\n\r\n" in buf:
            sep = b"\r\n\r\n" if (b"\r\n\r\n" in buf and (b"\n\n" not in buf or buf.index(b"\r\n\r\n") < buf.index(b"\n\n"))) else b"\n\n"
            event, buf = buf.split(sep, 1)
            for line in event.splitlines():
                if not line.startswith(b"data: "):
                    continue
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    done = True
                    continue
                j = json.loads(payload)
                if "error" in j:
                    return {"ok": False, "error": str(j["error"])[:200]}
                for c in j.get("choices") or []:
                    if c.get("finish_reason"):
                        finish = c["finish_reason"]
                    if c.get("text"):
                        t = time.perf_counter() - t0
                        if ttft is None:
                            ttft = t
                        else:
                            itl.append(t - last)
                        last = t
                        chunks += 1
        if time.perf_counter() - t0 > timeout:
            return {"ok": False, "error": "timed out"}
    e2e = time.perf_counter() - t0
    conn.close()
    ok = done and ttft is not None and finish == "length"
    return {"ok": ok, "error": None if ok else f"done={done} finish={finish} chunks={chunks}",
            "ttft": ttft, "e2e": e2e, "tokens": chunks, "itl": itl}


def bench(host, port, model, prompts, n_tok, n_requests, concurrency, out_len, timeout) -> dict:
    results = [None] * n_requests
    nxt = [0]
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= n_requests:
                return
            body = {"model": model, "prompt": prompts[i % len(prompts)], "max_tokens": out_len,
                    "temperature": 0, "stream": True}
            try:
                results[i] = one_request(host, port, body, timeout)
            except Exception as e:  # a reset connection, a malformed event: a failed request
                results[i] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:200]}
            results[i]["prompt_tokens"] = n_tok[i % len(prompts)]

    load0 = os.getloadavg()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(min(concurrency, n_requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dur = time.perf_counter() - t0
    ok = [r for r in results if r["ok"]]
    out_tokens = sum(r["tokens"] for r in ok)
    in_tokens = sum(r["prompt_tokens"] for r in ok)
    ttft = [r["ttft"] for r in ok]
    tpot = [(r["e2e"] - r["ttft"]) / (r["tokens"] - 1) for r in ok if r["tokens"] > 1]
    med = lambda v: statistics.median(v) * 1e3 if v else None  # noqa: E731
    mean = lambda v: statistics.fmean(v) * 1e3 if v else None  # noqa: E731
    return {"requests": n_requests, "concurrency": concurrency, "successful": len(ok),
            "first_error": next((r["error"] for r in results if not r["ok"]), None),
            "duration_s": dur, "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
            "output_throughput": out_tokens / dur, "total_token_throughput": (in_tokens + out_tokens) / dur,
            "ttft_mean_ms": mean(ttft), "ttft_median_ms": med(ttft),
            "tpot_median_ms": med(tpot), "e2el_median_ms": med([r["e2e"] for r in ok]),
            "loadavg_before": load0, "loadavg_after": os.getloadavg()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", action="append", required=True, help="NAME=HOST:PORT")
    ap.add_argument("--prompt-file", required=True, help="prompts, one per line")
    ap.add_argument("--tokenizer-model", required=True, help="GGUF whose tokenizer counts prompt tokens")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--requests", type=int, nargs="+", default=[4, 8], help="per concurrency")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    servers = []
    for s in args.server:
        name, hp = s.split("=", 1)
        host, port = hp.rsplit(":", 1)
        if not (host.startswith("127.") or host in ("localhost", "::1")):
            raise SystemExit(f"{host} is not a loopback address")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", "/v1/models")
        model = json.loads(conn.getresponse().read())["data"][0]["id"]
        servers.append((name, host, int(port), model))
    prompts = [l for l in pathlib.Path(args.prompt_file).read_text(encoding="utf-8").splitlines() if l]
    import llama_cpp  # type: ignore
    tok = llama_cpp.Llama(model_path=args.tokenizer_model, vocab_only=True, verbose=False)
    n_tok = [len(tok.tokenize(p.encode("utf-8"), add_bos=True, special=True)) for p in prompts]
    runs = []
    for rep in range(args.repeats):
        for c, n in zip(args.concurrency, args.requests):
            order = servers if rep % 2 == 0 else servers[::-1]
            for name, host, port, model in order:
                r = bench(host, port, model, prompts, n_tok, n, c, args.output_len, args.timeout)
                r.update({"server": name, "repeat": rep})
                runs.append(r)
                print(f"[{time.strftime('%H:%M:%S')}] rep {rep} c={c} {name}: {r['successful']}/{n} ok, "
                      f"out {r['output_throughput']:.2f} tok/s, total {r['total_token_throughput']:.2f} tok/s, "
                      f"TTFT median {r['ttft_median_ms'] or 0:.0f} ms, TPOT median {r['tpot_median_ms'] or 0:.0f} ms, "
                      f"load {r['loadavg_before'][0]:.1f}" + (f" ERR {r['first_error']}" if r['first_error'] else ""),
                      flush=True)
    pathlib.Path(args.out).write_text(json.dumps({
        "prompt_file": args.prompt_file, "prompt_tokens": n_tok, "output_len": args.output_len,
        "servers": [{"name": s[0], "port": s[2], "model": s[3]} for s in servers],
        "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
