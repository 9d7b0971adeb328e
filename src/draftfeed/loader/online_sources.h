// The online source and the lookahead over it, built from their options: the one place the
// command line and the Python OnlineSource make them, so both fetch ahead alike.
#pragma once

#include <memory>
#include <string>

#include "draftfeed/source/lookahead_source.h"
#include "draftfeed/source/online_source.h"
#include "draftfeed/source/sample_source.h"

namespace draftfeed {

struct OnlineSources {
  std::shared_ptr<OnlineSampleSource> online;
  std::shared_ptr<LookaheadSource> lookahead;  // null when off
  // What a loader fetches from: the lookahead when it is on, else the online source.
  std::shared_ptr<SampleSource> engine_source() const {
    if (lookahead) return lookahead;
    return online;
  }
  std::string description;  // for logs: endpoints, requests in flight, policies, the lookahead
};

// `options.dataset` set: the lookahead's default window applies (LookaheadOptions::window_for);
// a window > 0 without it is refused (kInvalidArgument: the lookahead reads the rows' token ids).
OnlineSources make_online_sources(const OnlineSourceOptions& options,
                                  const LookaheadOptions& lookahead);

}  // namespace draftfeed
