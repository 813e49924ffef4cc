// Child processes for tests: a program started with its output in a log file, its exit status
// decoded, the log read back. Shared by the kvtierd and Redis test harnesses.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace kvtier::testing {

// fork + execv(argv[0]) with stdout and stderr appended to `log_path`. The child exits 127 when
// the program cannot be started, and is killed when the thread that started it ends.
pid_t spawn_process(const std::vector<std::string>& argv, const std::string& log_path);
// The exit status of a waitpid() status, or -1 when the process died of a signal.
int exit_code_of(int wait_status);
// The whole file, or "" when it cannot be read.
std::string read_file(const std::string& path);

}  // namespace kvtier::testing
