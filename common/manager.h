/// \file
/// Manager: owns the order in which a process's long-running parts start
/// and stop, the way controller-runtime's manager runs its Runnables. Each
/// part is added with how to start it and how to stop it; Start() starts
/// them in the order added, and Stop() stops the ones that started in the
/// reverse order (what was started last depends on what started before it).
/// A part that fails to start stops the ones before it, and the error names
/// the part.
///
///   Manager m("meshload-controller");
///   m.Add({"metrics", [&] { return health.Start().status(); }, [&] { health.Stop(); }});
///   m.Add({"controller", [&] { return controller.Start(); }, [&] { controller.Stop(); }});
///   MESHLOAD_RETURN_IF_ERROR(m.Start());
///   ... wait for a signal ...
///   m.Stop();
///
/// Thread safety: not thread-safe; the process's main thread uses it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace meshload {

class Manager {
 public:
  struct Runnable {
    std::string name;               // in logs and errors
    std::function<Status()> start;  // returns once the part runs (or failed)
    std::function<void()> stop;     // returns once it stopped; may be empty
  };

  explicit Manager(std::string program) : program_(std::move(program)) {}
  ~Manager() { Stop(); }
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  void Add(Runnable runnable) { runnables_.push_back(std::move(runnable)); }

  /// Starts every part in the order added; the first that fails stops the
  /// ones already started (in reverse) and is returned, naming the part.
  Status Start();
  /// Stops the started parts in the reverse order (each once).
  void Stop();

 private:
  std::string program_;
  std::vector<Runnable> runnables_;
  size_t started_ = 0;
};

}  // namespace meshload
