package dev.deepx.flow;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.lang.reflect.Method;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;
import org.junit.jupiter.api.Test;

/** Building graphs: the canonical spec, and mistakes refused as they are made in Python's words. */
class GraphTest {
  @Test
  void operatorsBuildTheCanonicalSpec() {
    Graph g = new Graph();
    Tensor x = g.input("x", 2, 3);
    Tensor y = g.relu(g.add(x, 1.5));
    Tensor s = g.sum(y, Map.of("axes", new int[] {1}, "keepdims", true, "id", "total"));
    Tensor m = g.argmax(x, Map.of("axis", -1));
    g.output(s).output(m, "label");
    assertEquals("{\"deepx\":1,\"inputs\":{\"x\":{\"shape\":[2,3],\"dtype\":\"float32\"}},"
        + "\"nodes\":[{\"id\":\"add_0\",\"op\":\"add\",\"args\":[\"x\",1.5]},"
        + "{\"id\":\"relu_1\",\"op\":\"relu\",\"args\":[\"add_0\"]},"
        + "{\"id\":\"total\",\"op\":\"sum\",\"args\":[\"relu_1\"],\"attrs\":{\"axes\":[1],\"keepdims\":true}},"
        + "{\"id\":\"argmax_3\",\"op\":\"argmax\",\"args\":[\"x\"],\"attrs\":{\"axis\":-1}}],"
        + "\"outputs\":[\"total\",{\"label\":\"argmax_3\"}]}", g.toJson());
  }

  @Test
  void sourcesStateTheirShapeAndOptionalInputsMayBeLeftOut() {
    Graph g = new Graph();
    Tensor f = g.full(Map.of("shape", new int[] {2}, "dtype", "float64", "value", 2));
    Tensor x = g.input("x", new int[] {4, 5}, "float32");
    Tensor n = g.layerNorm(x, Map.of("eps", 0.001));
    Tensor scaled = g.layerNorm(x, g.ones(Map.of("shape", List.of(5), "dtype", "float32")));
    Tensor withNull = g.layerNorm(x, null, null, Map.of("id", "nulls"));
    g.output(f).output(n).output(scaled).output(withNull);
    assertEquals("[{\"id\":\"full_0\",\"op\":\"full\",\"args\":[],\"shape\":[2],\"dtype\":\"float64\","
        + "\"attrs\":{\"value\":2}},{\"id\":\"layer_norm_1\",\"op\":\"layer_norm\",\"args\":[\"x\"],"
        + "\"attrs\":{\"eps\":0.001}},{\"id\":\"ones_2\",\"op\":\"ones\",\"args\":[],\"shape\":[5],"
        + "\"dtype\":\"float32\"},{\"id\":\"layer_norm_3\",\"op\":\"layer_norm\",\"args\":[\"x\",\"ones_2\"]},"
        + "{\"id\":\"nulls\",\"op\":\"layer_norm\",\"args\":[\"x\"]}]", Json.write(g.toSpec().get("nodes")));
  }

  @Test
  void aListOfOperandsIsConcatenatedAndIntsStayIntsWhereFloatsStayFloats() {
    Graph g = new Graph();
    Tensor a = g.input("a", 2);
    g.output(g.concat(List.of(a, a), Map.of("axis", 0, "id", "c")));
    g.output(g.randomUniform(Map.of("shape", List.of(3), "dtype", "float64", "low", -1.0,
        "seed", 7)));
    g.output(g.pad(a, Map.of("widths", new int[][] {{1, 0}}, "value", 2.0f)));
    assertEquals("[{\"id\":\"c\",\"op\":\"concat\",\"args\":[\"a\",\"a\"],\"attrs\":{\"axis\":0}},"
        + "{\"id\":\"random_uniform_1\",\"op\":\"random_uniform\",\"args\":[],\"shape\":[3],"
        + "\"dtype\":\"float64\",\"attrs\":{\"low\":-1.0,\"seed\":7}},{\"id\":\"pad_2\",\"op\":\"pad\","
        + "\"args\":[\"a\"],\"attrs\":{\"value\":2.0,\"widths\":[[1,0]]}}]",
        Json.write(g.toSpec().get("nodes")));
  }

  private static void refused(Consumer<Graph> build, String says) {
    Graph g = new Graph();
    g.input("x", 2, 3);
    DeepxException e = assertThrows(DeepxException.class, () -> build.accept(g));
    assertEquals(says, e.getMessage());
    assertEquals("GraphError", e.kind());
    assertEquals(0, e.status());
  }

  private static Tensor x(Graph g) {
    return g.op("abs", List.of(new Graph().input("x", 1)), Map.of()); // (refused: another graph)
  }

