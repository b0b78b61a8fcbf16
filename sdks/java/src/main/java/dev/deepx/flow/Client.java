package dev.deepx.flow;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/**
 * A client of a deepx_flow gateway ({@code deepx-flow serve}'s HTTP port) over its contract
 * (docs/contract.md): analyze and run graphs, follow operations and runs, define, materialize
 * and read assets, call served models. Tensors travel as the protocol's binary data both ways.
 * The gateway's refusals are {@link DeepxException}s with its kind, message and HTTP status.
 */
public final class Client {
  private static final String HEADER_LENGTH = "Inference-Header-Content-Length";
  // (the Open Inference Protocol's /v2 calls answer {"error"} alone: the kind from the status)
  private static final Map<Integer, String> KIND_OF_STATUS = Map.of(400, "InputError",
      401, "Unauthenticated", 404, "NotFound", 405, "NotFound", 413, "TooLarge",
      500, "ExecutionError");
  // How long one exchange waits for an operation: a run longer than that is asked for again
  // by its id, a slice at a time, so that no exchange outlives its transport's timeout.
  static final Duration POLL = Duration.ofSeconds(60);
  // One exchange's transport timeout: well above POLL (a caller's longer wait extends it).
  private static final Duration EXCHANGE = Duration.ofMinutes(10);
  private static final SecureRandom RANDOM = new SecureRandom();

  private final String url;
  private final String token;
  private final HttpClient http;
  private final Duration poll;

  /** A client of the gateway at {@code url}, with DEEPX_GATEWAY_TOKEN as its bearer token where set. */
  public Client(String url) {
    this(url, System.getenv("DEEPX_GATEWAY_TOKEN"));
  }

  /** A client of the gateway at {@code url} with a bearer {@code token} (null: none). */
  public Client(String url, String token) {
    this(url, token, POLL);
  }

