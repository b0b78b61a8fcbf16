/* Calls a served model from C, through the C API alone (the trained-model test runs it):
 * prints the output's values, one per line.
 *
 *   call_model_c URL MODEL INPUT OUTPUT ROWS COLUMNS VALUE...   (URL: http:// or grpc://) */
#include <deepx/deepx.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  deepx_client* client;
  deepx_values* x;
  deepx_operation* answer;
  const deepx_values* y;
  int64_t shape[2];
  size_t n, i;
  float* values;
  if (argc < 7) {
    fprintf(stderr, "usage: call_model_c URL MODEL INPUT OUTPUT ROWS COLUMNS VALUE...\n");
    return 2;
  }
  shape[0] = atoll(argv[5]);
  shape[1] = atoll(argv[6]);
  n = (size_t)(argc - 7);
  values = malloc(n * sizeof(float));
  for (i = 0; i < n; i++) values[i] = strtof(argv[7 + i], NULL);
  if (deepx_client_new(argv[1], NULL, &client) != DEEPX_OK ||
      deepx_values_new("float32", shape, 2, values, n * sizeof(float), &x) != DEEPX_OK ||
      deepx_client_infer(client, argv[2], (const char* const*)&argv[3],
                         (const deepx_values* const*)&x, 1, &answer) != DEEPX_OK) {
    fprintf(stderr, "%s: %s\n", deepx_error_kind(), deepx_error_message());
    return 1;
  }
  y = deepx_operation_output(answer, argv[4]);
  if (y == NULL || strcmp(deepx_values_dtype(y), "float32") != 0) {
    fprintf(stderr, "no float32 output %s\n", argv[4]);
    return 1;
  }
  for (i = 0; i < deepx_values_count(y); i++) printf("%.9g\n", ((const float*)deepx_values_data(y))[i]);
  deepx_operation_free(answer);
  deepx_values_free(x);
  deepx_client_free(client);
  free(values);
  return 0;
}
