package dev.deepx.flow;

import java.util.Map;

/**
 * An operation's answer (a graph's execution, an asset's materialization, a model's
 * inference): its id, state (running, succeeded, failed, interrupted), run id, error, its
 * outputs once it succeeded, and every field the gateway said ({@code fields}: its JSON as
 * plain Java values, "materialized" among them where it sent it).
 */
public record Operation(String id, String state, String runId, String error,
    Map<String, Values> outputs, Map<String, Object> fields) {

  /** How far an operation's run has got: tasksDone of tasksTotal. */
  public record Progress(long tasksDone, long tasksTotal) {}

  /** The run's page on the gateway's dashboard, or null. */
  public String dashboard() {
    return fields.get("dashboard") instanceof String link ? link : null;
  }

  /** The run's progress (while it runs, and once it succeeded), or null. */
  public Progress progress() {
    if (fields.get("progress") instanceof Map<?, ?> p && p.get("tasks_done") instanceof Number done
        && p.get("tasks_total") instanceof Number total) {
      return new Progress(done.longValue(), total.longValue());
    }
    return null;
  }
}
