// The addon ships to machines with an older glibc than the build machine's. libstdc++.a (linked
// statically) refers to arc4random, which glibc has only since 2.36, from std::random_device, which the
// engine never uses. Defining it here, hidden, keeps the addon's glibc floor at 2.35 (Ubuntu 22.04).
#include <sys/random.h>

#include <cstdint>

extern "C" __attribute__((visibility("hidden"))) uint32_t arc4random(void) {
  uint32_t value = 0;
  while (getrandom(&value, sizeof value, 0) != static_cast<ssize_t>(sizeof value)) {
  }
  return value;
}
