// A fake libtransfer_engine.so for the tests of package mooncake: an
// in-process implementation of the C API of Mooncake Transfer Engine
// (transfer_engine_c.h), written from the header's prototypes and
// Mooncake's documented behaviour. Engines of one process are each
// other's peers; a transfer is a memmove done at submission (or when
// released, see fake_hold). It checks the Go side of the ABI: struct
// layout, C strings, the request array, the two code conventions.
//
// Behaviour kept from Mooncake: with metadata "P2PHANDSHAKE" the segment
// name is "host:port" (ports from 15000 up); openSegment of an unknown
// name is -1; registerLocalMemory of an overlapping range is -7 and
// unregisterLocalMemory of an unknown address -3; submitTransfer returns
// 2 (TooManyRequests) past the batch size and 1 (InvalidArgument) for an
// unknown target_id, queuing nothing; a remote range outside the peer's
// registered memory makes the task FAILED; zero length is COMPLETED; an
// opcode other than WRITE is a READ; getTransferStatus of a task never
// submitted is 1; a task is finished once its final status was read;
// freeBatchID with an unfinished task is 4 (BatchBusy).
//
// Stricter than Mooncake, to catch binding bugs: a local source outside
// memory registered with the engine, or an opcode other than 0 and 1, is
// counted as a violation (and the task FAILED, nothing moved); a call with
// a freed batch or a destroyed engine aborts the process (in Mooncake it
// is a use after free).
//
// Test hooks (not part of the C API) are the functions named fake_*, and
// the environment variable FAKE_TRANSFER_ENGINE_LATE, read when an engine
// is created: fake_late(engine, its value).
//
// Build: gcc -shared -fPIC -O2 -o libtransfer_engine.so fake_transfer_engine.c -lpthread

#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef void *transfer_engine_t;
typedef void *transport_t;

struct transfer_request {
    int opcode;
    void *source;
    int32_t target_id;
    uint64_t target_offset;
    uint64_t length;
};

struct transfer_status {
    int status;
    uint64_t transferred_bytes;
};

_Static_assert(sizeof(struct transfer_request) == 40, "transfer_request is 40 bytes");
_Static_assert(offsetof(struct transfer_request, source) == 8, "source at 8");
_Static_assert(offsetof(struct transfer_request, target_id) == 16, "target_id at 16");
_Static_assert(offsetof(struct transfer_request, target_offset) == 24, "target_offset at 24");
_Static_assert(offsetof(struct transfer_request, length) == 32, "length at 32");
_Static_assert(sizeof(struct transfer_status) == 16, "transfer_status is 16 bytes");

enum { ST_OK = 0, ST_INVALID_ARGUMENT = 1, ST_TOO_MANY_REQUESTS = 2, ST_BATCH_BUSY = 4 };
enum { ERR_INVALID_ARGUMENT = -1, ERR_ADDRESS_NOT_REGISTERED = -3, ERR_ADDRESS_OVERLAPPED = -7 };
enum { S_WAITING = 0, S_PENDING = 1, S_INVALID = 2, S_CANCELED = 3, S_COMPLETED = 4, S_TIMEOUT = 5, S_FAILED = 6 };

#define MAX_ENGINES 256
#define MAX_REGIONS 1024
#define MAX_SEGMENTS 256
#define NAME_LEN 128
#define ENGINE_MAGIC 0x7472616e73666572ULL
#define BATCH_MAGIC 0x6261746368626174ULL
#define DEAD 0x6465616464656164ULL

struct region {
    uintptr_t addr;
    size_t len;
    char location[32];
};

struct task {
    int opcode;
    uintptr_t source;
    int32_t target_id;
    uint64_t target_offset;
    uint64_t length;
    int status;
    uint64_t transferred;
    int finished;
    int held;
    int late; // TIMEOUT reports left before the task runs (fake_late)
};

struct batch;

struct engine {
    uint64_t magic;
    char name[NAME_LEN];
    char metadata[NAME_LEN];
    char proto[16];
    char transport_args[4096];
    int transport;
    int auto_discover;
    struct region regions[MAX_REGIONS];
    int nregions;
    char segments[MAX_SEGMENTS][NAME_LEN]; // id -> name; id 0 is the engine itself
    int nsegments;
    int hold;
    int timeout_mode;
    int late_polls;
    int fail_submit;
    uintptr_t last_entries;
    uint64_t n_submit, n_status, n_alloc, n_free, n_violations, n_live;
};

