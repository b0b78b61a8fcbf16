// Calls a served model from C++ (the trained-model test runs it): prints the output's values,
// one per line.
//
//   call_model URL MODEL INPUT OUTPUT ROWS COLUMNS VALUE...   (URL: http:// or grpc://)
#include <cstdio>
#include <cstdlib>

#include "deepx/deepx.hpp"

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: call_model URL MODEL INPUT OUTPUT ROWS COLUMNS VALUE...\n");
    return 2;
  }
  int64_t rows = std::atoll(argv[5]), columns = std::atoll(argv[6]);
  std::vector<float> x;
  for (int i = 7; i < argc; i++) x.push_back(std::strtof(argv[i], nullptr));
  try {
    deepx::Client client(argv[1]);
    deepx::Operation answer = client.infer(argv[2], {{argv[3], deepx::Values({rows, columns}, x)}});
    for (float v : answer.outputs.at(argv[4]).data<float>()) std::printf("%.9g\n", v);
  } catch (const deepx::Error& err) {
    std::fprintf(stderr, "%s: %s\n", err.kind().c_str(), err.what());
    return 1;
  }
  return 0;
}
