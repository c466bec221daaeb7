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
 * went to doing that from Python. PageReader is a thread of C that reads cold ranges into the
 * page cache and tells the loop through an eventfd when each is in, never taking the GIL (a
 * Python thread's hand-off of the GIL, and a timer guessing how long the read takes, cost a cold
 * small file three times its latency). _platform calls them, and _lookup (those that take a path),
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

#ifdef __linux__
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/sendfile.h>
#define HAS_PAGE_READER 1
#endif

/* ABI: what _platform checks before it uses the module (a stale build in a checkout is ignored). */
#define SYSCALLS_ABI 6

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

#ifdef HAS_PAGE_READER
/* PageReader: one thread of its own that brings ranges of files into the page cache, and never
 * takes the GIL. ask(fd, offset, size, token) queues a range (on a duplicate of fd, which the
 * thread closes); the thread asks the kernel for every range it took (POSIX_FADV_WILLNEED: the
 * device works on them together; what is asked meanwhile joins the batch), then waits for each
 * with a 1-byte read of its first and last page (read_through), and each done token is made
 * known through an eventfd the loop watches: fileno(), then done() for the tokens. No timer
 * guesses how long a read takes, and no Python runs off the loop's thread. A send (ask with a
 * socket and a head) is the range sent, not read: the thread sends the head and then the range
 * with sendfile (which waits for its pages there) on a duplicate of the socket it takes as it
 * begins, as far as the socket takes them, and done() says how far that was; cancel(token) holds
 * back one it has not begun (a connection gone, a wait given up), whose socket then was never
 * duplicated: the caller may close it once cancel() answers. close() (or the
 * object going away) closes the eventfd and the queued duplicates at once and ends the thread,
 * which frees what is left (it may be inside a read for a while; nothing waits for it). */

struct page_job {
    int fd;
    long long offset, size, token;
    int sock;      /* a send: the socket the range goes to, after head (the caller's number, kept
                      open by it until the send is begun or held back: the thread takes its own
                      duplicate as it begins, under the lock); else -1 */
    int flags;     /* the head's send flags (MSG_MORE) */
    char *head;    /* (malloc'd; NULL when empty) */
    size_t head_len;
};

/* What became of a range: read in, or (a send) how much of its head and of itself went. */
struct page_done {
    long long token, head_sent, file_sent;
    int err;  /* a send's errno: 0 (whole, or the file ended: file_sent short), EAGAIN (the socket
                 was full), ECANCELED (cancelled before it went) or why it failed */
    int send;
};

struct page_reader {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    struct page_job *jobs; /* queued, not yet taken by the thread */
    size_t njobs, jobs_cap;
    struct page_done *done; /* ranges read in (or sent), not yet taken by done() */
    size_t ndone, done_cap;
    long long *waiting; /* sends asked, neither begun nor cancelled yet */
    size_t nwaiting, waiting_cap;
    long long *cancelled; /* sends cancelled before the thread came to them */
    size_t ncancelled, cancelled_cap;
    long long sending; /* the send the thread is making (its token), else -1 */
    size_t owed; /* tokens asked and not yet taken by done(): done_cap never falls below it */
    int efd;
    int told; /* the eventfd was written since the last done(): no need to again */
    int running, closing;
    unsigned long generation; /* fork_generation when it was made */
};

typedef struct {
    PyObject_HEAD struct page_reader *r;
} PageReaderObject;

/* Bumped in each forked child (pthread_atfork, registered once a process): a reader made before
   the fork sees another generation. Read instead of getpid(), a system call on every call since
   glibc 2.25 (three a cold chunk, in ask, start and done). A child made without the fork
   handlers (a raw clone(2), glibc's _Fork) is not seen; os.fork() and multiprocessing run them,
   and a posix_spawn or vfork child runs no Python before it execs. */
static unsigned long fork_generation;
static pthread_once_t fork_watch = PTHREAD_ONCE_INIT;
static int fork_watch_failed;