  @Test
  void mistakesAreRefusedAsTheyAreMadeInPythonsWords() {
    refused(g -> g.op("relux", List.of(), Map.of("id", "y")), "node 'y': unknown operator 'relux' "
        + "(did you mean 'relu'?) (see docs/graph-spec.md or `deepx-flow ops` for the list)");
    refused(g -> g.op(null, List.of(), Map.of("id", "y")), "node 'y': unknown operator None "
        + "(did you mean 'ones'?) (see docs/graph-spec.md or `deepx-flow ops` for the list)");
    refused(g -> g.op("input", List.of(), null), "node 'input_0': unknown operator 'input' "
        + "(see docs/graph-spec.md or `deepx-flow ops` for the list)");
    refused(g -> g.op("add", List.of(1), null), "node 'add_0': add takes 2 input(s), got 1");
    refused(g -> g.sum(2.0, Map.of("axis", 1)),
        "node 'sum_0': sum has no attribute 'axis' (allowed: axes, keepdims); did you mean 'axes'?");
    refused(g -> g.relu(1, Map.of("alpha", 1)),
        "node 'relu_0': relu has no attribute 'alpha' (allowed: none)");
    refused(g -> g.oneHot(1), "node 'one_hot_0': one_hot needs attribute 'classes'");
    refused(g -> g.op("leaky_relu", List.of(1, 2), null),
        "node 'leaky_relu_0': leaky_relu takes 1 input(s) (x), got 2");
    refused(g -> g.op("layer_norm", List.of(), null),
        "node 'layer_norm_0': layer_norm takes 1 to 3 input(s) (x, scale?, bias?), got 0");
    refused(g -> g.full(Map.of("shape", List.of(1), "dtype", "float32")),
        "node 'full_0': full needs attribute 'value'");
    refused(g -> g.full(Map.of("dtype", "float32", "value", 1)),
        "node 'full_0': full needs a declared shape");
    refused(g -> g.full(Map.of("shape", new int[] {2, -1}, "dtype", "float32", "value", 1)),
        "node 'full_0': shape must be a list of non-negative integers, got [2, -1]");
    refused(g -> g.leakyRelu(1, Map.of("alpha", Double.POSITIVE_INFINITY)),
        "node 'leaky_relu_0': attribute 'alpha' is Infinity, not a value a spec holds (a finite "
        + "number, a string, a bool, null, or a list of them)");
    refused(g -> g.layerNorm(1, null, 2), "node 'layer_norm_0': layer_norm: input 3 is given "
        + "after one left out (null); only the last inputs may be left out");
    refused(g -> g.relu(Double.NaN), "node 'relu_0': an operand is NaN, not a finite number");
    refused(g -> g.relu("x"), "node 'relu_0': an operand is String, not a tensor of this graph or a number");
    refused(GraphTest::x, "an operand of 'abs_0' is not a tensor of this graph");
    refused(g -> g.input("x", 1), "node 'x': this id is taken by another input or node");
    refused(g -> g.relu(1, Map.of("id", "x")), "node 'x': this id is taken by another input or node");
    refused(g -> g.relu(1, Map.of("id", "")), "node 'relu_0': an id is a non-empty string, not ''");
    refused(g -> g.input("z", new int[] {1}, "float8"),
        "node 'z': unknown dtype 'float8' (did you mean 'float64'?)");
    refused(g -> g.concat(List.of()), "node 'concat_0': concat needs at least one input");
    refused(g -> g.output(g.relu(1)).output(g.abs(1), "relu_0"), "output 'relu_0' is named twice");
    refused(Graph::toSpec, "the graph has no outputs: name at least one (graph.output)");
  }

  @Test
  void aRefusedCallLeavesTheGraphAsItWas() {
    Graph g = new Graph();
    Tensor x = g.input("x", 2);
    assertThrows(DeepxException.class, () -> g.sum(x, Map.of("axis", 0)));
    g.output(g.relu(x));
    assertEquals("[{\"id\":\"relu_0\",\"op\":\"relu\",\"args\":[\"x\"]}]",
        Json.write(g.toSpec().get("nodes")));
  }

  @Test
  void closestSpellsAsDifflib() {
    List<String> choices = List.of("relu", "gelu", "exp", "sum", "mean");
    assertEquals("relu", Spelling.closest("relux", choices));
    assertEquals("sum", Spelling.closest("Sum", choices));
    assertNull(Spelling.closest("zzz", choices));
    // (ties: the largest word; Python: difflib.get_close_matches('abcd', ['abce', 'abcf']))
    assertEquals("abcf", Spelling.closest("abcd", List.of("abce", "abcf")));
    assertEquals(0.75, Spelling.ratio("abcd", "bcde"));
  }

  @Test
  void everyOperatorButInputIsAMethodOfGraph() {
    for (String name : OperatorTable.OPERATORS.keySet()) {
      if (name.equals("input")) {
        continue;
      }
      String[] parts = name.split("_");
      StringBuilder method = new StringBuilder(parts[0]);
      for (int i = 1; i < parts.length; i++) {
        method.append(Character.toUpperCase(parts[i].charAt(0))).append(parts[i].substring(1));
      }
      boolean found = Arrays.stream(Graph.class.getMethods())
          .map(Method::getName).anyMatch(method.toString()::equals);
      assertTrue(found, "no method " + method + " for " + name);
    }
  }

  @Test
  void largeIntegersAreWrittenAsGiven() {
    Graph g = new Graph();
    Tensor x = g.input("x", new int[] {2}, "int64");
    g.output(g.add(x, (1L << 62) + 1, Map.of("id", "y")));
    g.output(g.randomNormal(Map.of("shape", List.of(1), "dtype", "float32", "seed",
        (1L << 60) + 1)), "r");
    assertEquals("[{\"id\":\"y\",\"op\":\"add\",\"args\":[\"x\",4611686018427387905]},"
        + "{\"id\":\"random_normal_1\",\"op\":\"random_normal\",\"args\":[],\"shape\":[1],"
        + "\"dtype\":\"float32\",\"attrs\":{\"seed\":1152921504606846977}}]",
        Json.write(g.toSpec().get("nodes")));
  }

  @Test
  void idsMadeDoNotTakeANameGiven() {
    Graph g = new Graph();
    Tensor x = g.input("x", 2, 3);
    g.relu(x, Map.of("id", "relu_1"));
    assertEquals("relu_2", g.relu(x, Map.of("shape", new int[] {2, 3})).id());
  }
}
