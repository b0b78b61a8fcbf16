// Against a running gateway, over each transport it names (DEEPX_URL: HTTP; DEEPX_GRPC:
// gRPC, host:port; a test skips where neither is set): graphs built here run there, values
// cross exactly, operations are followed and cancelled, assets defined, materialized and
// read, and the gateway's refusals are deepx::Errors with their kind.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <thread>

#include "check.hpp"
#include "deepx/deepx.hpp"

using nlohmann::json;

namespace {

std::vector<std::pair<std::string, deepx::Client>> clients() {
  std::vector<std::pair<std::string, deepx::Client>> out;
  if (const char* url = std::getenv("DEEPX_URL"); url && *url) out.emplace_back("http", deepx::Client(url));
  if (const char* grpc = std::getenv("DEEPX_GRPC"); grpc && *grpc) {
    out.emplace_back("grpc", deepx::Client(std::string("grpc://") + grpc));
  }
  if (out.empty()) SKIP("DEEPX_URL and DEEPX_GRPC name no gateway");
  return out;
}

}  // namespace

TEST(a_graph_runs_on_the_gateway_and_int64_crosses_exactly) {
  for (auto& [transport, client] : clients()) {
    deepx::Graph g;
    auto x = g.input("x", {2, 3});
    auto n = g.input("n", {2}, "int64");
    g.output(g.sum(g.leaky_relu(g.mul(x, 2), {{"alpha", 0.5}}), {{"axes", {1}}}), "total");
    g.output(g.add(n, 1), "next");
    int64_t big = (int64_t{1} << 62) + 3;
    deepx::Operation done = client.execute(g, {{"x", deepx::Values({2, 3}, std::vector<float>{1, -2, 3, -4, 5, -6})},
                                               {"n", deepx::Values({2}, std::vector<int64_t>{big, -big})}});
    CHECK_EQ(done.state, std::string("succeeded"));
    CHECK_EQ(done.outputs.at("total").data<float>(), (std::vector<float>{6, 0}));
    CHECK_EQ(done.outputs.at("total").shape(), (std::vector<int64_t>{2}));
    CHECK_EQ(done.outputs.at("next").data<int64_t>(), (std::vector<int64_t>{big + 1, -big + 1}));
    CHECK(!done.run_id.empty() && !done.id.empty());
  }
}

TEST(an_operation_is_followed_by_id_and_its_run_listed) {
  for (auto& [transport, client] : clients()) {
    deepx::Graph g;
    g.output(g.exp(g.input("x", {3})), "e");
    deepx::Operation started = client.start(g, {{"x", deepx::Values({3}, std::vector<float>{0, 1, 2})}});
    deepx::Operation done = started;
    while (done.state == "running") done = client.operation(started.id, 1.0);
    CHECK_EQ(done.state, std::string("succeeded"));
    CHECK_EQ(done.outputs.at("e").data<float>().at(0), 1.0f);
    CHECK(done.progress && done.progress->tasks_total > 0 &&
          done.progress->tasks_done == done.progress->tasks_total);
    CHECK(done.dashboard.find("/run?id=" + done.run_id) != std::string::npos);
    CHECK_EQ(client.run(done.run_id)["status"].get<std::string>(), std::string("succeeded"));
    bool listed = false;
    for (const auto& r : client.runs("succeeded", 50)) listed = listed || r["id"] == done.run_id;
    CHECK(listed);
    // (cancelling what has ended changes nothing: its final state, without outputs)
    deepx::Operation again = client.cancel(done.id);
    CHECK_EQ(again.state, std::string("succeeded"));
    CHECK(again.outputs.empty());
  }
}