static void
bump_fork_generation(void)
{
    __atomic_add_fetch(&fork_generation, 1, __ATOMIC_RELAXED);
}

static void
watch_forks(void)
{
    fork_watch_failed = pthread_atfork(NULL, NULL, bump_fork_generation) != 0;
}

static unsigned long
current_generation(void)
{
    return __atomic_load_n(&fork_generation, __ATOMIC_RELAXED);
}

/* (Under the lock, or before the thread starts.) What the Python object owned, closed at once as
   it goes: the eventfd and the duplicates still queued (a read the thread is making goes on). */
static void
job_free(struct page_job *job)
{
    close(job->fd);
    free(job->head);
    job->head = NULL;
}

static void
page_reader_close(struct page_reader *r)
{
    for (size_t i = 0; i < r->njobs; i++)
        job_free(&r->jobs[i]);
    r->njobs = 0;
    if (r->efd >= 0)
        close(r->efd);
    r->efd = -1;
    __atomic_store_n(&r->closing, 1, __ATOMIC_RELAXED);
}

static void
page_reader_free(struct page_reader *r)
{
    free(r->jobs);
    free(r->done);
    free(r->waiting);
    free(r->cancelled);
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->wake);
    free(r);
}

/* Wait until the range's pages are most likely in: a 1-byte read of its first page, then of its
   last, each of which waits for that page (the kernel was asked for all of them at once, and a
   read ahead's pages come in together unless the device is busy). Nothing else is read: a read
   of every page, through a scratch buffer or a sendfile to /dev/null, cost 10-25% more CPU a
   request at 64 connections on the cold mixed set (docs/performance.md). A page still on the way is the loop's to find: its probe of a chunk read in
   checks every page (_reading_in.reading_in), and waits again. */
static void
read_through(int fd, long long offset, long long size)
{
    char byte;
    long long last = offset + size - 1;
    long long ends[2] = {offset, last - last % 4096};
    for (int i = 0; i < 2; i++) {
        if (i == 1 && ends[1] <= ends[0])
            break;
        while (pread(fd, &byte, 1, (off_t)ends[i]) < 0 && errno == EINTR)
            ;
    }
}

/* Room for *need* items of *item* bytes in *array* (doubling): 0 if there is none (or it would
   overflow), the array as it was. */
static int
grow(void **array, size_t *cap, size_t need, size_t item)
{
    if (need <= *cap)
        return 1;
    size_t cap2 = *cap ? *cap : 64;
    while (cap2 < need) {
        if (cap2 > SIZE_MAX / 2)
            return 0;
        cap2 *= 2;
    }
    if (cap2 > SIZE_MAX / item)
        return 0;
    void *bigger = realloc(*array, cap2 * item);
    if (bigger == NULL)
        return 0;
    *array = bigger;
    *cap = cap2;
    return 1;
}

static void
hint(const struct page_job *jobs, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        if (jobs[i].size > 0) /* (0 would mean to the end of the file) */
            posix_fadvise(jobs[i].fd, (off_t)jobs[i].offset, (off_t)jobs[i].size, POSIX_FADV_WILLNEED);
}

/* (Under the lock.) Whether *token* is in *list* of *n*, and take it out (one of it). */
static int
take_token(long long *list, size_t *n, long long token)
{
    for (size_t i = 0; i < *n; i++)
        if (list[i] == token) {
            list[i] = list[--*n];
            return 1;
        }
    return 0;
}

/* A send: the head, then the range with sendfile, on *sock*, the thread's duplicate of the
   socket (non-blocking: a full socket stops it where it is, EAGAIN). sendfile waits here, in this
   thread, for any page not in yet: none of it on the loop's. */
