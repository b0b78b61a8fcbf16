package dev.deepx.flow.conformance;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import dev.deepx.flow.Client;
import dev.deepx.flow.Contract;
import dev.deepx.flow.DeepxException;
import dev.deepx.flow.Graph;
import dev.deepx.flow.Json;
import dev.deepx.flow.Operation;
import dev.deepx.flow.Values;
import java.time.Duration;
import java.util.HashMap;
import java.util.Map;

/**
 * A scenario's calls, made in order against the gateway, each with what it must give
 * (sdks/conformance/make_scenarios.py lists them by "do").
 */
final class Scenario {
  private Scenario() {}

  static void run(JsonObject scenario, Client client) throws Conformance.Failed {
    int i = 0;
    for (JsonElement item : scenario.getAsJsonArray("scenario")) {
      JsonObject call = item.getAsJsonObject();
      i++;
      try {
        make(call, client);
      } catch (Conformance.Failed | RuntimeException e) {
        throw new Conformance.Failed("call " + i + " (" + call.get("do").getAsString() + "): "
            + e.getMessage());
      }
    }
  }

  // A call's graph, built through the SDK, which must give the stored spec.
  private static Graph graphOf(JsonObject call) throws Conformance.Failed {
    JsonObject graph = call.getAsJsonObject("graph");
    Graph g = Conformance.built(graph);
    Conformance.sameSpec(g, graph.get("spec"));
    return g;
  }

  private static Map<String, Values> inputsOf(JsonObject call) {
    Map<String, Values> out = new HashMap<>();
    for (Map.Entry<String, JsonElement> e : call.getAsJsonObject("inputs").entrySet()) {
      out.put(e.getKey(), Conformance.values(e.getValue().getAsJsonObject()));
    }
    return out;
  }

  // The call's expected tensors by name (read_asset's one, under its asset's name).
  private static void compareAll(Map<String, Values> got, JsonObject call)
      throws Conformance.Failed {
    JsonObject expected = call.getAsJsonObject("expected");
    Map<String, JsonObject> want = new HashMap<>();
    if (expected.has("dtype")) {
      want.put(call.get("asset").getAsString(), expected);
    } else {
      for (Map.Entry<String, JsonElement> e : expected.entrySet()) {
        want.put(e.getKey(), e.getValue().getAsJsonObject());
      }
    }
    double rtol = call.get("rtol").getAsDouble();
    double atol = call.get("atol").getAsDouble();
    for (Map.Entry<String, JsonObject> e : want.entrySet()) {
      Conformance.compare(got.get(e.getKey()), Conformance.values(e.getValue()), rtol, atol,
          e.getKey());
    }
  }

