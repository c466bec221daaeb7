/* aiosendfile._syscalls: the Linux system calls the standard library has no binding for, or
 * none that fits a request path.
 *
 * cachestat(2) (Linux >= 6.5) counts the pages of a range in the page cache; openat2(2) with
 * RESOLVE_CACHED (Linux >= 5.12) looks a path up and opens it only where that reads no disk;
 * accept4(2) takes a connection off a listening socket and answers its descriptor alone (the
 * standard library's accept formats the peer's address, and its EAGAIN, which ends every batch
 * of accepts, is an exception: together a tenth of a new connection's instructions, see
 * docs/performance.md). reopen_read opens a kept answer's file again, checks it against the
 * identity kept and reads (or probes) it in one call: a third of a warm request's instructions
 * went to doing that from Python. _platform calls them, and _lookup (those that take a path),
 * and nothing else: on a request path a ctypes
 * call costs 2-3 times a C call (docs/performance.md, "No ctypes on the request path"). Where
 * this module was not built (no compiler at install, AIOSENDFILE_NO_EXTENSIONS, not Linux),
 * _platform does without the first two, as on a kernel that lacks them, and accepts through the
 * standard library.
 *
 * The functions answer an int: what the call returns, or minus the errno, never an exception
 * for a refusal (the caller tells ENOSYS, EAGAIN, ELOOP... apart). cachestat and accept keep the
 * GIL: they read nothing and never wait (accept is made on a non-blocking socket), and taking
 * the GIL back can wait for another thread's switch interval, which costs more than the call.
 * openat2 lets it go, as the ctypes call did: its RESOLVE_CACHED bounds the path lookup, not the
 * file system's own open (an NFS or FUSE open asks a server or a daemon).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

/* ABI: what _platform checks before it uses the module (a stale build in a checkout is ignored). */
#define SYSCALLS_ABI 4

/* Both numbers are the same on every architecture of the unified syscall table. */
#if defined(SYS_cachestat)
#define NR_CACHESTAT SYS_cachestat
#elif defined(__x86_64__) || defined(__aarch64__) || defined(__riscv) || defined(__powerpc64__) || \
    defined(__s390x__) || defined(__loongarch64)
#define NR_CACHESTAT 451
#endif

#if defined(SYS_openat2)
#define NR_OPENAT2 SYS_openat2
#elif defined(__x86_64__) || defined(__aarch64__) || defined(__riscv) || defined(__powerpc64__) || \
    defined(__s390x__) || defined(__loongarch64)
#define NR_OPENAT2 437
#endif

#define RESOLVE_CACHED_FLAG 0x20

struct range_in {
    uint64_t off, len; /* struct cachestat_range */
};

struct cachestat_out {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

struct open_how_in {
    uint64_t flags, mode, resolve; /* struct open_how */
};

/* *value* (any integer-like object, as os.* takes) as an unsigned 64-bit value. */
static int
as_u64(PyObject *value, unsigned long long *out)
{
    PyObject *index = PyNumber_Index(value);
    if (index == NULL)
        return 0;
    unsigned long long v = PyLong_AsUnsignedLongLong(index);
    Py_DECREF(index);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return 0;
    *out = v;
    return 1;
}

static int
as_fd(PyObject *value, int *fd)
{
    long v = PyLong_AsLong(value);
    if (v == -1 && PyErr_Occurred())
        return 0;
    if (v < INT_MIN || v > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "fd out of range");
        return 0;
    }
    *fd = (int)v;
    return 1;
}

/* *value* as os.fsencode gives it: str (encoded, surrogateescape), bytes, or an os.PathLike of
   either; an unencodable str raises as it would there. A new reference, or NULL. */