static void
send_range(const struct page_job *job, int sock, struct page_done *d)
{
    while ((size_t)d->head_sent < job->head_len) {
        ssize_t n = send(sock, job->head + d->head_sent, job->head_len - (size_t)d->head_sent,
                         (job->size > 0 ? job->flags : 0) | MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            d->err = errno == EWOULDBLOCK ? EAGAIN : errno;
            return;
        }
        d->head_sent += n;
    }
    while (d->file_sent < job->size) {
        off_t offset = (off_t)(job->offset + d->file_sent);
        long long left = job->size - d->file_sent;
        ssize_t n = sendfile(sock, job->fd, &offset, (size_t)(left < 0x7ffff000LL ? left : 0x7ffff000LL));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            d->err = errno == EWOULDBLOCK ? EAGAIN : errno;
            return;
        }
        if (n == 0)
            return; /* the file ended early: file_sent short, err 0 */
        d->file_sent += n;
    }
}

static void *
page_reader_run(void *arg)
{
    struct page_reader *r = arg;
    struct page_job *batch = NULL;
    size_t batch_cap = 0;
    pthread_mutex_lock(&r->lock);
    for (;;) {
        while (r->njobs == 0 && !r->closing)
            pthread_cond_wait(&r->wake, &r->lock);
        if (r->closing)
            break;
        struct page_job *taken = r->jobs; /* the queue's array becomes the batch, and back */
        size_t n = r->njobs, taken_cap = r->jobs_cap;
        r->jobs = batch;
        r->jobs_cap = batch_cap;
        r->njobs = 0;
        batch = taken;
        batch_cap = taken_cap;
        pthread_mutex_unlock(&r->lock);
        hint(batch, 0, n);
        for (size_t i = 0; i < n; i++) {
            struct page_job *job = &batch[i];
            struct page_done d = {job->token, 0, 0, 0, job->sock >= 0};
            if (!d.send) {
                if (!__atomic_load_n(&r->closing, __ATOMIC_RELAXED)) /* (at worst one more read) */
                    if (job->size > 0)
                        read_through(job->fd, job->offset, job->size);
            }
            else {
                /* Begun under the lock: held back (cancel, close) before, or ours from here, on a
                   duplicate of the caller's socket taken now (the caller closes its own only once
                   cancel() has answered, which takes the lock too). */
                int sock = -1;
                pthread_mutex_lock(&r->lock);
                int skip = r->closing || take_token(r->cancelled, &r->ncancelled, job->token);
                if (!skip) {
                    take_token(r->waiting, &r->nwaiting, job->token);
                    r->sending = job->token;
                    sock = fcntl(job->sock, F_DUPFD_CLOEXEC, 0);
                    if (sock < 0)
                        d.err = errno;
                }
                pthread_mutex_unlock(&r->lock);
                if (skip)
                    d.err = ECANCELED;
                else if (sock >= 0) {
                    send_range(job, sock, &d);
                    close(sock);
                }
            }
            job_free(job);
            pthread_mutex_lock(&r->lock);
            r->sending = -1;
            if (!r->closing) {
                r->done[r->ndone++] = d; /* (room kept by ask: owed <= done_cap) */
                if (!r->told) { /* (one wake-up of the loop for all that is done by its next look) */
                    uint64_t one = 1;
                    while (write(r->efd, &one, sizeof one) < 0 && errno == EINTR)
                        ;
                    r->told = 1;
                }
            }
            /* What was asked meanwhile joins this batch: asked of the kernel now, not once the
               batch is read (a slow device works on all of it together). No room: it waits. */
            if (r->njobs && !r->closing && grow((void **)&batch, &batch_cap, n + r->njobs, sizeof *batch)) {
                size_t from = n;
                memcpy(batch + n, r->jobs, r->njobs * sizeof *batch);
                n += r->njobs;
                r->njobs = 0;
                pthread_mutex_unlock(&r->lock);
                hint(batch, from, n);
            }
            else
                pthread_mutex_unlock(&r->lock);
        }
        pthread_mutex_lock(&r->lock);
    }
    pthread_mutex_unlock(&r->lock);
    free(batch);
    page_reader_free(r);
    return NULL;
}

