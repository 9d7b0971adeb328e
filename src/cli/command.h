// The `draftfeed` program's subcommands register themselves here: one file per command
// (`cmd_<name>.cc`) holds a static `CommandRegistration`, so adding a command touches no other
// file.
#pragma once

#include <string>
#include <vector>

namespace draftfeed::cli {

// Runs a subcommand on its arguments (the words after the subcommand's name); returns the exit
// status.
using CommandFn = int (*)(const std::vector<std::string>& args);

struct Command {
  std::string name;
  std::string summary;  // one line for `draftfeed --help`
  std::string usage;    // full usage text for `draftfeed NAME --help`
  CommandFn run;
};

std::vector<Command>& command_registry();

struct CommandRegistration {
  explicit CommandRegistration(Command command) {
    command_registry().push_back(std::move(command));
  }
};

}  // namespace draftfeed::cli
