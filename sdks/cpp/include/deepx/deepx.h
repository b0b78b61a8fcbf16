/* deepx_flow's C API: libdeepx's graphs, values and client for C and for other languages'
 * foreign function interfaces. Handles are opaque; every call returns a status (DEEPX_OK, or
 * why not), and after a failure deepx_error_message(), deepx_error_kind() and
 * deepx_error_status() say what went wrong (this thread's last failure: the same message,
 * kind and HTTP status as deepx::Error). No C++ exception crosses this boundary.
 *
 * Tensors of a graph are named by their ids (const char*, owned by the graph, valid while it
 * lives); strings a call gives through a char** are the caller's, freed with deepx_free. */
#ifndef DEEPX_DEEPX_H
#define DEEPX_DEEPX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  DEEPX_OK = 0,
  DEEPX_ERROR = 1,    /* a deepx_flow error: deepx_error_kind() names it */
  DEEPX_INVALID = 2,  /* a NULL handle or argument where one is needed */
  DEEPX_INTERNAL = 3  /* anything else (out of memory, ...) */
};

typedef struct deepx_graph deepx_graph;
typedef struct deepx_values deepx_values;
typedef struct deepx_client deepx_client;
typedef struct deepx_operation deepx_operation;

/* This thread's last failure: its message (as deepx::Error::what()), its kind (GraphError,
 * InputError, NotFound, ...) and the gateway's HTTP status (0 where none). */
const char* deepx_error_message(void);
const char* deepx_error_kind(void);
int deepx_error_status(void);

/* A string a call gave (spec, JSON answers). */
void deepx_free(char* text);

/* -- graphs ------------------------------------------------------------------------------ */

int deepx_graph_new(deepx_graph** out);
void deepx_graph_free(deepx_graph* graph);
/* A named input of shape (rank values) and dtype; *id: its id (its name). */
int deepx_graph_input(deepx_graph* graph, const char* name, const int64_t* shape, size_t rank,
                      const char* dtype, const char** id);
/* Operator name on inputs (ids of tensors of this graph; NULL for an optional input left
 * out), with options_json (NULL, or a JSON object of attributes and "id", "shape", "dtype");
 * *id: the new node's id. */
int deepx_graph_op(deepx_graph* graph, const char* name, const char* const* inputs,
                   size_t count, const char* options_json, const char** id);
/* As deepx_graph_op, the operands a JSON array: strings are ids of tensors of this graph,
 * numbers and bools literals, null an optional input left out ("[\"x\", 1.5]"). */
int deepx_graph_op_json(deepx_graph* graph, const char* name, const char* args_json,
                        const char* options_json, const char** id);
/* Names the tensor id as an output (named name, or its id where name is NULL). */
int deepx_graph_output(deepx_graph* graph, const char* id, const char* name);
/* The graph spec as JSON (deepx_free it). */
int deepx_graph_spec(const deepx_graph* graph, char** json);

/* -- values ------------------------------------------------------------------------------ */

/* Values of dtype and shape from their raw little-endian bytes, row-major (bool: a byte of
 * 0 or 1 each; float16 and bfloat16: their 16-bit patterns). The bytes are copied. */
int deepx_values_new(const char* dtype, const int64_t* shape, size_t rank, const void* data,
                     size_t nbytes, deepx_values** out);
void deepx_values_free(deepx_values* values);
const char* deepx_values_dtype(const deepx_values* values);
size_t deepx_values_rank(const deepx_values* values);
const int64_t* deepx_values_shape(const deepx_values* values);
/* The number of values, and their raw bytes (deepx_values_nbytes of them). */
size_t deepx_values_count(const deepx_values* values);
const void* deepx_values_data(const deepx_values* values);
size_t deepx_values_nbytes(const deepx_values* values);
/* A float16 or bfloat16 tensor's values as float32, into out (count of them). */
int deepx_values_to_float32(const deepx_values* values, float* out, size_t count);

/* -- the client -------------------------------------------------------------------------- */

/* A client of the gateway at url: http://host:port, https://host:port or grpc://host:port;
 * token NULL for DEEPX_GATEWAY_TOKEN where that is set. */