static PyObject *
page_reader_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "PageReader() takes no arguments");
        return NULL;
    }
    struct page_reader *r = calloc(1, sizeof *r);
    if (r == NULL)
        return PyErr_NoMemory();
    r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (r->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        free(r);
        return NULL;
    }
    r->sending = -1;
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->wake, NULL);
    r->generation = current_generation();
    PageReaderObject *self = (PageReaderObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        page_reader_close(r);
        page_reader_free(r);
        return NULL;
    }
    self->r = r;
    return (PyObject *)self;
}

/* Let the reader go: its eventfd and the duplicates still queued closed now, the rest freed by its
   thread once a read under way ends (or now, if it never started). */
static void
page_reader_release(PageReaderObject *self)
{
    struct page_reader *r = self->r;
    self->r = NULL;
    if (r == NULL)
        return;
    if (r->generation != current_generation()) {
        /* A forked child: its thread is not here, and its lock may have been held at the fork.
           Its own copies of the descriptors are closed (the parent's stay open), the rest left. */
        for (size_t i = 0; i < r->njobs; i++)
            close(r->jobs[i].fd);
        if (r->efd >= 0)
            close(r->efd);
        return;
    }
    pthread_mutex_lock(&r->lock);
    page_reader_close(r);
    if (r->running) {
        pthread_cond_signal(&r->wake); /* the thread frees the rest */
        pthread_mutex_unlock(&r->lock);
    }
    else {
        pthread_mutex_unlock(&r->lock);
        page_reader_free(r);
    }
}

static void
page_reader_dealloc(PageReaderObject *self)
{
    page_reader_release(self);
    PyTypeObject *type = Py_TYPE(self);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *
page_reader_close_method(PageReaderObject *self, PyObject *Py_UNUSED(ignored))
{
    page_reader_release(self);
    Py_RETURN_NONE;
}

/* Whether the reader may not be used here (an exception set): closed, or made before a fork. */
static int
closed(PageReaderObject *self)
{
    if (self->r == NULL) {
        PyErr_SetString(PyExc_ValueError, "the page reader is closed");
        return 1;
    }
    if (self->r->generation != current_generation()) {
        PyErr_SetString(PyExc_RuntimeError, "a PageReader is not used across fork()");
        return 1;
    }
    return 0;
}


PyDoc_STRVAR(page_reader_ask_doc,
             "ask(fd, offset, size, token[, sock, head, flags]) -> None\n\n"
             "Have the reader's thread bring [offset, offset+size) of fd into the page cache (on a\n"
             "duplicate of fd: the caller may close its own at once); token is given back by done().\n"
             "With sock (a non-blocking socket), head (bytes-like) and flags (head's send flags): the\n"
             "thread sends head, then the range with sendfile, to a duplicate of sock it takes as it\n"
             "begins, as far as the socket takes them, and done() gives back (token, head_sent,\n"
             "file_sent, errno). The caller keeps sock open until then, or until cancel() answers.");

static PyObject *
page_reader_ask(PageReaderObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    struct page_reader *r = self->r;
    int fd;
    long long offset, size, token;
    if (closed(self))
        return NULL;
    int sock = -1, flags = 0;
    if (nargs != 4 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "ask() takes fd, offset, size and token (and sock, head, flags)");
        return NULL;
    }
    if (!as_fd(args[0], &fd))
        return NULL;
    offset = PyLong_AsLongLong(args[1]);
    size = offset == -1 && PyErr_Occurred() ? -1 : PyLong_AsLongLong(args[2]);
    token = size == -1 && PyErr_Occurred() ? -1 : PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (offset < 0 || size < 0) {
        PyErr_SetString(PyExc_ValueError, "offset and size must not be negative");
        return NULL;
    }
    char *head = NULL;
    size_t head_len = 0;
    if (nargs == 7) {
        if (!as_fd(args[4], &sock)) /* (not duplicated here: see struct page_job) */
            return NULL;
        flags = PyLong_AsLong(args[6]);
        if (flags == -1 && PyErr_Occurred())
            return NULL;
        Py_buffer view;
        if (PyObject_GetBuffer(args[5], &view, PyBUF_SIMPLE) < 0)
            return NULL;
        if (view.len > 0) {
            head = malloc((size_t)view.len);
            if (head == NULL) {
                PyBuffer_Release(&view);
                return PyErr_NoMemory();
            }
            memcpy(head, view.buf, (size_t)view.len);
            head_len = (size_t)view.len;
        }
        PyBuffer_Release(&view);
    }
    int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (copy < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        free(head);
        return NULL;
    }
    pthread_mutex_lock(&r->lock);
    if (!grow((void **)&r->jobs, &r->jobs_cap, r->njobs + 1, sizeof *r->jobs) ||
        !grow((void **)&r->done, &r->done_cap, r->owed + 1, sizeof *r->done) ||
        (sock >= 0 && (!grow((void **)&r->waiting, &r->waiting_cap, r->owed + 1, sizeof *r->waiting) ||
                       !grow((void **)&r->cancelled, &r->cancelled_cap, r->owed + 1, sizeof *r->cancelled)))) {
        pthread_mutex_unlock(&r->lock);
        close(copy);
        free(head);
        return PyErr_NoMemory();
    }
    if (!r->running) {
        pthread_attr_t attr;
        pthread_t thread;
        sigset_t all, before;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &before); /* the thread takes no signal: they are the loop's */
        int failed = pthread_create(&thread, &attr, page_reader_run, r);
        pthread_sigmask(SIG_SETMASK, &before, NULL);
        pthread_attr_destroy(&attr);
        if (failed) {
            pthread_mutex_unlock(&r->lock);
            close(copy);
            free(head);
            errno = failed;
            return PyErr_SetFromErrno(PyExc_OSError);
        }
        r->running = 1;
    }
    r->jobs[r->njobs].fd = copy;
    r->jobs[r->njobs].offset = offset;
    r->jobs[r->njobs].size = size;
    r->jobs[r->njobs].token = token;
    r->jobs[r->njobs].sock = sock;
    r->jobs[r->njobs].flags = flags;
    r->jobs[r->njobs].head = head;
    r->jobs[r->njobs].head_len = head_len;
    r->njobs++;
    r->owed++;
    if (sock >= 0)
        r->waiting[r->nwaiting++] = token;
    pthread_mutex_unlock(&r->lock);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(page_reader_start_doc,
             "start() -> None\n\n"
             "Have the thread take every range asked so far (a loop's turn of them: one wake-up).");

