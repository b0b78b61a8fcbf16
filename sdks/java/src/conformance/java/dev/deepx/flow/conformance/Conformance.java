package dev.deepx.flow.conformance;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.google.gson.JsonPrimitive;
import dev.deepx.flow.Client;
import dev.deepx.flow.DeepxException;
import dev.deepx.flow.Graph;
import dev.deepx.flow.Json;
import dev.deepx.flow.Operation;
import dev.deepx.flow.Tensor;
import dev.deepx.flow.Values;
import java.io.IOException;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.stream.Stream;

/**
 * The conformance suite's runner for Java (sdks/conformance/run.sh calls it through
 * conformance.sh): each case is built through the SDK's public API (its steps, by method name)
 * and must give the stored graph spec; then it runs on the gateway at DEEPX_URL and must give
 * the stored outputs. Prints each failure and one line: {@code java http: N passed, N failed}.
 *
 * Each scenario's calls are made in order (make_scenarios.py says what each must give).
 *
 * <pre>java -cp ... dev.deepx.flow.conformance.Conformance FOLDER...   (of cases and scenarios)</pre>
 */
public final class Conformance {
  private Conformance() {}

  /** A case that does not hold, with what differs. */
  static final class Failed extends Exception {
    private static final long serialVersionUID = 1L;

    Failed(String message) {
      super(message);
    }
  }

  // (names this runner's assets, on a gateway others use too)
  static final String PREFIX = "java_http_";

  public static void main(String[] args) throws IOException {
    List<Path> files = new ArrayList<>();
    for (String folder : args) { // (of cases, and of scenarios)
      try (Stream<Path> listed = Files.list(Path.of(folder))) {
        files.addAll(listed.filter(p -> p.toString().endsWith(".json")).sorted().toList());
      }
    }
    Client client = new Client(System.getenv("DEEPX_URL"));
    int passed = 0;
    int failed = 0;
    for (Path file : files) {
      try {
        String text = Files.readString(file).replace("{prefix}", PREFIX);
        JsonObject c = JsonParser.parseString(text).getAsJsonObject();
        if (c.has("scenario")) {
          Scenario.run(c, client);
        } else {
          run(c, client);
        }
        passed++;
      } catch (Failed | RuntimeException e) {
        failed++;
        System.out.println("FAILED " + file.getFileName() + ": " + e.getMessage());
      }
    }
    System.out.println("java http: " + passed + " passed, " + failed + " failed");
    System.exit(failed > 0 ? 1 : 0);
  }

  // Whether g's spec is the stored one: compared as JSON trees, numbers as written (an int
  // is not 2.0).
  static void sameSpec(Graph g, JsonElement stored) throws Failed {
    String made = g.toJson();
    if (!canonical(JsonParser.parseString(made)).equals(canonical(stored))) {
      throw new Failed("the graph the steps build: " + made);
    }
  }

  static void run(JsonObject c, Client client) throws Failed {
    JsonObject error = c.has("error") ? c.getAsJsonObject("error") : null;
    Graph g;
    try {
      g = built(c);
    } catch (DeepxException e) {
      if (error != null && error.get("at").getAsString().equals("build")) {
        refused(e, error);
        return;
      }
      throw e;
    }
    if (error != null && error.get("at").getAsString().equals("build")) {
      throw new Failed("not refused as it was built: " + g.toJson());
    }
    sameSpec(g, c.get("spec"));
    Map<String, Values> inputs = new HashMap<>();
    for (Map.Entry<String, JsonElement> e : c.getAsJsonObject("inputs").entrySet()) {
      inputs.put(e.getKey(), values(e.getValue().getAsJsonObject()));
    }
    Operation done;
    try {
      done = client.execute(g, inputs);
    } catch (DeepxException e) {
      if (error != null) {
        refused(e, error);
        return;
      }
      throw e;
    }
    if (error != null) {
      throw new Failed("not refused as " + error.get("kind").getAsString() + ": " + done.state());
    }
    if (!"succeeded".equals(done.state())) {
      throw new Failed(done.state() + ": " + done.error());
    }
    double rtol = c.get("rtol").getAsDouble();
    double atol = c.get("atol").getAsDouble();
    for (Map.Entry<String, JsonElement> e : c.getAsJsonObject("expected").entrySet()) {
      compare(done.outputs().get(e.getKey()), values(e.getValue().getAsJsonObject()), rtol, atol,
          e.getKey());
    }
  }

