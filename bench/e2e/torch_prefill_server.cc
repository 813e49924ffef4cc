#include "bench/e2e/torch_prefill_server.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <iostream>

#include <nlohmann/json.hpp>

namespace kvtier::bench {

std::unique_ptr<TorchPrefillServer> TorchPrefillServer::start(
    const std::string& script, const std::vector<std::string>& models, int longest_prompt) {
  std::string model_list;
  for (const auto& m : models) model_list += (model_list.empty() ? "" : ",") + m;
  const std::vector<std::string> argv = {"python3",
                                         script,
                                         "--serve",
                                         "--models",
                                         model_list,
                                         "--prompts",
                                         std::to_string(longest_prompt)};
  int in[2], out[2];
  if (::pipe(in) != 0) return nullptr;
  if (::pipe(out) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    return nullptr;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::cerr << "e2e_bench: cannot start " << script << "\n";
    for (int fd : {in[0], in[1], out[0], out[1]}) ::close(fd);
    return nullptr;
  }
  if (pid == 0) {
    ::dup2(in[0], STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    for (int fd : {in[0], in[1], out[0], out[1]}) ::close(fd);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  // A script that died must not kill e2e_bench with SIGPIPE on the next request.
  std::signal(SIGPIPE, SIG_IGN);
  FILE* to = ::fdopen(in[1], "w");
  FILE* from = ::fdopen(out[0], "r");
  if (!to || !from) {
    std::cerr << "e2e_bench: cannot talk to " << script << "\n";
    if (to)
      std::fclose(to);
    else
      ::close(in[1]);  // its stdin ends: it exits
    if (from)
      std::fclose(from);
    else
      ::close(out[0]);
    ::waitpid(pid, nullptr, 0);
    return nullptr;
  }
  return std::unique_ptr<TorchPrefillServer>(new TorchPrefillServer(pid, to, from));
}

TorchPrefillServer::~TorchPrefillServer() {
  std::fclose(to_);  // the script's stdin ends: it exits
  std::fclose(from_);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  if (!failed_ && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    std::cerr << "e2e_bench: the PyTorch reference ended with status " << status << "\n";
  }
}

void TorchPrefillServer::fail(const std::string& why) {
  if (!failed_) std::cerr << "e2e_bench: no PyTorch column from here on: " << why << "\n";
  failed_ = true;
}

std::optional<double> TorchPrefillServer::prefill_ms(const std::string& model, int tokens,
                                                     int samples) {
  if (failed_) return std::nullopt;
  if (std::fprintf(to_, "%s %d %d\n", model.c_str(), tokens, samples) < 0 ||
      std::fflush(to_) != 0) {
    fail("the script is gone (no PyTorch or no CUDA there? its stderr says)");
    return std::nullopt;
  }
  char buf[4096];
  if (!std::fgets(buf, sizeof buf, from_)) {
    fail("the script ended without answering (its stderr says why)");
    return std::nullopt;
  }
  const auto j = nlohmann::json::parse(buf, nullptr, false);
  if (j.is_discarded() || !j.contains("ms")) {
    fail(std::string("unexpected answer: ") + buf);
    return std::nullopt;
  }
  return j["ms"].get<double>();
}

}  // namespace kvtier::bench
