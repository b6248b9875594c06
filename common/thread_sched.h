/// \file
/// Scheduling class of the data path's background threads.
///
/// The sidecar's producers, readers and server loop move bytes ahead of the
/// trainer (by `prefetch` steps); none of them is waited on by a person or
/// by the trainer's current step. Linux's SCHED_BATCH says exactly that:
/// the thread is CPU-bound and throughput-oriented, so its wake-ups do not
/// preempt other threads (the trainer keeps its core when a RELEASE wakes
/// the server loop or a free slot wakes a producer), while the trainer's
/// wake-ups still preempt it. Any unprivileged thread may switch itself to
/// SCHED_BATCH (no capability, allowed by the container runtimes' default
/// seccomp profiles); its nice value is unchanged.
///
/// Measured on a 2-vCPU VM (docs/benchmarks.md, run 8): TokenStream batches
/// of 131 kB stream about 15 % faster, because fewer wake-ups preempt a
/// producer part-way through a copy.
#pragma once

#include <string>

#include "common/status.h"

namespace meshload {

/// How the sidecar's data-path threads are scheduled.
enum class ThreadSched {
  kBatch,   // SCHED_BATCH (the default)
  kNormal,  // SCHED_OTHER, as created
};

/// "batch" or "normal" (the spelling of --staging-sched).
Result<ThreadSched> ParseThreadSched(const std::string& text);
const char* ToString(ThreadSched sched);

/// Puts the calling thread in the given class (only it, not the rest of
/// the process; threads it creates afterwards inherit the class).
Status SetCurrentThreadSched(ThreadSched sched);

/// SetCurrentThreadSched, and a warning naming `thread` when the system
/// refuses (a seccomp profile that denies it): the thread then runs as it
/// was, which costs throughput, not correctness. `kNormal` is applied too:
/// a process started in another class (`chrt -b`) passes it on to its
/// threads.
void ApplyThreadSched(ThreadSched sched, const char* thread);

}  // namespace meshload
