package dev.deepx.flow;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;

/**
 * A graph being built: its inputs, its nodes in the order they were made, and its outputs.
 * Every operator of the table is a method (GraphOperators, generated), checked as it is called
 * (name, number of inputs, attributes): a mistake throws a {@link DeepxException} at once, with
 * Python's message. Node ids are the ids given ({@code "id"} in the options) or
 * {@code <op>_<n>} in the order the nodes were made; attributes are those given; literals stay
 * numbers. {@link #toSpec()} is the graph spec (docs/graph-spec.md) the gateway reads.
 */
public final class Graph extends GraphOperators {
  /** The dtypes a graph may use. */
  public static final List<String> DTYPES = List.of("bool", "int8", "int16", "int32", "int64",
      "uint8", "uint16", "uint32", "uint64", "float16", "bfloat16", "float32", "float64");

  private final Map<String, Map<String, Object>> inputs = new LinkedHashMap<>();
  private final List<Map<String, Object>> nodes = new ArrayList<>();
  private final List<String[]> outputs = new ArrayList<>(); // [name, id]
  private final Set<String> ids = new HashSet<>();

  /** A named float32 input of {@code shape}. */
  public Tensor input(String name, int... shape) {
    return input(name, shape, "float32");
  }

  /** A named input of {@code shape} and {@code dtype} (see {@link #DTYPES}). */
  public Tensor input(String name, int[] shape, String dtype) {
    if (name == null || name.isEmpty()) {
      throw new DeepxException("GraphError", "an input's name must be a non-empty string, not "
          + Spelling.shown(name));
    }
    List<Integer> checked = shapeOf(shape, name);
    if (!DTYPES.contains(dtype)) {
      throw DeepxException.graph(name, "unknown dtype " + Spelling.shown(dtype)
          + Spelling.didYouMean(String.valueOf(dtype), DTYPES));
    }
    claim(name);
    Map<String, Object> entry = new LinkedHashMap<>();
    entry.put("shape", checked);
    entry.put("dtype", dtype);
    inputs.put(name, entry);
    return new Tensor(this, name, "input");
  }

  /**
   * Any operator by name: {@code inputs} are tensors of this graph or Number and Boolean
   * literals (a null for an optional input left out, at the end only); {@code options} its
   * attributes, and "id", "shape" and "dtype" (what a node that states them states). Every
   * operator of the table also has a method of its own.
   */
  @Override
  public Tensor op(String name, List<?> inputs, Map<String, ?> options) {
    Map<String, Object> given = new TreeMap<>(); // (the first unknown one named, whatever the order)
    if (options != null) {
      given.putAll(options);
    }
    String id = autoId(name);
    if (given.containsKey("id")) {
      Object v = given.remove("id");
      if (!(v instanceof String) || ((String) v).isEmpty()) {
        throw DeepxException.graph(id, "an id is a non-empty string, not " + Spelling.shown(v));
      }
      id = (String) v;
    }
    OperatorTable.Operator entry = name == null ? null : OperatorTable.OPERATORS.get(name);
    if (entry == null || name.equals("input")) {
      Set<String> names = new TreeSet<>(OperatorTable.OPERATORS.keySet());
      names.remove("input");
      throw DeepxException.graph(id, "unknown operator " + Spelling.shown(name)
          + Spelling.didYouMean(name == null ? "None" : name, names)
          + " (see docs/graph-spec.md or `deepx-flow ops` for the list)");
    }
    List<?> operands = inputs == null ? List.of() : inputs;
    checkInputs(entry, operands, id);
    Map<String, Object> node = new LinkedHashMap<>();
    node.put("id", id);
    node.put("op", name);
    // (a node may state its shape or dtype: the gateway checks it against its rule)
    Object shape = given.remove("shape");
    Object dtype = given.remove("dtype");
    for (OperatorTable.Attr state : entry.states()) {
      boolean stated = state.name().equals("shape") ? shape != null : dtype != null;
      if (state.required() && !stated) {
        throw DeepxException.graph(id, name + " needs a declared " + state.name());
      }
    }
    List<Integer> stateShape = shape == null ? null : shapeOf(shape, id);
    if (dtype != null && !DTYPES.contains(dtype)) {
      throw DeepxException.graph(id, "unknown dtype " + Spelling.shown(dtype)
          + Spelling.didYouMean(String.valueOf(dtype), DTYPES));
    }
    Map<String, Object> attrs = checkAttrs(entry, given, id);
    List<Object> args = new ArrayList<>();
    for (Object operand : operands) {
      if (operand != null) { // (an optional input left out: only at the end, checkInputs says)
        args.add(arg(operand, id));
      }
    }
    node.put("args", args);
    if (stateShape != null) {
      node.put("shape", stateShape);
    }
    if (dtype != null) {
      node.put("dtype", dtype);
    }
    if (!attrs.isEmpty()) {
      node.put("attrs", attrs);
    }
    claim(id);
    nodes.add(node);
    return new Tensor(this, id, name);
  }