struct batch {
    uint64_t magic;
    struct engine *e;
    size_t size;
    size_t count;
    struct task *tasks;
    struct batch *next;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t live_batches, live_engines; // across engines
static struct engine *engines[MAX_ENGINES];
static int next_port = 15000;
static struct batch *batches; // live batches of every engine

static void die(const char *what, const void *p) {
    fprintf(stderr, "fake transfer engine: %s %p\n", what, p);
    abort();
}

static struct engine *check_engine(transfer_engine_t h) {
    struct engine *e = (struct engine *)h;
    if (e == NULL || e->magic != ENGINE_MAGIC) die("call with a destroyed or invalid engine", h);
    return e;
}

static struct batch *check_batch(struct engine *e, uint64_t id) {
    struct batch *b = (struct batch *)(uintptr_t)id;
    if (b == NULL || b->magic != BATCH_MAGIC) die("use of a freed or invalid batch", b);
    if (b->e != e) die("batch of another engine", b);
    return b;
}

static struct engine *find_engine(const char *name) {
    for (int i = 0; i < MAX_ENGINES; i++)
        if (engines[i] != NULL && strcmp(engines[i]->name, name) == 0) return engines[i];
    return NULL;
}

static struct region *find_region(struct engine *e, uintptr_t addr, uint64_t len) {
    for (int i = 0; i < e->nregions; i++) {
        struct region *r = &e->regions[i];
        if (addr >= r->addr && addr + len >= addr && addr + len <= r->addr + r->len) return r;
    }
    return NULL;
}

// run performs task t of engine e.
static void run(struct engine *e, struct task *t) {
    t->held = 0;
    if (t->length == 0) {
        t->status = S_COMPLETED;
        return;
    }
    if (t->opcode != 0 && t->opcode != 1) e->n_violations++;
    if (find_region(e, t->source, t->length) == NULL) {
        e->n_violations++;
        t->status = S_FAILED;
        return;
    }
    struct engine *peer = t->target_id == 0 ? e : find_engine(e->segments[t->target_id]);
    if (peer == NULL || find_region(peer, (uintptr_t)t->target_offset, t->length) == NULL) {
        t->status = S_FAILED;
        return;
    }
    void *remote = (void *)(uintptr_t)t->target_offset;
    if (t->opcode == 1)
        memmove(remote, (void *)t->source, t->length);
    else
        memmove((void *)t->source, remote, t->length);
    t->transferred = t->length;
    t->status = S_COMPLETED;
}

EXPORT transfer_engine_t createTransferEngine(const char *metadata_conn_string, const char *local_server_name,
                                              const char *ip_or_host_name, uint64_t rpc_port, int auto_discover) {
    (void)rpc_port;
    if (metadata_conn_string == NULL || local_server_name == NULL || ip_or_host_name == NULL) return NULL;
    if (strcmp(metadata_conn_string, "fake:fail") == 0) return NULL;
    struct engine *e = calloc(1, sizeof *e);
    if (e == NULL) return NULL;
    e->magic = ENGINE_MAGIC;
    e->auto_discover = auto_discover;
    e->nsegments = 1;
    const char *late = getenv("FAKE_TRANSFER_ENGINE_LATE"); // fake_late for tests that cannot call it
    if (late != NULL) e->late_polls = atoi(late);
    snprintf(e->metadata, sizeof e->metadata, "%s", metadata_conn_string);
    pthread_mutex_lock(&mu);
    if (strcmp(metadata_conn_string, "P2PHANDSHAKE") == 0)
        snprintf(e->name, sizeof e->name, "%s:%d", ip_or_host_name, next_port++);
    else
        snprintf(e->name, sizeof e->name, "%s", local_server_name);
    snprintf(e->segments[0], NAME_LEN, "%s", e->name);
    int slot = -1;
    for (int i = 0; i < MAX_ENGINES; i++)
        if (engines[i] == NULL) {
            slot = i;
            break;
        }
    if (slot < 0 || find_engine(e->name) != NULL) {
        pthread_mutex_unlock(&mu);
        free(e);
        return NULL;
    }
    engines[slot] = e;
    live_engines++;
    pthread_mutex_unlock(&mu);
    return e;
}

EXPORT int getLocalIpAndPort(transfer_engine_t engine, char *buf_out, size_t buf_len) {
    struct engine *e = check_engine(engine);
    snprintf(buf_out, buf_len, "%s", e->name);
    return 0;
}

EXPORT transport_t installTransport(transfer_engine_t engine, const char *proto, void **args) {
    struct engine *e = check_engine(engine);
    if (strcmp(proto, "tcp") != 0 && strcmp(proto, "rdma") != 0) return NULL;
    if (strcmp(proto, "rdma") == 0 && (args == NULL || args[0] == NULL)) return NULL;
    pthread_mutex_lock(&mu);
    snprintf(e->proto, sizeof e->proto, "%s", proto);
    if (args != NULL && args[0] != NULL) snprintf(e->transport_args, sizeof e->transport_args, "%s", (char *)args[0]);
    e->transport = 1;
    pthread_mutex_unlock(&mu);
    return &e->transport;
}

EXPORT int32_t openSegment(transfer_engine_t engine, const char *segment_name) {
    struct engine *e = check_engine(engine);
    if (segment_name == NULL || segment_name[0] == 0) return ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&mu);
    int32_t id = -1;
    for (int i = 0; i < e->nsegments; i++)
        if (strcmp(e->segments[i], segment_name) == 0) id = i;
    if (id < 0 && find_engine(segment_name) != NULL && e->nsegments < MAX_SEGMENTS) {
        id = e->nsegments++;
        snprintf(e->segments[id], NAME_LEN, "%s", segment_name);
    }
    pthread_mutex_unlock(&mu);
    return id;
}

