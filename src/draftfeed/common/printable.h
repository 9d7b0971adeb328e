// Text from outside (a file's bytes, a server's handle, a lock holder's record) made safe to put in
// a message or a log line: control characters (C0, DEL, C1, line separators, bidirectional
// overrides) and bytes that are not UTF-8 written as \xNN and a backslash doubled, so that a name
// cannot forge lines, move the cursor or carry bytes that are not UTF-8 into a terminal or a log.
// Other UTF-8 text (a path in Chinese) stays as it is.
#pragma once

#include <string>
#include <string_view>

namespace draftfeed {

std::string printable(std::string_view text);

}  // namespace draftfeed
