// Test shim (LD_PRELOAD): flock() and fcntl() record locks fail with errno DP_NOLOCK_ERRNO (default
// ENOSYS), as on a file system without locks; every other fcntl() command is passed through.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/file.h>

static int lock_errno(void) {
  const char* e = getenv("DP_NOLOCK_ERRNO");
  return e != NULL ? atoi(e) : ENOSYS;
}

int flock(int fd, int operation) {
  (void)fd;
  (void)operation;
  errno = lock_errno();
  return -1;
}

int fcntl(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  switch (cmd) {
    case F_SETLK:
    case F_SETLKW:
    case F_GETLK:
#ifdef F_OFD_SETLK
    case F_OFD_SETLK:
    case F_OFD_SETLKW:
    case F_OFD_GETLK:
#endif
      errno = lock_errno();
      return -1;
    default: {
      int (*real)(int, int, ...) = (int (*)(int, int, ...))dlsym(RTLD_NEXT, "fcntl");
      return real(fd, cmd, arg);
    }
  }
}
