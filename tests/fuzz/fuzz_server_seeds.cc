// Writes the seed corpora of the server fuzz targets: valid requests of every route, one
// connection's bytes a file, for the door named on the command line (http_request, wire_frame).
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/server/raw_requests.h"
#include "tests/server/wire_blocks.h"

using namespace kvtier;

namespace {

std::string http(const std::string& method, const std::string& target, const std::string& body = "",
                 const std::string& type = "application/json") {
  return method + " " + target + " HTTP/1.1\r\nHost: kvtier\r\nContent-Type: " + type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: fuzz_server_seeds http_request|wire_frame DIR\n";
    return 2;
  }
  const std::string door = argv[1], dir = argv[2];
  const auto tokens = testing::prompt(1, 32);
  const auto blocks = testing::prompt_blocks(testing::tiny_layout(DType::kBF16), "fuzz", tokens);
  const std::string doc(blocks[0].document.begin(), blocks[0].document.end());
  const std::string hex = blocks[0].hash.hex();
  std::vector<std::string> seeds;
  if (door == "http_request") {
    const nlohmann::json prompt{{"namespace", "fuzz"}, {"tokens", tokens}, {"extra_keys", {"lora-a"}}};
    const nlohmann::json batch{{"namespace", "fuzz"}, {"hashes", {hex, blocks[1].hash.hex()}}};
    seeds = {http("GET", "/healthz"),
             http("GET", "/v1/layout"),
             http("GET", "/metrics") + http("GET", "/v1/stats"),
             http("POST", "/v1/lookup", prompt.dump()),
             http("POST", "/v1/prefetch", prompt.dump()),
             http("PUT", "/v1/blocks/" + hex + "?namespace=fuzz", doc, "application/octet-stream") +
                 http("GET", "/v1/blocks/" + hex + "?namespace=fuzz"),
             http("POST", "/v1/blocks:batchGet", batch.dump()),
             http("DELETE", "/v1/blocks/" + hex)};
  } else if (door == "wire_frame") {
    seeds = {testing::request_bytes(1, "", BlockHash{}, "any-key"),
             testing::request_bytes(2, "fuzz", blocks[0].hash, doc) +
                 testing::request_bytes(3, "fuzz", blocks[0].hash, ""),
             testing::request_bytes(4, "fuzz", BlockHash{},
                                    std::string(reinterpret_cast<const char*>(blocks[0].hash.bytes.data()), 32) +
                                        std::string(reinterpret_cast<const char*>(blocks[1].hash.bytes.data()), 32)),
             testing::request_bytes(5, "fuzz", blocks[0].hash, "")};
  } else {
    std::cerr << "unknown door " << door << "\n";
    return 2;
  }
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::ofstream(dir + "/seed-" + std::to_string(i), std::ios::binary).write(seeds[i].data(), seeds[i].size());
  }
  return 0;
}