EXPORT int closeSegment(transfer_engine_t engine, int32_t segment_id) {
    struct engine *e = check_engine(engine);
    return segment_id >= 0 && segment_id < e->nsegments ? 0 : ERR_INVALID_ARGUMENT;
}

EXPORT void destroyTransferEngine(transfer_engine_t engine) {
    struct engine *e = check_engine(engine);
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_ENGINES; i++)
        if (engines[i] == e) engines[i] = NULL;
    e->magic = DEAD; // kept allocated, so that a later call aborts
    live_engines--;
    pthread_mutex_unlock(&mu);
}

EXPORT int registerLocalMemory(transfer_engine_t engine, void *addr, size_t length, const char *location,
                               int remote_accessible) {
    struct engine *e = check_engine(engine);
    (void)remote_accessible;
    if (addr == NULL || length == 0 || location == NULL) return ERR_INVALID_ARGUMENT;
    uintptr_t a = (uintptr_t)addr;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < e->nregions; i++) {
        struct region *r = &e->regions[i];
        if (a < r->addr + r->len && r->addr < a + length) {
            pthread_mutex_unlock(&mu);
            return ERR_ADDRESS_OVERLAPPED;
        }
    }
    if (e->nregions == MAX_REGIONS) {
        pthread_mutex_unlock(&mu);
        return ERR_INVALID_ARGUMENT;
    }
    struct region *r = &e->regions[e->nregions++];
    r->addr = a;
    r->len = length;
    snprintf(r->location, sizeof r->location, "%s", location);
    pthread_mutex_unlock(&mu);
    return 0;
}

EXPORT int unregisterLocalMemory(transfer_engine_t engine, void *addr) {
    struct engine *e = check_engine(engine);
    pthread_mutex_lock(&mu);
    for (int i = 0; i < e->nregions; i++)
        if (e->regions[i].addr == (uintptr_t)addr) {
            e->regions[i] = e->regions[--e->nregions];
            pthread_mutex_unlock(&mu);
            return 0;
        }
    pthread_mutex_unlock(&mu);
    return ERR_ADDRESS_NOT_REGISTERED;
}

