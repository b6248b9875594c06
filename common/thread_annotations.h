// Clang's thread-safety analysis (-Wthread-safety), through macros that are
// empty for other compilers. Every member a mutex protects says which
// (MESHLOAD_GUARDED_BY), every function that must be called with it held
// says so (MESHLOAD_REQUIRES), and one that takes it itself says it must
// not be held (MESHLOAD_EXCLUDES); the clang configuration of CI builds with
// -Wthread-safety -Werror, so the rules are checked, not only written.
// Use meshload::Mutex, MutexLock and CondVar (common/mutex.h): std::mutex
// carries no annotations in libstdc++.
// See https://clang.llvm.org/docs/ThreadSafetyAnalysis.html.
#pragma once

#if defined(__clang__)
#define MESHLOAD_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define MESHLOAD_THREAD_ANNOTATION(x)
#endif

#define MESHLOAD_CAPABILITY(x) MESHLOAD_THREAD_ANNOTATION(capability(x))
#define MESHLOAD_SCOPED_CAPABILITY MESHLOAD_THREAD_ANNOTATION(scoped_lockable)
#define MESHLOAD_GUARDED_BY(x) MESHLOAD_THREAD_ANNOTATION(guarded_by(x))
#define MESHLOAD_PT_GUARDED_BY(x) MESHLOAD_THREAD_ANNOTATION(pt_guarded_by(x))
#define MESHLOAD_ACQUIRED_BEFORE(...) MESHLOAD_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define MESHLOAD_ACQUIRED_AFTER(...) MESHLOAD_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define MESHLOAD_REQUIRES(...) MESHLOAD_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define MESHLOAD_ACQUIRE(...) MESHLOAD_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define MESHLOAD_RELEASE(...) MESHLOAD_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define MESHLOAD_ACQUIRE_SHARED(...) MESHLOAD_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define MESHLOAD_RELEASE_SHARED(...) MESHLOAD_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define MESHLOAD_REQUIRES_SHARED(...) MESHLOAD_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define MESHLOAD_TRY_ACQUIRE(...) MESHLOAD_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define MESHLOAD_EXCLUDES(...) MESHLOAD_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define MESHLOAD_ASSERT_CAPABILITY(x) MESHLOAD_THREAD_ANNOTATION(assert_capability(x))
#define MESHLOAD_RETURN_CAPABILITY(x) MESHLOAD_THREAD_ANNOTATION(lock_returned(x))
// For the few functions the analysis cannot follow (a lock handed between
// functions by a callback); each use says why.
#define MESHLOAD_NO_THREAD_SAFETY_ANALYSIS MESHLOAD_THREAD_ANNOTATION(no_thread_safety_analysis)