  /** Names {@code tensor} as an output of the graph, by its id. */
  public Graph output(Tensor tensor) {
    return output(tensor, tensor == null ? null : tensor.id());
  }

  /** Names {@code tensor} as the output {@code name} of the graph. */
  public Graph output(Tensor tensor, String name) {
    if (tensor == null || tensor.graph != this) {
      throw new DeepxException("GraphError", "an output is not a tensor of this graph");
    }
    if (name == null || name.isEmpty()) {
      throw new DeepxException("GraphError", "an output's name must be a non-empty string, not "
          + Spelling.shown(name));
    }
    for (String[] o : outputs) {
      if (o[0].equals(name)) {
        throw new DeepxException("GraphError", "output " + Spelling.shown(name) + " is named twice");
      }
    }
    outputs.add(new String[] {name, tensor.id()});
    return this;
  }

  /** The graph spec: {deepx: 1, inputs, nodes, outputs}, as JSON writes it (a copy). */
  public Map<String, Object> toSpec() {
    if (outputs.isEmpty()) {
      throw new DeepxException("GraphError",
          "the graph has no outputs: name at least one (graph.output)");
    }
    List<Object> named = new ArrayList<>();
    for (String[] o : outputs) {
      named.add(o[0].equals(o[1]) ? o[1] : Map.of(o[0], o[1]));
    }
    Map<String, Object> spec = new LinkedHashMap<>();
    spec.put("deepx", 1);
    spec.put("inputs", inputs);
    spec.put("nodes", nodes);
    spec.put("outputs", named);
    return Json.copy(spec);
  }

  /** The graph spec as compact JSON. */
  public String toJson() {
    return Json.write(toSpec());
  }

  private Object arg(Object operand, String id) {
    if (operand instanceof Tensor) {
      if (((Tensor) operand).graph != this) {
        throw new DeepxException("GraphError", "an operand of " + Spelling.shown(id)
            + " is not a tensor of this graph");
      }
      return ((Tensor) operand).id();
    }
    if (operand instanceof Boolean || isInteger(operand)) {
      return operand;
    }
    if (operand instanceof Double || operand instanceof Float) {
      double v = ((Number) operand).doubleValue();
      if (Double.isNaN(v) || Double.isInfinite(v)) {
        throw DeepxException.graph(id, "an operand is " + operand + ", not a finite number");
      }
      return operand;
    }
    throw DeepxException.graph(id, "an operand is " + operand.getClass().getSimpleName()
        + ", not a tensor of this graph or a number");
  }

  private static boolean isInteger(Object v) {
    return v instanceof Integer || v instanceof Long || v instanceof Short || v instanceof Byte
        || v instanceof BigInteger;
  }

  // A shape: an int[] (or a list of integers) of non-negative extents, as a list.
  private static List<Integer> shapeOf(Object shape, String id) {
    List<Integer> out = new ArrayList<>();
    boolean ok = shape instanceof int[] || shape instanceof List;
    if (shape instanceof int[]) {
      for (int d : (int[]) shape) {
        out.add(d);
      }
    } else if (shape instanceof List) {
      for (Object d : (List<?>) shape) {
        ok &= d instanceof Integer || d instanceof Long;
        out.add(d instanceof Number ? ((Number) d).intValue() : -1);
      }
    }
    ok &= out.stream().allMatch(d -> d >= 0);
    if (!ok) {
      throw DeepxException.graph(id, "shape must be a list of non-negative integers, got "
          + (shape instanceof int[] ? Arrays.toString((int[]) shape) : String.valueOf(shape)));
    }
    return out;
  }

