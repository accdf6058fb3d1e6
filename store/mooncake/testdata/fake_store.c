// A fake libmooncake_store.so for the tests of package mooncake: an
// in-memory implementation of the C API of Mooncake Store (store_c.h),
// written from the header's prototypes and Mooncake's documented
// semantics. It stands in for a cluster of one client and checks the Go
// side of the ABI: struct layout, C strings, pointer arrays, int and
// int64 results.
//
// Semantics kept from Mooncake: batch calls return 0 and put per-key
// results in results_out (put: 0 or a negative code; get: bytes read or a
// negative code; exists: 1, 0 or a negative code); a put of a key already
// present succeeds and keeps the first value; a missing key is -704; a
// buffer shorter than the value is -600; put_from and get_into buffers
// must lie inside a registered buffer (-600 otherwise); remove_by_regex
// matches keys with a regular expression (POSIX extended here, ECMAScript
// in Mooncake; the two agree on escaped literals); a value that does not
// fit in global_segment_size is -200; create blocks SIGINT, SIGTERM, SIGHUP
// and SIGUSR1 on the calling thread.
//
// batch_get_into with a key named more than once, as Mooncake's does
// (it keys its transfers by key): each occurrence is checked on its own
// (-600 for a buffer too small), every other occurrence reports the full
// size, and only the last of those occurrences' buffers is written.
//
// Leases and removal, as in Mooncake: exists and get grant a read lease on
// each key found, and a get holds its keys while it copies (the copy runs
// outside the fake's lock, as a transfer does). A removal without force
// leaves a key under a lease or being read: remove fails with -706,
// remove_by_regex and remove_all skip it and count only what they removed.
// A removal with force takes the key at once and hands its memory to the
// next put, even while a get is copying out of it: that get then returns
// another key's bytes as success, as forced removal does in Mooncake. Value
// memory is kept on a free list and reused, never returned to the system
// before destroy, so such a read is wrong but not undefined.
//
// Test hooks (not part of the C API): master_server_addr "fake:fail" makes
// setup fail with -1; "fake:wait=R,W" makes setup block until a byte can
// be read from file descriptor R (after writing 's' to W), and destroy
// write 'd' to W. fake_set_lease sets the lease a read grants (none by
// default: a key is held only while it is copied), fake_gate_get stops
// the next get in the middle of its copy, and the other functions named
// fake_* report what the fake observed. A call on a destroyed store aborts
// the process.
//
// Build: gcc -shared -fPIC -O2 -o libmooncake_store.so fake_store.c -lpthread

#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <regex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef void *mooncake_store_t;

struct mooncake_replicate_config {
    size_t replica_num;
    int with_soft_pin;
    int with_hard_pin;
    const char **preferred_segments;
    size_t preferred_segments_count;
};
typedef struct mooncake_replicate_config mooncake_replicate_config_t;

_Static_assert(sizeof(mooncake_replicate_config_t) == 32, "replicate config is 32 bytes");
_Static_assert(offsetof(mooncake_replicate_config_t, preferred_segments) == 16, "preferred_segments at 16");
_Static_assert(offsetof(mooncake_replicate_config_t, preferred_segments_count) == 24, "count at 24");

enum {
    E_OK = 0,
    E_INTERNAL = -1,
    E_NO_HANDLE = -200,
    E_INVALID_PARAMS = -600,
    E_NOT_FOUND = -704,
    E_HAS_LEASE = -706,
};

#define NBUCKETS 4096
#define MAGIC 0x6d6f6f6e63616b65ULL
#define DEAD 0x6465616464656164ULL

struct entry {
    struct entry *next;
    uint64_t hash;
    char *key;
    void *data;
    size_t cap;  // bytes of data
    size_t size;
    int64_t lease_until;
    int pins;      // gets copying out of it now
    int refusals;  // removals refused under the current lease
    int dead;      // out of the index while pinned: freed by the last unpin
    uint64_t xget; // the get that last planned a transfer of it
    size_t xidx;   // that transfer's index
};

// spare is value memory of removed entries, for the next puts.
struct spare {
    void *data;
    size_t cap;
};

struct region {
    uintptr_t addr;
    size_t size;
};

