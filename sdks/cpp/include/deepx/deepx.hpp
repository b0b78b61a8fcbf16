// deepx_flow's C++ SDK: build graphs (deepx::Graph, every operator a method), run them and
// call served models on a gateway (deepx::Client, over HTTP or gRPC), values as typed
// vectors (deepx::Values), errors as deepx::Error. The C API is deepx/deepx.h.
#pragma once

#include "deepx/client.hpp"
#include "deepx/error.hpp"
#include "deepx/graph.hpp"
#include "deepx/values.hpp"