  private static void checkInputs(OperatorTable.Operator entry, List<?> inputs, String id) {
    int required = 0;
    boolean variadic = false;
    for (String in : entry.inputs()) {
      variadic |= in.endsWith("...");
      if (!in.endsWith("?")) {
        required++;
      }
    }
    int given = 0;
    for (int i = 0; i < inputs.size(); i++) {
      if (inputs.get(i) != null) {
        if (given < i) { // (a null before it: the operands would shift into its place)
          throw DeepxException.graph(id, entry.name() + ": input " + (i + 1) + " is given after "
              + "one left out (null); only the last inputs may be left out");
        }
        given++;
      }
    }
    int all = entry.inputs().size();
    String listed = String.join(", ", entry.inputs());
    if (variadic) {
      if (given < 1) {
        throw DeepxException.graph(id, entry.name() + " needs at least one input");
      }
    } else if (entry.kind().equals("composite") && required != all) {
      if (given < required || given > all) {
        throw DeepxException.graph(id, entry.name() + " takes " + required + " to " + all
            + " input(s) (" + listed + "), got " + given);
      }
    } else if (given != all) {
      throw DeepxException.graph(id, entry.name() + " takes " + all + " input(s)"
          + (entry.kind().equals("composite") ? " (" + listed + ")" : "") + ", got " + given);
    }
  }

  private static Map<String, Object> checkAttrs(OperatorTable.Operator entry,
      Map<String, Object> given, String id) {
    List<String> known = new ArrayList<>();
    for (OperatorTable.Attr a : entry.attrs()) {
      known.add(a.name());
    }
    Map<String, Object> out = new TreeMap<>();
    for (Map.Entry<String, Object> e : given.entrySet()) {
      String key = e.getKey();
      if (!known.contains(key)) {
        String close = Spelling.closest(key, known);
        throw DeepxException.graph(id, entry.name() + " has no attribute " + Spelling.shown(key)
            + " (allowed: " + (known.isEmpty() ? "none" : String.join(", ", known)) + ")"
            + (close == null ? "" : "; did you mean " + Spelling.shown(close) + "?"));
      }
      if (e.getValue() != null) { // (null: the operator's default)
        out.put(key, value(e.getValue(), key, id, 0));
      }
    }
    for (OperatorTable.Attr a : entry.attrs()) {
      if (a.required() && !out.containsKey(a.name())) {
        throw DeepxException.graph(id, entry.name() + " needs attribute " + Spelling.shown(a.name()));
      }
    }
    return out;
  }

  // An attribute's value as a spec holds it: a bool, a string, a finite number, or a list of
  // them (a Java array becomes a list); NaN and the infinities do not cross as JSON.
  private static Object value(Object v, String key, String id, int depth) {
    if (v == null || v instanceof Boolean || v instanceof String || isInteger(v) || v instanceof BigDecimal) {
      return v;
    }
    if (v instanceof Double || v instanceof Float) {
      double d = ((Number) v).doubleValue();
      if (!Double.isNaN(d) && !Double.isInfinite(d)) {
        return v;
      }
    }
    List<Object> items = null;
    if (v instanceof List) {
      items = new ArrayList<>((List<?>) v);
    } else if (v != null && v.getClass().isArray()) {
      items = new ArrayList<>();
      for (int i = 0; i < java.lang.reflect.Array.getLength(v); i++) {
        items.add(java.lang.reflect.Array.get(v, i));
      }
    }
    if (items != null && depth < 32) {
      List<Object> out = new ArrayList<>();
      for (Object item : items) {
        out.add(value(item, key, id, depth + 1));
      }
      return out;
    }
    throw DeepxException.graph(id, "attribute " + Spelling.shown(key) + " is "
        + (v instanceof Number ? v : String.valueOf(v)) + ", not a value a spec holds (a finite "
        + "number, a string, a bool, null, or a list of them)");
  }

  // <op>_<n>, n the node's place; past an id taken by a name given, the next free n
  private String autoId(String name) {
    for (int n = nodes.size(); ; n++) {
      String id = name + "_" + n;
      if (!ids.contains(id)) {
        return id;
      }
    }
  }

  private void claim(String id) {
    if (!ids.add(id)) {
      throw DeepxException.graph(id, "this id is taken by another input or node");
    }
  }
}
