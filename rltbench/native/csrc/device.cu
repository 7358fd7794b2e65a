// Host-side device facts shared by the launchers: SM count and occupancy, cached per device.
#include "common.cuh"

#include <map>
#include <mutex>
#include <utility>

namespace rltb {

int sm_count() {
  static int counts[64] = {0};
  int device = 0;
  cudaGetDevice(&device);
  if (device < 0 || device >= 64) return 1;
  if (counts[device] == 0) {
    int n = 0;
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    counts[device] = n > 0 ? n : 1;
  }
  return counts[device];
}

int blocks_per_sm(const void* kernel, int threads) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> cache;
  int device = 0;
  cudaGetDevice(&device);
  const auto key = std::make_pair(kernel, threads * 256 + device);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, 0) != cudaSuccess || n < 1) n = 1;
  cache[key] = n;
  return n;
}

void prefer_shared_memory(const void* kernel) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, bool> done;
  int device = 0;
  cudaGetDevice(&device);
  std::lock_guard<std::mutex> lock(mu);
  if (done.count({kernel, device})) return;
  cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  cudaGetLastError();   // a hint: a device that refuses it runs the kernel all the same
  done[{kernel, device}] = true;
}

}  // namespace rltb