  private static void make(JsonObject call, Client client) throws Conformance.Failed {
    String asset = call.has("asset") ? call.get("asset").getAsString() : null;
    switch (call.get("do").getAsString()) {
      case "define_asset" -> client.defineAsset(asset, graphOf(call));
      case "materialize" -> {
        Operation done = client.materialize(asset);
        if (!done.state().equals(call.get("state").getAsString())) {
          throw new Conformance.Failed(asset + ": " + done.state() + " (" + done.error() + ")");
        }
      }
      case "read_asset" -> compareAll(Map.of(asset, client.readAsset(asset)), call);
      case "list_assets" -> {
        for (JsonElement name : call.getAsJsonArray("includes")) {
          if (client.assets().stream().noneMatch(a -> name.getAsString().equals(a.get("name")))) {
            throw new Conformance.Failed(name.getAsString() + " is not listed");
          }
        }
      }
      case "asset_versions" -> {
        int count = client.assetVersions(asset).size();
        if (count < call.get("at_least").getAsInt()) {
          throw new Conformance.Failed(count + " versions of " + asset);
        }
      }
      case "execute" -> execute(call, client);
      case "infer" -> {
        Operation done;
        try {
          done = client.infer(call.get("model").getAsString(), inputsOf(call));
        } catch (DeepxException e) {
          if (call.has("error")) {
            Conformance.refused(e, call.getAsJsonObject("error"));
            return;
          }
          throw e;
        }
        if (call.has("error")) {
          throw new Conformance.Failed("not refused: " + done.fields());
        }
        compareAll(done.outputs(), call);
      }
      case "cancel" -> {
        Operation started = client.start(graphOf(call), inputsOf(call));
        if (!"running".equals(started.state())) {
          throw new Conformance.Failed("started: " + started.state());
        }
        Operation done = client.cancel(started.id());
        if (!"interrupted".equals(done.state()) || done.error() == null
            || !done.error().contains("cancelled")) {
          throw new Conformance.Failed("cancelled: " + done.state() + " (" + done.error() + ")");
        }
        Object status = client.run(done.runId()).get("status");
        if (!"interrupted".equals(status)) {
          throw new Conformance.Failed("its run: " + status);
        }
      }
      case "analyze" -> {
        Map<String, Object> answer = client.analyze(graphOf(call));
        for (String side : new String[] {"inputs", "outputs"}) {
          Object want = Json.plain(call.getAsJsonObject("analysis").get(side));
          if (!want.equals(answer.get(side))) {
            throw new Conformance.Failed("the " + side + ": " + Json.write(answer.get(side))
                + ", not " + Json.write(want));
          }
        }
        if (!(answer.get("plan") instanceof String plan) || plan.isEmpty()) {
          throw new Conformance.Failed("no plan");
        }
        if (!(answer.get("tasks") instanceof Number tasks) || tasks.doubleValue() < 1) {
          throw new Conformance.Failed("tasks " + answer.get("tasks"));
        }
      }
      case "cancel_ended" -> {
        Operation done = client.execute(graphOf(call), inputsOf(call));
        if (!"succeeded".equals(done.state()) || done.outputs().isEmpty()) {
          throw new Conformance.Failed(done.state() + ": " + done.error());
        }
        Operation cancelled = client.cancel(done.id());
        if (!"succeeded".equals(cancelled.state()) || !cancelled.outputs().isEmpty()
            || cancelled.fields().containsKey("outputs")) { // (it had ended: nothing changes)
          throw new Conformance.Failed("cancelled after its end: " + cancelled.state() + " with "
              + cancelled.fields().get("outputs"));
        }
        Operation again = client.operation(done.id());
        for (Map.Entry<String, Values> e : done.outputs().entrySet()) {
          Conformance.compare(again.outputs().get(e.getKey()), e.getValue(), 0, 0, e.getKey());
        }
      }
      case "check_server" -> {
        if (!Contract.PROTOCOL_VERSION.equals(call.get("protocol_version").getAsString())
            || !Contract.OPERATOR_TABLE_HASH.equals(call.get("operator_table_hash").getAsString())) {
          throw new Conformance.Failed("this SDK: " + Contract.PROTOCOL_VERSION + " "
              + Contract.OPERATOR_TABLE_HASH);
        }
        Object hash = client.checkServer().get("operator_table_hash");
        if (!call.get("operator_table_hash").getAsString().equals(hash)) {
          throw new Conformance.Failed("the gateway's hash: " + hash);
        }
      }
      default -> throw new Conformance.Failed("no such call");
    }
  }

  // Runs a call's graph; with "follow", starts it and asks again until it ends, and checks
  // what following a run shows: progress, the dashboard link, the run in the catalog.
  private static void execute(JsonObject call, Client client) throws Conformance.Failed {
    Graph g = graphOf(call);
    if (!call.has("follow") || !call.get("follow").getAsBoolean()) {
      Operation done = client.execute(g, inputsOf(call));
      if (!"succeeded".equals(done.state())) {
        throw new Conformance.Failed(done.state() + ": " + done.error());
      }
      compareAll(done.outputs(), call);
      return;
    }
    Operation done = client.start(g, inputsOf(call));
    while ("running".equals(done.state())) {
      done = client.operation(done.id(), Duration.ofSeconds(1));
    }
    if (!"succeeded".equals(done.state())) {
      throw new Conformance.Failed(done.state() + ": " + done.error());
    }
    Operation.Progress p = done.progress();
    if (p == null || p.tasksTotal() == 0 || p.tasksDone() != p.tasksTotal()) {
      throw new Conformance.Failed("progress " + p);
    }
    if (done.dashboard() == null || !done.dashboard().endsWith("/run?id=" + done.runId())) {
      throw new Conformance.Failed("dashboard " + done.dashboard());
    }
    Object status = client.run(done.runId()).get("status");
    if (!"succeeded".equals(status)) {
      throw new Conformance.Failed("its run: " + status);
    }
    String runId = done.runId();
    if (client.runs(null, 100).stream().noneMatch(r -> runId.equals(r.get("id")))) {
      throw new Conformance.Failed("the run " + runId + " is not listed");
    }
    compareAll(done.outputs(), call);
  }
}