  // The case's graph, made by calling the method named by each step.
  static Graph built(JsonObject c) {
    Graph g = new Graph();
    Map<String, Tensor> tensors = new HashMap<>();
    for (JsonElement item : c.getAsJsonArray("steps")) {
      JsonObject step = item.getAsJsonObject();
      if (step.has("input")) {
        String name = step.get("input").getAsString();
        tensors.put(name, g.input(name, ints(step.getAsJsonArray("shape")),
            step.get("dtype").getAsString()));
        continue;
      }
      String op = step.get("op").getAsString();
      List<Object> operands = new ArrayList<>();
      for (JsonElement a : step.getAsJsonArray("args")) {
        operands.add(a.isJsonPrimitive() && a.getAsJsonPrimitive().isString()
            ? tensors.get(a.getAsString()) : Json.plain(a));
      }
      Map<String, Object> options = new LinkedHashMap<>();
      for (Map.Entry<String, JsonElement> a : step.getAsJsonObject("attrs").entrySet()) {
        options.put(a.getKey(), Json.plain(a.getValue()));
      }
      options.put("id", step.get("id").getAsString());
      if (step.has("shape")) {
        options.put("shape", ints(step.getAsJsonArray("shape")));
      }
      if (step.has("dtype")) {
        options.put("dtype", step.get("dtype").getAsString());
      }
      tensors.put(step.get("id").getAsString(), call(g, op, operands, options));
    }
    for (JsonElement o : c.getAsJsonArray("outputs")) {
      JsonArray pair = o.getAsJsonArray();
      g.output(tensors.get(pair.get(1).getAsString()), pair.get(0).getAsString());
    }
    return g;
  }

  // The operator's own method (by its camelCase name); the generic op for a name the table
  // lacks or more operands than its methods take (a mistake Java's types keep out of them).
  static Tensor call(Graph g, String op, List<Object> operands, Map<String, Object> options) {
    StringBuilder name = new StringBuilder();
    for (String part : op.split("_")) {
      name.append(name.length() == 0 ? part
          : part.isEmpty() ? "" : Character.toUpperCase(part.charAt(0)) + part.substring(1));
    }
    Method method = null;
    Object[] args = null;
    try {
      method = Graph.class.getMethod(name.toString(), List.class, Map.class);
      args = new Object[] {operands, options}; // (a list of operands: concat)
    } catch (NoSuchMethodException variadic) {
      Class<?>[] types = new Class<?>[operands.size() + 1];
      Arrays.fill(types, Object.class);
      types[operands.size()] = Map.class;
      try {
        method = Graph.class.getMethod(name.toString(), types);
        args = operands.toArray(new Object[operands.size() + 1]);
        args[operands.size()] = options;
      } catch (NoSuchMethodException none) {
        return g.op(op, operands, options);
      }
    }
    try {
      return (Tensor) method.invoke(g, args);
    } catch (InvocationTargetException e) {
      throw (RuntimeException) e.getCause();
    } catch (IllegalAccessException e) {
      throw new IllegalStateException(e);
    }
  }

  static int[] ints(JsonArray items) {
    int[] out = new int[items.size()];
    for (int i = 0; i < out.length; i++) {
      out[i] = items.get(i).getAsInt();
    }
    return out;
  }

  static void refused(DeepxException e, JsonObject want) throws Failed {
    String kind = want.get("kind").getAsString();
    if (!e.kind().equals(kind)) {
      throw new Failed("the kind: " + e.kind() + ", not " + kind + " (" + e.getMessage() + ")");
    }
    if (want.has("message") && !e.getMessage().equals(want.get("message").getAsString())) {
      throw new Failed("the message: \"" + e.getMessage() + "\", not \""
          + want.get("message").getAsString() + "\"");
    }
    if (want.has("contains") && !e.getMessage().contains(want.get("contains").getAsString())) {
      throw new Failed("the message: \"" + e.getMessage() + "\" has no \""
          + want.get("contains").getAsString() + "\"");
    }
  }

  // A JSON tree as one text: keys sorted, an integer as its digits, any other number as the
  // double it is ("f:" first: 2.0 is not 2, 1e-05 is 1.0E-5).
  static String canonical(JsonElement e) {
    if (e.isJsonObject()) {
      Map<String, String> sorted = new TreeMap<>();
      for (Map.Entry<String, JsonElement> item : e.getAsJsonObject().entrySet()) {
        sorted.put(item.getKey(), canonical(item.getValue()));
      }
      return "{" + sorted + "}";
    }
    if (e.isJsonArray()) {
      List<String> items = new ArrayList<>();
      for (JsonElement item : e.getAsJsonArray()) {
        items.add(canonical(item));
      }
      return items.toString();
    }
    if (e.isJsonPrimitive() && e.getAsJsonPrimitive().isNumber()) {
      Number n = Json.number(e.getAsString());
      return n instanceof Double ? "f:" + n : n.toString();
    }
    return e.toString();
  }

