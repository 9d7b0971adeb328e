#include "draftfeed/loader/online_sources.h"

#include <cstdint>
#include <utility>

#include "draftfeed/common/error.h"
#include "draftfeed/source/cache_source.h"

namespace draftfeed {

OnlineSources make_online_sources(const OnlineSourceOptions& options,
                                  const LookaheadOptions& lookahead) {
  lookahead.validate();
  const auto dataset = options.dataset;
  LookaheadOptions ahead = lookahead;
  ahead.window = lookahead.window_for(options.client.fetch_threads, dataset != nullptr);
  OnlineSources out;
  out.description = "online (" + std::to_string(options.client.endpoints.size()) +
                    " endpoint(s), " + std::to_string(options.client.fetch_threads) +
                    " in flight, on_missing=" + on_missing_name(options.cache.on_missing) +
                    ", on_generate=" + on_generate_name(options.on_generate);
  out.online = std::make_shared<OnlineSampleSource>(options);
  if (*ahead.window > 0) {
    require(dataset != nullptr, ErrorKind::kInvalidArgument,
            "lookahead needs data_path (the lookahead reads the rows' token ids)");
    out.description += ", lookahead " + std::to_string(*ahead.window) + " rows";
    out.lookahead = std::make_shared<LookaheadSource>(out.online, dataset, ahead);
  }
  out.description += ")";
  return out;
}

}  // namespace draftfeed
