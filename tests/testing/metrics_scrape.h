// Reading a running process's Prometheus metrics in tests: its /metrics text,
// and one sample's value out of that text. Header-only; the test binary links
// httplib.
//
//   EXPECT_GE(SampleValue(ScrapeMetrics(port), "meshload_batches_consumed_total"), 1);
#pragma once

#include <httplib.h>

#include <string>

namespace meshload::testing {

/// The body of GET /metrics from 127.0.0.1:`port`; "" when nothing answered.
inline std::string ScrapeMetrics(int port) {
  httplib::Client client("127.0.0.1", port);
  auto res = client.Get("/metrics");
  return res ? res->body : "";
}

/// The value of sample `series` (its name and any labels as exposed, e.g.
/// `name{a="b"}`) in the Prometheus text `text`; -1 when it is not there.
inline double SampleValue(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  return at == std::string::npos ? -1.0 : std::stod(text.substr(at + series.size() + 2));
}

}  // namespace meshload::testing
