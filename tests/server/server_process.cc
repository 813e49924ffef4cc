#include "tests/server/server_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <regex>
#include <thread>

#include "tests/support/child_process.h"

namespace kvtier::testing {

ServerProcess::ServerProcess(const std::string& log_path, std::vector<std::string> args) : log_path_(log_path) {
  std::vector<std::string> argv{KVTIER_KVTIERD_PATH, "--port", "0"};
  argv.insert(argv.end(), args.begin(), args.end());
  pid_ = spawn_process(argv, log_path_);
  const std::regex listening(R"(listening on https?://[^:]+:(\d+))");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    std::smatch m;
    const std::string text = read_file(log_path_);
    if (std::regex_search(text, m, listening)) {
      port_ = std::stoi(m[1].str());
      return;
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

int ServerProcess::stop(int sig) {
  if (pid_ <= 0) return -1;
  kill(pid_, sig);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return exit_code_of(status);
}

std::string ServerProcess::log() const { return read_file(log_path_); }

size_t ServerProcess::rss_bytes() const {
  std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

ProgramRun run_program(const std::vector<std::string>& argv, const std::string& log_path) {
  std::ofstream(log_path, std::ios::trunc).close();
  const pid_t pid = spawn_process(argv, log_path);
  int status = 0;
  waitpid(pid, &status, 0);
  return {exit_code_of(status), read_file(log_path)};
}

int connect_loopback(int port, int recv_timeout_s) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  if (recv_timeout_s > 0) {
    timeval tv{recv_timeout_s, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  return fd;
}

}  // namespace kvtier::testing
