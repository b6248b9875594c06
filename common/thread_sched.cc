#include "common/thread_sched.h"

#include <pthread.h>
#include <sched.h>

#include <cerrno>

#include "common/logging.h"

namespace meshload {

Result<ThreadSched> ParseThreadSched(const std::string& text) {
  if (text == "batch") return ThreadSched::kBatch;
  if (text == "normal") return ThreadSched::kNormal;
  return InvalidArgument("expected batch or normal, got '" + text + "'");
}

const char* ToString(ThreadSched sched) { return sched == ThreadSched::kBatch ? "batch" : "normal"; }

Status SetCurrentThreadSched(ThreadSched sched) {
  sched_param param{};
  param.sched_priority = 0;  // the only priority of SCHED_BATCH and SCHED_OTHER
  const int policy = sched == ThreadSched::kBatch ? SCHED_BATCH : SCHED_OTHER;
  // pthread_setschedparam acts on this thread alone (sched_setscheduler(0)
  // would too on Linux, but POSIX says process).
  const int rc = ::pthread_setschedparam(::pthread_self(), policy, &param);
  if (rc != 0) return IoErrorFromErrno(std::string("pthread_setschedparam(") + ToString(sched) + ")", "", rc);
  return Status::Ok();
}

void ApplyThreadSched(ThreadSched sched, const char* thread) {
  if (Status st = SetCurrentThreadSched(sched); !st.ok()) {
    LogWarn("cannot change the thread's scheduling class; it keeps the one it has",
            {{"thread", thread}, {"sched", ToString(sched)}, {"error", st.ToString()}});
  }
}

}  // namespace meshload
