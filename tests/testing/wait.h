// Waiting in tests for something to happen, instead of sleeping for a fixed
// time and hoping it has happened by then. Shared by every test binary.
//
//   ASSERT_TRUE(WaitFor([&] { return server.running(); }, 10s)) << "the server did not start";
//
// Deadlines are generous (the tests run under ASan and TSan on slow, shared
// machines): a passing test only waits as long as the condition takes. A
// fixed sleep is still right where the time passing is the point (a slow
// server, a timeout that must elapse, checking that something does NOT
// happen); say why next to it.
#pragma once

#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

namespace meshload::testing {

/// Calls `pred` (on this thread) every `poll` until it returns true, then
/// returns true; false once `deadline` has passed and a last call still
/// says no.
template <class Pred>
[[nodiscard]] bool WaitFor(Pred&& pred, std::chrono::milliseconds deadline,
                           std::chrono::milliseconds poll = std::chrono::milliseconds(5)) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (true) {
    if (pred()) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(poll);
  }
}

// ---- another thread blocked ----------------------------------------------
//
// A test that must act only once another thread is blocked (in a Get on an
// empty queue, waiting for a slot, in a read) records the thread's id on
// that thread just before the call, and waits for it to be asleep:
//
//   std::atomic<pid_t> tid{0};
//   std::thread t([&] { tid = CurrentThreadId(); queue.Get(&key); });
//   EXPECT_TRUE(WaitFor([&] { return tid != 0 && ThreadIsAsleep(tid); }, 10s));
//
// A thread may also sleep for a moment on its way there (a page fault, a
// contended lock), so this can say yes a little early: use it where acting
// early makes the test less strict, never wrong.

/// The calling thread's kernel id (gettid(2)).
inline pid_t CurrentThreadId() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

/// Whether thread `tid` of this process is asleep in the kernel: state S or
/// D in /proc/self/task/TID/stat (a futex: a mutex or condition variable;
/// poll, accept, a blocking read). False for a thread that has exited.
inline bool ThreadIsAsleep(pid_t tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t name_end = stat.rfind(')');  // the name (comm) may hold spaces and parentheses
  if (name_end == std::string::npos || name_end + 2 >= stat.size()) return false;
  const char state = stat[name_end + 2];
  return state == 'S' || state == 'D';
}

}  // namespace meshload::testing
