// Assertions on Status, Result<T> (and anything else with ok() that can say
// why: status(), ToStatus(), message()) that print the error when they fail:
//   EXPECT_OK(job);  ASSERT_OK(source->Read(...)) << "while reading";
// A bare EXPECT_TRUE(x.ok()) says only "false".
//
// And gmock matchers on the same, which print the code and message they got:
//   EXPECT_THAT(st, StatusIs(StatusCode::kInvalidArgument, HasSubstr("axes")));
//   EXPECT_THAT(result, StatusIs(StatusCode::kNotFound));
//   EXPECT_THAT(st, HasMessage(HasSubstr("truncated")));   // any error code
//   EXPECT_THAT(st, IsOk());
// The message matcher sees message() (not the location); for a plain string
// use EXPECT_THAT(st.message(), HasSubstr("...")).
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <concepts>
#include <optional>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

#include "common/status.h"

namespace meshload {

// How gtest and gmock print a Status or a Result ("Actual: ..."): the code
// and `location: message`, not the object's bytes. Found by ADL.
inline void PrintTo(const Status& st, std::ostream* os) {
  *os << StatusCodeName(st.code());
  if (!st.ok()) *os << ": \"" << st.ToString() << "\"";
}

template <typename T>
void PrintTo(const Result<T>& r, std::ostream* os) {
  if (r.ok()) {
    *os << "ok: " << ::testing::PrintToString(*r);
  } else {
    PrintTo(r.status(), os);
  }
}

namespace testing {

template <typename T>
Status StatusOf(const T& v) {
  if constexpr (std::is_convertible_v<const T&, Status>) {
    return v;
  } else if constexpr (requires {
                         { v.status() } -> std::convertible_to<Status>;
                       }) {
    return v.status();
  } else if constexpr (requires {
                         { v.ToStatus() } -> std::convertible_to<Status>;
                       }) {
    return v.ok() ? Status() : v.ToStatus();
  } else if constexpr (requires {
                         { v.message() } -> std::convertible_to<std::string>;
                       }) {
    return v.ok() ? Status() : Status(StatusCode::kInternal, std::string(v.message()));
  } else {
    return v.ok() ? Status() : Status(StatusCode::kInternal, "ok() is false");
  }
}

template <typename T>
::testing::AssertionResult IsOkFormat(const char* text, const T& value) {
  if (value.ok()) return ::testing::AssertionSuccess();
  const Status st = StatusOf(value);
  return ::testing::AssertionFailure() << text << " is not OK: " << st.ToString() << " (" << StatusCodeName(st.code())
                                       << ")";
}

namespace internal_status {

// What IsOk(), StatusIs() and HasMessage() check, on a Status.
class StatusMatcherCore {
 public:
  enum class Want { kOk, kCode, kAnyError };

  StatusMatcherCore(Want want, StatusCode code, std::optional<::testing::Matcher<const std::string&>> message)
      : want_(want), code_(code), message_(std::move(message)) {}

  void DescribeTo(std::ostream* os) const {
    switch (want_) {
      case Want::kOk: *os << "is OK"; return;
      case Want::kCode: *os << "has code " << StatusCodeName(code_); break;
      case Want::kAnyError: *os << "is an error (any code)"; break;
    }
    if (message_) {
      *os << " and a message that ";
      message_->DescribeTo(os);
    }
  }

  void DescribeNegationTo(std::ostream* os) const {
    switch (want_) {
      case Want::kOk: *os << "is not OK"; return;
      case Want::kCode: *os << "has a code other than " << StatusCodeName(code_); break;
      case Want::kAnyError: *os << "is OK"; break;
    }
    if (message_) {
      *os << " or has a message that ";
      message_->DescribeNegationTo(os);
    }
  }

  bool MatchAndExplain(const Status& st, ::testing::MatchResultListener* listener) const {
    *listener << "whose code is " << StatusCodeName(st.code());
    if (!st.ok()) {
      *listener << " and message is " << ::testing::PrintToString(st.message());
      if (!st.location().empty()) {
        *listener << " (location " << ::testing::PrintToString(st.location()) << ")";
      }
    }
    switch (want_) {
      case Want::kOk: return st.ok();
      case Want::kCode:
        if (st.code() != code_) return false;
        break;
      case Want::kAnyError:
        if (st.ok()) return false;
        break;
    }
    if (!message_) return true;
    ::testing::StringMatchResultListener inner;
    const bool matched = message_->MatchAndExplain(st.message(), &inner);
    const std::string why = inner.str();
    if (!why.empty()) *listener << ", " << why;
    return matched;
  }

 private:
  Want want_;
  StatusCode code_;
  std::optional<::testing::Matcher<const std::string&>> message_;
};

// The core adapted to one argument type (Status, Result<T>, ...).
template <typename Arg>
class MonoStatusMatcher : public ::testing::MatcherInterface<Arg> {
 public:
  explicit MonoStatusMatcher(StatusMatcherCore core) : core_(std::move(core)) {}
  void DescribeTo(std::ostream* os) const override { core_.DescribeTo(os); }
  void DescribeNegationTo(std::ostream* os) const override { core_.DescribeNegationTo(os); }
  bool MatchAndExplain(Arg actual, ::testing::MatchResultListener* listener) const override {
    return core_.MatchAndExplain(StatusOf(actual), listener);
  }

 private:
  StatusMatcherCore core_;
};

// Polymorphic: converts to a Matcher of whatever type it is used on.
class StatusMatcher {
 public:
  explicit StatusMatcher(StatusMatcherCore core) : core_(std::move(core)) {}

  template <typename T>
  operator ::testing::Matcher<T>() const {  // NOLINT(google-explicit-constructor)
    return ::testing::Matcher<T>(new MonoStatusMatcher<const T&>(core_));
  }

 private:
  StatusMatcherCore core_;
};

}  // namespace internal_status

/// Matches an OK Status, or a Result<T> holding a value.
inline internal_status::StatusMatcher IsOk() {
  using internal_status::StatusMatcherCore;
  return internal_status::StatusMatcher(StatusMatcherCore(StatusMatcherCore::Want::kOk, StatusCode::kOk, std::nullopt));
}

/// Matches a Status (or Result<T>) whose code is `code`.
inline internal_status::StatusMatcher StatusIs(StatusCode code) {
  using internal_status::StatusMatcherCore;
  return internal_status::StatusMatcher(StatusMatcherCore(StatusMatcherCore::Want::kCode, code, std::nullopt));
}

/// Matches a Status (or Result<T>) whose code is `code` and whose message()
/// matches `message` (a matcher on std::string, e.g. HasSubstr("x"), or a
/// string to equal).
template <typename MessageMatcher>
internal_status::StatusMatcher StatusIs(StatusCode code, MessageMatcher&& message) {
  using internal_status::StatusMatcherCore;
  return internal_status::StatusMatcher(
      StatusMatcherCore(StatusMatcherCore::Want::kCode, code,
                        ::testing::MatcherCast<const std::string&>(std::forward<MessageMatcher>(message))));
}

/// Matches an error (not OK, any code) whose message() matches `message`.
template <typename MessageMatcher>
internal_status::StatusMatcher HasMessage(MessageMatcher&& message) {
  using internal_status::StatusMatcherCore;
  return internal_status::StatusMatcher(
      StatusMatcherCore(StatusMatcherCore::Want::kAnyError, StatusCode::kOk,
                        ::testing::MatcherCast<const std::string&>(std::forward<MessageMatcher>(message))));
}

}  // namespace testing
}  // namespace meshload

#define EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::meshload::testing::IsOkFormat, (expr))
#define ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::meshload::testing::IsOkFormat, (expr))