struct fake {
    uint64_t magic;
    pthread_mutex_t mu;
    atomic_ulong calls;
    atomic_int destroyed;
    int ready;
    char hostname[256];
    uint64_t capacity, used, keys;
    struct entry *buckets[NBUCKETS];
    struct region *regions;
    size_t nregions, capregions;
    struct spare *spares;
    size_t nspares, capspares;
    int notify_fd;
    int64_t lease_ns;    // lease a read grants; 0: held only while copied
    int lease_refusals;  // > 0: a lease also ends after this many refused removals
    uint64_t refused;    // removals without force refused or skipped for a lease
    int gate_r, gate_w;  // fake_gate_get: stop the next get's copy here
    uint64_t gets;       // gets so far, to tell their transfers apart

    // observations
    int setup_blocked;  // signals blocked on the thread that ran setup
    int setup_on_main;  // setup ran on the main thread
    int repl_seen;      // a non-NULL replicate config was passed
    size_t repl_num;
    int repl_soft, repl_hard;
    size_t repl_nsegs;
    char repl_seg0[256];
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static uint64_t hash_key(const char *k) {
    uint64_t h = 1469598103934665603ULL;
    for (; *k; k++) {
        h ^= (unsigned char)*k;
        h *= 1099511628211ULL;
    }
    return h;
}

// enter checks the handle and counts the call.
static struct fake *enter(mooncake_store_t s) {
    struct fake *f = s;
    if (f == NULL) return NULL;
    if (f->magic != MAGIC) {
        fprintf(stderr, "fake mooncake: call on a %s store handle %p\n",
                f->magic == DEAD ? "destroyed" : "bad", s);
        abort();
    }
    atomic_fetch_add(&f->calls, 1);
    return f;
}

static struct entry *find(struct fake *f, const char *key, uint64_t h) {
    for (struct entry *e = f->buckets[h % NBUCKETS]; e; e = e->next)
        if (e->hash == h && strcmp(e->key, key) == 0) return e;
    return NULL;
}

// recycle keeps value memory for a later put.
static void recycle(struct fake *f, void *data, size_t cap) {
    if (f->nspares == f->capspares) {
        size_t c = f->capspares ? 2 * f->capspares : 64;
        struct spare *ns = realloc(f->spares, c * sizeof *ns);
        if (!ns) return;  // leaked rather than freed: a read may still copy from it
        f->spares = ns;
        f->capspares = c;
    }
    f->spares[f->nspares++] = (struct spare){data, cap};
}

// take_spare returns recycled memory of at least n bytes, or NULL.
static void *take_spare(struct fake *f, size_t n, size_t *cap) {
    for (size_t i = 0; i < f->nspares; i++) {
        if (f->spares[i].cap >= n) {
            void *p = f->spares[i].data;
            *cap = f->spares[i].cap;
            f->spares[i] = f->spares[--f->nspares];
            return p;
        }
    }
    return NULL;
}

// drop takes e out of the index and recycles its value memory at once, so
// that the next put may reuse it; the entry itself is freed by the last
// get copying out of it. The caller holds f->mu.
static void drop(struct fake *f, struct entry **link) {
    struct entry *e = *link;
    *link = e->next;
    f->used -= e->size;
    f->keys--;
    recycle(f, e->data, e->cap);
    e->data = NULL;
    if (e->pins > 0) {
        e->dead = 1;
        return;
    }
    free(e->key);
    free(e);
}

// lease grants e the lease of a read. The caller holds f->mu.
static void lease(struct fake *f, struct entry *e) {
    e->lease_until = f->lease_ns > 0 ? now_ns() + f->lease_ns : 0;
    e->refusals = 0;
}

// removable reports whether a removal (with force or not) may take e now,
// and counts a refusal. The caller holds f->mu.
static int removable(struct fake *f, struct entry *e, int force, int64_t now) {
    if (force) return 1;
    if (e->pins == 0 && e->lease_until <= now) return 1;
    if (e->pins == 0 && f->lease_refusals > 0 && e->refusals >= f->lease_refusals) return 1;
    e->refusals++;
    f->refused++;
    return 0;
}

// registered reports whether [p, p+n) lies inside one registered buffer.
static int registered(struct fake *f, const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < f->nregions; i++) {
        struct region r = f->regions[i];
        if (a >= r.addr && a + n >= a && a + n <= r.addr + r.size) return 1;
    }
    return 0;
}