static PyObject *
encoded_path(PyObject *value, const char *caller)
{
    PyObject *path = PyOS_FSPath(value);
    if (path == NULL)
        return NULL;
    PyObject *name = NULL;
    if (PyUnicode_Check(path))
        name = PyUnicode_EncodeFSDefault(path);
    else if (PyBytes_Check(path)) {
        name = path;
        Py_INCREF(name);
    }
    else
        PyErr_Format(PyExc_TypeError, "%s() takes a str, bytes or os.PathLike path", caller);
    Py_DECREF(path);
    return name;
}

PyDoc_STRVAR(cachestat_doc,
             "cachestat(fd, offset, size) -> int\n\n"
             "Pages of [offset, offset+size) in the page cache, or minus the errno.");

static PyObject *
syscalls_cachestat(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    int fd;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "cachestat() takes fd, offset and size");
        return NULL;
    }
    unsigned long long offset, size;
    if (!as_fd(args[0], &fd) || !as_u64(args[1], &offset) || !as_u64(args[2], &size))
        return NULL;
#ifdef NR_CACHESTAT
    struct range_in range = {offset, size};
    struct cachestat_out out;
    if (syscall(NR_CACHESTAT, fd, &range, &out, 0) != 0)
        return PyLong_FromLong(-(long)errno);
    return PyLong_FromUnsignedLongLong(out.nr_cache);
#else
    return PyLong_FromLong(-(long)ENOSYS);
#endif
}

PyDoc_STRVAR(openat2_cached_doc,
             "openat2_cached(path, flags, resolve) -> int\n\n"
             "openat2(AT_FDCWD, path, {flags, 0, resolve | RESOLVE_CACHED}): the descriptor, or\n"
             "minus the errno (a NUL in the path: -ENOENT, no such path).");

static PyObject *
syscalls_openat2_cached(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long flags, resolve;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "openat2_cached() takes path, flags and resolve");
        return NULL;
    }
    if (!as_u64(args[1], &flags) || !as_u64(args[2], &resolve))
        return NULL;
    PyObject *name = encoded_path(args[0], "openat2_cached");
    if (name == NULL)
        return NULL;
    const char *chars = PyBytes_AS_STRING(name);
    long result;
    if (memchr(chars, 0, (size_t)PyBytes_GET_SIZE(name)) != NULL)
        result = -(long)ENOENT; /* a NUL: no such path (the kernel would read up to it) */
    else {
#ifdef NR_OPENAT2
        struct open_how_in how = {flags, 0, resolve | RESOLVE_CACHED_FLAG};
        long fd;
        int err;
        Py_BEGIN_ALLOW_THREADS
        fd = syscall(NR_OPENAT2, AT_FDCWD, chars, &how, sizeof how);
        err = errno;
        Py_END_ALLOW_THREADS
        result = fd >= 0 ? fd : -(long)err;
#else
        result = -(long)ENOSYS;
#endif
    }
    Py_DECREF(name);
    return PyLong_FromLong(result);
}

PyDoc_STRVAR(accept_doc,
             "accept(fd) -> int\n\n"
             "accept4(fd, NULL, NULL, SOCK_CLOEXEC): the new connection's descriptor, or minus the\n"
             "errno (-EAGAIN: none waiting).");

static PyObject *
syscalls_accept(PyObject *Py_UNUSED(module), PyObject *value)
{
    int fd;
    if (!as_fd(value, &fd))
        return NULL;
    int conn = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
    return PyLong_FromLong(conn >= 0 ? (long)conn : -(long)errno);
}

/* A file time in nanoseconds, as os.stat_result's st_*_ns (exact past 2262 too). */
static PyObject *
time_ns(time_t sec, long nsec)
{
    if (sec > -9000000000LL && sec < 9000000000LL)
        return PyLong_FromLongLong((long long)sec * 1000000000LL + nsec);
    PyObject *s = PyLong_FromLongLong((long long)sec), *billion = PyLong_FromLong(1000000000L);
    PyObject *n = PyLong_FromLong(nsec), *product = NULL, *sum = NULL;
    if (s != NULL && billion != NULL && n != NULL && (product = PyNumber_Multiply(s, billion)) != NULL)
        sum = PyNumber_Add(product, n);
    Py_XDECREF(s);
    Py_XDECREF(billion);
    Py_XDECREF(n);
    Py_XDECREF(product);
    return sum;
}

