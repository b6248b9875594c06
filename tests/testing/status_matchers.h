// Assertions on Status, Result<T> (and anything else with ok() that can say
// why: status(), ToStatus(), message()) that print the error when they fail:
//   EXPECT_OK(job);  ASSERT_OK(source->Read(...)) << "while reading";
// A bare EXPECT_TRUE(x.ok()) says only "false".
#pragma once

#include <gtest/gtest.h>

#include <concepts>
#include <string>
#include <type_traits>

#include "common/status.h"

namespace meshload::testing {

template <typename T>
Status StatusOf(const T& v) {
  if constexpr (std::is_convertible_v<const T&, Status>) {
    return v;
  } else if constexpr (requires { { v.status() } -> std::convertible_to<Status>; }) {
    return v.status();
  } else if constexpr (requires { { v.ToStatus() } -> std::convertible_to<Status>; }) {
    return v.ok() ? Status() : v.ToStatus();
  } else if constexpr (requires { { v.message() } -> std::convertible_to<std::string>; }) {
    return v.ok() ? Status() : Status(StatusCode::kInternal, std::string(v.message()));
  } else {
    return v.ok() ? Status() : Status(StatusCode::kInternal, "ok() is false");
  }
}

template <typename T>
::testing::AssertionResult IsOkFormat(const char* text, const T& value) {
  if (value.ok()) return ::testing::AssertionSuccess();
  const Status st = StatusOf(value);
  return ::testing::AssertionFailure() << text << " is not OK: " << st.ToString() << " ("
                                       << StatusCodeName(st.code()) << ")";
}

}  // namespace meshload::testing

#define EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::meshload::testing::IsOkFormat, (expr))
#define ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::meshload::testing::IsOkFormat, (expr))