static void note_config(struct fake *f, const mooncake_replicate_config_t *c) {
    if (c == NULL) return;
    f->repl_seen = 1;
    f->repl_num = c->replica_num;
    f->repl_soft = c->with_soft_pin;
    f->repl_hard = c->with_hard_pin;
    f->repl_nsegs = c->preferred_segments_count;
    f->repl_seg0[0] = 0;
    if (c->preferred_segments_count > 0 && c->preferred_segments && c->preferred_segments[0]) {
        strncpy(f->repl_seg0, c->preferred_segments[0], sizeof f->repl_seg0 - 1);
        f->repl_seg0[sizeof f->repl_seg0 - 1] = 0;
    }
}

// put_one stores size bytes at src under key; the caller holds f->mu.
static int put_one(struct fake *f, const char *key, const void *src, size_t size) {
    if (!f->ready) return E_INTERNAL;
    if (key[0] == 0) return E_INVALID_PARAMS;
    uint64_t h = hash_key(key);
    if (find(f, key, h)) return E_OK;  // first writer wins
    if (size > f->capacity || f->used + size > f->capacity) return E_NO_HANDLE;
    struct entry *e = calloc(1, sizeof *e);
    if (!e) return E_INTERNAL;
    e->key = strdup(key);
    e->data = take_spare(f, size, &e->cap);
    if (!e->data) {
        e->cap = size ? size : 1;
        e->data = malloc(e->cap);
    }
    if (!e->key || !e->data) {
        free(e->key);
        free(e->data);
        free(e);
        return E_INTERNAL;
    }
    memcpy(e->data, src, size);
    e->size = size;
    e->hash = h;
    e->next = f->buckets[h % NBUCKETS];
    f->buckets[h % NBUCKETS] = e;
    f->used += size;
    f->keys++;
    return E_OK;
}

static int put_from_one(struct fake *f, const char *key, void *buf, size_t size) {
    if (size > 0 && !registered(f, buf, size)) return E_INVALID_PARAMS;
    return put_one(f, key, buf, size);
}

// xfer is one copy of a get: from a value into a buffer.
struct xfer {
    struct entry *e;
    void *dst;
    const void *src;
    size_t size;
};

// lookup checks one key of a get and leases it; it returns the value's
// size and sets *out, or returns a negative code. The caller holds f->mu.
static int64_t lookup(struct fake *f, const char *key, void *buf, size_t size, struct entry **out) {
    if (!f->ready) return E_INTERNAL;
    struct entry *e = find(f, key, hash_key(key));
    if (!e) return E_NOT_FOUND;
    if (size < e->size) return E_INVALID_PARAMS;
    if (e->size > 0 && !registered(f, buf, e->size)) return E_INVALID_PARAMS;
    lease(f, e);
    *out = e;
    return (int64_t)e->size;
}

// get_many runs a get of count keys: it looks every key up under the lock,
// with one transfer per key (the last buffer of a key named twice wins, as
// in Mooncake), then copies with the lock released, then unpins.
static void get_many(struct fake *f, const char **keys, void **buffers, const size_t *sizes,
                     size_t count, int64_t *results) {
    struct xfer *xs = calloc(count ? count : 1, sizeof *xs);
    if (!xs) {
        for (size_t i = 0; i < count; i++) results[i] = E_INTERNAL;
        return;
    }
    size_t nx = 0;
    pthread_mutex_lock(&f->mu);
    uint64_t id = ++f->gets;
    for (size_t i = 0; i < count; i++) {
        struct entry *e = NULL;
        results[i] = lookup(f, keys[i], buffers[i], sizes[i], &e);
        if (results[i] < 0) continue;
        if (e->xget == id) {  // named before in this call: its last buffer wins
            xs[e->xidx].dst = buffers[i];
            continue;
        }
        e->xget = id;
        e->xidx = nx;
        e->pins++;
        xs[nx++] = (struct xfer){e, buffers[i], e->data, e->size};
    }
    int gr = -1, gw = -1;
    if (nx > 0 && f->gate_r >= 0) {
        gr = f->gate_r;
        gw = f->gate_w;
        f->gate_r = f->gate_w = -1;
    }
    pthread_mutex_unlock(&f->mu);
    if (gr >= 0) {
        char c = 'g';
        ssize_t n = write(gw, &c, 1);
        n = read(gr, &c, 1);
        (void)n;
    }
    // A transfer takes time: copy the first halves, yield, copy the second
    // halves, so that whatever may run during a transfer in Mooncake runs
    // here too.
    for (size_t j = 0; j < nx; j++) memcpy(xs[j].dst, xs[j].src, xs[j].size / 2);
    if (nx > 0) sched_yield();
    for (size_t j = 0; j < nx; j++) {
        size_t half = xs[j].size / 2;
        memcpy((char *)xs[j].dst + half, (const char *)xs[j].src + half, xs[j].size - half);
    }
    pthread_mutex_lock(&f->mu);
    for (size_t j = 0; j < nx; j++) {
        struct entry *e = xs[j].e;
        if (--e->pins == 0 && e->dead) {
            free(e->key);
            free(e);
        }
    }
    pthread_mutex_unlock(&f->mu);
    free(xs);
}

