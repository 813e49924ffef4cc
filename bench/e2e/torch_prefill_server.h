// PyTorch's prefill of the engine's models, asked row by row: bench/torch_prefill_reference.py
// --serve runs as a child process that builds its models once, then times the forwards e2e_bench
// asks for between its own, so the engine and its reference take turns on the GPU round by round
// (this host's GPU has slow periods lasting seconds; a reference measured minutes earlier can sit
// in another one).
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvtier::bench {

class TorchPrefillServer {
 public:
  // Starts `python3 script --serve --models ... --prompts longest`; nullptr (and why, on stderr)
  // when it cannot be started. A script that exits at once (no PyTorch, no CUDA) is found by the
  // first request.
  static std::unique_ptr<TorchPrefillServer> start(const std::string& script,
                                                   const std::vector<std::string>& models,
                                                   int longest_prompt);
  ~TorchPrefillServer();
  TorchPrefillServer(const TorchPrefillServer&) = delete;
  TorchPrefillServer& operator=(const TorchPrefillServer&) = delete;

  // Median milliseconds of `samples` timed forwards of `tokens` tokens (after the script's own
  // untimed ones), or nothing once the script has failed (said once on stderr).
  std::optional<double> prefill_ms(const std::string& model, int tokens, int samples);

 private:
  TorchPrefillServer(pid_t pid, FILE* to, FILE* from) : pid_(pid), to_(to), from_(from) {}
  void fail(const std::string& why);

  pid_t pid_;
  FILE* to_;
  FILE* from_;
  bool failed_ = false;
};

}  // namespace kvtier::bench
