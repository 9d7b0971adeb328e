// The `draftfeed` command: dispatches to the registered subcommands (see command.h).
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "command.h"
#include "draftfeed/common/error.h"

namespace draftfeed::cli {

std::vector<Command>& command_registry() {
  static std::vector<Command> commands;
  return commands;
}

namespace {

void print_help() {
  auto commands = command_registry();
  std::sort(commands.begin(), commands.end(),
            [](const Command& a, const Command& b) { return a.name < b.name; });
  std::printf("usage: draftfeed COMMAND [ARGS...]\n\ncommands:\n");
  for (const auto& command : commands) {
    std::printf("  %-10s %s\n", command.name.c_str(), command.summary.c_str());
  }
  std::printf("\n`draftfeed COMMAND --help` shows a command's options.\n");
}

}  // namespace
}  // namespace draftfeed::cli

int main(int argc, char** argv) {
  using namespace draftfeed::cli;
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    print_help();
    return argc < 2 ? 2 : 0;
  }
  const std::string name = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  for (const auto& command : command_registry()) {
    if (command.name != name) continue;
    if (std::find(args.begin(), args.end(), "--help") != args.end() ||
        std::find(args.begin(), args.end(), "-h") != args.end()) {
      std::printf("%s\n", command.usage.c_str());
      return 0;
    }
    try {
      return command.run(args);
    } catch (const draftfeed::Error& error) {
      std::fprintf(stderr, "draftfeed %s: error: %s\n", name.c_str(), error.what());
      return error.kind() == draftfeed::ErrorKind::kInvalidArgument ? 2 : 1;
    } catch (const std::exception& error) {
      std::fprintf(stderr, "draftfeed %s: error: %s\n", name.c_str(), error.what());
      return 1;
    }
  }
  std::fprintf(stderr, "draftfeed: unknown command '%s'\n\n", name.c_str());
  print_help();
  return 2;
}