/* A stat's identity as (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns), the values os.stat
   gives (_lookup.identity_of); a new reference, or NULL. */
static PyObject *
identity_of(const struct stat *st)
{
    PyObject *dev = st->st_dev == (dev_t)-1 ? PyLong_FromLong(-1)
                                             : PyLong_FromUnsignedLongLong((unsigned long long)st->st_dev);
    return Py_BuildValue("(NNNNN)", dev, PyLong_FromUnsignedLongLong((unsigned long long)st->st_ino),
                         PyLong_FromLongLong((long long)st->st_size),
                         time_ns(st->st_mtim.tv_sec, st->st_mtim.tv_nsec),
                         time_ns(st->st_ctim.tv_sec, st->st_ctim.tv_nsec));
}

/* Whether *st* has the identity *ident* (a tuple of identity_of's five ints) without building
   one: 1 yes, 0 no, -1 where it cannot be told so (not five ints that fit, a time out of range:
   the caller compares identity_of's tuple). */
static int
same_identity(PyObject *ident, const struct stat *st)
{
    if (!PyTuple_CheckExact(ident) || PyTuple_GET_SIZE(ident) != 5)
        return -1;
    long long want[5];
    for (Py_ssize_t i = 0; i < 5; i++) {
        PyObject *item = PyTuple_GET_ITEM(ident, i);
        int overflow = 0;
        if (!PyLong_CheckExact(item))
            return -1;
        want[i] = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (overflow || (want[i] == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return -1;
        }
    }
    if (st->st_mtim.tv_sec <= -9000000000LL || st->st_mtim.tv_sec >= 9000000000LL ||
        st->st_ctim.tv_sec <= -9000000000LL || st->st_ctim.tv_sec >= 9000000000LL ||
        (unsigned long long)st->st_dev > (unsigned long long)LLONG_MAX ||
        (unsigned long long)st->st_ino > (unsigned long long)LLONG_MAX)
        return -1;
    return want[0] == (long long)st->st_dev && want[1] == (long long)st->st_ino &&
           want[2] == (long long)st->st_size &&
           want[3] == (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec &&
           want[4] == (long long)st->st_ctim.tv_sec * 1000000000LL + st->st_ctim.tv_nsec;
}

PyDoc_STRVAR(stat_identity_doc,
             "stat_identity(path) -> tuple | int\n\n"
             "stat(path) as (st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns), the values\n"
             "os.stat gives, or minus the errno (a NUL in the path: -ENOENT).");

static PyObject *
syscalls_stat_identity(PyObject *Py_UNUSED(module), PyObject *value)
{
    PyObject *name = encoded_path(value, "stat_identity");
    if (name == NULL)
        return NULL;
    const char *chars = PyBytes_AS_STRING(name);
    if (memchr(chars, 0, (size_t)PyBytes_GET_SIZE(name)) != NULL) {
        Py_DECREF(name);
        return PyLong_FromLong(-(long)ENOENT);
    }
    struct stat st;
    int result, err;
    Py_BEGIN_ALLOW_THREADS /* (a lookup may read the disk, as os.stat's) */
    result = stat(chars, &st);
    err = errno;
    Py_END_ALLOW_THREADS
    Py_DECREF(name);
    if (result != 0)
        return PyLong_FromLong(-(long)err);
    return identity_of(&st);
}

/* What reopen_read answers for a file it opened and did not read whole (the third item): a
   transfer's warm_to (_outlet: PROBED_COLD, 0, or the size when probed warm), or REFUSED_NOWAIT
   where the file system refuses RWF_NOWAIT (the caller remembers its device). */
#define PROBED_COLD (-1)
#define REFUSED_NOWAIT (-2)

static int cachestat_missing = 0; /* the kernel said ENOSYS or EPERM: never asked again */

/* Whether every page of [0, size) is in the page cache: 1, 0, or -1 where cachestat cannot tell. */
static int
all_cached(int fd, unsigned long long size)
{
#ifdef NR_CACHESTAT
    if (cachestat_missing)
        return -1;
    struct range_in range = {0, size};
    struct cachestat_out out;
    if (syscall(NR_CACHESTAT, fd, &range, &out, 0) != 0) {
        if (errno == ENOSYS || errno == EPERM)
            cachestat_missing = 1;
        return -1;
    }
    unsigned long long page = (unsigned long long)sysconf(_SC_PAGESIZE);
    return out.nr_cache >= (size + page - 1) / page;
#else
    (void)fd;
    (void)size;
    return -1;
#endif
}

/* One RWF_NOWAIT read of *size* bytes at *offset*: what preadv2 answers, its errno in *err*. */
static ssize_t
read_nowait(int fd, char *into, size_t size, off_t offset, int *err)
{
#ifdef RWF_NOWAIT
    struct iovec iov = {into, size};
    ssize_t got = preadv2(fd, &iov, 1, offset, RWF_NOWAIT);
    *err = errno;
    return got;
#else
    (void)fd;
    (void)into;
    (void)size;
    (void)offset;
    *err = EOPNOTSUPP;
    return -1;
#endif
}

/* reopen_read's state for a failed RWF_NOWAIT read: some page would wait for the disk, the file
   system refuses the flag, or any other error (0: not read; the sender meets it again). */
static long long
nowait_failed(int err)
{
    if (err == EAGAIN)
        return PROBED_COLD;
    if (err == EOPNOTSUPP || err == ENOTSUP || err == EINVAL)
        return REFUSED_NOWAIT;
    return 0;
}

PyDoc_STRVAR(reopen_read_doc,
             "reopen_read(path, ident, head, read_max, probe_max) -> bytes | tuple | None\n\n"
             "A kept answer's file opened again (read-only, close-on-exec, non-blocking) if its fstat\n"
             "has the identity *ident*; else None, nothing left open. A file of at most *read_max*\n"
             "bytes whose pages are all cached is read with one RWF_NOWAIT read and closed: *head*\n"
             "followed by its bytes. Otherwise (fd, size, state): state -1 not all cached, -2 the\n"
             "file system refuses RWF_NOWAIT, its size if at most *probe_max* bytes and every page\n"
             "cached (cachestat and its last page read), 0 not probed.");

static PyObject *
syscalls_reopen_read(PyObject *Py_UNUSED(module), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "reopen_read() takes path, ident, head, read_max and probe_max");
        return NULL;
    }
    PyObject *ident = args[1], *head = args[2];
    if (!PyBytes_Check(head)) {
        PyErr_SetString(PyExc_TypeError, "reopen_read() takes a bytes head");
        return NULL;
    }
    long long read_max = PyLong_AsLongLong(args[3]), probe_max;
    if (read_max == -1 && PyErr_Occurred())
        return NULL;
    probe_max = PyLong_AsLongLong(args[4]);
    if (probe_max == -1 && PyErr_Occurred())
        return NULL;
    PyObject *name = encoded_path(args[0], "reopen_read");
    if (name == NULL)
        return NULL;
    const char *chars = PyBytes_AS_STRING(name);
    if (memchr(chars, 0, (size_t)PyBytes_GET_SIZE(name)) != NULL) {
        Py_DECREF(name);
        Py_RETURN_NONE;
    }
    struct stat st;
    int fd, result = -1;
    Py_BEGIN_ALLOW_THREADS /* (a lookup or an open may wait, as os.open's) */
    fd = open(chars, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd >= 0)
        result = fstat(fd, &st);
    Py_END_ALLOW_THREADS
    Py_DECREF(name);
    if (fd < 0)
        Py_RETURN_NONE;
    int same = result == 0 ? same_identity(ident, &st) : 0;
    if (same < 0) { /* (told by identity_of's own tuple) */
        PyObject *now = identity_of(&st);
        same = now == NULL ? -1 : PyObject_RichCompareBool(now, ident, Py_EQ);
        Py_XDECREF(now);
    }
    if (same != 1) {
        close(fd);
        if (same < 0)
            return NULL; /* (no memory, or a comparison that raised) */
        Py_RETURN_NONE;
    }
    long long size = (long long)st.st_size, state = 0;
    if (size <= read_max) {
        if (size == 0) {
            close(fd);
            Py_INCREF(head);
            return head;
        }
        int cached = all_cached(fd, (unsigned long long)size);
        if (cached == 0)
            state = PROBED_COLD; /* (a refused RWF_NOWAIT read would start the read-ahead here) */
        else {
            Py_ssize_t head_size = PyBytes_GET_SIZE(head);
            PyObject *out = PyBytes_FromStringAndSize(NULL, head_size + (Py_ssize_t)size);
            if (out == NULL) {
                close(fd);
                return NULL;
            }
            memcpy(PyBytes_AS_STRING(out), PyBytes_AS_STRING(head), (size_t)head_size);
            int err;
            ssize_t got = read_nowait(fd, PyBytes_AS_STRING(out) + head_size, (size_t)size, 0, &err);
            if (got == size) {
                close(fd);
                return out;
            }
            Py_DECREF(out);
            /* (short: the sender finds why, partly cached or truncated since) */
            state = got >= 0 ? 0 : nowait_failed(err);
        }
    }
    else if (size <= probe_max) {
        int cached = all_cached(fd, (unsigned long long)size);
        if (cached == 0)
            state = PROBED_COLD;
        else if (cached == 1) {
            /* All present: ready unless the last page is still being read in (_writer.is_cold). */
            char byte;
            int err;
            ssize_t got = read_nowait(fd, &byte, 1, (off_t)(size - 1), &err);
            state = got == 1 ? size : got < 0 ? nowait_failed(err) : 0;
        }
    }
    PyObject *opened = Py_BuildValue("(iLL)", fd, size, state);
    if (opened == NULL)
        close(fd);
    return opened;
}

