"""Serving one-row requests over HTTP: `deepx-flow serve` against what a user would write
instead.

What: the MLP 784-256-10 and the small convolutional network of `bench_inference.py`
(`mlp`, `cnn`), each answering one-row requests of the Open Inference Protocol's JSON
(`POST /v2/models/NAME/infer`), from a bounded loopback load generator that keeps
`concurrency` requests in flight (1, 16 and 64) until it has sent `REQUESTS` of them.

Contenders, on the same 2 cores, side by side in one run, the same request bodies:

- deepx_flow (workers): `deepx-flow serve --model-repository`, each model with a config
  asking for dynamic batching (max_batch_size 64, a queue delay of 500 us) and one replica
  (the default count), resident on a worker of the embedded cluster (a Dask actor, batches
  over its own connection);
- deepx_flow (KIND_CPU): the same server and config with `kind: KIND_CPU` and one replica,
  a thread of the gateway's own process (no hop to a worker);
- plain: what a user writes without a server for models: an HTTP endpoint (Starlette on
  uvicorn) that decodes the same JSON, calls ONNX Runtime's `session.run` on the one row
  (CPU provider, default threads) and answers the same JSON, no batching.

Reported per model, concurrency and contender: requests/s, and p50 and p99 latency (ms),
measured by the load generator (a process of its own), each the median of ROUNDS rounds
that take the contenders in turn. Every answer is checked against ONNX
Runtime's for its own row (relative 1e-5).

Targets, for each deepx_flow placement: at concurrency 64, throughput at least 2x the plain
endpoint's; at concurrency 1, p50 latency at most the plain endpoint's plus 2 ms.

Run: `python benchmarks/bench_serving.py [--quick]` (--quick: 48 requests a level, no wait
for a quiet machine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import common
from bench_inference import cnn, mlp

# (a second or more at 64 clients: with 2,000, a run of 0.3 s counted the 64 connections'
# setup and the first requests' as much as the steady state, and repeated runs differed
# by a fifth)
REQUESTS = 6000
# Each measurement is taken this many times, the contenders in turn, and the median of each
# figure reported (each round's are recorded): on a shared 2-core machine single runs of
# the same server differed by a third.
ROUNDS = 3
CONCURRENCY = (1, 16, 64)
CONFIG = """max_batch_size: 64
dynamic_batching { max_queue_delay_microseconds: 500 }
instance_group [ { count: COUNT, kind: KIND } ]
"""
# (kind, replicas, model name suffix). One replica in each placement, the default count.
# In the gateway's process a second shares the GIL with the first and with the event loop
# that reads every request, and measured slower (the MLP at 64 clients: 3,070 requests/s
# with two, 4,480 with one). On the workers a second adds no core here (the gateway, the
# load generator and both workers share these 2), only a process more to schedule and
# smaller batches: at 64 clients of the conv net, 6,900-8,460 requests/s with one (median
# 8,320) and 7,210-8,160 with two (median 7,450), four runs each in turn; the MLP
# 10,040-11,380 with one, 9,860-10,660 with two.
PLACEMENTS = {"deepx_flow (workers)": ("KIND_AUTO", 1, ""),
              "deepx_flow (KIND_CPU)": ("KIND_CPU", 1, "_cpu")}
INPUTS = {"mlp": [1, 784], "cnn": [1, 1, 28, 28]}

PLAIN = '''
import json, sys
import numpy as np, onnxruntime as ort, uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
sessions = {name: ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            for name, path in json.loads(sys.argv[1]).items()}

async def infer(request):
    body = await request.json()
    session = sessions[request.path_params["model"]]
    feed = {t["name"]: np.array(t["data"], np.float32).reshape(t["shape"])
            for t in body["inputs"]}
    names = [o.name for o in session.get_outputs()]
    outs = session.run(None, feed)
    return JSONResponse({"model_name": request.path_params["model"], "outputs": [
        {"name": n, "datatype": "FP32", "shape": list(o.shape), "data": o.ravel().tolist()}
        for n, o in zip(names, outs)]})

app = Starlette(routes=[Route("/v2/models/{model}/infer", infer, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
'''

LOAD = '''
import asyncio, json, sys, time
from urllib.parse import urlsplit

# Each of `concurrency` clients keeps one HTTP/1.1 connection and sends its next request when
# its answer is in, as wrk does: requests are encoded once, answers read by their
# Content-Length. (httpx's pool was the bottleneck at 64 clients: it scanned every
# connection for every request, 80% of the load generator's time, and capped the plain
# endpoint at 525 requests/s where it answers 3,000.)
async def main(url, bodies, concurrency, total):
    parts = urlsplit(url)
    head = (f"POST {parts.path} HTTP/1.1\\r\\nHost: {parts.netloc}\\r\\n"
            f"Content-Type: application/json\\r\\nContent-Length: ")
    requests = [head.encode() + b"%d\\r\\n\\r\\n" % len(b) + b for b in bodies]
    latencies, answers = [], {}

    async def exchange(reader, writer, i):
        writer.write(requests[i % len(requests)])
        lines = (await reader.readuntil(b"\\r\\n\\r\\n")).decode("latin-1").split("\\r\\n")
        fields = dict(line.split(":", 1) for line in lines[1:] if line)
        length = {k.strip().lower(): v.strip() for k, v in fields.items()}.get(
            "content-length")
        if length is None:
            raise SystemExit(f"{url}: an answer without a Content-Length: {lines[:8]}")
        body = await reader.readexactly(int(length))
        if lines[0].split(" ", 2)[1] != "200":
            raise SystemExit(f"{url}: {lines[0]} {body[:300]!r}")
        return body

    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    await exchange(reader, writer, 0)  # the first request (a connection made once)
    writer.close()
    queue = iter(range(total))

    async def client():
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        try:
            for i in queue:
                began = time.perf_counter()
                try:  # (a server that stops answering fails the run, not hangs it)
                    body = await asyncio.wait_for(exchange(reader, writer, i), 60)
                except asyncio.TimeoutError:
                    raise SystemExit(f"{url}: request {i} not answered in 60 s")
                latencies.append(time.perf_counter() - began)
                answers[i] = json.loads(body)["outputs"][0]["data"]  # every one checked
        finally:
            writer.close()
    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    seconds = time.perf_counter() - began
    print(json.dumps({"seconds": seconds, "latencies": latencies, "answers": answers}))

url, path, concurrency, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
bodies = [line.encode() for line in open(path).read().splitlines()]
asyncio.run(main(url, bodies, concurrency, total))
'''


def start(command, pattern: str, env=None, timeout: float = 180.0):
    """A server process, and the first match of `pattern` in its stderr (its ports)."""
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    deadline, line = time.monotonic() + timeout, ""
    while not re.search(pattern, line):
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            raise SystemExit(f"{command[:3]} exited {proc.returncode}")
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"{command[:3]} did not start")
    return proc, re.search(pattern, line)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc, timeout: float = 120.0) -> None:
    """Until something listens on `port` (uvicorn at log level warning says nothing)."""
    import socket
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the plain endpoint did not start (exit {proc.poll()})")
        time.sleep(0.1)


def stop(proc) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def load(url: str, bodies: Path, concurrency: int, total: int) -> dict:
    done = subprocess.run([sys.executable, "-c", LOAD, url, str(bodies), str(concurrency),
                           str(total)], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    result = json.loads(done.stdout)
    lat = np.array(result["latencies"]) * 1000
    return {"requests_per_second": total / result["seconds"],
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "answers": {int(k): v for k, v in result["answers"].items()}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    total = 48 if args.quick else REQUESTS
    rounds_of = 1 if args.quick else ROUNDS
    if not args.quick:
        common.wait_until_quiet()
    import onnxruntime as ort
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        paths = {}
        for name, build in (("mlp", mlp), ("cnn", cnn)):
            for kind, count, suffix in PLACEMENTS.values():
                folder = tmp / "models" / (name + suffix)
                (folder / "1").mkdir(parents=True)
                paths[name] = build(folder / "1" / "model.onnx")
                (folder / "config.pbtxt").write_text(
                    CONFIG.replace("KIND", kind, 1).replace("COUNT", str(count), 1))
        rng = np.random.default_rng(0)
        rows, want, bodies = {}, {}, {}
        for name, shape in INPUTS.items():
            rows[name] = rng.standard_normal((64, *shape[1:])).astype(np.float32)
            session = ort.InferenceSession(paths[name], providers=["CPUExecutionProvider"])
            want[name] = session.run(None, {"x": rows[name]})[0]
            bodies[name] = tmp / f"{name}.jsonl"
            bodies[name].write_text("\n".join(json.dumps({"inputs": [{
                "name": "x", "shape": shape, "datatype": "FP32",
                "data": r.ravel().tolist()}]}) for r in rows[name]))
        env = {**os.environ, "DEEPX_DB_URL": f"sqlite:///{tmp / 'serve.db'}"}
        deepx, found = start([sys.executable, "-m", "deepx_flow.cli.main", "serve",
                              "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
                              "--results", str(tmp / "results"), "--model-repository",
                              str(tmp / "models")], r"HTTP on (\S+),", env=env)
        deepx_url = "http://" + found.group(1)
        port = free_port()
        plain = subprocess.Popen([sys.executable, "-c", PLAIN, json.dumps(paths), str(port)])
        wait_listening(port, plain)
        plain_url = f"http://127.0.0.1:{port}"
        measured, rows_out = {}, []
        try:
            for name in INPUTS:
                for concurrency in CONCURRENCY:
                    contenders = [(c, deepx_url, name + suffix)
                                  for c, (_, _, suffix) in PLACEMENTS.items()]
                    rounds: dict = {}
                    for _ in range(rounds_of):  # (the contenders in turn, each round)
                        for contender, url, served in contenders + [("plain", plain_url,
                                                                     name)]:
                            got = load(f"{url}/v2/models/{served}/infer", bodies[name],
                                       concurrency, total)
                            answers = got.pop("answers")
                            assert len(answers) == total, (contender, len(answers))
                            for i, data in answers.items():  # each request its own row's
                                row = want[name][i % len(want[name])]
                                np.testing.assert_allclose(
                                    np.array(data, np.float32).reshape(row.shape), row,
                                    rtol=1e-5, atol=1e-5 * float(np.abs(want[name]).max()))
                            rounds.setdefault(contender, []).append(got)
                    for contender, runs in rounds.items():
                        got = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
                        got["rounds"] = runs
                        measured[f"{name}/{concurrency}/{contender}"] = got
                        rows_out.append([name, concurrency, contender,
                                         common.fmt(got["requests_per_second"], 0),
                                         common.fmt(got["p50_ms"]), common.fmt(got["p99_ms"])])
        finally:
            stop(deepx)
            stop(plain)
    common.print_table(["model", "concurrency", "contender", "requests/s", "p50 ms",
                        "p99 ms"], rows_out, "one-row requests over HTTP, same 2 cores")
    targets = []
    for name in INPUTS:
        for contender in PLACEMENTS:
            ours, theirs = measured[f"{name}/64/{contender}"], measured[f"{name}/64/plain"]
            ratio = ours["requests_per_second"] / theirs["requests_per_second"]
            targets.append(common.target(f"{name}, {contender}: throughput at concurrency 64 "
                                         f"at least 2x the plain endpoint's", ratio,
                                         ratio >= 2.0))
            ours, theirs = measured[f"{name}/1/{contender}"], measured[f"{name}/1/plain"]
            extra = ours["p50_ms"] - theirs["p50_ms"]
            targets.append(common.target(f"{name}, {contender}: p50 latency at concurrency 1 "
                                         f"at most the plain endpoint's + 2 ms", extra,
                                         extra <= 2.0))
    import importlib.util
    http = "httptools" if importlib.util.find_spec("httptools") else "h11"
    common.write_results("bench_serving", {"machine": common.machine_info(),
                                           "http_parser": http,  # (both servers': uvicorn's)
                                           "requests": total, "measured": measured,
                                           "targets": targets, "quick": args.quick},
                         quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