int deepx_client_new(const char* url, const char* token, deepx_client** out);
void deepx_client_free(deepx_client* client);
/* The contract this library speaks, and its operator table's hash (as the gateway's
 * capabilities give it). */
const char* deepx_protocol_version(void);
const char* deepx_operator_table_hash(void);
/* The gateway's capabilities as JSON, once it is found to speak this library's protocol and
 * operator table (DEEPX_ERROR of kind RemoteError saying what differs, otherwise). */
int deepx_client_check_server(deepx_client* client, char** json);
/* The gateway's analysis of a graph, as JSON. */
int deepx_client_analyze(deepx_client* client, const deepx_graph* graph, char** json);
/* Runs graph (or spec_json, a graph spec) on the inputs (names[i]: values[i]) and waits for
 * its end, however long (a minute an exchange, then the operation asked for again by its id:
 * "operation_id", or 32 random hex digits of the client's): options_json NULL or
 * {"operation_id", "outputs", "wait_seconds"} ("wait_seconds": one exchange, answering
 * "running" past it). A client may be used from several threads at once. */
int deepx_client_execute(deepx_client* client, const deepx_graph* graph,
                         const char* const* names, const deepx_values* const* values,
                         size_t count, const char* options_json, deepx_operation** out);
int deepx_client_execute_spec(deepx_client* client, const char* spec_json,
                              const char* const* names, const deepx_values* const* values,
                              size_t count, const char* options_json, deepx_operation** out);
/* An operation as the gateway has it (waiting up to wait_seconds for its end); cancelling
 * one: the operation once it ended. */
int deepx_client_operation(deepx_client* client, const char* id, double wait_seconds,
                           deepx_operation** out);
int deepx_client_cancel(deepx_client* client, const char* id, deepx_operation** out);
/* Runs (status NULL for all; limit 0: the gateway's default), one run, as JSON. */
int deepx_client_runs(deepx_client* client, const char* status, int limit, char** json);
int deepx_client_run(deepx_client* client, const char* id, char** json);
/* Assets: define one from a graph (options_json NULL or {dependencies, description,
 * partitions, partition_axis, checks}), list them, list one's versions, materialize one
 * and wait for it as deepx_client_execute does (options_json NULL or {partitions, force,
 * upstream, operation_id, wait_seconds}), read one (options_json
 * NULL or {version, partition, slice}). */
int deepx_client_define_asset(deepx_client* client, const char* name, const deepx_graph* graph,
                              const char* options_json, char** json);
int deepx_client_assets(deepx_client* client, char** json);
int deepx_client_asset_versions(deepx_client* client, const char* name, char** json);
int deepx_client_materialize(deepx_client* client, const char* name, const char* options_json,
                             deepx_operation** out);
int deepx_client_read_asset(deepx_client* client, const char* name, const char* options_json,
                            deepx_values** out);
/* Calls served model on the inputs (the Open Inference Protocol's infer). */
int deepx_client_infer(deepx_client* client, const char* model, const char* const* names,
                       const deepx_values* const* values, size_t count, deepx_operation** out);

/* -- operations -------------------------------------------------------------------------- */

void deepx_operation_free(deepx_operation* operation);
const char* deepx_operation_id(const deepx_operation* operation);
/* running, succeeded, failed or interrupted ("" for a model's answer). */
const char* deepx_operation_state(const deepx_operation* operation);
const char* deepx_operation_run_id(const deepx_operation* operation);
const char* deepx_operation_error(const deepx_operation* operation);
/* Every field the gateway said but the outputs, as JSON (owned by the operation). */
const char* deepx_operation_fields(const deepx_operation* operation);
/* The outputs: how many, the name of the i-th (in name order), one by name (NULL where
 * there is none; owned by the operation). */
size_t deepx_operation_output_count(const deepx_operation* operation);
const char* deepx_operation_output_name(const deepx_operation* operation, size_t index);
const deepx_values* deepx_operation_output(const deepx_operation* operation, const char* name);

#ifdef __cplusplus
}
#endif

#endif