static PyMethodDef syscalls_methods[] = {
    {"stat_identity", (PyCFunction)syscalls_stat_identity, METH_O, stat_identity_doc},
    {"accept", (PyCFunction)syscalls_accept, METH_O, accept_doc},
    {"reopen_read", (PyCFunction)(void (*)(void))syscalls_reopen_read, METH_FASTCALL, reopen_read_doc},
    {"cachestat", (PyCFunction)(void (*)(void))syscalls_cachestat, METH_FASTCALL, cachestat_doc},
    {"openat2_cached", (PyCFunction)(void (*)(void))syscalls_openat2_cached, METH_FASTCALL,
     openat2_cached_doc},
    {NULL, NULL, 0, NULL},
};

static int
syscalls_exec(PyObject *module)
{
    return PyModule_AddIntConstant(module, "ABI", SYSCALLS_ABI);
}

static PyModuleDef_Slot syscalls_slots[] = {
    {Py_mod_exec, syscalls_exec},
#ifdef Py_mod_multiple_interpreters
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#ifdef Py_mod_gil
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef syscalls_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "aiosendfile._syscalls",
    .m_doc = "cachestat(2), openat2(2) with RESOLVE_CACHED and accept4(2), for aiosendfile._platform only.",
    .m_size = 0,
    .m_methods = syscalls_methods,
    .m_slots = syscalls_slots,
};

PyMODINIT_FUNC
PyInit__syscalls(void)
{
    return PyModuleDef_Init(&syscalls_module);
}
