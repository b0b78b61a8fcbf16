package dev.deepx.flow;

import java.util.Map;

/**
 * An operation's answer (a graph's execution, an asset's materialization, a model's
 * inference): its id, state (running, succeeded, failed, interrupted), run id, error, its
 * outputs once it succeeded, and every field the gateway said ({@code fields}: its JSON as
 * plain Java values, "materialized" and "dashboard" among them where it sent them).
 */
public record Operation(String id, String state, String runId, String error,
    Map<String, Values> outputs, Map<String, Object> fields) {}
