package dev.deepx.flow;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.time.Duration;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * Against a running gateway (DEEPX_URL, as the Python tests start one; skipped without): graphs
 * built here run there, outputs come back exact in every dtype, and the gateway's refusals
 * arrive as DeepxExceptions with their kind, message and status.
 */
class ClientTest {
  private Client client;

  @BeforeEach
  void gateway() {
    String url = System.getenv("DEEPX_URL");
    assumeTrue(url != null && !url.isEmpty(), "DEEPX_URL names no gateway");
    client = new Client(url);
  }

  @Test
  void aGraphBuiltHereRunsOnTheGatewayAndItsOutputsComeBack() {
    Graph g = new Graph();
    Tensor x = g.input("x", 2, 3);
    Tensor y = g.leakyRelu(g.mul(x, 2), Map.of("alpha", 0.5));
    g.output(g.sum(y, Map.of("axes", List.of(1))), "total").output(g.argmax(x, Map.of("axis", 1)), "label");
    Operation done = client.execute(g, Map.of("x", Values.of(new float[] {1, -2, 3, -4, 5, -6}, 2, 3)));
    assertEquals("succeeded", done.state());
    assertNotNull(done.id());
    assertEquals("float32", done.outputs().get("total").dtype());
    assertArrayEquals(new int[] {2}, done.outputs().get("total").shape());
    assertArrayEquals(new float[] {2 - 2 + 6, -4 + 10 - 6}, done.outputs().get("total").floats());
    assertArrayEquals(new long[] {2, 1}, done.outputs().get("label").longs());
  }

  @Test
  void everyDtypeCrossesBothWaysExactly() {
    Values[] all = {
      Values.of(new boolean[] {true, false, true}), Values.of(new byte[] {-128, 0, 127}),
      Values.of(new short[] {-32768, 1, 32767}), Values.of(new int[] {Integer.MIN_VALUE, 1, Integer.MAX_VALUE}),
      Values.of(new long[] {(1L << 62) + 3, Long.MIN_VALUE, Long.MAX_VALUE}),
      new Values("uint8", new int[] {3}, new short[] {0, 1, 255}),
      new Values("uint16", new int[] {3}, new int[] {0, 1, 65535}),
      new Values("uint32", new int[] {3}, new long[] {0, 1, 4294967295L}),
      new Values("uint64", new int[] {3}, new long[] {0, 1, -1L}),
      new Values("float16", new int[] {3}, new short[] {0x3c00, (short) 0x8000, 0x7bff}),
      new Values("bfloat16", new int[] {3}, new short[] {0x3f80, (short) 0xff80, 0x0001}),
      Values.of(new float[] {-0.0f, Float.NaN, Float.MAX_VALUE}),
      Values.of(new double[] {Double.NEGATIVE_INFINITY, -0.0, Double.MIN_VALUE}),
    };
    for (Values v : all) {
      Graph g = new Graph();
      g.output(g.flip(g.input("x", new int[] {3}, v.dtype())), "y");
      Values back = client.execute(g, Map.of("x", v)).outputs().get("y");
      Values again = client.execute(g, Map.of("x", back)).outputs().get("y");
      assertEquals(v.toString(), again.toString(), v.dtype());
    }
  }

  @Test
  void int64BeyondTwoToThe53CrossesExactly() {
    Graph g = new Graph();
    g.output(g.add(g.input("n", new int[] {2}, "int64"), 1), "next");
    long big = (1L << 62) + 3;
    Operation done = client.execute(g, Map.of("n", Values.of(new long[] {big, -big})));
    assertArrayEquals(new long[] {big + 1, -big + 1}, done.outputs().get("next").longs());
  }

  @Test
  void theGatewaySpeaksThisSdksProtocolAndOperatorTable() {
    Map<String, Object> caps = client.checkServer();
    assertEquals(Contract.PROTOCOL_VERSION, caps.get("protocol_version"));
    assertEquals(Contract.OPERATOR_TABLE_HASH, caps.get("operator_table_hash"));
  }

  @Test
  void theGatewaysAnalysisGivesEveryOutputsShapeAndDtype() {
    Graph g = new Graph();
    Tensor x = g.input("x", 4, 5);
    g.output(g.matmul(x, g.transpose(x)), "gram");
    Map<String, Object> analysis = client.analyze(g);
    assertEquals(List.of(Map.of("name", "gram", "datatype", "FP32", "shape", List.of(4L, 4L))),
        analysis.get("outputs"));
  }

  @Test
  void theGatewaysRefusalsAreDeepxExceptionsWithTheirKindAndStatus() {
    Map<String, Object> spec = Map.of("deepx", 1, "inputs", Map.of("x", Map.of("shape", List.of(2),
        "dtype", "float32")), "nodes", List.of(Map.of("id", "y", "op", "add", "args",
        List.of("x", "missing"))), "outputs", List.of("y"));
    DeepxException e = assertThrows(DeepxException.class,
        () -> client.execute(spec, Map.of("x", Values.of(new float[] {1, 2}))));
    assertEquals("SpecError", e.kind());
    assertEquals(400, e.status());
    assertTrue(e.getMessage().contains("missing input 'missing'"), e.getMessage());
    Graph g = new Graph();
    g.output(g.relu(g.input("x", 2)));
    e = assertThrows(DeepxException.class,
        () -> client.execute(g, Map.of("x", Values.of(new float[] {1, 2, 3}))));
    assertEquals("InputError", e.kind());
    assertTrue(e.getMessage().contains("'x'"), e.getMessage());
    e = assertThrows(DeepxException.class, () -> client.operation("no-such-operation"));
    assertEquals("NotFound", e.kind());
    assertEquals(404, e.status());
    e = assertThrows(DeepxException.class, () -> client.infer("no_such_model",
        Map.of("x", Values.of(new float[] {1}))));
    assertEquals("NotFound", e.kind());
    e = assertThrows(DeepxException.class, () -> new Client("http://127.0.0.1:9").runs());
    assertEquals("RemoteError", e.kind());
    assertTrue(e.getMessage().startsWith("cannot reach the gateway at http://127.0.0.1:9: "), e.getMessage());
  }

