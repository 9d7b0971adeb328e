// Text from outside (a file's bytes, a server's handle, a lock holder's record) made safe to put in
// a message or a log line: control and non-ASCII bytes written as \xNN, so that a name cannot
// forge lines, move the cursor or carry bytes that are not UTF-8 into a terminal or a log.
#pragma once

#include <string>
#include <string_view>

namespace draftfeed {

std::string printable(std::string_view text);

}  // namespace draftfeed