  static double number(JsonElement v) {
    JsonPrimitive p = v.getAsJsonPrimitive();
    if (p.isBoolean()) {
      return p.getAsBoolean() ? 1 : 0;
    }
    return switch (p.getAsString()) {
      case "NaN" -> Double.NaN;
      case "Infinity" -> Double.POSITIVE_INFINITY;
      case "-Infinity" -> Double.NEGATIVE_INFINITY;
      default -> Double.parseDouble(p.getAsString());
    };
  }

  // A case's tensor as Values (int64 and uint64 as decimal strings; float16 and bfloat16 as
  // their 16-bit patterns).
  static Values values(JsonObject t) {
    String dtype = t.get("dtype").getAsString();
    int[] shape = ints(t.getAsJsonArray("shape"));
    JsonArray data = t.getAsJsonArray("data");
    if (t.has("pattern")) { // (value i is (i mod modulo) * scale: too large to store)
      int modulo = t.getAsJsonObject("pattern").get("modulo").getAsInt();
      double scale = t.getAsJsonObject("pattern").get("scale").getAsDouble();
      data = new JsonArray();
      for (int i = 0; i < Arrays.stream(shape).reduce(1, (a, b) -> a * b); i++) {
        data.add((i % modulo) * scale);
      }
    }
    int n = data.size();
    Object out = switch (dtype) {
      case "bool" -> new boolean[n];
      case "int8" -> new byte[n];
      case "int16", "uint8", "float16", "bfloat16" -> new short[n];
      case "int32", "uint16" -> new int[n];
      case "int64", "uint32", "uint64" -> new long[n];
      case "float32" -> new float[n];
      default -> new double[n];
    };
    for (int i = 0; i < n; i++) {
      JsonElement v = data.get(i);
      switch (dtype) {
        case "bool" -> ((boolean[]) out)[i] = v.getAsBoolean();
        case "int8" -> ((byte[]) out)[i] = (byte) number(v);
        case "int16", "uint8", "float16", "bfloat16" -> ((short[]) out)[i] = (short) (int) number(v);
        case "int32", "uint16" -> ((int[]) out)[i] = (int) number(v);
        case "int64" -> ((long[]) out)[i] = Long.parseLong(v.getAsString());
        case "uint64" -> ((long[]) out)[i] = Long.parseUnsignedLong(v.getAsString());
        case "uint32" -> ((long[]) out)[i] = (long) number(v);
        case "float32" -> ((float[]) out)[i] = v.getAsString().matches("-?[0-9.eE+-]+")
            ? Float.parseFloat(v.getAsString()) : (float) number(v);
        default -> ((double[]) out)[i] = number(v);
      }
    }
    return new Values(dtype, shape, out);
  }

  // Each value as a double: exactly for every dtype but int64 and uint64 (compared as longs).
  static double[] flat(Values v) {
    Object data = v.dtype().equals("float16") || v.dtype().equals("bfloat16") ? v.toFloat32()
        : v.data();
    double[] out = new double[java.lang.reflect.Array.getLength(data)];
    for (int i = 0; i < out.length; i++) {
      Object x = java.lang.reflect.Array.get(data, i);
      out[i] = x instanceof Boolean ? ((Boolean) x ? 1 : 0) : ((Number) x).doubleValue();
    }
    return out;
  }

  static void compare(Values got, Values want, double rtol, double atol, String name)
      throws Failed {
    if (got == null) {
      throw new Failed(name + ": not among the outputs");
    }
    if (!got.dtype().equals(want.dtype()) || !Arrays.equals(got.shape(), want.shape())) {
      throw new Failed(name + ": " + got.dtype() + Arrays.toString(got.shape()) + ", not "
          + want.dtype() + Arrays.toString(want.shape()));
    }
    boolean exact = rtol == 0 && atol == 0;
    if (want.dtype().endsWith("int64") || exact && !want.dtype().startsWith("float")) {
      if (!got.toString().equals(want.toString())) { // (the same values, bit for bit)
        throw new Failed(name + ": " + got + ", not " + want);
      }
      return;
    }
    double[] a = flat(got);
    double[] b = flat(want);
    for (int i = 0; i < b.length; i++) {
      boolean same = exact // (-0 is not 0, and NaN is NaN)
          ? Double.doubleToLongBits(a[i]) == Double.doubleToLongBits(b[i])
          : Double.isNaN(a[i]) && Double.isNaN(b[i]) || a[i] == b[i]
              || Math.abs(a[i] - b[i]) <= atol + rtol * Math.abs(b[i]);
      if (!same) {
        throw new Failed(name + "[" + i + "]: " + a[i] + ", not " + b[i]);
      }
    }
  }
}
