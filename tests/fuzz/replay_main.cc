// Runs a libFuzzer target over every file of the given corpus directories,
// without libFuzzer: a regression test that builds with any compiler and
// keeps past findings (and the seeds) passing on every CI run.
//
//   npy_header_replay DIR...   -> "N passed, 0 failed" (a crash fails the test)

#include <dirent.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  size_t ran = 0;
  for (int i = 1; i < argc; ++i) {
    DIR* dir = opendir(argv[i]);
    if (!dir) {
      std::fprintf(stderr, "cannot open corpus directory %s\n", argv[i]);
      return 2;
    }
    std::vector<std::string> files;
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] != '.') files.push_back(std::string(argv[i]) + "/" + e->d_name);
    }
    closedir(dir);
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++ran;
    }
  }
  if (ran == 0) {
    std::fprintf(stderr, "no corpus files found\n");
    return 2;
  }
  std::printf("%zu passed, 0 failed\n", ran);
  return 0;
}