static PyObject *
page_reader_start(PageReaderObject *self, PyObject *Py_UNUSED(ignored))
{
    struct page_reader *r = self->r;
    if (closed(self))
        return NULL;
    pthread_mutex_lock(&r->lock);
    int asked = r->njobs != 0;
    pthread_mutex_unlock(&r->lock);
    if (asked) /* (after the unlock: the woken thread does not wait for the lock at once) */
        pthread_cond_signal(&r->wake);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(page_reader_cancel_doc,
             "cancel(token) -> bool\n\n"
             "A send asked with token is not made if the thread has not begun it: True. False if it\n"
             "is being made, or was (done() gives back what went), or is no send asked.");

static PyObject *
page_reader_cancel(PageReaderObject *self, PyObject *arg)
{
    struct page_reader *r = self->r;
    if (closed(self))
        return NULL;
    long long token = PyLong_AsLongLong(arg);
    if (token == -1 && PyErr_Occurred())
        return NULL;
    pthread_mutex_lock(&r->lock);
    /* Only a send still waiting is held back: one begun, given back, a read or never asked is
       not, and leaves no mark (room for every send owed is kept by ask). */
    int cancelled = take_token(r->waiting, &r->nwaiting, token);
    if (cancelled)
        r->cancelled[r->ncancelled++] = token;
    else
        for (size_t i = 0; !cancelled && i < r->ncancelled; i++)
            cancelled = r->cancelled[i] == token; /* (asked again: still held back) */
    pthread_mutex_unlock(&r->lock);
    return PyBool_FromLong(cancelled);
}

PyDoc_STRVAR(page_reader_done_doc,
             "done() -> list[int | tuple[int, int, int, int]]\n\n"
             "The tokens of the ranges read in since the last call (the eventfd is read too); for a\n"
             "send, (token, head bytes sent, file bytes sent, errno).");

static PyObject *
page_reader_done(PageReaderObject *self, PyObject *Py_UNUSED(ignored))
{
    struct page_reader *r = self->r;
    uint64_t count;
    if (closed(self))
        return NULL;
    while (read(r->efd, &count, sizeof count) < 0 && errno == EINTR)
        ; /* (EAGAIN: nothing since; the list is read anyway) */
    pthread_mutex_lock(&r->lock);
    PyObject *tokens = PyList_New((Py_ssize_t)r->ndone);
    if (tokens != NULL) {
        for (size_t i = 0; i < r->ndone; i++) {
            struct page_done *d = &r->done[i];
            PyObject *token = d->send ? Py_BuildValue("(LLLi)", d->token, d->head_sent, d->file_sent, d->err)
                                      : PyLong_FromLongLong(d->token);
            if (token == NULL) {
                Py_CLEAR(tokens);
                break;
            }
            PyList_SET_ITEM(tokens, (Py_ssize_t)i, token);
        }
    }
    if (tokens != NULL) {
        r->owed -= r->ndone;
        r->ndone = 0;
        r->told = 0;
    }
    else if (r->ndone) { /* (no memory: the loop is woken again to take them) */
        uint64_t one = 1;
        while (write(r->efd, &one, sizeof one) < 0 && errno == EINTR)
            ;
    }
    pthread_mutex_unlock(&r->lock);
    return tokens;
}

static PyObject *
page_reader_fileno(PageReaderObject *self, PyObject *Py_UNUSED(ignored))
{
    if (closed(self))
        return NULL;
    return PyLong_FromLong(self->r->efd);
}

static PyMethodDef page_reader_methods[] = {
    {"ask", (PyCFunction)(void (*)(void))page_reader_ask, METH_FASTCALL, page_reader_ask_doc},
    {"start", (PyCFunction)page_reader_start, METH_NOARGS, page_reader_start_doc},
    {"cancel", (PyCFunction)page_reader_cancel, METH_O, page_reader_cancel_doc},
    {"done", (PyCFunction)page_reader_done, METH_NOARGS, page_reader_done_doc},
    {"close", (PyCFunction)page_reader_close_method, METH_NOARGS,
     "close() -> None: its eventfd and queued duplicates closed now; its thread ends."},
    {"fileno", (PyCFunction)page_reader_fileno, METH_NOARGS, "fileno() -> int: the eventfd to watch."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot page_reader_slots[] = {
    {Py_tp_new, page_reader_new},
    {Py_tp_dealloc, page_reader_dealloc},
    {Py_tp_methods, page_reader_methods},
    {Py_tp_doc, "PageReader(): a thread that reads ranges into the page cache without the GIL."},
    {0, NULL},
};

static PyType_Spec page_reader_spec = {
    .name = "aiosendfile._syscalls.PageReader",
    .basicsize = sizeof(PageReaderObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = page_reader_slots,
};
#endif /* HAS_PAGE_READER */

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
#ifdef HAS_PAGE_READER
    pthread_once(&fork_watch, watch_forks);
    if (!fork_watch_failed) { /* (else no PageReader: a fork could not be told, the timer serves) */
        PyObject *type = PyType_FromSpec(&page_reader_spec);
        if (type == NULL)
            return -1;
        if (PyModule_AddObject(module, "PageReader", type) < 0) {
            Py_DECREF(type);
            return -1;
        }
    }
#endif
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
    .m_doc = "cachestat(2), openat2(2) with RESOLVE_CACHED, accept4(2) and a page reader, for aiosendfile._platform only.",
    .m_size = 0,
    .m_methods = syscalls_methods,
    .m_slots = syscalls_slots,
};

PyMODINIT_FUNC
PyInit__syscalls(void)
{
    return PyModuleDef_Init(&syscalls_module);
}