static int exists_one(struct fake *f, const char *key) {
    if (!f->ready) return E_INTERNAL;
    struct entry *e = find(f, key, hash_key(key));
    if (!e) return 0;
    lease(f, e);
    return 1;
}

// ---------------------------------------------------------------------------
// The C API
// ---------------------------------------------------------------------------

EXPORT mooncake_store_t mooncake_store_create(void) {
    struct fake *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->magic = MAGIC;
    f->notify_fd = -1;
    f->gate_r = f->gate_w = -1;
    pthread_mutex_init(&f->mu, NULL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    return f;
}

EXPORT void mooncake_store_destroy(mooncake_store_t s) {
    struct fake *f = enter(s);
    if (!f) return;
    pthread_mutex_lock(&f->mu);
    for (size_t b = 0; b < NBUCKETS; b++)
        while (f->buckets[b]) drop(f, &f->buckets[b]);
    free(f->regions);
    f->regions = NULL;
    f->nregions = f->capregions = 0;
    for (size_t i = 0; i < f->nspares; i++) free(f->spares[i].data);
    free(f->spares);
    f->spares = NULL;
    f->nspares = f->capspares = 0;
    f->ready = 0;
    int fd = f->notify_fd;
    atomic_fetch_add(&f->destroyed, 1);
    f->magic = DEAD;  // the struct is kept so that tests can read its counters
    pthread_mutex_unlock(&f->mu);
    if (fd >= 0) {
        char c = 'd';
        ssize_t w = write(fd, &c, 1);
        (void)w;
    }
}

EXPORT int mooncake_store_setup(mooncake_store_t s, const char *local_hostname,
                                const char *metadata_server, uint64_t global_segment_size,
                                uint64_t local_buffer_size, const char *protocol,
                                const char *device_name, const char *master_server_addr) {
    struct fake *f = enter(s);
    if (!f) return E_INTERNAL;
    (void)metadata_server;
    (void)local_buffer_size;
    (void)device_name;
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    int blocked = sigismember(&cur, SIGINT) || sigismember(&cur, SIGTERM) ||
                  sigismember(&cur, SIGHUP) || sigismember(&cur, SIGUSR1);
    int on_main = syscall(SYS_gettid) == getpid();
    const char *master = master_server_addr ? master_server_addr : "127.0.0.1:50051";
    const char *proto = protocol ? protocol : "tcp";
    int rfd = -1, wfd = -1;
    if (strcmp(master, "fake:fail") == 0) return E_INTERNAL;
    if (sscanf(master, "fake:wait=%d,%d", &rfd, &wfd) == 2) {
        char c = 's';
        ssize_t n = write(wfd, &c, 1);
        n = read(rfd, &c, 1);
        (void)n;
    }
    if (strcmp(proto, "tcp") != 0 && strcmp(proto, "rdma") != 0) return E_INTERNAL;
    pthread_mutex_lock(&f->mu);
    f->setup_blocked = blocked;
    f->setup_on_main = on_main;
    f->notify_fd = wfd;
    f->capacity = global_segment_size;
    const char *host = local_hostname && *local_hostname ? local_hostname : "localhost";
    if (strchr(host, ':'))
        snprintf(f->hostname, sizeof f->hostname, "%s", host);
    else
        snprintf(f->hostname, sizeof f->hostname, "%s:12300", host);
    f->ready = 1;
    pthread_mutex_unlock(&f->mu);
    return E_OK;
}

EXPORT int mooncake_store_init_all(mooncake_store_t s, const char *protocol,
                                   const char *device_name, uint64_t mount_segment_size) {
    enter(s);
    (void)protocol;
    (void)device_name;
    (void)mount_segment_size;
    return E_INTERNAL;  // not modelled
}

EXPORT int mooncake_store_health_check(mooncake_store_t s) {
    struct fake *f = enter(s);
    if (!f) return E_INTERNAL;
    pthread_mutex_lock(&f->mu);
    int ok = f->ready;
    pthread_mutex_unlock(&f->mu);
    return ok ? E_OK : E_INTERNAL;
}

EXPORT int mooncake_store_put(mooncake_store_t s, const char *key, const void *value,
                              size_t size, const mooncake_replicate_config_t *config) {
    struct fake *f = enter(s);
    if (!f || !key || (!value && size > 0)) return E_INTERNAL;
    pthread_mutex_lock(&f->mu);
    note_config(f, config);
    int rc = put_one(f, key, value, size);
    pthread_mutex_unlock(&f->mu);
    return rc;
}

EXPORT int mooncake_store_put_from(mooncake_store_t s, const char *key, void *buffer,
                                   size_t size, const mooncake_replicate_config_t *config) {
    struct fake *f = enter(s);
    if (!f || !key || (!buffer && size > 0)) return E_INTERNAL;
    pthread_mutex_lock(&f->mu);
    note_config(f, config);
    int rc = put_from_one(f, key, buffer, size);
    pthread_mutex_unlock(&f->mu);
    return rc;
}

EXPORT int mooncake_store_batch_put_from(mooncake_store_t s, const char **keys, void **buffers,
                                         const size_t *sizes, size_t count,
                                         const mooncake_replicate_config_t *config,
                                         int *results_out) {
    struct fake *f = enter(s);
    if (!f || !keys || !buffers || !sizes || !results_out) return E_INTERNAL;
    for (size_t i = 0; i < count; i++)
        if (!keys[i] || (!buffers[i] && sizes[i] > 0)) return E_INTERNAL;
    pthread_mutex_lock(&f->mu);
    note_config(f, config);
    for (size_t i = 0; i < count; i++) results_out[i] = put_from_one(f, keys[i], buffers[i], sizes[i]);
    pthread_mutex_unlock(&f->mu);
    return E_OK;
}

EXPORT int64_t mooncake_store_get_into(mooncake_store_t s, const char *key, void *buffer,
                                       size_t size) {
    struct fake *f = enter(s);
    if (!f || !key || (!buffer && size > 0)) return E_INTERNAL;
    int64_t rc;
    get_many(f, &key, &buffer, &size, 1, &rc);
    return rc;
}

EXPORT int mooncake_store_batch_get_into(mooncake_store_t s, const char **keys, void **buffers,
                                         const size_t *sizes, size_t count,
                                         int64_t *results_out) {
    struct fake *f = enter(s);
    if (!f || !keys || !buffers || !sizes || !results_out) return E_INTERNAL;
    for (size_t i = 0; i < count; i++)
        if (!keys[i] || (!buffers[i] && sizes[i] > 0)) return E_INTERNAL;
    get_many(f, keys, buffers, sizes, count, results_out);
    return E_OK;
}

EXPORT int mooncake_store_is_exist(mooncake_store_t s, const char *key) {
    struct fake *f = enter(s);
    if (!f || !key) return E_INTERNAL;
    pthread_mutex_lock(&f->mu);
    int rc = exists_one(f, key);
    pthread_mutex_unlock(&f->mu);
    return rc;
}

EXPORT int mooncake_store_batch_is_exist(mooncake_store_t s, const char **keys, size_t count,
                                         int *results_out) {
    struct fake *f = enter(s);
    if (!f || !keys || !results_out) return E_INTERNAL;
    for (size_t i = 0; i < count; i++)
        if (!keys[i]) return E_INTERNAL;
    pthread_mutex_lock(&f->mu);
    for (size_t i = 0; i < count; i++) results_out[i] = exists_one(f, keys[i]);
    pthread_mutex_unlock(&f->mu);
    return E_OK;
}

EXPORT int64_t mooncake_store_get_size(mooncake_store_t s, const char *key) {
    struct fake *f = enter(s);
    if (!f || !key) return E_INTERNAL;
    pthread_mutex_lock(&f->mu);
    struct entry *e = find(f, key, hash_key(key));
    int64_t rc = e ? (int64_t)e->size : E_NOT_FOUND;
    pthread_mutex_unlock(&f->mu);
    return rc;
}

EXPORT int mooncake_store_get_hostname(mooncake_store_t s, char *buf_out, size_t buf_len) {
    struct fake *f = enter(s);
    if (!f || !buf_out || buf_len == 0) return E_INTERNAL;
    pthread_mutex_lock(&f->mu);
    size_t n = strlen(f->hostname);
    int rc = E_INTERNAL;
    if (n < buf_len) {
        memcpy(buf_out, f->hostname, n + 1);
        rc = E_OK;
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

EXPORT int mooncake_store_remove(mooncake_store_t s, const char *key, int force) {
    struct fake *f = enter(s);
    if (!f || !key) return E_INTERNAL;
    pthread_mutex_lock(&f->mu);
    uint64_t h = hash_key(key);
    int rc = E_NOT_FOUND;
    for (struct entry **l = &f->buckets[h % NBUCKETS]; *l; l = &(*l)->next) {
        if ((*l)->hash == h && strcmp((*l)->key, key) == 0) {
            if (!removable(f, *l, force, now_ns())) {
                rc = E_HAS_LEASE;
            } else {
                drop(f, l);
                rc = E_OK;
            }
            break;
        }
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

// remove_matching deletes the keys re matches (every key when re is NULL).
static int64_t remove_matching(struct fake *f, const regex_t *re, int force) {
    int64_t n = 0;
    int64_t now = now_ns();
    for (size_t b = 0; b < NBUCKETS; b++) {
        struct entry **l = &f->buckets[b];
        while (*l) {
            struct entry *e = *l;
            if ((re == NULL || regexec(re, e->key, 0, NULL, 0) == 0) &&
                removable(f, e, force, now)) {
                drop(f, l);
                n++;
            } else {
                l = &e->next;
            }
        }
    }
    return n;
}

EXPORT int64_t mooncake_store_remove_by_regex(mooncake_store_t s, const char *pattern, int force) {
    struct fake *f = enter(s);
    if (!f || !pattern) return E_INTERNAL;
    regex_t re;
    if (regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB) != 0) return E_INVALID_PARAMS;
    pthread_mutex_lock(&f->mu);
    int64_t n = remove_matching(f, &re, force);
    pthread_mutex_unlock(&f->mu);
    regfree(&re);
    return n;
}

EXPORT int64_t mooncake_store_remove_all(mooncake_store_t s, int force) {
    struct fake *f = enter(s);
    if (!f) return E_INTERNAL;
    pthread_mutex_lock(&f->mu);
    int64_t n = remove_matching(f, NULL, force);
    pthread_mutex_unlock(&f->mu);
    return n;
}

EXPORT int mooncake_store_register_buffer(mooncake_store_t s, void *buffer, size_t size) {
    struct fake *f = enter(s);
    if (!f || !buffer || size == 0) return E_INTERNAL;
    uintptr_t a = (uintptr_t)buffer;
    if (a + size < a) return E_INVALID_PARAMS;
    pthread_mutex_lock(&f->mu);
    int rc = E_OK;
    for (size_t i = 0; i < f->nregions; i++) {
        struct region r = f->regions[i];
        if (a < r.addr + r.size && r.addr < a + size) rc = E_INVALID_PARAMS;
    }
    if (rc == E_OK && f->nregions == f->capregions) {
        size_t cap = f->capregions ? 2 * f->capregions : 8;
        struct region *nr = realloc(f->regions, cap * sizeof *nr);
        if (!nr) {
            rc = E_INTERNAL;
        } else {
            f->regions = nr;
            f->capregions = cap;
        }
    }
    if (rc == E_OK) f->regions[f->nregions++] = (struct region){a, size};
    pthread_mutex_unlock(&f->mu);
    return rc;
}

EXPORT int mooncake_store_unregister_buffer(mooncake_store_t s, void *buffer) {
    struct fake *f = enter(s);
    if (!f) return E_INTERNAL;
    pthread_mutex_lock(&f->mu);
    int rc = E_INVALID_PARAMS;
    for (size_t i = 0; i < f->nregions; i++) {
        if (f->regions[i].addr == (uintptr_t)buffer) {
            f->regions[i] = f->regions[--f->nregions];
            rc = E_OK;
            break;
        }
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

// ---------------------------------------------------------------------------
// Test hooks: what the fake observed. They may be called on a destroyed
// store (the fake keeps its struct) and do not count as calls.
// ---------------------------------------------------------------------------

EXPORT uint64_t fake_calls(mooncake_store_t s) {
    return atomic_load(&((struct fake *)s)->calls);
}

EXPORT int fake_destroyed(mooncake_store_t s) {
    return atomic_load(&((struct fake *)s)->destroyed);
}

// fake_setup_seen reports, for the thread that ran setup, whether any of
// SIGINT, SIGTERM, SIGHUP, SIGUSR1 was blocked (bit 0) and whether it was
// the main thread (bit 1).
EXPORT int fake_setup_seen(mooncake_store_t s) {
    struct fake *f = s;
    return (f->setup_blocked ? 1 : 0) | (f->setup_on_main ? 2 : 0);
}

// fake_keys returns the number of keys held and stores the bytes held.
EXPORT uint64_t fake_keys(mooncake_store_t s, uint64_t *bytes) {
    struct fake *f = s;
    pthread_mutex_lock(&f->mu);
    uint64_t n = f->keys;
    *bytes = f->used;
    pthread_mutex_unlock(&f->mu);
    return n;
}

// fake_replicate reports the last replicate config a put passed: 0 if
// none was ever passed (NULL), else 1 with its fields stored in out
// (replica_num, with_soft_pin, with_hard_pin, preferred_segments_count)
// and the first preferred segment copied into seg0.
EXPORT int fake_replicate(mooncake_store_t s, uint64_t *out, char *seg0, size_t seg0_len) {
    struct fake *f = s;
    pthread_mutex_lock(&f->mu);
    int seen = f->repl_seen;
    out[0] = f->repl_num;
    out[1] = (uint64_t)f->repl_soft;
    out[2] = (uint64_t)f->repl_hard;
    out[3] = f->repl_nsegs;
    snprintf(seg0, seg0_len, "%s", f->repl_seg0);
    pthread_mutex_unlock(&f->mu);
    return seen;
}

// fake_set_lease sets the lease that exists and get grant from now on:
// ns nanoseconds (0: none beyond the copy of a get), ending early after
// refusals removals without force were refused under it (0: by time only).
EXPORT void fake_set_lease(mooncake_store_t s, int64_t ns, int32_t refusals) {
    struct fake *f = s;
    pthread_mutex_lock(&f->mu);
    f->lease_ns = ns;
    f->lease_refusals = refusals;
    pthread_mutex_unlock(&f->mu);
}

// fake_refused returns how many removals without force were refused (remove)
// or skipped (remove_by_regex, remove_all, one per key) for a lease or a
// get in flight.
EXPORT uint64_t fake_refused(mooncake_store_t s) {
    struct fake *f = s;
    pthread_mutex_lock(&f->mu);
    uint64_t n = f->refused;
    pthread_mutex_unlock(&f->mu);
    return n;
}

// fake_gate_get stops the next get that copies anything after it looked
// its keys up and pinned them, before it copies: it writes 'g' to file
// descriptor w, then waits for a byte on r.
EXPORT void fake_gate_get(mooncake_store_t s, int32_t r, int32_t w) {
    struct fake *f = s;
    pthread_mutex_lock(&f->mu);
    f->gate_r = r;
    f->gate_w = w;
    pthread_mutex_unlock(&f->mu);
}
