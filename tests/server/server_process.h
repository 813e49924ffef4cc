// ServerProcess: the real kvtierd binary started on a free port for a test (fork + exec, output
// to a log file in the test's directory), stopped with a signal and waited for, so tests see
// exactly what an operator would: exit statuses, the log, and the directory left behind.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"

namespace kvtier::testing {

class ServerProcess {
 public:
  // Starts `kvtierd --port 0 args...` and waits (up to 30 s) for it to listen. On failure
  // port() is 0 and log() says why.
  ServerProcess(const std::string& log_path, std::vector<std::string> args);
  ~ServerProcess();  // SIGKILL if still running
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  // Sends `sig` and waits; the exit status, or -1 if killed by a signal.
  int stop(int sig = 15);
  std::string log() const;
  // Resident memory of the process, from /proc.
  size_t rss_bytes() const;

 private:
  std::string log_path_;
  pid_t pid_ = -1;
  int port_ = 0;
};

// The exit status and output of a program run to completion (for the CLI and the Python client).
struct ProgramRun {
  int exit_code = -1;
  std::string output;
};
ProgramRun run_program(const std::vector<std::string>& argv, const std::string& log_path);

// A plain TCP connection to 127.0.0.1:port (a client that says nothing, or speaks bytes by hand);
// -1 with errno set when it cannot connect. With `recv_timeout_s`, its reads give up after that
// long instead of hanging a test.
int connect_loopback(int port, int recv_timeout_s = 0);

// Tests that start kvtierd (tiny layout) several times, each with its own log in one directory.
class ServerFixture : public ::testing::Test {
 protected:
  std::unique_ptr<ServerProcess> start(std::vector<std::string> args) {
    args.insert(args.begin(), {"--layout", "tiny"});
    auto s = std::make_unique<ServerProcess>((dir_ / ("kvtierd-" + std::to_string(++started_) + ".log")).string(),
                                             std::move(args));
    EXPECT_GT(s->port(), 0) << s->log();
    return s;
  }
  TempDir dir_;
  int started_ = 0;
};

}  // namespace kvtier::testing