EXPORT uint64_t allocateBatchID(transfer_engine_t engine, size_t batch_size) {
    struct engine *e = check_engine(engine);
    struct batch *b = calloc(1, sizeof *b);
    struct task *t = calloc(batch_size ? batch_size : 1, sizeof *t);
    if (b == NULL || t == NULL) {
        free(b);
        free(t);
        return UINT64_MAX;
    }
    b->magic = BATCH_MAGIC;
    b->e = e;
    b->size = batch_size;
    b->tasks = t;
    pthread_mutex_lock(&mu);
    b->next = batches;
    batches = b;
    e->n_alloc++;
    e->n_live++;
    live_batches++;
    pthread_mutex_unlock(&mu);
    return (uint64_t)(uintptr_t)b;
}

EXPORT int submitTransfer(transfer_engine_t engine, uint64_t batch_id, struct transfer_request *entries, size_t count) {
    struct engine *e = check_engine(engine);
    pthread_mutex_lock(&mu);
    struct batch *b = check_batch(e, batch_id);
    e->n_submit++;
    e->last_entries = (uintptr_t)entries;
    if (b->count + count > b->size) {
        pthread_mutex_unlock(&mu);
        return ST_TOO_MANY_REQUESTS;
    }
    for (size_t i = 0; i < count; i++) {
        int32_t id = entries[i].target_id;
        if (id < 0 || id >= e->nsegments) {
            pthread_mutex_unlock(&mu);
            return ST_INVALID_ARGUMENT;
        }
    }
    for (size_t i = 0; i < count; i++) {
        struct task *t = &b->tasks[b->count++];
        memset(t, 0, sizeof *t);
        t->opcode = entries[i].opcode;
        t->source = (uintptr_t)entries[i].source;
        t->target_id = entries[i].target_id;
        t->target_offset = entries[i].target_offset;
        t->length = entries[i].length;
        if (e->fail_submit) {
            t->status = S_FAILED;
        } else if (e->late_polls > 0) {
            t->late = e->late_polls;
            t->status = S_WAITING;
        } else if (e->hold) {
            t->held = 1;
            t->status = S_WAITING;
        } else {
            run(e, t);
        }
    }
    int rc = e->fail_submit;
    pthread_mutex_unlock(&mu);
    return rc;
}

EXPORT int getTransferStatus(transfer_engine_t engine, uint64_t batch_id, size_t task_id,
                             struct transfer_status *status) {
    struct engine *e = check_engine(engine);
    pthread_mutex_lock(&mu);
    struct batch *b = check_batch(e, batch_id);
    e->n_status++;
    if (task_id >= b->count) {
        pthread_mutex_unlock(&mu);
        return ST_INVALID_ARGUMENT;
    }
    struct task *t = &b->tasks[task_id];
    if (t->late > 0) {
        // Timed out, and still running: the bytes land after this report.
        status->status = S_TIMEOUT;
        status->transferred_bytes = 0;
        if (--t->late == 0) run(e, t);
    } else if (t->held) {
        status->status = e->timeout_mode ? S_TIMEOUT : (task_id % 2 ? S_PENDING : S_WAITING);
        status->transferred_bytes = 0;
    } else {
        status->status = t->status;
        status->transferred_bytes = t->transferred;
        t->finished = 1;
    }
    pthread_mutex_unlock(&mu);
    return ST_OK;
}

EXPORT int freeBatchID(transfer_engine_t engine, uint64_t batch_id) {
    struct engine *e = check_engine(engine);
    pthread_mutex_lock(&mu);
    struct batch *b = check_batch(e, batch_id);
    for (size_t i = 0; i < b->count; i++)
        if (!b->tasks[i].finished) {
            pthread_mutex_unlock(&mu);
            return ST_BATCH_BUSY;
        }
    for (struct batch **p = &batches; *p != NULL; p = &(*p)->next)
        if (*p == b) {
            *p = b->next;
            break;
        }
    b->magic = DEAD; // kept allocated, so that a second free aborts
    free(b->tasks);
    b->tasks = NULL;
    e->n_free++;
    e->n_live--;
    live_batches--;
    pthread_mutex_unlock(&mu);
    return ST_OK;
}

// ---- test hooks ----

// fake_hold makes later submissions of e wait (WAITING or PENDING) until
// fake_release; with timeout set, held tasks report TIMEOUT meanwhile
// (unfinished, as Mooncake with MC_SLICE_TIMEOUT).
EXPORT void fake_hold(transfer_engine_t engine, int hold, int timeout) {
    struct engine *e = check_engine(engine);
    pthread_mutex_lock(&mu);
    e->hold = hold;
    e->timeout_mode = timeout;
    pthread_mutex_unlock(&mu);
}

