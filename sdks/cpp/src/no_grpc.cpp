// Built without gRPC (-DDEEPX_GRPC=OFF): grpc:// URLs are refused, saying so.
#include "deepx/client.hpp"

namespace deepx::detail {

std::shared_ptr<Transport> grpc_transport(const std::string& address, const std::string&) {
  throw Error("InputError", "this libdeepx was built without gRPC (-DDEEPX_GRPC=OFF): " +
                                shown("grpc://" + address) + " cannot be reached");
}

}  // namespace deepx::detail
