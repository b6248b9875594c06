#include "common/manager.h"

#include "common/logging.h"

namespace meshload {

Status Manager::Start() {
  for (; started_ < runnables_.size(); ++started_) {
    const Runnable& r = runnables_[started_];
    if (!r.start) continue;
    if (Status st = r.start(); !st.ok()) {
      LogError("cannot start", {{"program", program_}, {"part", r.name}, {"error", st.ToString()}});
      Stop();
      return Status(st.code(), r.name + ": " + st.message(), st.location());
    }
  }
  return Status::Ok();
}

void Manager::Stop() {
  while (started_ > 0) {
    const Runnable& r = runnables_[--started_];
    if (r.stop) r.stop();
  }
}

}  // namespace meshload