// fake_late makes later submissions of e late, as Mooncake's tasks whose
// slices outlive MC_SLICE_TIMEOUT: each task reports TIMEOUT to its first
// polls status calls, runs (moves its bytes) right after the last of them,
// and reports its end state from then on. 0 turns it off.
EXPORT void fake_late(transfer_engine_t engine, int polls) {
    struct engine *e = check_engine(engine);
    pthread_mutex_lock(&mu);
    e->late_polls = polls;
    pthread_mutex_unlock(&mu);
}

// fake_release runs every held task of e and returns how many.
EXPORT int fake_release(transfer_engine_t engine) {
    struct engine *e = check_engine(engine);
    int n = 0;
    pthread_mutex_lock(&mu);
    for (struct batch *b = batches; b != NULL; b = b->next)
        if (b->e == e)
            for (size_t i = 0; i < b->count; i++)
                if (b->tasks[i].held) {
                    run(e, &b->tasks[i]);
                    n++;
                }
    pthread_mutex_unlock(&mu);
    return n;
}

// fake_fail_submit makes later submissions queue their tasks as FAILED and
// return code (a transport that failed after queuing).
EXPORT void fake_fail_submit(transfer_engine_t engine, int code) {
    struct engine *e = check_engine(engine);
    pthread_mutex_lock(&mu);
    e->fail_submit = code;
    pthread_mutex_unlock(&mu);
}

// fake_stats writes the call counters of e: submit, status, alloc, free,
// violations, live batches, registered regions, auto_discover.
EXPORT void fake_stats(transfer_engine_t engine, uint64_t *out) {
    struct engine *e = check_engine(engine);
    pthread_mutex_lock(&mu);
    out[0] = e->n_submit;
    out[1] = e->n_status;
    out[2] = e->n_alloc;
    out[3] = e->n_free;
    out[4] = e->n_violations;
    out[5] = e->n_live;
    out[6] = (uint64_t)e->nregions;
    out[7] = (uint64_t)e->auto_discover;
    pthread_mutex_unlock(&mu);
}

// fake_transport writes "proto|args[0]" of the installed transport.
EXPORT void fake_transport(transfer_engine_t engine, char *buf, size_t len) {
    struct engine *e = check_engine(engine);
    pthread_mutex_lock(&mu);
    snprintf(buf, len, "%s|%s", e->proto, e->transport_args);
    pthread_mutex_unlock(&mu);
}

// fake_location writes the location registered with the region at addr,
// or "" when there is none.
EXPORT void fake_location(transfer_engine_t engine, uintptr_t addr, char *buf, size_t len) {
    struct engine *e = check_engine(engine);
    pthread_mutex_lock(&mu);
    buf[0] = 0;
    for (int i = 0; i < e->nregions; i++)
        if (e->regions[i].addr == addr) snprintf(buf, len, "%s", e->regions[i].location);
    pthread_mutex_unlock(&mu);
}

// fake_layout writes sizeof and offsetof of the two structs as compiled.
EXPORT void fake_layout(uint64_t *out) {
    out[0] = sizeof(struct transfer_request);
    out[1] = offsetof(struct transfer_request, source);
    out[2] = offsetof(struct transfer_request, target_id);
    out[3] = offsetof(struct transfer_request, target_offset);
    out[4] = offsetof(struct transfer_request, length);
    out[5] = sizeof(struct transfer_status);
    out[6] = offsetof(struct transfer_status, transferred_bytes);
}

// fake_global writes the live batches and live engines of the process.
EXPORT void fake_global(uint64_t *out) {
    pthread_mutex_lock(&mu);
    out[0] = live_batches;
    out[1] = live_engines;
    pthread_mutex_unlock(&mu);
}

// fake_last_entries returns the entries pointer of e's last submitTransfer.
EXPORT uint64_t fake_last_entries(transfer_engine_t engine) {
    struct engine *e = check_engine(engine);
    pthread_mutex_lock(&mu);
    uint64_t p = e->last_entries;
    pthread_mutex_unlock(&mu);
    return p;
}
