// The simulated vLLM server (tools/sim_vllm_server.py) as a child process, for `draftfeed demo`'s
// online epoch: started with the demo's shapes, its port read from a file it writes once listening,
// stopped (SIGTERM, then SIGKILL) when this object goes away. It listens on 127.0.0.1 only.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace draftfeed::cli {

struct SimServerOptions {
  std::string script;  // path of sim_vllm_server.py
  std::string python = "python3";
  std::string server_dir;  // where it writes hidden-state files
  std::string log_path;    // its stdout and stderr
  std::int64_t layers = 4;
  std::int64_t hidden = 1024;
  std::uint64_t seed = 0;
  double latency_median = 0.02;  // seconds per request, lognormal
  double latency_p99 = 0.3;
  double startup_timeout = 60;
};

class SimServerProcess {
 public:
  // Starts the server and waits until it listens. Throws Error(kRuntime) naming the script and the
  // tail of its log when it exits or does not listen in time.
  explicit SimServerProcess(const SimServerOptions& options);
  ~SimServerProcess();
  SimServerProcess(const SimServerProcess&) = delete;
  SimServerProcess& operator=(const SimServerProcess&) = delete;

  const std::string& url() const { return url_; }  // http://127.0.0.1:PORT/v1

 private:
  void stop();

  pid_t pid_ = -1;
  std::string url_;
};

// Where the simulated server's script is: `explicit_path` if given, else $DRAFTFEED_SIM_SERVER,
// else tools/sim_vllm_server.py under the current folder, else under the source tree this program
// was built from. Nothing when none exists.
std::optional<std::string> find_sim_server_script(const std::string& explicit_path);

}  // namespace draftfeed::cli
