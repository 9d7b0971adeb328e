// Tests that fault a truncated mapping on purpose and expect the fault guard to recover need a
// runtime that lets a SIGBUS handler siglongjmp back. ThreadSanitizer's does not: a minimal program
// (a thread reading a truncated mapping inside sigsetjmp, its SIGBUS handler doing siglongjmp)
// catches every fault when built plainly and dies of the signal under -fsanitize=thread, with or
// without TSAN_OPTIONS=handle_sigbus=0. Under TSan those tests are skipped, saying why; they run in
// the plain and the ASan+UBSan builds.
#pragma once

#include <gtest/gtest.h>

#if defined(__SANITIZE_THREAD__)
#define SKIP_WHERE_SIGBUS_CANNOT_BE_RECOVERED()                                        \
  GTEST_SKIP() << "ThreadSanitizer's runtime does not return from a SIGBUS handler's " \
                  "siglongjmp (see sigbus_recovery.h)"
#else
#define SKIP_WHERE_SIGBUS_CANNOT_BE_RECOVERED() static_cast<void>(0)
#endif
