"""`dx.connect(url)`: a client of a gateway, so that a notebook uses a remote deployment as it
would use `dx.run`; the reference client for the SDKs' conformance suite.

It speaks the HTTP mirror with binary tensors (`docs/contract.md`), through the standard
library alone. `connect` compares the server's protocol version and operator table with its
own first: a server without an operator this SDK offers is said at once, not when a call
fails.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
import uuid

import numpy as np

from deepx_flow.contract import tensors
from deepx_flow.errors import DeepxError, InputError, shown

HEADER_LENGTH = tensors.BINARY_HEADER
POLL_SECONDS = 60.0  # how long one call waits for an operation; the HTTP timeout is longer


class RemoteError(DeepxError):
    """The gateway refused a call or could not be reached: its message, as it said it, and
    its kind (the gateway's error class: GraphError, NotFound, ...), where it said one."""

    def __init__(self, message: str, status: int | None = None, kind: str | None = None):
        super().__init__(message)
        self.status, self.kind = status, kind
        self.exit_code = 2 if status is not None and 400 <= status < 500 else 1


class Remote:
    """A gateway at `url` (http:// or https://), called with `token` (a bearer token) when
    given. `timeout` bounds each HTTP exchange, in seconds (a run may take longer: `run`
    asks for it again by id)."""

    def __init__(self, url: str, token: str | None = None,
                 timeout: float = POLL_SECONDS + 60.0):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InputError(f"url is {shown(url)}, not an http:// or https:// address of a "
                             f"gateway (deepx-flow serve)")
        self.url, self.token, self.timeout = url.rstrip("/"), token, timeout

    def __repr__(self) -> str:
        return f"Remote({self.url!r})"

    # -- calls ----------------------------------------------------------------------------------

    def capabilities(self) -> dict:
        return self._json("GET", "/v1/capabilities")

    def runs(self, status: str | None = None, limit: int = 20) -> list[dict]:
        query = f"?limit={int(limit)}" + (f"&status={status}" if status else "")
        return self._json("GET", "/v1/runs" + query)["runs"]

    def run(self, outputs, inputs: dict | None = None):
        """Compute `outputs` (a Tensor, a list or dict of them, or a Graph) on the gateway's
        cluster, as `dx.run` computes them here: NumPy arrays, in the same structure."""
        graph, answer = self._started(outputs, inputs, POLL_SECONDS)
        return _shaped(outputs, graph, self.finished(answer["operation"], answer)["outputs"])

    def persist(self, outputs, inputs: dict | None = None):
        """Start computing `outputs` on the gateway's cluster and return at once, as
        `dx.persist` does: a RemoteResult per output (in the same structure), whose
        `to_numpy()` waits for the run and reads that output. The results stay on the
        gateway, found by the operation's id, also from another process."""
        graph, answer = self._started(outputs, inputs, 0.0)
        handles = {name: RemoteResult(self, answer["operation"], name, graph[node_id].shape,
                                      graph[node_id].dtype)
                   for name, node_id in graph.outputs}
        return _shaped(outputs, graph, handles)

    def _started(self, outputs, inputs, wait_seconds: float):
        from deepx_flow.runtime.inputs import Binding
        from deepx_flow.sdk.bindings import carried_array, with_bound_inputs
        from deepx_flow.sdk.build import build_graph
        from deepx_flow.spec.writer import graph_to_document
        graph = build_graph(outputs)
        arrays = {}
        for name, value in with_bound_inputs(outputs, inputs).items():
            value = carried_array(value) if isinstance(value, Binding) else value
            if not isinstance(value, np.ndarray):
                raise InputError(f"input {shown(name)}: a remote run takes NumPy arrays, not "
                                 f"{type(value).__name__}")
            arrays[name] = value
        # Its own operation id, and waits of a minute at a time: a run longer than any one
        # HTTP exchange is asked for again by id until it ends, never started twice.
        operation_id = uuid.uuid4().hex
        answer = self.execute(graph_to_document(graph), arrays, wait_seconds, operation_id)
        if answer["state"] == "failed":
            _raise_for(answer)
        return graph, answer

    def finished(self, operation_id: str, answer: dict | None = None) -> dict:
        """The operation once it ended (asked for a minute at a time, unless `answer`, the
        last one had, says it ended); a RemoteError with its error unless it succeeded."""
        answer = answer or self.operation(operation_id, POLL_SECONDS)
        while answer["state"] == "running":
            answer = self.operation(operation_id, POLL_SECONDS)
        if answer["state"] != "succeeded":
            _raise_for(answer)
        return answer

    # -- assets -----------------------------------------------------------------------------

    def assets(self) -> list[dict]:
        """The gateway's assets, in dependency order, with their status."""
        return self._json("GET", "/v1/assets")["assets"]

    def versions(self, name: str) -> list[dict]:
        """The stored versions of asset `name`, newest first."""
        return self._json("GET", f"/v1/assets/{_quoted(name)}/versions")["versions"]

    def define(self, name: str, graph, dependencies=(), description: str = "",
               partitions=(), partition_axis: int | None = None, checks=()) -> dict:
        """Define an asset on the gateway: `graph` (a Tensor built here, a dx.Graph with one
        output, or a spec as a dict) computes it, and each of its inputs reads the upstream
        asset of that name. Checks in the contract's form (docs/contract.md), e.g.
        `{"kind": "in_range", "low": 0}`. The asset as `assets()` lists it."""
        body = {"name": name, "graph": _spec(graph), "dependencies": list(dependencies),
                "description": description, "partitions": list(partitions),
                "checks": list(checks)}
        if partition_axis is not None:
            body["partition_axis"] = partition_axis
        return self._json("POST", "/v1/assets:define", body)

    def materialize(self, name: str, partitions=None, force: bool = False,
                    upstream: bool = False) -> dict:
        """Materialize asset `name` on the gateway (only what is stale unless `force`; with
        `upstream`, what it depends on too) and wait for it: what was made (versions by
        target, runs, checks, what was skipped and why); a RemoteError saying why otherwise
        (a failed blocking check, an upstream never made)."""
        operation_id = uuid.uuid4().hex
        body = {"force": force, "upstream": upstream, "wait_seconds": POLL_SECONDS,
                "operation_id": operation_id}
        if partitions:
            body["partitions"] = list(partitions)
        answer = self._json("POST", f"/v1/assets/{_quoted(name)}:materialize", body)
        return self.finished(operation_id, answer)["materialized"]

    def load(self, name: str, version: str | None = None, partition: str | None = None,
             slice=None) -> np.ndarray:
        """A stored version of asset `name` (the newest usable one, or `version`; one
        `partition`) or its `slice` ([start, stop) per leading axis), as NumPy."""
        body = {"parameters": {"binary_data_output": True}}
        for key, value in (("version", version), ("partition", partition), ("slice", slice)):
            if value is not None:
                body[key] = value
        head = json.dumps(body, allow_nan=False).encode()
        answer = self._operation(self._call("POST", f"/v1/assets/{_quoted(name)}:read", head))
        return answer["outputs"][name]

    def execute(self, spec: dict, inputs: dict, wait_seconds: float | None = None,
                operation_id: str | None = None) -> dict:
        """`graphs:execute`: the operation, with its outputs as arrays once it succeeded."""
        listed, parts = [], []
        for name, array in inputs.items():
            raw = tensors.to_raw(array)
            listed.append({"name": name, "datatype": tensors.datatype_of(array.dtype),
                           "shape": list(array.shape),
                           "parameters": {"binary_data_size": len(raw)}})
            parts.append(raw)
        body = {"graph": spec, "inputs": listed, "parameters": {"binary_data_output": True}}
        if wait_seconds is not None:
            body["wait_seconds"] = wait_seconds
        if operation_id is not None:
            body["operation_id"] = operation_id
        head = json.dumps(body, allow_nan=False).encode()
        return self._operation(self._call("POST", "/v1/graphs:execute",
                                          b"".join([head, *parts]), len(head)))

    def operation(self, operation_id: str, wait_seconds: float | None = 0.0) -> dict:
        query = "?binary_data_output=true" + \
            ("" if wait_seconds is None else f"&wait_seconds={float(wait_seconds)}")
        return self._operation(self._call("GET", f"/v1/operations/{operation_id}{query}"))

    def cancel(self, operation_id: str) -> dict:
        return self._operation(self._call("POST", f"/v1/operations/{operation_id}:cancel"))

    # -- the wire --------------------------------------------------------------------------------

    def _json(self, method: str, path: str, body: dict | None = None) -> dict:
        data, _ = self._call(method, path, None if body is None else
                             json.dumps(body, allow_nan=False).encode())
        return json.loads(data)

    def _call(self, method: str, path: str, body: bytes | None = None,
              header_length: int | None = None) -> tuple[bytes, int | None]:
        headers = {"Content-Type": "application/octet-stream" if header_length is not None
                   else "application/json"}
        if header_length is not None:
            headers[HEADER_LENGTH] = str(header_length)
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url + path, data=body, method=method,
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                length = answer.headers.get(HEADER_LENGTH)
                return answer.read(), None if length is None else int(length)
        except urllib.error.HTTPError as err:
            text = err.read().decode(errors="replace")
            kind = None
            try:
                said = json.loads(text)
                message, kind = said["error"], said.get("kind")
            except (ValueError, KeyError, TypeError, AttributeError):
                message = text or err.reason
            raise RemoteError(f"{self.url}: {message}", err.code, kind) from None
        except (urllib.error.URLError, OSError) as err:
            raise RemoteError(f"cannot reach the gateway at {self.url}: "
                              f"{getattr(err, 'reason', err)}") from None

    @staticmethod
    def _operation(answer: tuple[bytes, int | None]) -> dict:
        data, length = answer
        head = json.loads(data[:length] if length is not None else data)
        if "outputs" in head:
            head["outputs"] = tensors.from_json_list(
                head["outputs"], data[length:] if length is not None else b"", "outputs")
        return head


class RemoteResult:
    """One output of a `Remote.persist`: its name, shape and dtype now, its values once the
    gateway's run ends (`to_numpy`)."""

    def __init__(self, remote: Remote, operation_id: str, name: str, shape, dtype):
        self.remote, self.operation_id, self.name = remote, operation_id, name
        self.shape, self.dtype = tuple(shape), dtype

    def __repr__(self) -> str:
        return f"RemoteResult({self.name!r}, {self.dtype}{list(self.shape)}, operation " \
               f"{self.operation_id})"

    def wait(self) -> "RemoteResult":
        self.remote.finished(self.operation_id)
        return self

    def to_numpy(self) -> np.ndarray:
        return self.remote.finished(self.operation_id)["outputs"][self.name]


def _raise_for(answer: dict):
    raise RemoteError(f"operation {answer['operation']} {answer['state']}: "
                      f"{answer.get('error', '')}")


def _shaped(outputs, graph, results: dict):
    """`results` (by output name) in the structure `outputs` was given in."""
    from deepx_flow.sdk.tensor import Tensor
    if isinstance(outputs, Tensor):
        return results[graph.outputs[0][0]]
    if isinstance(outputs, dict) or not isinstance(outputs, (list, tuple)):
        return results
    return [results[name] for name, _ in graph.outputs]


def _spec(graph) -> dict:
    """A graph to send: a spec dict as given; a Tensor or a dx.Graph as its spec."""
    from deepx_flow.ir import Graph
    from deepx_flow.sdk.build import build_graph
    from deepx_flow.sdk.tensor import Tensor
    from deepx_flow.spec.writer import graph_to_document
    if isinstance(graph, dict):
        return graph
    if isinstance(graph, (Tensor, Graph)):
        return graph_to_document(build_graph(graph))
    raise InputError(f"graph is {shown(graph)}, not a Tensor, a dx.Graph or a spec dict")


def _quoted(name) -> str:
    if not isinstance(name, str):
        raise InputError(f"asset name {shown(name)} is not text")
    return urllib.parse.quote(name, safe="")


def connect(url: str, token: str | None = None, timeout: float = POLL_SECONDS + 60.0) -> Remote:
    """A client of the gateway at `url`, once its protocol version and operator table are
    found to be this deepx_flow's (a RemoteError saying what differs, otherwise)."""
    from deepx_flow.gateway.capabilities import PROTOCOL_VERSION, operator_table, table_hash
    remote = Remote(url, token, timeout)
    caps = remote.capabilities()
    if caps.get("protocol_version") != PROTOCOL_VERSION:
        raise RemoteError(f"{url} speaks {shown(caps.get('protocol_version'))}, this "
                          f"deepx_flow {PROTOCOL_VERSION}")
    ours = operator_table()
    if caps.get("operator_table_hash") != table_hash(ours):
        theirs = {o["name"] for o in caps.get("operators", [])}
        missing = sorted({o["name"] for o in ours} - theirs)
        differ = sorted(o["name"] for o in ours if o["name"] in theirs
                        and o not in caps.get("operators", []))
        raise RemoteError(f"{url} has another operator table than this deepx_flow: "
                          f"missing {', '.join(missing) or 'none'}; different "
                          f"{', '.join(differ) or 'none'} (upgrade one side)")
    return remote