  /** (the tests' own, with a shorter {@code poll} than a run) */
  Client(String url, String token, Duration poll) {
    this.poll = poll;
    this.url = (url == null || url.isEmpty() ? "http://127.0.0.1:8000" : url).replaceAll("/+$", "");
    this.token = token == null || token.isEmpty() ? null : token;
    this.http = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1)
        .connectTimeout(Duration.ofSeconds(30)).build();
  }

  /** What the gateway speaks: protocol version, operator table and its hash, limits. */
  public Map<String, Object> capabilities() {
    return json("GET", "/v1/capabilities", null);
  }

  /**
   * The capabilities, once the gateway is found to speak this SDK's protocol and operator
   * table ({@link Contract}); a RemoteError saying what differs otherwise, as Python's
   * dx.connect says it.
   */
  @SuppressWarnings("unchecked")
  public Map<String, Object> checkServer() {
    Map<String, Object> caps = capabilities();
    if (!Contract.PROTOCOL_VERSION.equals(caps.get("protocol_version"))) {
      throw new DeepxException("RemoteError", url + " speaks "
          + Spelling.shown(caps.get("protocol_version")) + ", this SDK " + Contract.PROTOCOL_VERSION);
    }
    if (!Contract.OPERATOR_TABLE_HASH.equals(caps.get("operator_table_hash"))) {
      Set<String> theirs = new TreeSet<>();
      for (Object o : (List<Object>) caps.getOrDefault("operators", List.of())) {
        theirs.add(String.valueOf(((Map<String, Object>) o).get("name")));
      }
      Set<String> missing = new TreeSet<>(OperatorTable.OPERATORS.keySet());
      missing.removeAll(theirs);
      theirs.removeAll(OperatorTable.OPERATORS.keySet());
      throw new DeepxException("RemoteError", url + " has another operator table than this SDK: "
          + "missing " + (missing.isEmpty() ? "none" : String.join(", ", missing))
          + "; not in this SDK " + (theirs.isEmpty() ? "none" : String.join(", ", theirs))
          + " (upgrade one side)");
    }
    return caps;
  }

  /** The gateway's analysis of {@code graph} (a Graph, or a spec as a Map): shapes, dtypes, plan. */
  public Map<String, Object> analyze(Object graph) {
    return json("POST", "/v1/graphs:analyze", Map.of("graph", specOf(graph)));
  }

  /** Runs {@code graph} on {@code inputs} and waits for its outputs, however long it runs. */
  public Operation execute(Object graph, Map<String, Values> inputs) {
    return execute(graph, inputs, Map.of());
  }

  /**
   * Runs {@code graph} on {@code inputs}; options: fields of graphs:execute ("operation_id":
   * the operation's id, else one made here; "wait_seconds": answer "running" past it, else
   * wait until it ends; "outputs").
   */
  public Operation execute(Object graph, Map<String, Values> inputs, Map<String, ?> options) {
    Map<String, Object> body = new LinkedHashMap<>();
    body.put("graph", specOf(graph));
    body.putAll(waited(options));
    body.put("parameters", Map.of("binary_data_output", true));
    return followed(withTensors("/v1/graphs:execute", body, inputs), options);
  }

  /**
   * Starts running {@code graph} on {@code inputs} and answers at once: the operation,
   * "running" (or ended already); follow it with {@link #operation(String, Duration)}.
   */
  public Operation start(Object graph, Map<String, Values> inputs) {
    return execute(graph, inputs, Map.of("wait_seconds", 0));
  }

  /** An operation as the gateway has it now. */
  public Operation operation(String id) {
    return operation(id, Duration.ZERO);
  }

  /** An operation as the gateway has it once it ends, or after {@code wait}. */
  public Operation operation(String id, Duration wait) {
    String path = "/v1/operations/" + escape(id) + "?binary_data_output=true";
    if (!wait.isZero()) {
      path += "&wait_seconds=" + seconds(wait);
    }
    return operationOf(call("GET", path, null, -1, wait));
  }

  /**
   * Stops a running operation: the operation once it ended (one that ended is unchanged), with
   * no outputs ({@link #operation(String)} has them).
   */
  public Operation cancel(String id) {
    return operationOf(call("POST", "/v1/operations/" + escape(id) + ":cancel", null, -1,
        Duration.ZERO));
  }

  /** The runs the gateway's database records, newest first. */
  public List<Map<String, Object>> runs() {
    return runs(null, 0);
  }

  /** The runs of {@code status} (null: any), newest first, at most {@code limit} (0: the gateway's). */
  @SuppressWarnings("unchecked")
  public List<Map<String, Object>> runs(String status, int limit) {
    List<String> query = new ArrayList<>();
    if (status != null) {
      query.add("status=" + escape(status));
    }
    if (limit > 0) {
      query.add("limit=" + limit);
    }
    String path = "/v1/runs" + (query.isEmpty() ? "" : "?" + String.join("&", query));
    return (List<Map<String, Object>>) json("GET", path, null).get("runs");
  }

  /** One run by id (or a prefix of it): its status, tasks, workers, times, error. */
  public Map<String, Object> run(String id) {
    return json("GET", "/v1/runs/" + escape(id), null);
  }

  /** Defines (or defines again) asset {@code name} computed by {@code graph}'s one output. */
  public Map<String, Object> defineAsset(String name, Object graph) {
    return defineAsset(name, graph, Map.of());
  }

  /**
   * Defines (or defines again) asset {@code name} computed by {@code graph} (each input reads
   * the upstream asset of its name); options: fields of assets:define (dependencies,
   * description, partitions, partition_axis, checks).
   */
  public Map<String, Object> defineAsset(String name, Object graph, Map<String, ?> options) {
    Map<String, Object> body = new LinkedHashMap<>();
    body.put("name", name);
    body.put("graph", specOf(graph));
    body.putAll(options);
    return json("POST", "/v1/assets:define", body);
  }

  /** Every asset defined: name, status, latest version, checks, ... */
  @SuppressWarnings("unchecked")
  public List<Map<String, Object>> assets() {
    return (List<Map<String, Object>>) json("GET", "/v1/assets", null).get("assets");
  }

  /** The stored versions of asset {@code name}, newest first. */
  @SuppressWarnings("unchecked")
  public List<Map<String, Object>> assetVersions(String name) {
    return (List<Map<String, Object>>) json("GET", "/v1/assets/" + escape(name) + "/versions",
        null).get("versions");
  }

  /** Makes a new version of asset {@code name} where it is stale, and waits: the operation. */
  public Operation materialize(String name) {
    return materialize(name, Map.of());
  }

  /**
   * Makes a new version of asset {@code name}; options: partitions, force, upstream,
   * operation_id (else one made here), wait_seconds (answer "running" past it, else wait
   * until it ends). The operation's field "materialized" says what was made and checked.
   */
  public Operation materialize(String name, Map<String, ?> options) {
    Map<String, Object> body = waited(options);
    return followed(operationOf(call("POST", "/v1/assets/" + escape(name) + ":materialize",
        Json.write(body).getBytes(StandardCharsets.UTF_8), -1, waitOf(body))), options);
  }

  /** The newest usable version of asset {@code name}. */
  public Values readAsset(String name) {
    return readAsset(name, Map.of());
  }

  /** A version of asset {@code name}; options: version, partition, slice ([start, stop) per leading axis). */
  public Values readAsset(String name, Map<String, ?> options) {
    Map<String, Object> body = new LinkedHashMap<>(options);
    body.put("parameters", Map.of("binary_data_output", true));
    Operation read = operationOf(call("POST", "/v1/assets/" + escape(name) + ":read",
        Json.write(body).getBytes(StandardCharsets.UTF_8), -1, Duration.ZERO));
    return read.outputs().get(name);
  }

  /** Calls served model {@code model} (the Open Inference Protocol's infer) on {@code inputs}. */
  public Operation infer(String model, Map<String, Values> inputs) {
    Map<String, Object> body = new LinkedHashMap<>();
    body.put("parameters", Map.of("binary_data_output", true));
    return withTensors("/v2/models/" + escape(model) + "/infer", body, inputs);
  }

  // A waiting call's options as sent: its operation's id (the caller's, or one made here, so
  // that a run is asked for again by id, never started twice) and its wait (the caller's, or
  // one slice).
  private Map<String, Object> waited(Map<String, ?> options) {
    Map<String, Object> body = new LinkedHashMap<>(options);
    if (body.get("operation_id") == null) {
      byte[] id = new byte[16];
      RANDOM.nextBytes(id);
      body.put("operation_id", HexFormat.of().formatHex(id));
    }
    if (body.get("wait_seconds") == null) {
      body.put("wait_seconds", seconds(poll));
    }
    return body;
  }

  // The operation once it ended, asked for again a slice at a time while it runs; as it came
  // where the caller chose a wait (start and follow: theirs to ask again).
  private Operation followed(Operation answer, Map<String, ?> options) {
    if (options.get("wait_seconds") != null) {
      return answer;
    }
    while ("running".equals(answer.state())) {
      answer = operation(answer.id(), poll);
    }
    return answer;
  }

  // A duration as the contract's seconds: an integer where it is whole.
  private static Number seconds(Duration d) {
    long ms = d.toMillis();
    if (ms % 1000 == 0) {
      return ms / 1000;
    }
    return ms / 1000.0;
  }

  // The wait a request's body asks for (the gateway refuses a negative one, or past a day).
  private static Duration waitOf(Map<String, Object> body) {
    if (body.get("wait_seconds") instanceof Number n) {
      return Duration.ofMillis(Math.round(Math.max(0, Math.min(n.doubleValue(), 86400)) * 1000));
    }
    return Duration.ZERO;
  }

  private static Object specOf(Object graph) {
    return graph instanceof Graph ? ((Graph) graph).toSpec() : graph;
  }

  private static String escape(String part) {
    return URLEncoder.encode(part, StandardCharsets.UTF_8).replace("+", "%20");
  }

  private Operation withTensors(String path, Map<String, Object> body, Map<String, Values> inputs) {
    List<Map<String, Object>> listed = new ArrayList<>();
    ByteArrayOutputStream raw = new ByteArrayOutputStream();
    for (Map.Entry<String, Values> e : inputs.entrySet()) {
      Values v = e.getValue();
      byte[] bytes = v.toBytes();
      Map<String, Object> entry = new LinkedHashMap<>();
      entry.put("name", e.getKey());
      entry.put("datatype", Values.WIRE.get(v.dtype()));
      entry.put("shape", v.shape());
      entry.put("parameters", Map.of("binary_data_size", bytes.length));
      listed.add(entry);
      raw.writeBytes(bytes);
    }
    body.put("inputs", listed);
    byte[] head = Json.write(body).getBytes(StandardCharsets.UTF_8);
    ByteArrayOutputStream all = new ByteArrayOutputStream(head.length + raw.size());
    all.writeBytes(head);
    all.writeBytes(raw.toByteArray());
    return operationOf(call("POST", path, all.toByteArray(), head.length, waitOf(body)));
  }

  @SuppressWarnings("unchecked")
  private Map<String, Object> json(String method, String path, Object body) {
    byte[] text = body == null ? null : Json.write(body).getBytes(StandardCharsets.UTF_8);
    Answer answer = call(method, path, text, -1, Duration.ZERO);
    return (Map<String, Object>) parse(answer.body, 0, answer.body.length);
  }

  private record Answer(byte[] body, int headLength) {}

  // One exchange; wait: how long the gateway may hold it (a caller's wait past the
  // transport's timeout extends it).
  private Answer call(String method, String path, byte[] body, int jsonLength, Duration wait) {
    Duration timeout = wait.plus(POLL).compareTo(EXCHANGE) > 0 ? wait.plus(POLL) : EXCHANGE;
    HttpRequest.Builder request = HttpRequest.newBuilder(URI.create(url + path))
        .timeout(timeout)
        .method(method, body == null ? HttpRequest.BodyPublishers.noBody()
            : HttpRequest.BodyPublishers.ofByteArray(body));
    request.header("Content-Type", jsonLength >= 0 ? "application/octet-stream" : "application/json");
    if (jsonLength >= 0) {
      request.header(HEADER_LENGTH, Integer.toString(jsonLength));
    }
    if (token != null) {
      request.header("Authorization", "Bearer " + token);
    }
    HttpResponse<byte[]> answer;
    try {
      answer = http.send(request.build(), HttpResponse.BodyHandlers.ofByteArray());
    } catch (IOException e) {
      String why = e.getMessage() != null ? e.getMessage() : e.getClass().getSimpleName();
      throw new DeepxException("RemoteError", "cannot reach the gateway at " + url + ": " + why);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new DeepxException("RemoteError", "interrupted while calling the gateway at " + url);
    }
    byte[] data = answer.body();
    if (answer.statusCode() >= 400) {
      String message = new String(data, StandardCharsets.UTF_8);
      String kind = KIND_OF_STATUS.getOrDefault(answer.statusCode(), "RemoteError");
      try {
        if (Json.parse(message) instanceof Map<?, ?> said && said.get("error") instanceof String e) {
          message = e;
          if (said.get("kind") instanceof String k) {
            kind = k;
          }
        }
      } catch (DeepxException notJson) {
        // (not JSON: said as it came)
      }
      throw new DeepxException(kind, message, answer.statusCode(), null);
    }
    int length = -1;
    String said = answer.headers().firstValue(HEADER_LENGTH).orElse(null);
    if (said != null) {
      try {
        length = Integer.parseInt(said.trim());
      } catch (NumberFormatException e) {
        length = Integer.MAX_VALUE;
      }
      if (length < 0 || length > data.length) {
        throw new DeepxException("RemoteError", "the gateway sent a bad " + HEADER_LENGTH);
      }
    }
    return new Answer(data, length);
  }

  private static Object parse(byte[] data, int from, int to) {
    String text = new String(data, from, to - from, StandardCharsets.UTF_8);
    try {
      return Json.parse(text);
    } catch (DeepxException e) {
      throw new DeepxException("RemoteError", "the gateway's answer is " + e.getMessage());
    }
  }

  @SuppressWarnings("unchecked")
  private static Operation operationOf(Answer answer) {
    byte[] data = answer.body;
    int at = answer.headLength >= 0 ? answer.headLength : data.length;
    Map<String, Object> fields = (Map<String, Object>) parse(data, 0, at);
    Map<String, Values> outputs = new LinkedHashMap<>();
    if (fields.get("outputs") instanceof List<?> listed) {
      for (Object item : listed) {
        Map<String, Object> entry = (Map<String, Object>) item;
        String name = (String) entry.get("name");
        List<Object> extents = (List<Object>) entry.get("shape");
        int[] shape = new int[extents.size()];
        for (int i = 0; i < shape.length; i++) {
          shape[i] = ((Number) extents.get(i)).intValue();
        }
        String dtype = null;
        for (Map.Entry<String, String> w : Values.WIRE.entrySet()) {
          if (w.getValue().equals(entry.get("datatype"))) {
            dtype = w.getKey();
          }
        }
        if (dtype == null) {
          throw new DeepxException("RemoteError", "the gateway sent datatype "
              + Spelling.shown(entry.get("datatype")));
        }
        Object size = entry.get("parameters") instanceof Map<?, ?> p ? p.get("binary_data_size") : null;
        if (!(size instanceof Number) || at + ((Number) size).longValue() > data.length) {
          throw new DeepxException("RemoteError", "output " + Spelling.shown(name)
              + " came without its binary data");
        }
        int n = ((Number) size).intValue();
        outputs.put(name, Values.fromBytes(dtype, shape, data, at, n));
        at += n;
      }
    }
    return new Operation((String) fields.get("operation"), (String) fields.get("state"),
        (String) fields.get("run_id"), fields.get("error") == null ? null
        : String.valueOf(fields.get("error")), outputs, fields);
  }
}
