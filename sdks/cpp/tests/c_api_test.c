/* The C API from C alone: a graph built, refused mistakes with their kind and message, a run
 * on the gateway (DEEPX_URL; that part skipped without), followed, listed and cancelled once
 * ended, an asset defined, materialized, listed and read, a graph analyzed, the server
 * checked, and values both ways. Prints
 * `--- PASS: name` per test and `N passed, N failed, N skipped`. */
#include <deepx/deepx.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int passed, failed, skipped;

#define CHECK(condition)                                                             \
  do {                                                                               \
    if (!(condition)) {                                                              \
      printf("--- FAIL: %s: %s:%d: %s (last error: %s)\n", __func__, __FILE__,       \
             __LINE__, #condition, deepx_error_message());                           \
      failed++;                                                                      \
      return;                                                                        \
    }                                                                                \
  } while (0)

static void pass(const char* name) {
  printf("--- PASS: %s\n", name);
  passed++;
}

static void test_a_graph_is_built_and_written_as_its_spec(void) {
  deepx_graph* g;
  const char *x, *y, *total;
  int64_t shape[] = {2, 3};
  char* spec;
  CHECK(deepx_graph_new(&g) == DEEPX_OK);
  CHECK(deepx_graph_input(g, "x", shape, 2, "float32", &x) == DEEPX_OK);
  CHECK(deepx_graph_op_json(g, "add", "[\"x\", 1.5]", NULL, &y) == DEEPX_OK);
  CHECK(deepx_graph_op(g, "sum", &y, 1, "{\"axes\": [1], \"id\": \"total\"}", &total) == DEEPX_OK);
  CHECK(strcmp(total, "total") == 0 && strcmp(y, "add_0") == 0);
  CHECK(deepx_graph_output(g, total, NULL) == DEEPX_OK);
  CHECK(deepx_graph_spec(g, &spec) == DEEPX_OK);
  CHECK(strcmp(spec,
               "{\"deepx\":1,\"inputs\":{\"x\":{\"dtype\":\"float32\",\"shape\":[2,3]}},\"nodes\":["
               "{\"args\":[\"x\",1.5],\"id\":\"add_0\",\"op\":\"add\"},"
               "{\"args\":[\"add_0\"],\"attrs\":{\"axes\":[1]},\"id\":\"total\",\"op\":\"sum\"}],"
               "\"outputs\":[\"total\"]}") == 0);
  deepx_free(spec);
  deepx_graph_free(g);
  pass(__func__);
}

static void test_mistakes_are_statuses_with_pythons_messages(void) {
  deepx_graph* g;
  const char* x;
  int64_t shape[] = {2};
  CHECK(deepx_graph_new(&g) == DEEPX_OK);
  CHECK(deepx_graph_input(g, "x", shape, 1, "float32", &x) == DEEPX_OK);
  CHECK(deepx_graph_op(g, "relux", &x, 1, NULL, NULL) == DEEPX_ERROR);
  CHECK(strcmp(deepx_error_kind(), "GraphError") == 0);
  CHECK(strcmp(deepx_error_message(),
               "node 'relux_0': unknown operator 'relux' (did you mean 'relu'?) (see "
               "docs/graph-spec.md or `deepx-flow ops` for the list)") == 0);
  CHECK(deepx_graph_op(g, "sum", &x, 1, "{\"axis\": 1}", NULL) == DEEPX_ERROR);
  CHECK(strcmp(deepx_error_message(),
               "node 'sum_0': sum has no attribute 'axis' (allowed: axes, keepdims); did you "
               "mean 'axes'?") == 0);
  CHECK(deepx_graph_op(g, "sum", &x, 1, "{not json", NULL) == DEEPX_ERROR);
  CHECK(strcmp(deepx_error_kind(), "InputError") == 0);
  CHECK(deepx_graph_output(g, "nothing", NULL) == DEEPX_ERROR);
  CHECK(deepx_graph_op(NULL, "relu", &x, 1, NULL, NULL) == DEEPX_INVALID);
  CHECK(strcmp(deepx_error_message(), "graph is NULL") == 0);
  deepx_graph_free(g);
  pass(__func__);
}

static void test_values_hold_their_bytes(void) {
  deepx_values* v;
  int64_t shape[] = {2};
  uint16_t bits[] = {0x3c00, 0xc000};
  float floats[2];
  CHECK(deepx_values_new("float16", shape, 1, bits, sizeof bits, &v) == DEEPX_OK);
  CHECK(deepx_values_count(v) == 2 && deepx_values_nbytes(v) == 4 && deepx_values_rank(v) == 1);
  CHECK(deepx_values_to_float32(v, floats, 2) == DEEPX_OK && floats[0] == 1 && floats[1] == -2);
  deepx_values_free(v);
  CHECK(deepx_values_new("float32", shape, 1, bits, 2, &v) == DEEPX_ERROR);
  CHECK(strcmp(deepx_error_message(), "2 bytes, but a float32 tensor of shape [2] is 8") == 0);
  pass(__func__);
}

static void test_a_graph_runs_on_the_gateway(void) {
  const char* url = getenv("DEEPX_URL");
  deepx_client* client;
  deepx_graph* g;
  deepx_values* x;
  deepx_operation *op, *again;
  const char *in, *out;
  int64_t shape[] = {3};
  double data[] = {1, 4, 9};
  if (url == NULL || !*url) {
    printf("--- SKIP: %s (DEEPX_URL names no gateway)\n", __func__);
    skipped++;
    return;
  }
  CHECK(deepx_client_new(url, NULL, &client) == DEEPX_OK);
  CHECK(deepx_graph_new(&g) == DEEPX_OK);
  CHECK(deepx_graph_input(g, "x", shape, 1, "float64", &in) == DEEPX_OK);
  CHECK(deepx_graph_op(g, "sqrt", &in, 1, NULL, &out) == DEEPX_OK);
  CHECK(deepx_graph_output(g, out, "root") == DEEPX_OK);
  CHECK(deepx_values_new("float64", shape, 1, data, sizeof data, &x) == DEEPX_OK);
  CHECK(deepx_client_execute(client, g, &in, (const deepx_values* const*)&x, 1, NULL, &op) == DEEPX_OK);
  CHECK(strcmp(deepx_operation_state(op), "succeeded") == 0);
  CHECK(deepx_operation_output_count(op) == 1 && strcmp(deepx_operation_output_name(op, 0), "root") == 0);
  const deepx_values* root = deepx_operation_output(op, "root");
  const double* got = deepx_values_data(root);
  CHECK(strcmp(deepx_values_dtype(root), "float64") == 0 && got[0] == 1 && got[1] == 2 && got[2] == 3);
  /* the operation's id is the client's own (32 hex digits): the same request sent again
   * with it attaches to that operation, which is not run twice */
  const char* id = deepx_operation_id(op);
  CHECK(strlen(id) == 32 && strspn(id, "0123456789abcdef") == 32);
  char options[80];
  snprintf(options, sizeof options, "{\"operation_id\": \"%s\"}", id);
  CHECK(deepx_client_execute(client, g, &in, (const deepx_values* const*)&x, 1, options, &again) == DEEPX_OK);
  CHECK(strcmp(deepx_operation_id(again), id) == 0);
  CHECK(strcmp(deepx_operation_run_id(again), deepx_operation_run_id(op)) == 0);
  CHECK(deepx_operation_output(again, "root") != NULL);
  deepx_operation_free(again);
  deepx_operation_free(op);
  CHECK(deepx_client_operation(client, "no-such-operation", 0, &op) == DEEPX_ERROR);
  CHECK(strcmp(deepx_error_kind(), "NotFound") == 0 && deepx_error_status() == 404);
  deepx_values_free(x);
  deepx_graph_free(g);
  deepx_client_free(client);
  pass(__func__);
}

static void test_runs_assets_and_analysis_from_c(void) {
  const char* url = getenv("DEEPX_URL");
  deepx_client* client;
  deepx_graph *g, *a;
  deepx_values *x, *read;
  deepx_operation *op, *followed, *cancelled, *made;
  const char *in, *out, *n, *sq;
  int64_t shape[] = {3};
  float data[] = {0, 1, 2};
  char *json, name[64], text[160];
  if (url == NULL || !*url) {
    printf("--- SKIP: %s (DEEPX_URL names no gateway)\n", __func__);
    skipped++;
    return;
  }
  CHECK(deepx_client_new(url, NULL, &client) == DEEPX_OK);
  CHECK(deepx_client_check_server(client, &json) == DEEPX_OK);
  CHECK(strstr(json, "\"protocol_version\":\"deepx.v1\"") != NULL);
  deepx_free(json);
  /* a run followed by its id, then found among the runs; a cancel once it ended changes
   * nothing (its final state, no outputs) */
  CHECK(deepx_graph_new(&g) == DEEPX_OK);
  CHECK(deepx_graph_input(g, "x", shape, 1, "float32", &in) == DEEPX_OK);
  CHECK(deepx_graph_op(g, "exp", &in, 1, NULL, &out) == DEEPX_OK);
  CHECK(deepx_graph_output(g, out, "e") == DEEPX_OK);
  CHECK(deepx_client_analyze(client, g, &json) == DEEPX_OK);
  CHECK(strstr(json, "\"shape\":[3]") != NULL);
  deepx_free(json);
  CHECK(deepx_values_new("float32", shape, 1, data, sizeof data, &x) == DEEPX_OK);
  CHECK(deepx_client_execute(client, g, &in, (const deepx_values* const*)&x, 1, NULL, &op) == DEEPX_OK);
  CHECK(deepx_client_operation(client, deepx_operation_id(op), 0, &followed) == DEEPX_OK);
  CHECK(strcmp(deepx_operation_state(followed), "succeeded") == 0);
  CHECK(strcmp(deepx_operation_run_id(followed), deepx_operation_run_id(op)) == 0);
  snprintf(text, sizeof text, "/run?id=%s", deepx_operation_run_id(op));
  CHECK(strstr(deepx_operation_fields(followed), text) != NULL);  /* its dashboard link */
  CHECK(strstr(deepx_operation_fields(followed), "\"tasks_total\"") != NULL);
  CHECK(deepx_client_run(client, deepx_operation_run_id(op), &json) == DEEPX_OK);
  CHECK(strstr(json, "\"status\":\"succeeded\"") != NULL);
  deepx_free(json);
  CHECK(deepx_client_runs(client, "succeeded", 50, &json) == DEEPX_OK);
  CHECK(strstr(json, deepx_operation_run_id(op)) != NULL);
  deepx_free(json);
  CHECK(deepx_client_cancel(client, deepx_operation_id(op), &cancelled) == DEEPX_OK);
  CHECK(strcmp(deepx_operation_state(cancelled), "succeeded") == 0);
  CHECK(deepx_operation_output_count(cancelled) == 0);
  deepx_operation_free(cancelled);
  deepx_operation_free(followed);
  deepx_operation_free(op);
  /* an asset: defined, materialized, listed with one version, read */
  snprintf(name, sizeof name, "c_squares_%d", (int)getpid());
  CHECK(deepx_graph_new(&a) == DEEPX_OK);
  CHECK(deepx_graph_op(a, "arange", NULL, 0, "{\"shape\": [4], \"dtype\": \"float32\", \"start\": 1}", &n) == DEEPX_OK);
  const char* both[] = {n, n};
  CHECK(deepx_graph_op(a, "mul", both, 2, NULL, &sq) == DEEPX_OK);
  CHECK(deepx_graph_output(a, sq, "squares") == DEEPX_OK);
  CHECK(deepx_client_define_asset(client, name, a, "{\"description\": \"four squares\"}", &json) == DEEPX_OK);
  CHECK(strstr(json, name) != NULL);
  deepx_free(json);
  CHECK(deepx_client_materialize(client, name, NULL, &made) == DEEPX_OK);
  CHECK(strcmp(deepx_operation_state(made), "succeeded") == 0);
  deepx_operation_free(made);
  CHECK(deepx_client_assets(client, &json) == DEEPX_OK);
  CHECK(strstr(json, name) != NULL);
  deepx_free(json);
  CHECK(deepx_client_asset_versions(client, name, &json) == DEEPX_OK);
  CHECK(json[0] == '[' && strstr(json, "\"version\"") != NULL);
  deepx_free(json);
  CHECK(deepx_client_read_asset(client, name, NULL, &read) == DEEPX_OK);
  const float* squares = deepx_values_data(read);
  CHECK(strcmp(deepx_values_dtype(read), "float32") == 0 && deepx_values_count(read) == 4);
  CHECK(squares[0] == 1 && squares[1] == 4 && squares[2] == 9 && squares[3] == 16);
  deepx_values_free(read);
  CHECK(deepx_client_read_asset(client, "no_such_asset", NULL, &read) == DEEPX_ERROR);
  CHECK(strcmp(deepx_error_kind(), "NotFound") == 0);
  deepx_values_free(x);
  deepx_graph_free(a);
  deepx_graph_free(g);
  deepx_client_free(client);
  pass(__func__);
}

int main(void) {
  test_a_graph_is_built_and_written_as_its_spec();
  test_mistakes_are_statuses_with_pythons_messages();
  test_values_hold_their_bytes();
  test_a_graph_runs_on_the_gateway();
  test_runs_assets_and_analysis_from_c();
  printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  return failed ? 1 : 0;
}