  @Test
  void anOperationIsFollowedByIdAndItsRunIsListed() {
    Graph g = new Graph();
    g.output(g.exp(g.input("x", 3)), "e");
    Operation started = client.execute(g, Map.of("x", Values.of(new float[] {0, 1, 2})),
        Map.of("wait_seconds", 60));
    Operation again = client.operation(started.id(), Duration.ofSeconds(30));
    assertEquals("succeeded", again.state());
    assertArrayEquals(started.outputs().get("e").floats(), again.outputs().get("e").floats());
    Map<String, Object> newest = client.runs(null, 1).get(0);
    assertEquals(started.runId(), newest.get("id"));
    assertEquals("succeeded", client.run(started.runId()).get("status"));
    assertEquals(1, client.runs("succeeded", 1).size());
    // (cancelling what has ended changes nothing: its final state, and no outputs)
    Operation cancelled = client.cancel(started.id());
    assertEquals("succeeded", cancelled.state());
    assertTrue(cancelled.outputs().isEmpty());
  }

  // A graph of about a second here: four 2048 x 2048 matmuls, each a fixed point ((J/n)(J/n)
  // = J/n), summed: n.
  private static Graph slow() {
    Graph g = new Graph();
    int n = 2048;
    Tensor a = g.full(Map.of("shape", List.of(n, n), "dtype", "float32", "value", 1.0 / n));
    Tensor m = a;
    for (int i = 0; i < 4; i++) {
      m = g.matmul(m, a);
    }
    g.output(g.sum(m), "s");
    return g;
  }

  @Test
  void aRunLongerThanOneWaitIsAskedForAgainByItsIdUntilItEnds() {
    // (a slice of 1 ms: submitting the run alone takes longer; without asking again, "running")
    Client sliced = new Client(System.getenv("DEEPX_URL"), null, Duration.ofMillis(1));
    Operation done = sliced.execute(slow(), Map.of());
    assertEquals("succeeded", done.state(), done.error());
    assertEquals(2048f, done.outputs().get("s").floats()[0], 1e-2f);
    assertTrue(done.id().matches("[0-9a-f]{32}"), done.id()); // (its id, made here)
    // a caller's id is the operation's; a caller's wait is not followed: theirs to follow
    String id = "java-given-" + ProcessHandle.current().pid() + "-" + System.nanoTime();
    Operation started = sliced.execute(slow(), Map.of(), Map.of("operation_id", id,
        "wait_seconds", 0));
    assertEquals(id, started.id());
    assertEquals("running", started.state());
    assertTrue(started.outputs().isEmpty());
    Operation followed = started;
    while ("running".equals(followed.state())) {
      followed = sliced.operation(id, Duration.ofMillis(1));
    }
    assertEquals("succeeded", followed.state(), followed.error());
    assertEquals(2048f, followed.outputs().get("s").floats()[0], 1e-2f);
    // materialize waits as execute does
    String name = "java_slow_" + ProcessHandle.current().pid();
    sliced.defineAsset(name, slow());
    Operation made = sliced.materialize(name, Map.of("operation_id", id + "-asset"));
    assertEquals("succeeded", made.state(), made.error());
    assertEquals(id + "-asset", made.id());
    assertEquals(2048f, sliced.readAsset(name).floats()[0], 1e-2f);
  }

  @Test
  void assetsAreDefinedFromGraphsMaterializedListedAndRead() {
    String name = "java_readings_" + ProcessHandle.current().pid();
    Graph g = new Graph();
    Tensor n = g.arange(Map.of("shape", List.of(8), "dtype", "float64", "start", 0, "step", 0.5));
    g.output(g.reshape(n, Map.of("shape", List.of(4, 2))), "r");
    client.defineAsset(name, g, Map.of("description", "eight readings",
        "checks", List.of(Map.of("kind", "all_finite"))));
    Graph totals = new Graph();
    totals.output(totals.sum(totals.input(name, new int[] {4, 2}, "float64"),
        Map.of("axes", List.of(1))), "t");
    client.defineAsset(name + "_totals", totals);
    Operation made = client.materialize(name + "_totals", Map.of("upstream", true, "wait_seconds", 120));
    assertEquals("succeeded", made.state(), made.error());
    Values read = client.readAsset(name + "_totals");
    assertArrayEquals(new double[] {0.5, 2.5, 4.5, 6.5}, read.doubles());
    Values slice = client.readAsset(name, Map.of("slice", List.of(List.of(1, 3))));
    assertArrayEquals(new int[] {2, 2}, slice.shape());
    assertArrayEquals(new double[] {1, 1.5, 2, 2.5}, slice.doubles());
    Map<String, Object> listed = client.assets().stream()
        .filter(a -> name.equals(a.get("name"))).findFirst().orElseThrow();
    assertEquals("fresh", listed.get("status"));
    assertEquals(true, client.assetVersions(name).get(0).get("checks_passed"));
    DeepxException e = assertThrows(DeepxException.class, () -> client.readAsset("no_such_asset"));
    assertEquals("NotFound", e.kind());
  }
}
