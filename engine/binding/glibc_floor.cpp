// The addons ship to machines with an older glibc than the build machine's: the floor is glibc 2.28 (RHEL 8,
// Debian 10, Ubuntu 20.04; docs/packing.md, "Compatibility floors"). The linker binds every glibc symbol to
// its newest version, so the engine, and the static libstdc++, libgcc and CUDA runtime linked into an addon,
// would need whatever the build machine's glibc has (2.36 here). Each symbol above the floor is defined here,
// hidden: every reference inside the addon binds to this definition, which calls the version the floor's glibc
// exports (`.symver`) or, for the one function 2.28 lacks, does the same work. Hidden, so Node and other
// libraries never see them. test/floors.test.ts reads the addons' version needs and fails on any above the
// floor, naming the symbol to add here.
//
// Symbols that moved from libpthread and libdl into libc in 2.34 keep their old versions in libc, so these
// forwarders link against 2.36's libc and resolve, on 2.28, in libpthread.so.0, libdl.so.2 and librt.so.1,
// which the addons list as needed (engine/CMakeLists.txt).
#include <link.h>
#include <sys/random.h>

#include <cstddef>
#include <cstdint>

#define A2D_HIDDEN extern "C" __attribute__((visibility("hidden")))

// A2D_AT_FLOOR(ret, name, version, params, args): `name` (hidden) calls `name@version`. The definition is
// named through an asm label: GCC drops the visibility of a definition named like a builtin (exp, pow).
#define A2D_AT_FLOOR(ret, name, version, params, args)           \
  extern "C" ret a2d_floor_##name params;                        \
  __asm__(".symver a2d_floor_" #name "," #name "@" version);     \
  A2D_HIDDEN ret a2d_pinned_##name params __asm__(#name);        \
  ret a2d_pinned_##name params { return a2d_floor_##name args; }

// libm: 2.29 added faster exp, log and pow under a new version; the old ones compute the same values.
A2D_AT_FLOOR(double, exp, "GLIBC_2.2.5", (double x), (x))
A2D_AT_FLOOR(double, log, "GLIBC_2.2.5", (double x), (x))
A2D_AT_FLOOR(double, pow, "GLIBC_2.2.5", (double x, double y), (x, y))

// stat and friends became functions in 2.33; before, the headers called __xstat with a version number (1).
struct stat;
struct stat64;
A2D_AT_FLOOR(int, __xstat, "GLIBC_2.2.5", (int v, const char* path, struct stat* buf), (v, path, buf))
A2D_AT_FLOOR(int, __lxstat, "GLIBC_2.2.5", (int v, const char* path, struct stat* buf), (v, path, buf))
A2D_AT_FLOOR(int, __fxstat, "GLIBC_2.2.5", (int v, int fd, struct stat* buf), (v, fd, buf))
A2D_AT_FLOOR(int, __fxstat64, "GLIBC_2.2.5", (int v, int fd, struct stat64* buf), (v, fd, buf))
A2D_AT_FLOOR(int, __xstat64, "GLIBC_2.2.5", (int v, const char* path, struct stat64* buf), (v, path, buf))
A2D_HIDDEN int stat(const char* path, struct stat* buf) { return a2d_floor___xstat(1, path, buf); }
A2D_HIDDEN int lstat(const char* path, struct stat* buf) { return a2d_floor___lxstat(1, path, buf); }
A2D_HIDDEN int fstat(int fd, struct stat* buf) { return a2d_floor___fxstat(1, fd, buf); }
A2D_HIDDEN int fstat64(int fd, struct stat64* buf) { return a2d_floor___fxstat64(1, fd, buf); }
A2D_HIDDEN int stat64(const char* path, struct stat64* buf) { return a2d_floor___xstat64(1, path, buf); }

// libpthread and libdl moved into libc in 2.34 under new versions; the old ones are the same functions.
A2D_AT_FLOOR(int, pthread_create, "GLIBC_2.2.5", (void* thread, const void* attr, void* (*start)(void*), void* arg), (thread, attr, start, arg))
A2D_AT_FLOOR(int, pthread_join, "GLIBC_2.2.5", (unsigned long thread, void** result), (thread, result))
A2D_AT_FLOOR(int, pthread_detach, "GLIBC_2.2.5", (unsigned long thread), (thread))
A2D_AT_FLOOR(int, pthread_once, "GLIBC_2.2.5", (int* once, void (*init)(void)), (once, init))
A2D_AT_FLOOR(int, pthread_key_create, "GLIBC_2.2.5", (unsigned* key, void (*destructor)(void*)), (key, destructor))
A2D_AT_FLOOR(int, __pthread_key_create, "GLIBC_2.2.5", (unsigned* key, void (*destructor)(void*)), (key, destructor))
A2D_AT_FLOOR(int, pthread_key_delete, "GLIBC_2.2.5", (unsigned key), (key))
A2D_AT_FLOOR(void*, pthread_getspecific, "GLIBC_2.2.5", (unsigned key), (key))
A2D_AT_FLOOR(int, pthread_setspecific, "GLIBC_2.2.5", (unsigned key, const void* value), (key, value))

// The static CUDA runtime: the driver is opened with dlopen, and its locks, semaphores and shared memory are
// libpthread's and librt's of old (2.2.5, dlmopen 2.3.4).
A2D_AT_FLOOR(void*, dlopen, "GLIBC_2.2.5", (const char* file, int mode), (file, mode))
A2D_AT_FLOOR(void*, dlmopen, "GLIBC_2.3.4", (long lmid, const char* file, int mode), (lmid, file, mode))
A2D_AT_FLOOR(void*, dlsym, "GLIBC_2.2.5", (void* handle, const char* name), (handle, name))
A2D_AT_FLOOR(void*, dlvsym, "GLIBC_2.2.5", (void* handle, const char* name, const char* version), (handle, name, version))
A2D_AT_FLOOR(int, dlclose, "GLIBC_2.2.5", (void* handle), (handle))
A2D_AT_FLOOR(char*, dlerror, "GLIBC_2.2.5", (void), ())
A2D_AT_FLOOR(int, shm_open, "GLIBC_2.2.5", (const char* name, int flags, unsigned mode), (name, flags, mode))
A2D_AT_FLOOR(int, shm_unlink, "GLIBC_2.2.5", (const char* name), (name))
A2D_AT_FLOOR(int, pthread_kill, "GLIBC_2.2.5", (unsigned long thread, int signal), (thread, signal))
A2D_AT_FLOOR(int, pthread_mutex_trylock, "GLIBC_2.2.5", (void* mutex), (mutex))
A2D_AT_FLOOR(int, pthread_mutexattr_init, "GLIBC_2.2.5", (void* attr), (attr))
A2D_AT_FLOOR(int, pthread_mutexattr_destroy, "GLIBC_2.2.5", (void* attr), (attr))
A2D_AT_FLOOR(int, pthread_mutexattr_settype, "GLIBC_2.2.5", (void* attr, int type), (attr, type))
A2D_AT_FLOOR(int, pthread_mutexattr_setpshared, "GLIBC_2.2.5", (void* attr, int shared), (attr, shared))
A2D_AT_FLOOR(int, pthread_condattr_setpshared, "GLIBC_2.2.5", (void* attr, int shared), (attr, shared))
A2D_AT_FLOOR(int, pthread_rwlock_init, "GLIBC_2.2.5", (void* lock, const void* attr), (lock, attr))
A2D_AT_FLOOR(int, pthread_rwlock_destroy, "GLIBC_2.2.5", (void* lock), (lock))
A2D_AT_FLOOR(int, pthread_rwlock_rdlock, "GLIBC_2.2.5", (void* lock), (lock))
A2D_AT_FLOOR(int, pthread_rwlock_tryrdlock, "GLIBC_2.2.5", (void* lock), (lock))
A2D_AT_FLOOR(int, pthread_rwlock_timedrdlock, "GLIBC_2.2.5", (void* lock, const void* until), (lock, until))
A2D_AT_FLOOR(int, pthread_rwlock_wrlock, "GLIBC_2.2.5", (void* lock), (lock))
A2D_AT_FLOOR(int, pthread_rwlock_trywrlock, "GLIBC_2.2.5", (void* lock), (lock))
A2D_AT_FLOOR(int, pthread_rwlock_timedwrlock, "GLIBC_2.2.5", (void* lock, const void* until), (lock, until))
A2D_AT_FLOOR(int, pthread_rwlock_unlock, "GLIBC_2.2.5", (void* lock), (lock))
A2D_AT_FLOOR(int, pthread_rwlockattr_init, "GLIBC_2.2.5", (void* attr), (attr))
A2D_AT_FLOOR(int, pthread_rwlockattr_destroy, "GLIBC_2.2.5", (void* attr), (attr))
A2D_AT_FLOOR(int, pthread_rwlockattr_setpshared, "GLIBC_2.2.5", (void* attr, int shared), (attr, shared))
A2D_AT_FLOOR(int, sem_init, "GLIBC_2.2.5", (void* sem, int shared, unsigned value), (sem, shared, value))
A2D_AT_FLOOR(int, sem_destroy, "GLIBC_2.2.5", (void* sem), (sem))
A2D_AT_FLOOR(int, sem_wait, "GLIBC_2.2.5", (void* sem), (sem))
A2D_AT_FLOOR(int, sem_trywait, "GLIBC_2.2.5", (void* sem), (sem))
A2D_AT_FLOOR(int, sem_timedwait, "GLIBC_2.2.5", (void* sem, const void* until), (sem, until))
A2D_AT_FLOOR(int, sem_post, "GLIBC_2.2.5", (void* sem), (sem))

// libstdc++ skips atomic reference counts while this says the process has one thread (2.32); zero is
// always correct, only slower, and Node is never single-threaded anyway.
extern "C" {
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;
}

// libstdc++.a refers to arc4random (2.36) from std::random_device, which the engine never uses.
A2D_HIDDEN uint32_t arc4random(void) {
  uint32_t value = 0;
  while (getrandom(&value, sizeof value, 0) != static_cast<ssize_t>(sizeof value)) {
  }
  return value;
}

// libgcc's unwinder finds the unwind tables of the code that threw through _dl_find_object (2.35) and has no
// other path once it was built with it; the tables are the PT_GNU_EH_FRAME segment of the loaded object
// that holds the address, which dl_iterate_phdr (every glibc) lists.
namespace {
struct FindObject {
  uintptr_t address;
  dl_find_object* result;
  bool found;
};

int find_object(dl_phdr_info* info, size_t, void* data) {
  auto* search = static_cast<FindObject*>(data);
  uintptr_t start = UINTPTR_MAX, end = 0;
  const void* eh_frame = nullptr;
  bool holds = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    const uintptr_t from = info->dlpi_addr + segment.p_vaddr;
    if (segment.p_type == PT_LOAD) {
      if (from < start) start = from;
      if (from + segment.p_memsz > end) end = from + segment.p_memsz;
      if (search->address >= from && search->address < from + segment.p_memsz) holds = true;
    } else if (segment.p_type == PT_GNU_EH_FRAME) {
      eh_frame = reinterpret_cast<const void*>(from);
    }
  }
  if (!holds) return 0;
  search->found = true;
  search->result->dlfo_flags = 0;
  search->result->dlfo_map_start = reinterpret_cast<void*>(start);
  search->result->dlfo_map_end = reinterpret_cast<void*>(end);
  search->result->dlfo_link_map = nullptr;
  search->result->dlfo_eh_frame = const_cast<void*>(eh_frame);
  return 1;
}
}  // namespace

A2D_HIDDEN int _dl_find_object(void* address, dl_find_object* result) noexcept {
  FindObject search{reinterpret_cast<uintptr_t>(address), result, false};
  dl_iterate_phdr(find_object, &search);
  return search.found ? 0 : -1;
}
