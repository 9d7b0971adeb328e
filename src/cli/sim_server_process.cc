#include "sim_server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "draftfeed/common/control_file.h"
#include "draftfeed/common/error.h"

extern char** environ;

namespace draftfeed::cli {

namespace fs = std::filesystem;

namespace {

std::string log_tail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  return all.size() > 2000 ? all.substr(all.size() - 2000) : all;
}

// The port number the file holds, or "" while it holds none (not yet written, or not a number).
std::string port_in(const std::string& port_file) {
  const ControlFileRules rules{64, "a port file", ControlFileLinks::kRefuse};
  Result<ControlFile> read = read_control_file(port_file, rules);
  if (!read.ok()) return "";
  std::string text = std::move(read.value().bytes);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  const bool number =
      !text.empty() && text.size() <= 5 &&
      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  return number ? text : "";
}

bool exited(pid_t pid) {
  int status = 0;
  return ::waitpid(pid, &status, WNOHANG) == pid;
}

}  // namespace

SimServerProcess::SimServerProcess(const SimServerOptions& options) {
  const std::string port_file = options.server_dir + ".port";
  std::error_code ignored;
  fs::remove(port_file, ignored);
  fs::create_directories(options.server_dir, ignored);
  const auto number = [](double value) {
    std::ostringstream out;
    out << value;
    return out.str();
  };
  std::vector<std::string> args = {options.python,     options.script,
                                   "--server-dir",     options.server_dir,
                                   "--port",           "0",
                                   "--port-file",      port_file,
                                   "--layers",         std::to_string(options.layers),
                                   "--hidden",         std::to_string(options.hidden),
                                   "--seed",           std::to_string(options.seed),
                                   "--latency-median", number(options.latency_median),
                                   "--latency-p99",    number(options.latency_p99)};
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, options.log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  ::posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  const int spawned =
      ::posix_spawnp(&pid_, options.python.c_str(), &actions, nullptr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) {
    pid_ = -1;
    throw Error(ErrorKind::kRuntime,
                "cannot run " + options.python + ": " + os_error_text(spawned));
  }

  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(options.startup_timeout);
  while (!fs::exists(port_file)) {
    if (exited(pid_)) {
      pid_ = -1;
      throw Error(ErrorKind::kRuntime,
                  options.script + " exited at start:\n" + log_tail(options.log_path));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      stop();
      throw Error(ErrorKind::kRuntime, options.script + " did not listen within " +
                                           number(options.startup_timeout) + " s:\n" +
                                           log_tail(options.log_path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // The server writes the file whole once listening; read until it holds a number (a control
  // file: bounded, never a FIFO's blocking open).
  std::string port;
  while (port.empty() && std::chrono::steady_clock::now() < deadline) {
    port = port_in(port_file);
    if (port.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  fs::remove(port_file, ignored);
  url_ = "http://127.0.0.1:" + port + "/v1";
}

SimServerProcess::~SimServerProcess() { stop(); }

void SimServerProcess::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!exited(pid_)) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  pid_ = -1;
}

std::optional<std::string> find_sim_server_script(const std::string& explicit_path) {
  std::vector<std::string> candidates;
  if (!explicit_path.empty())
    return fs::exists(explicit_path) ? std::optional(explicit_path) : std::nullopt;
  if (const char* env = std::getenv("DRAFTFEED_SIM_SERVER"); env != nullptr && *env != '\0') {
    candidates.emplace_back(env);
  }
  candidates.emplace_back("tools/sim_vllm_server.py");
#ifdef DRAFTFEED_SOURCE_DIR
  candidates.emplace_back(std::string(DRAFTFEED_SOURCE_DIR) + "/tools/sim_vllm_server.py");
#endif
  for (const std::string& path : candidates) {
    if (fs::exists(path)) return fs::absolute(path).string();
  }
  return std::nullopt;
}

}  // namespace draftfeed::cli