namespace {

// A graph that runs for seconds: matmuls of a 1024x1024 matrix of 2**-10 (exact: every
// product is that matrix again), summed (exactly 1024).
deepx::Graph seconds_long(int matmuls) {
  deepx::Graph g;
  auto a = g.full({{"shape", {1024, 1024}}, {"dtype", "float32"}, {"value", 1.0 / 1024}});
  auto m = a;
  for (int i = 0; i < matmuls; i++) m = g.matmul(m, a);
  g.output(g.sum(m), "total");
  return g;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool hex_id(const std::string& id) {
  return id.size() == 32 && id.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

TEST(a_run_longer_than_one_exchanges_wait_is_asked_for_until_it_ends) {
  for (auto& [transport, client] : clients()) {
    // the run outlasts a wait of 1 ms: a wait of the caller's is one exchange, answering
    // "running" past it, under the caller's id
    std::string id = "cpp-" + transport + "-" + std::to_string(getpid()) + "-wait";
    deepx::Operation running = client.execute(seconds_long(40), {}, {{"wait_seconds", 0.001}, {"operation_id", id}});
    CHECK_EQ(running.state, std::string("running"));
    CHECK_EQ(running.id, id);
    CHECK(running.outputs.empty());
    CHECK_EQ(client.operation(id, 120).outputs.at("total").data<float>(), (std::vector<float>{1024}));
    // with each exchange waiting 1 ms (60 s unless set), execute() still answers the
    // outputs, asking for the operation again by the id it chose
    client.set_wait_slice(0.001);
    deepx::Operation done = client.execute(seconds_long(40));
    CHECK_EQ(done.state, std::string("succeeded"));
    CHECK_EQ(done.outputs.at("total").data<float>(), (std::vector<float>{1024}));
    CHECK(hex_id(done.id));
  }
}

TEST(a_cancel_from_another_thread_runs_while_execute_waits) {
  for (auto& [transport, client] : clients()) {
    // one thread waits in execute() (one exchange of up to 60 s; the run takes ~10 s);
    // another, on the same client, finds the operation and cancels it at once (a cancel
    // that waited for execute's exchange would find the run ended, or come after 60 s)
    std::string id = "cpp-" + transport + "-" + std::to_string(getpid()) + "-cancelled";
    std::optional<deepx::Operation> done;
    std::string failed;
    std::thread waiting([&] {
      try {
        done = client.execute(seconds_long(300), {}, {{"operation_id", id}});  // (~10 s)
      } catch (const std::exception& err) {
        failed = err.what();
      }
    });
    auto started = std::chrono::steady_clock::now();
    std::optional<deepx::Operation> cancelled;
    std::string refused;
    while (!cancelled && refused.empty() && seconds_since(started) < 20) {
      try {
        client.operation(id);
        cancelled = client.cancel(id);
      } catch (const deepx::Error& err) {
        if (err.kind() != "NotFound") refused = err.what();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // (not started yet)
      }
    }
    double took = seconds_since(started);
    waiting.join();
    CHECK_EQ(failed, std::string());
    CHECK_EQ(refused, std::string());
    CHECK(cancelled.has_value());
    CHECK(took < 20);  // (not after execute's exchange of 60 s)
    CHECK_EQ(cancelled->state, std::string("interrupted"));
    CHECK_EQ(done->state, std::string("interrupted"));
    CHECK(done->error.find("cancelled") != std::string::npos);
  }
}

TEST(a_running_operation_is_cancelled) {
  for (auto& [transport, client] : clients()) {
    deepx::Graph g;
    auto a = g.full({{"shape", {2048, 2048}}, {"dtype", "float32"}, {"value", 1.0 / 2048}});
    auto m = a;
    for (int i = 0; i < 30; i++) m = g.matmul(m, a);
    g.output(m, "slow");
    deepx::Operation started = client.start(g);
    CHECK_EQ(started.state, std::string("running"));
    deepx::Operation done = client.cancel(started.id);
    CHECK_EQ(done.state, std::string("interrupted"));
    CHECK(done.error.find("cancelled") != std::string::npos);
    CHECK_EQ(client.run(done.run_id)["status"].get<std::string>(), std::string("interrupted"));
  }
}

TEST(the_gateways_refusals_are_errors_with_their_kind) {
  for (auto& [transport, client] : clients()) {
    json spec = {{"deepx", 1}, {"inputs", {{"x", {{"shape", {2}}, {"dtype", "float32"}}}}},
                 {"nodes", {{{"id", "y"}, {"op", "add"}, {"args", {"x", "missing"}}}}}, {"outputs", {"y"}}};
    deepx::Error refused = THROWN(client.execute(spec, {{"x", deepx::Values({2}, std::vector<float>{1, 2})}}));
    CHECK_EQ(refused.kind(), std::string("SpecError"));
    CHECK_EQ(refused.status(), 400);
    CHECK(std::string(refused.what()).find("missing") != std::string::npos);
    deepx::Graph g;
    g.output(g.relu(g.input("x", {2})));
    deepx::Error shape = THROWN(client.execute(g, {{"x", deepx::Values({3}, std::vector<float>{1, 2, 3})}}));
    CHECK_EQ(shape.kind(), std::string("InputError"));
    CHECK(std::string(shape.what()).find("'x'") != std::string::npos);
    deepx::Error missing = THROWN(client.operation("no-such-operation"));
    CHECK_EQ(missing.kind(), std::string("NotFound"));
    CHECK_EQ(missing.status(), 404);
    CHECK_EQ(THROWN(client.infer("no_such_model", {})).kind(), std::string("NotFound"));
  }
  deepx::Error unreachable = THROWN(deepx::Client("http://127.0.0.1:9").runs());
  CHECK_EQ(unreachable.kind(), std::string("RemoteError"));
  CHECK(std::string(unreachable.what()).find("cannot reach the gateway at http://127.0.0.1:9") == 0);
  deepx::Error no_grpc = THROWN(deepx::Client("grpc://127.0.0.1:9").runs());
  CHECK_EQ(no_grpc.kind(), std::string("RemoteError"));
  CHECK(std::string(no_grpc.what()).find("cannot reach the gateway at 127.0.0.1:9") == 0);
  CHECK_EQ(THROWN(deepx::Client("ftp://x")).kind(), std::string("InputError"));
}

TEST(assets_are_defined_materialized_listed_and_read) {
  for (auto& [transport, client] : clients()) {
    std::string name = "cpp_" + transport + "_readings_" + std::to_string(getpid());
    deepx::Graph g;
    auto n = g.arange({{"shape", {8}}, {"dtype", "float64"}, {"start", 0}, {"step", 0.5}});
    g.output(g.reshape(n, {{"shape", {4, 2}}}), "r");
    client.define_asset(name, g, {{"description", "eight readings"}, {"checks", {{{"kind", "all_finite"}}}}});
    deepx::Graph totals;
    totals.output(totals.sum(totals.input(name, {4, 2}, "float64"), {{"axes", {1}}}), "t");
    client.define_asset(name + "_totals", totals);
    deepx::Operation made = client.materialize(name + "_totals", {{"upstream", true}});
    CHECK_EQ(made.state, std::string("succeeded"));
    CHECK(made.fields["materialized"]["versions"].contains(name));
    CHECK(hex_id(made.id));
    deepx::Values read = client.read_asset(name + "_totals");
    CHECK_EQ(read.data<double>(), (std::vector<double>{0.5, 2.5, 4.5, 6.5}));
    deepx::Values slice = client.read_asset(name, {{"slice", {{1, 3}}}});
    CHECK_EQ(slice.shape(), (std::vector<int64_t>{2, 2}));
    CHECK_EQ(slice.data<double>(), (std::vector<double>{1, 1.5, 2, 2.5}));
    bool fresh = false;
    for (const auto& a : client.assets()) fresh = fresh || (a["name"] == name && a["status"] == "fresh");
    CHECK(fresh);
    json versions = client.asset_versions(name);
    CHECK(versions.size() == 1 && versions[0]["checks_passed"] == true);
    CHECK_EQ(THROWN(client.read_asset("no_such_asset")).kind(), std::string("NotFound"));
  }
}

TEST(the_gateway_analyzes_a_graph_and_says_its_capabilities) {
  for (auto& [transport, client] : clients()) {
    deepx::Graph g;
    auto x = g.input("x", {4, 5});
    g.output(g.matmul(x, g.transpose(x)), "gram");
    json analysis = client.analyze(g);
    CHECK_EQ(analysis["outputs"][0]["shape"].dump(), std::string("[4,4]"));
    json caps = client.capabilities();
    CHECK_EQ(caps["protocol_version"].get<std::string>(), std::string("deepx.v1"));
  }
}

TEST(tensors_past_the_message_limit_cross_both_ways) {
  for (auto& [transport, client] : clients()) {
    std::vector<float> x(1500000);  // (6 MB: streamed in chunks over gRPC)
    for (size_t i = 0; i < x.size(); i++) x[i] = static_cast<float>(i % 1000);
    deepx::Graph g;
    g.output(g.neg(g.input("x", {static_cast<int64_t>(x.size())})), "y");
    deepx::Operation done = client.execute(g, {{"x", deepx::Values({static_cast<int64_t>(x.size())}, x)}});
    std::vector<float> y = done.outputs.at("y").data<float>();
    CHECK_EQ(y.size(), x.size());
    CHECK(y[999] == -999.0f && y[x.size() - 1] == -static_cast<float>((x.size() - 1) % 1000));
  }
}

int main() { return check::run_all(); }
