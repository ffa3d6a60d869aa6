"""A named shared-memory segment and the operating system's parts a ring across processes needs.

- The segment is a file under `/dev/shm` (what POSIX `shm_open` makes), opened with `O_NOFOLLOW`,
  mode 0600, and mapped with `mmap`. Not `multiprocessing.shared_memory`: before Python 3.13 its
  resource tracker unlinks a segment when *any* process that attached it exits (cpython #82300).
  The name lives until `unlink`; the memory until the last process unmaps it.
- The lock is `flock` on the segment's file, taken after a thread lock: the kernel drops it when
  its holder dies, whatever instruction it was at, so a killed process never blocks the others.
- Waiting is a futex on a 32-bit word of the segment (`FUTEX_WAIT` with a timeout): a waiting
  process sleeps in the kernel and uses no CPU; `FUTEX_WAKE` wakes it.
- A process is known by its pid and its start time (`/proc/PID/stat`), so a reused pid is not
  taken for the process that died.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import platform
import re
import stat
import threading

from devbridge.errors import InvalidArgumentError, RangeError, RingCorruptError, short

#: Where named segments live (a tmpfs: memory, not disk).
SHM_DIR = "/dev/shm"
#: A segment's name: what `shm_open` accepts, without the leading slash (the same name in every process).
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")

#: The futex system call's number on each machine Linux runs this on (its syscall tables).
FUTEX_SYSCALLS = {"x86_64": 202, "aarch64": 98, "ppc64le": 221, "s390x": 238}
_SYS_FUTEX = FUTEX_SYSCALLS.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_libc = ctypes.CDLL(None, use_errno=True)  # its calls release the GIL


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def segment_path(name: object) -> str:
    """The file of the segment named `name`; ARG-1 for what is not a segment name."""
    if type(name) is not str or not _NAME.fullmatch(name.removeprefix("/")):
        raise InvalidArgumentError(
            "ARG-1", f"a ring's name must be 1 to 200 letters, digits, '_', '.' or '-', got {short(name)}"
        )
    return os.path.join(SHM_DIR, name.removeprefix("/"))


class Segment:
    """One process's mapping of a named segment: its bytes, its lock, its futex words."""

    def __init__(self, path: str, fd: int, size: int) -> None:
        self.path = path
        self._fd = fd
        # every page mapped now (MAP_POPULATE), not on a first write in the middle of a copy
        self.map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        self.size = size
        self._words: dict[int, ctypes.c_uint32] = {}  # futex words by byte offset (they pin the map)

    @classmethod
    def create(cls, name: object, size: int) -> Segment:
        """A new segment of `size` zero bytes; ARG-1 when the name is taken."""
        path = segment_path(name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            raise InvalidArgumentError("ARG-1", f"a shared-memory segment named {name!r} exists already") from None
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            os.ftruncate(fd, size)
            try:  # the memory taken now: a full /dev/shm is an error here, not a SIGBUS on a write later
                os.posix_fallocate(fd, 0, size)
            except OSError as e:
                raise RangeError("RANGE-1", f"no room for a ring of {size} B in {SHM_DIR}: {e.strerror}") from None
            return cls(path, fd, size)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise

    @classmethod
    def open(cls, name: object, least: int) -> Segment:
        """The segment named `name`, when it is a regular file of this user's, readable and
        writable by this user only, of at least `least` bytes (SHM-1 otherwise)."""
        path = segment_path(name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise InvalidArgumentError("ARG-1", f"no shared-memory segment is named {name!r}") from None
        except OSError as e:  # a link (ELOOP), a segment this user may not open (EACCES), ...
            raise RingCorruptError("SHM-1", f"{name!r} cannot be opened as a ring: {e.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise RingCorruptError("SHM-1", f"{name!r} is not a shared-memory segment")
            if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
                raise RingCorruptError("SHM-1", f"{name!r} is not this user's alone (owner or mode)")
            if info.st_size < least:
                raise RingCorruptError("SHM-1", f"{name!r} is {info.st_size} B: too short for a ring")
            return cls(path, fd, info.st_size)
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def unlink(name: object) -> None:
        """Remove the name (mappings stay valid until unmapped); ARG-1 when there is none."""
        try:
            os.unlink(segment_path(name))
        except FileNotFoundError:
            raise InvalidArgumentError("ARG-1", f"no shared-memory segment is named {name!r}") from None

    def locked_after(self, thread_lock: threading.Lock | None) -> _Locked:
        """The segment's lock (`with lock:`), taken after `thread_lock` (None: one the caller
        already holds), for a caller whose every use of the segment holds that thread lock first:
        a `flock` keeps other processes out, not other threads of this one. The kernel drops a
        dead holder's `flock`, so a killed process never keeps it."""
        return _Locked(self._fd, thread_lock)

    def lock_held(self) -> bool:
        """Whether some process holds the segment's lock at this moment (a look: never waits)."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        return False

    def _word(self, offset: int) -> ctypes.c_uint32:
        word = self._words.get(offset)
        if word is None:
            word = self._words[offset] = ctypes.c_uint32.from_buffer(self.map, offset)
        return word

    def wait(self, offset: int, seen: int, timeout: float) -> None:
        """Sleep until the 32-bit word at `offset` is woken, no longer holds `seen`, or `timeout`
        seconds pass (no spinning: the kernel holds the sleeper)."""
        word = self._word(offset)
        if _SYS_FUTEX is None:  # no futex number known for this machine: a short sleep instead
            threading.Event().wait(min(timeout, 0.001))
            return
        sec = int(timeout)
        spec = _Timespec(sec, int((timeout - sec) * 1e9))
        if _libc.syscall(_SYS_FUTEX, ctypes.byref(word), _FUTEX_WAIT, ctypes.c_uint32(seen), ctypes.byref(spec), 0, 0):
            code = ctypes.get_errno()
            if code not in (errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR):
                raise OSError(code, os.strerror(code))

    def wake(self, offset: int) -> None:
        """Wake every process sleeping on the word at `offset`."""
        if _SYS_FUTEX is not None:
            _libc.syscall(_SYS_FUTEX, ctypes.byref(self._word(offset)), _FUTEX_WAKE, 0x7FFFFFFF, 0, 0, 0)

    def close(self) -> bool:
        """Unmap and close. False when a view of the bytes is still held somewhere: the map then
        goes when the last view does."""
        self._words.clear()
        os.close(self._fd)
        try:
            self.map.close()
        except BufferError:
            return False
        return True


_TRIES = 20  # non-blocking tries of the segment's lock before a blocking one


class _Locked:
    """The segment's lock as a context manager: a thread lock (if any), then `flock` on the file."""

    __slots__ = ("_fd", "_thread_lock")

    def __init__(self, fd: int, thread_lock: threading.Lock | None) -> None:
        self._fd = fd
        self._thread_lock = thread_lock

    def __enter__(self) -> None:
        if self._thread_lock is not None:
            self._thread_lock.acquire()
        try:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the usual case: free
            except BlockingIOError:
                self._wait()
        except BaseException:
            if self._thread_lock is not None:
                self._thread_lock.release()
            raise

    def _wait(self) -> None:
        # Held for microseconds: a few tries before sleeping in the kernel, whose wake-up
        # costs more than the wait (an adaptive lock; never a wait for an event).
        for _ in range(_TRIES):
            os.sched_yield()
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        if self._thread_lock is not None:
            self._thread_lock.release()


def _start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), None when it is gone or a zombie,
    or -1 when /proc cannot say (no file descriptor left, ...): not known dead."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return -1
    fields = text[text.rfind(b")") + 2 :].split()  # after the command name, which may hold spaces
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


_me: tuple[int, int] = (0, 0)


def this_process() -> tuple[int, int]:
    """This process's pid and start time (read again after a fork)."""
    global _me
    pid = os.getpid()
    if _me[0] != pid:
        _me = (pid, _start_time(pid) or 0)
    return _me


def alive(pid: int, started: int) -> bool:
    """Whether the process that had `pid` and started at `started` still runs (not a zombie).
    Only a process known dead is not alive: when /proc cannot answer, it is taken as alive."""
    if pid <= 0:
        return False
    now = _start_time(pid)
    return now == started or now == -1
