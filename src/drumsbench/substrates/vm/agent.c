/*
 * The guest agent of DrumsBench's `vm` substrate: PID 1 of the guest, JSON lines over virtio-serial.
 *
 * Built on the host by the image builder (gcc -static -O2 -pthread), put in the initramfs, copied
 * to /run/drumsbench/agent by /init, which switch_roots into it: the agent is the guest's init.
 * It is C, not Python, because under software emulation every code path a fresh fork runs for the
 * first time is translated again: a Python agent cost ~0.2 s of CPU per fork before its first
 * answer, this one a few milliseconds.
 *
 * Protocol: one JSON object per line each way. A request has "id" and "op"; its response the same
 * "id" and "ok" (with "error" and "errno" when false). Binary data is base64.
 *   ping                                     -> {}
 *   hello {time, seed}                       set CLOCK_REALTIME; mix seed into the kernel's pool and
 *                                            force a CRNG reseed (a fork's fresh randomness)
 *   exec {argv, cwd, env, stdin, timeout, limit}
 *                                            -> {code, out, err, out_total, err_total, timed_out}
 *   write {path, data}; put {base, files}; read {path, limit} -> {data}
 *   end                                      kill every process but the agent
 *   reset {dirs}                             kill every process but the agent, empty dirs and the
 *                                            guest's temp folders
 *   digest {path} -> {digest}                drumsbench.core.fingerprint.tree_digest, computed here
 *   scan {folders, tokens, max_bytes} -> {hits}   drumsbench.core.canary_scan.scan_tokens, computed here
 *   sync                                     flush file systems (before a snapshot)
 *   sopen {argv, cwd, env} -> {sid, pid} | {code}   a stream: stdin and stdout held by the host
 *   sread {sid, at, hold} -> {data, at, eof}; swrite {sid, at, data, close} -> {written}
 *   spoll {sid} -> {code}; sclose {sid, timeout} -> {code}
 * Each request runs in its own thread. As PID 1 the agent reaps every process: one reaper thread
 * waits for any child and hands exit statuses to the execs waiting for them.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/random.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define EXEC_VAR "DRUMSBENCH_EXEC"
#define DRAIN_GRACE_MS 200

/* ---------------------------------------------------------------------------------------------- */
/* small helpers                                                                                   */

static void logmsg(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n > (int)sizeof buf - 2) n = sizeof buf - 2;
    buf[n++] = '\n';
    if (write(2, "drumsbench-agent: ", 18) < 0 || write(2, buf, n) < 0) return;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { logmsg("out of memory"); _exit(1); }
    return p;
}

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n ? n : 1);
    if (!p) { logmsg("out of memory"); _exit(1); }
    return p;
}

static double now_mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

typedef struct { char *p; size_t n, cap; } buf_t;

static void buf_add(buf_t *b, const void *d, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void buf_str(buf_t *b, const char *s) { buf_add(b, s, strlen(s)); }
static void buf_fmt(buf_t *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) buf_add(b, tmp, n < (int)sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* ---------------------------------------------------------------------------------------------- */
/* JSON: a small DOM parser and a writer                                                           */

enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };
typedef struct json {
    int type;
    double num;
    char *str;            /* J_STR: bytes (NUL-terminated; may contain NUL, see len) */
    size_t len;
    struct json *items;   /* J_ARR / J_OBJ values */
    char **keys;          /* J_OBJ keys */
    size_t count;
} json;

typedef struct { const char *s, *e; int err; } jp;

static void jp_ws(jp *p) { while (p->s < p->e && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')) p->s++; }

static void put_utf8(buf_t *b, unsigned cp) {
    unsigned char o[4];
    size_t n;
    if (cp < 0x80) { o[0] = cp; n = 1; }
    else if (cp < 0x800) { o[0] = 0xC0 | (cp >> 6); o[1] = 0x80 | (cp & 0x3F); n = 2; }
    else if (cp < 0x10000) { o[0] = 0xE0 | (cp >> 12); o[1] = 0x80 | ((cp >> 6) & 0x3F); o[2] = 0x80 | (cp & 0x3F); n = 3; }
    else { o[0] = 0xF0 | (cp >> 18); o[1] = 0x80 | ((cp >> 12) & 0x3F); o[2] = 0x80 | ((cp >> 6) & 0x3F); o[3] = 0x80 | (cp & 0x3F); n = 4; }
    buf_add(b, o, n);
}

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return -1;
    }
    *out = v;
    return 0;
}

static int jp_string(jp *p, char **out, size_t *len) {
    if (p->s >= p->e || *p->s != '"') return -1;
    p->s++;
    buf_t b = {0};
    buf_add(&b, "", 0);
    while (p->s < p->e && *p->s != '"') {
        char c = *p->s++;
        if (c != '\\') { buf_add(&b, &c, 1); continue; }
        if (p->s >= p->e) break;
        c = *p->s++;
        switch (c) {
        case 'n': buf_add(&b, "\n", 1); break;
        case 't': buf_add(&b, "\t", 1); break;
        case 'r': buf_add(&b, "\r", 1); break;
        case 'b': buf_add(&b, "\b", 1); break;
        case 'f': buf_add(&b, "\f", 1); break;
        case 'u': {
            unsigned cp, lo;
            if (p->e - p->s < 4 || hex4(p->s, &cp)) { free(b.p); return -1; }
            p->s += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && p->e - p->s >= 6 && p->s[0] == '\\' && p->s[1] == 'u' &&
                !hex4(p->s + 2, &lo) && lo >= 0xDC00 && lo < 0xE000) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p->s += 6;
            }
            put_utf8(&b, cp);
            break;
        }
        default: buf_add(&b, &c, 1);
        }
    }
    if (p->s >= p->e) { free(b.p); return -1; }
    p->s++;
    *out = b.p;
    *len = b.n;
    return 0;
}

static void jfree(json *j);

static int jp_value(jp *p, json *out, int depth) {
    memset(out, 0, sizeof *out);
    jp_ws(p);
    if (p->s >= p->e || depth > 32) return -1;
    char c = *p->s;
    if (c == '"') { out->type = J_STR; return jp_string(p, &out->str, &out->len); }
    if (c == '{' || c == '[') {
        int obj = c == '{';
        out->type = obj ? J_OBJ : J_ARR;
        p->s++;
        size_t cap = 0;
        jp_ws(p);
        if (p->s < p->e && *p->s == (obj ? '}' : ']')) { p->s++; return 0; }
        for (;;) {
            if (out->count == cap) {
                cap = cap ? cap * 2 : 8;
                out->items = xrealloc(out->items, cap * sizeof(json));
                if (obj) out->keys = xrealloc(out->keys, cap * sizeof(char *));
            }
            if (obj) {
                size_t kl;
                jp_ws(p);
                if (jp_string(p, &out->keys[out->count], &kl)) return -1;
                jp_ws(p);
                if (p->s >= p->e || *p->s != ':') { free(out->keys[out->count]); return -1; }
                p->s++;
            }
            if (jp_value(p, &out->items[out->count], depth + 1)) {
                if (obj) free(out->keys[out->count]);
                return -1;
            }
            out->count++;
            jp_ws(p);
            if (p->s < p->e && *p->s == ',') { p->s++; continue; }
            if (p->s < p->e && *p->s == (obj ? '}' : ']')) { p->s++; return 0; }
            return -1;
        }
    }
    if (!strncmp(p->s, "null", 4)) { p->s += 4; out->type = J_NULL; return 0; }
    if (!strncmp(p->s, "true", 4)) { p->s += 4; out->type = J_BOOL; out->num = 1; return 0; }
    if (!strncmp(p->s, "false", 5)) { p->s += 5; out->type = J_BOOL; return 0; }
    char *end;
    out->type = J_NUM;
    out->num = strtod(p->s, &end);
    if (end == p->s) return -1;
    p->s = end;
    return 0;
}

static void jfree(json *j) {
    if (!j) return;
    free(j->str);
    for (size_t i = 0; i < j->count; i++) {
        jfree(&j->items[i]);
        if (j->keys) free(j->keys[i]);
    }
    free(j->items);
    free(j->keys);
}

static json *jget(json *o, const char *key) {
    if (!o || o->type != J_OBJ) return NULL;
    for (size_t i = 0; i < o->count; i++)
        if (!strcmp(o->keys[i], key)) return &o->items[i];
    return NULL;
}
static const char *jstr(json *o, const char *key) {
    json *v = jget(o, key);
    return v && v->type == J_STR ? v->str : NULL;
}
static double jnum(json *o, const char *key, double dflt) {
    json *v = jget(o, key);
    return v && v->type == J_NUM ? v->num : dflt;
}

/* A JSON string literal of arbitrary bytes: bytes >= 0x80 are kept when they form valid UTF-8
   sequences (the host decodes UTF-8); invalid bytes become \u00XX. */
static void jw_str(buf_t *b, const char *s, size_t n) {
    buf_add(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (c == '"' || c == '\\') { char e[2] = {'\\', c}; buf_add(b, e, 2); }
        else if (c < 0x20) buf_fmt(b, "\\u%04x", c);
        else if (c < 0x80) buf_add(b, &c, 1);
        else {
            size_t k = c >= 0xF0 && c < 0xF5 ? 3 : c >= 0xE0 ? 2 : c >= 0xC2 && c < 0xE0 ? 1 : 0;
            int ok = k > 0 && i + k < n;
            for (size_t j = 1; ok && j <= k; j++) ok = ((unsigned char)s[i + j] & 0xC0) == 0x80;
            if (ok) { buf_add(b, s + i, k + 1); i += k; }
            else buf_fmt(b, "\\u%04x", c);
        }
    }
    buf_add(b, "\"", 1);
}

/* ---------------------------------------------------------------------------------------------- */
/* base64                                                                                          */

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void b64_enc(buf_t *b, const unsigned char *d, size_t n) {
    buf_add(b, "\"", 1);
    char q[4];
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = d[i] << 16 | (i + 1 < n ? d[i + 1] << 8 : 0) | (i + 2 < n ? d[i + 2] : 0);
        q[0] = B64[v >> 18];
        q[1] = B64[(v >> 12) & 63];
        q[2] = i + 1 < n ? B64[(v >> 6) & 63] : '=';
        q[3] = i + 2 < n ? B64[v & 63] : '=';
        buf_add(b, q, 4);
    }
    buf_add(b, "\"", 1);
}

static unsigned char *b64_dec(const char *s, size_t n, size_t *out_n) {
    static signed char map[256];
    static int ready;
    if (!ready) {
        memset(map, -1, sizeof map);
        for (int i = 0; i < 64; i++) map[(unsigned char)B64[i]] = i;
        ready = 1;
    }
    unsigned char *out = xmalloc(n / 4 * 3 + 3);
    size_t o = 0;
    unsigned v = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int x = map[(unsigned char)s[i]];
        if (x < 0) continue; /* '=' and anything else */
        v = v << 6 | x;
        bits += 6;
        if (bits >= 8) { bits -= 8; out[o++] = (v >> bits) & 0xFF; }
    }
    *out_n = o;
    return out;
}

/* ---------------------------------------------------------------------------------------------- */
/* the channel                                                                                     */

static int port_fd = -1;
static pthread_mutex_t port_lock = PTHREAD_MUTEX_INITIALIZER;

static void send_line(buf_t *b) {
    buf_add(b, "\n", 1);
    pthread_mutex_lock(&port_lock);
    size_t off = 0;
    while (off < b->n) {
        ssize_t w = write(port_fd, b->p + off, b->n - off);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) { usleep(1000); continue; }
            break; /* the host went away */
        }
        off += w;
    }
    pthread_mutex_unlock(&port_lock);
}

/* ---------------------------------------------------------------------------------------------- */
/* processes                                                                                       */

typedef struct child {
    pid_t pid;
    int status, done, wake_fd;
    struct child *next;
} child;

static pthread_mutex_t kids_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t kids_cond = PTHREAD_COND_INITIALIZER; /* a child was spawned / one exited */
static child *kids;
static unsigned long exec_seq;

static void *reaper(void *arg) {
    (void)arg;
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, 0);
        if (pid < 0) {
            if (errno == ECHILD) {
                pthread_mutex_lock(&kids_lock);
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += 1;
                pthread_cond_timedwait(&kids_cond, &kids_lock, &ts);
                pthread_mutex_unlock(&kids_lock);
            }
            continue;
        }
        pthread_mutex_lock(&kids_lock);
        for (child *c = kids; c; c = c->next)
            if (c->pid == pid && !c->done) {
                c->status = st;
                c->done = 1;
                if (c->wake_fd >= 0 && write(c->wake_fd, "x", 1) < 0) { /* nothing to do */ }
                break;
            }
        pthread_cond_broadcast(&kids_cond);
        pthread_mutex_unlock(&kids_lock);
    }
    return NULL;
}

/* pids of every process but PID 1 and kernel threads */
static size_t list_procs(pid_t **out) {
    size_t n = 0, cap = 64;
    pid_t *pids = xmalloc(cap * sizeof(pid_t));
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        pid_t pid = atoi(e->d_name);
        if (pid <= 2) continue;
        char path[64], stat[512];
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t r = read(fd, stat, sizeof stat - 1);
        close(fd);
        if (r <= 0) continue;
        stat[r] = 0;
        char *rp = strrchr(stat, ')');
        int ppid = 0;
        if (!rp || sscanf(rp + 1, " %*c %d", &ppid) != 1) continue;
        if (ppid == 2) continue;
        if (n == cap) pids = xrealloc(pids, (cap *= 2) * sizeof(pid_t));
        pids[n++] = pid;
    }
    if (d) closedir(d);
    *out = pids;
    return n;
}

static void kill_marked(const char *token) {
    char needle[64];
    int nl = snprintf(needle, sizeof needle, "%s=%s", EXEC_VAR, token);
    pid_t *pids;
    size_t n = list_procs(&pids);
    char *env = xmalloc(1 << 16);
    for (size_t i = 0; i < n; i++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/environ", pids[i]);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t r = read(fd, env, (1 << 16) - 1);
        close(fd);
        for (ssize_t off = 0; r > 0 && off < r;) {
            size_t l = strnlen(env + off, r - off);
            if (l == (size_t)nl && !memcmp(env + off, needle, nl)) { kill(pids[i], SIGKILL); break; }
            off += l + 1;
        }
    }
    free(env);
    free(pids);
}

/* argv and environment of a command the host asked for, with the exec token that marks its processes */
typedef struct { char **argv, **envp, *token; const char *path_env; size_t nenv; } cmdline;

static void cmdline_init(cmdline *c, json *argv_j, json *env_j) {
    c->argv = xmalloc((argv_j->count + 1) * sizeof(char *));
    for (size_t i = 0; i < argv_j->count; i++) c->argv[i] = argv_j->items[i].type == J_STR ? argv_j->items[i].str : "";
    c->argv[argv_j->count] = NULL;
    size_t nenv = env_j && env_j->type == J_OBJ ? env_j->count : 0;
    c->envp = xmalloc((nenv + 2) * sizeof(char *));
    c->path_env = NULL;
    size_t k = 0;
    for (size_t i = 0; i < nenv; i++) {
        if (env_j->items[i].type != J_STR || !strcmp(env_j->keys[i], EXEC_VAR)) continue;
        if (!strcmp(env_j->keys[i], "PATH")) c->path_env = env_j->items[i].str;
        if (asprintf(&c->envp[k], "%s=%s", env_j->keys[i], env_j->items[i].str) > 0) k++;
    }
    c->token = xmalloc(32);
    pthread_mutex_lock(&kids_lock);
    snprintf(c->token, 32, "%lu", ++exec_seq);
    pthread_mutex_unlock(&kids_lock);
    if (asprintf(&c->envp[k], "%s=%s", EXEC_VAR, c->token) > 0) k++;
    c->envp[k] = NULL;
    c->nenv = k;
}

static void cmdline_free(cmdline *c) {
    for (size_t i = 0; i < c->nenv; i++) free(c->envp[i]);
    free(c->envp);
    free(c->argv);
    free(c->token);
}

/* posix_spawn of exe in a session of its own with fds[0..2] as stdin, stdout, stderr, registered in
 * kids before the reaper can see it exit (wake_fd: written when it exits, -1 for none); NULL with
 * *spawn_err set when it could not start */
static child *spawn_child(const char *exe, cmdline *c, const char *cwd, const int fds[3], int wake_fd, int *spawn_err) {
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    for (int i = 0; i < 3; i++) posix_spawn_file_actions_adddup2(&fa, fds[i], i);
    posix_spawn_file_actions_addchdir_np(&fa, cwd);
    posix_spawnattr_init(&at);
    sigset_t none, dflt;
    sigemptyset(&none);
    sigfillset(&dflt);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &dflt);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    child *me = xmalloc(sizeof *me);
    memset(me, 0, sizeof *me);
    me->wake_fd = wake_fd;
    pid_t pid;
    pthread_mutex_lock(&kids_lock);
    *spawn_err = posix_spawn(&pid, exe, &fa, &at, c->argv, c->envp);
    if (!*spawn_err) {
        me->pid = pid;
        me->next = kids;
        kids = me;
        pthread_cond_broadcast(&kids_cond);
    }
    pthread_mutex_unlock(&kids_lock);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (*spawn_err) { free(me); return NULL; }
    return me;
}

/* the exit code of a reaped child as exec reports it (-N: killed by signal N); under kids_lock */
static int child_code(const child *me) {
    if (!me->done) return -9;
    return WIFSIGNALED(me->status) ? -WTERMSIG(me->status) : WEXITSTATUS(me->status);
}

/* remove a child from kids and free it; under kids_lock */
static void child_forget(child *me) {
    for (child **pp = &kids; *pp; pp = &(*pp)->next)
        if (*pp == me) { *pp = me->next; break; }
    free(me);
}

typedef struct { buf_t head, tail; size_t head_room, tail_room, total, tail_start; } headtail;

static void ht_init(headtail *h, size_t limit) {
    memset(h, 0, sizeof *h);
    h->head_room = limit - limit / 2;
    h->tail_room = limit / 2;
}
/* The tail is kept in a buffer that is compacted when it grows past twice its room. */
static void ht_add(headtail *h, const char *d, size_t n) {
    h->total += n;
    size_t take = h->head.n < h->head_room ? h->head_room - h->head.n : 0;
    if (take > n) take = n;
    if (take) { buf_add(&h->head, d, take); d += take; n -= take; }
    if (!n || !h->tail_room) return;
    if (n >= h->tail_room) {
        h->tail.n = 0;
        h->tail_start = 0;
        buf_add(&h->tail, d + n - h->tail_room, h->tail_room);
        return;
    }
    buf_add(&h->tail, d, n);
    if (h->tail.n - h->tail_start > h->tail_room) h->tail_start = h->tail.n - h->tail_room;
    if (h->tail_start > 4 * h->tail_room) {
        memmove(h->tail.p, h->tail.p + h->tail_start, h->tail.n - h->tail_start);
        h->tail.n -= h->tail_start;
        h->tail_start = 0;
    }
}

static char *find_exe(const char *name, const char *path) {
    if (strchr(name, '/')) return strdup(name);
    if (!path) path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    char *copy = strdup(path), *save = NULL;
    char *found = NULL;
    for (char *dir = strtok_r(copy, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", *dir ? dir : ".", name);
        struct stat st;
        if (!stat(full, &st) && S_ISREG(st.st_mode) && !access(full, X_OK)) { found = strdup(full); break; }
    }
    free(copy);
    return found;
}

static void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

static int op_exec(json *req, buf_t *res, char *err, size_t errlen) {
    json *argv_j = jget(req, "argv"), *env_j = jget(req, "env"), *stdin_j = jget(req, "stdin");
    const char *cwd = jstr(req, "cwd");
    double timeout = jnum(req, "timeout", 60);
    size_t limit = (size_t)jnum(req, "limit", 65536);
    if (!argv_j || argv_j->type != J_ARR || !argv_j->count) { snprintf(err, errlen, "exec: no argv"); return EINVAL; }
    if (!cwd) cwd = "/";
    struct stat st;
    if (stat(cwd, &st) || !S_ISDIR(st.st_mode)) { snprintf(err, errlen, "working folder %s is gone", cwd); return ENOENT; }
    double t0 = now_mono();

    cmdline cl;
    cmdline_init(&cl, argv_j, env_j);
    char **argv = cl.argv, *token = cl.token;
    const char *path_env = cl.path_env;

    unsigned char *in_data = NULL;
    size_t in_n = 0, in_off = 0;
    if (stdin_j && stdin_j->type == J_STR) in_data = b64_dec(stdin_j->str, stdin_j->len, &in_n);

    int out_p[2], err_p[2], in_p[2] = {-1, -1}, wake_p[2];
    pipe2(out_p, O_CLOEXEC);
    pipe2(err_p, O_CLOEXEC);
    pipe2(wake_p, O_CLOEXEC);
    if (in_data) pipe2(in_p, O_CLOEXEC);
    else in_p[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);

    headtail out, errs;
    ht_init(&out, limit);
    ht_init(&errs, limit);
    int code = 0, timed_out = 0;
    char *exe = find_exe(argv[0], path_env);
    child *me = NULL;
    int spawn_err = exe ? 0 : ENOENT;
    if (exe) me = spawn_child(exe, &cl, cwd, (int[3]){in_p[0], out_p[1], err_p[1]}, wake_p[1], &spawn_err);
    close(out_p[1]);
    close(err_p[1]);
    close(in_p[0]);

    if (!me) { /* not found / not executable: what a shell would say and exit with */
        code = spawn_err == ENOENT ? 127 : 126;
        char msg[512];
        int n = snprintf(msg, sizeof msg, "%s: %s\n", argv[0], spawn_err == ENOENT ? "not found" : strerror(spawn_err));
        ht_add(&errs, msg, n);
        if (in_p[1] >= 0) close(in_p[1]);
        in_p[1] = -1;
    } else {
        int in_w = in_p[1];
        if (in_w >= 0) {
            set_nonblock(in_w);
            if (!in_n) { close(in_w); in_w = -1; }
        }
        int open_out = 1, open_err = 1, exited = 0;
        double deadline = t0 + timeout, exited_at = 0;
        char chunk[65536];
        while (open_out || open_err) {
            double t = now_mono();
            if (t >= deadline) {
                pthread_mutex_lock(&kids_lock);
                timed_out = !me->done;
                pthread_mutex_unlock(&kids_lock);
                break;
            }
            if (!exited) {
                pthread_mutex_lock(&kids_lock);
                exited = me->done;
                pthread_mutex_unlock(&kids_lock);
                if (exited) exited_at = t;
            }
            if (exited && t - exited_at > DRAIN_GRACE_MS / 1000.0) break;
            double wait = deadline - t;
            if (exited && wait > DRAIN_GRACE_MS / 1000.0 - (t - exited_at)) wait = DRAIN_GRACE_MS / 1000.0 - (t - exited_at);
            struct pollfd pf[4];
            int np = 0, io = -1, ie = -1, iw = -1, ii = -1;
            if (open_out) { io = np; pf[np++] = (struct pollfd){out_p[0], POLLIN, 0}; }
            if (open_err) { ie = np; pf[np++] = (struct pollfd){err_p[0], POLLIN, 0}; }
            if (!exited) { iw = np; pf[np++] = (struct pollfd){wake_p[0], POLLIN, 0}; }
            if (in_w >= 0) { ii = np; pf[np++] = (struct pollfd){in_w, POLLOUT, 0}; }
            int ms = (int)(wait * 1000) + 1;
            if (poll(pf, np, ms) < 0 && errno != EINTR) break;
            if (io >= 0 && pf[io].revents) {
                ssize_t r = read(out_p[0], chunk, sizeof chunk);
                if (r > 0) ht_add(&out, chunk, r);
                else if (r == 0 || (errno != EINTR && errno != EAGAIN)) open_out = 0;
            }
            if (ie >= 0 && pf[ie].revents) {
                ssize_t r = read(err_p[0], chunk, sizeof chunk);
                if (r > 0) ht_add(&errs, chunk, r);
                else if (r == 0 || (errno != EINTR && errno != EAGAIN)) open_err = 0;
            }
            if (iw >= 0 && pf[iw].revents) {
                char tmp[16];
                if (read(wake_p[0], tmp, sizeof tmp) < 0) { /* woken anyway */ }
            }
            if (ii >= 0 && pf[ii].revents) {
                ssize_t w = write(in_w, in_data + in_off, in_n - in_off > 65536 ? 65536 : in_n - in_off);
                if (w > 0) in_off += w;
                if ((w < 0 && errno != EAGAIN && errno != EINTR) || in_off >= in_n) { close(in_w); in_w = -1; }
            }
        }
        if (in_w >= 0) close(in_w);
        if (timed_out) { kill(-me->pid, SIGKILL); kill_marked(token); }
        /* wait for the exit status: until the deadline (+0.5 s) if output ended first */
        pthread_mutex_lock(&kids_lock);
        double until = (deadline > now_mono() ? deadline : now_mono()) + 0.5;
        int killed = 0;
        while (!me->done) {
            double t = now_mono();
            if (t >= until) {
                if (killed) break;
                timed_out = 1;
                killed = 1;
                pthread_mutex_unlock(&kids_lock);
                kill(-me->pid, SIGKILL);
                kill_marked(token);
                pthread_mutex_lock(&kids_lock);
                until = t + 5.0;
                continue;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            double w = until - t;
            if (w > 0.5) w = 0.5;
            ts.tv_sec += (time_t)w;
            ts.tv_nsec += (long)((w - (time_t)w) * 1e9);
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&kids_cond, &kids_lock, &ts);
        }
        code = child_code(me);
        child_forget(me);
        close(wake_p[1]); /* the reaper writes to it only under kids_lock */
        wake_p[1] = -1;
        pthread_mutex_unlock(&kids_lock);
    }
    close(out_p[0]);
    close(err_p[0]);
    close(wake_p[0]);
    if (wake_p[1] >= 0) close(wake_p[1]);

    buf_fmt(res, ",\"code\":%d,\"out\":", code);
    buf_t o = {0};
    buf_add(&o, out.head.p ? out.head.p : "", out.head.n);
    buf_add(&o, out.tail.p ? out.tail.p + out.tail_start : "", out.tail.n - out.tail_start);
    b64_enc(res, (unsigned char *)o.p, o.n);
    o.n = 0;
    buf_add(&o, errs.head.p ? errs.head.p : "", errs.head.n);
    buf_add(&o, errs.tail.p ? errs.tail.p + errs.tail_start : "", errs.tail.n - errs.tail_start);
    buf_str(res, ",\"err\":");
    b64_enc(res, (unsigned char *)o.p, o.n);
    buf_fmt(res, ",\"out_total\":%zu,\"err_total\":%zu,\"timed_out\":%s,\"duration\":%.6f", out.total, errs.total,
            timed_out ? "true" : "false", now_mono() - t0);
    free(o.p);
    free(out.head.p);
    free(out.tail.p);
    free(errs.head.p);
    free(errs.tail.p);
    free(exe);
    free(in_data);
    cmdline_free(&cl);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* streams: a command whose stdin and stdout the host holds for as long as it talks to it          */
/*                                                                                                 */
/* Bytes are counted from the stream's start both ways, so a request the host gave up on (a VM      */
/* stopped meanwhile) can be repeated without losing or doubling a byte: sread returns what lies at */
/* and beyond "at" (what came before is dropped as received), swrite skips what was written before. */

typedef struct stream {
    unsigned long sid;
    int in_fd, out_fd;           /* our ends; -1 once closed */
    child *kid;                  /* in kids until the stream is freed */
    char token[32];
    buf_t held;                  /* read from stdout, not yet acknowledged; held.p[0] is byte "base" */
    size_t base, written;
    int eof, refs, gone;
    pthread_mutex_t rlock, wlock; /* one reader, one writer at a time */
    struct stream *next;
} stream;

static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER;
static stream *streams;
static unsigned long stream_seq;

static stream *stream_get(json *req) {
    unsigned long sid = (unsigned long)jnum(req, "sid", 0);
    pthread_mutex_lock(&streams_lock);
    stream *s = streams;
    while (s && s->sid != sid) s = s->next;
    if (s) s->refs++;
    pthread_mutex_unlock(&streams_lock);
    return s;
}

static void stream_put(stream *s) {
    pthread_mutex_lock(&streams_lock);
    int last = --s->refs == 0 && s->gone;
    pthread_mutex_unlock(&streams_lock);
    if (!last) return;
    if (s->in_fd >= 0) close(s->in_fd);
    if (s->out_fd >= 0) close(s->out_fd);
    pthread_mutex_lock(&kids_lock);
    child_forget(s->kid);
    pthread_mutex_unlock(&kids_lock);
    free(s->held.p);
    pthread_mutex_destroy(&s->rlock);
    pthread_mutex_destroy(&s->wlock);
    free(s);
}

/* sopen {argv, cwd, env} -> {sid} or, when it cannot start, {code} (126: no working folder or not
 * executable, 127: not found). stderr goes to /dev/null. */
static int op_sopen(json *req, buf_t *res, char *err, size_t errlen) {
    json *argv_j = jget(req, "argv"), *env_j = jget(req, "env");
    const char *cwd = jstr(req, "cwd");
    if (!argv_j || argv_j->type != J_ARR || !argv_j->count) { snprintf(err, errlen, "sopen: no argv"); return EINVAL; }
    if (!cwd) cwd = "/";
    struct stat st;
    if (stat(cwd, &st) || !S_ISDIR(st.st_mode)) { buf_str(res, ",\"code\":126"); return 0; }
    cmdline cl;
    cmdline_init(&cl, argv_j, env_j);
    char *exe = find_exe(cl.argv[0], cl.path_env);
    int spawn_err = ENOENT;
    child *me = NULL;
    int in_p[2], out_p[2], null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    pipe2(in_p, O_CLOEXEC);
    pipe2(out_p, O_CLOEXEC);
    if (exe) me = spawn_child(exe, &cl, cwd, (int[3]){in_p[0], out_p[1], null_fd}, -1, &spawn_err);
    close(in_p[0]);
    close(out_p[1]);
    close(null_fd);
    if (!me) {
        close(in_p[1]);
        close(out_p[0]);
        buf_fmt(res, ",\"code\":%d", spawn_err == ENOENT ? 127 : 126);
    } else {
        stream *s = xmalloc(sizeof *s);
        memset(s, 0, sizeof *s);
        s->in_fd = in_p[1];
        s->out_fd = out_p[0];
        s->kid = me;
        snprintf(s->token, sizeof s->token, "%s", cl.token);
        pthread_mutex_init(&s->rlock, NULL);
        pthread_mutex_init(&s->wlock, NULL);
        pthread_mutex_lock(&streams_lock);
        s->sid = ++stream_seq;
        s->next = streams;
        streams = s;
        pthread_mutex_unlock(&streams_lock);
        buf_fmt(res, ",\"sid\":%lu,\"pid\":%d", s->sid, me->pid);
    }
    free(exe);
    cmdline_free(&cl);
    return 0;
}

/* sread {sid, at, hold} -> {data, at, eof}: stdout from byte "at" on, waiting up to "hold" s for some */
static int op_sread(json *req, buf_t *res, char *err, size_t errlen) {
    stream *s = stream_get(req);
    if (!s) { snprintf(err, errlen, "sread: no such stream"); return ENOENT; }
    size_t at = (size_t)jnum(req, "at", 0);
    double wait = jnum(req, "hold", 1.0);
    pthread_mutex_lock(&s->rlock);
    if (at > s->base) { /* acknowledged: drop it */
        size_t drop = at - s->base > s->held.n ? s->held.n : at - s->base;
        memmove(s->held.p, s->held.p + drop, s->held.n - drop);
        s->held.n -= drop;
        s->base += drop;
    }
    if (!s->held.n && !s->eof && !s->gone) {
        struct pollfd pf = {s->out_fd, POLLIN, 0};
        if (poll(&pf, 1, (int)(wait * 1000)) > 0) {
            char chunk[65536];
            ssize_t r = read(s->out_fd, chunk, sizeof chunk);
            if (r > 0) buf_add(&s->held, chunk, r);
            else if (r == 0 || (errno != EINTR && errno != EAGAIN)) s->eof = 1;
        }
    }
    buf_str(res, ",\"data\":");
    b64_enc(res, (unsigned char *)(s->held.p ? s->held.p : ""), s->held.n);
    buf_fmt(res, ",\"at\":%zu,\"eof\":%s", s->base, (s->eof || s->gone) && !s->held.n ? "true" : "false");
    pthread_mutex_unlock(&s->rlock);
    stream_put(s);
    return 0;
}

/* swrite {sid, at, data, close} -> {written}: data (byte "at" of stdin on) written whole, then stdin
 * closed when "close"; EPIPE once the command no longer reads */
static int op_swrite(json *req, buf_t *res, char *err, size_t errlen) {
    stream *s = stream_get(req);
    if (!s) { snprintf(err, errlen, "swrite: no such stream"); return ENOENT; }
    size_t at = (size_t)jnum(req, "at", 0), n = 0;
    json *data_j = jget(req, "data");
    unsigned char *d = data_j && data_j->type == J_STR ? b64_dec(data_j->str, data_j->len, &n) : NULL;
    int rc = 0;
    pthread_mutex_lock(&s->wlock);
    size_t off = s->written > at ? s->written - at : 0;
    if (s->written < at) { snprintf(err, errlen, "swrite: byte %zu is past what was written (%zu)", at, s->written); rc = EINVAL; }
    while (!rc && off < n) {
        if (s->in_fd < 0 || s->gone) { snprintf(err, errlen, "swrite: stdin is closed"); rc = EPIPE; break; }
        struct pollfd pf = {s->in_fd, POLLOUT, 0};
        if (poll(&pf, 1, 1000) <= 0) continue;
        ssize_t w = write(s->in_fd, d + off, n - off);
        if (w > 0) { off += w; s->written += w; }
        else if (w < 0 && errno != EINTR && errno != EAGAIN) { snprintf(err, errlen, "swrite: %s", strerror(errno)); rc = errno; }
    }
    json *close_j = jget(req, "close");
    if (!rc && close_j && close_j->type == J_BOOL && close_j->num && s->in_fd >= 0) {
        close(s->in_fd);
        s->in_fd = -1;
    }
    if (!rc) buf_fmt(res, ",\"written\":%zu", s->written);
    pthread_mutex_unlock(&s->wlock);
    free(d);
    stream_put(s);
    return rc;
}

/* spoll {sid} -> {code}: the exit status once the command ended, else null */
static int op_spoll(json *req, buf_t *res, char *err, size_t errlen) {
    stream *s = stream_get(req);
    if (!s) { snprintf(err, errlen, "spoll: no such stream"); return ENOENT; }
    pthread_mutex_lock(&kids_lock);
    if (s->kid->done) buf_fmt(res, ",\"code\":%d", child_code(s->kid));
    else buf_str(res, ",\"code\":null");
    pthread_mutex_unlock(&kids_lock);
    stream_put(s);
    return 0;
}

/* sclose {sid, timeout} -> {code}: kill the command and everything it started (its session, its
 * token), wait up to "timeout" s for its status (null if none), forget the stream */
static int op_sclose(json *req, buf_t *res, char *err, size_t errlen) {
    stream *s = stream_get(req);
    if (!s) { snprintf(err, errlen, "sclose: no such stream"); return ENOENT; }
    pthread_mutex_lock(&streams_lock);
    if (!s->gone) {
        s->gone = 1;
        for (stream **pp = &streams; *pp; pp = &(*pp)->next)
            if (*pp == s) { *pp = s->next; break; }
    }
    pthread_mutex_unlock(&streams_lock);
    pthread_mutex_lock(&kids_lock);
    int done = s->kid->done;
    pid_t pid = s->kid->pid;
    pthread_mutex_unlock(&kids_lock);
    if (!done) kill(-pid, SIGKILL);
    kill_marked(s->token);
    double until = now_mono() + jnum(req, "timeout", 5.0);
    pthread_mutex_lock(&kids_lock);
    while (!s->kid->done && now_mono() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&kids_cond, &kids_lock, &ts);
    }
    if (s->kid->done) buf_fmt(res, ",\"code\":%d", child_code(s->kid));
    else buf_str(res, ",\"code\":null");
    pthread_mutex_unlock(&kids_lock);
    stream_put(s);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* files                                                                                           */

static int mkdirs(const char *path) { /* mkdir -p of the parent folders of path */
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0777) && errno != EEXIST) return errno;
        *p = '/';
    }
    return 0;
}

static int write_file(const char *path, const unsigned char *d, size_t n) {
    int e = mkdirs(path);
    if (e) return e;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return errno;
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(fd, d + off, n - off);
        if (w < 0) { if (errno == EINTR) continue; e = errno; close(fd); return e; }
        off += w;
    }
    return close(fd) ? errno : 0;
}

static int op_write(json *req, buf_t *res, char *err, size_t errlen) {
    (void)res;
    const char *path = jstr(req, "path");
    json *data = jget(req, "data");
    if (!path || !data || data->type != J_STR) { snprintf(err, errlen, "write: path and data needed"); return EINVAL; }
    size_t n;
    unsigned char *d = b64_dec(data->str, data->len, &n);
    int e = write_file(path, d, n);
    free(d);
    if (e) snprintf(err, errlen, "%s: %s", path, strerror(e));
    return e;
}

static int op_put(json *req, buf_t *res, char *err, size_t errlen) {
    (void)res;
    const char *base = jstr(req, "base");
    json *files = jget(req, "files");
    if (!base || !files || files->type != J_OBJ) { snprintf(err, errlen, "put: base and files needed"); return EINVAL; }
    for (size_t i = 0; i < files->count; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", base, files->keys[i]);
        size_t n;
        unsigned char *d = b64_dec(files->items[i].str ? files->items[i].str : "", files->items[i].len, &n);
        int e = write_file(path, d, n);
        free(d);
        if (e) { snprintf(err, errlen, "%s: %s", path, strerror(e)); return e; }
    }
    return 0;
}

static int op_read(json *req, buf_t *res, char *err, size_t errlen) {
    const char *path = jstr(req, "path");
    json *lim = jget(req, "limit");
    size_t limit = lim && lim->type == J_NUM ? (size_t)lim->num : (size_t)-1;
    if (!path) { snprintf(err, errlen, "read: path needed"); return EINVAL; }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { int e = errno; snprintf(err, errlen, "%s: %s", path, strerror(e)); return e; }
    buf_t d = {0};
    buf_add(&d, "", 0);
    char chunk[65536];
    while (d.n < limit) {
        size_t want = limit - d.n < sizeof chunk ? limit - d.n : sizeof chunk;
        ssize_t r = read(fd, chunk, want);
        if (r < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            free(d.p);
            snprintf(err, errlen, "%s: %s", path, strerror(e));
            return e;
        }
        if (!r) break;
        buf_add(&d, chunk, r);
    }
    close(fd);
    buf_str(res, ",\"data\":");
    b64_enc(res, (unsigned char *)d.p, d.n);
    free(d.p);
    return 0;
}

static void rm_contents(int dfd) { /* remove everything inside an open folder, never following links */
    DIR *d = fdopendir(dfd);
    if (!d) { close(dfd); return; }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (!unlinkat(dirfd(d), e->d_name, 0)) continue;
        int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub >= 0) rm_contents(sub);
        unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR);
    }
    closedir(d);
}

/* kill every process but the agent, until none is left (no program of the guest's is run: its root
 * may have replaced any of them) */
static int end_all(char *err, size_t errlen) {
    for (int i = 0; i < 50; i++) {
        pid_t *pids;
        size_t n = list_procs(&pids);
        for (size_t j = 0; j < n; j++) kill(pids[j], SIGKILL);
        free(pids);
        if (!n) return 0;
        usleep(20000);
    }
    snprintf(err, errlen, "processes survive SIGKILL");
    return EBUSY;
}

static int op_end(json *req, buf_t *res, char *err, size_t errlen) {
    (void)req; (void)res;
    return end_all(err, errlen);
}

static int op_reset(json *req, buf_t *res, char *err, size_t errlen) {
    (void)res;
    int rc = end_all(err, errlen);
    if (rc) return rc;
    static const char *temp[] = {"/tmp", "/var/tmp", "/dev/shm"};
    json *dirs = jget(req, "dirs");
    size_t nd = dirs && dirs->type == J_ARR ? dirs->count : 0;
    for (size_t j = 0; j < nd + 3; j++) {
        const char *dir = j < nd ? dirs->items[j].str : temp[j - nd];
        if (!dir) continue;
        int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) {
            char probe[4096];
            snprintf(probe, sizeof probe, "%s/x", dir);
            mkdirs(probe);
            continue;
        }
        rm_contents(fd);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* SHA-256 (FIPS 180-4), for the tree digest                                                      */

typedef struct { uint32_t h[8]; uint64_t len; unsigned char buf[64]; size_t n; } sha256;

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha_block(sha256 *s, const unsigned char *p) {
    uint32_t w[64], a, b, c, d, e, f, g, h;
    for (int i = 0; i < 16; i++) w[i] = (uint32_t)p[4 * i] << 24 | p[4 * i + 1] << 16 | p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = s->h[0]; b = s->h[1]; c = s->h[2]; d = s->h[3]; e = s->h[4]; f = s->h[5]; g = s->h[6]; h = s->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    s->h[0] += a; s->h[1] += b; s->h[2] += c; s->h[3] += d; s->h[4] += e; s->h[5] += f; s->h[6] += g; s->h[7] += h;
}

static void sha_init(sha256 *s) {
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, iv, sizeof iv);
    s->len = 0;
    s->n = 0;
}

static void sha_add(sha256 *s, const void *data, size_t n) {
    const unsigned char *p = data;
    s->len += n;
    while (n) {
        size_t take = 64 - s->n < n ? 64 - s->n : n;
        memcpy(s->buf + s->n, p, take);
        s->n += take; p += take; n -= take;
        if (s->n == 64) { sha_block(s, s->buf); s->n = 0; }
    }
}

static void sha_hex(sha256 *s, char out[65]) {
    uint64_t bits = s->len * 8;
    unsigned char pad = 0x80, zero = 0, lenb[8];
    sha_add(s, &pad, 1);
    while (s->n != 56) sha_add(s, &zero, 1);
    for (int i = 0; i < 8; i++) lenb[i] = bits >> (56 - 8 * i);
    sha_add(s, lenb, 8);
    for (int i = 0; i < 8; i++) sprintf(out + 8 * i, "%08x", s->h[i]);
}

/* ---------------------------------------------------------------------------------------------- */
/* tree digest: exactly drumsbench.core.fingerprint.tree_digest (os.walk order, sorted names)           */

typedef struct { char *name; int is_dir; } ent;

static int ent_cmp(const void *a, const void *b) { return strcmp(((const ent *)a)->name, ((const ent *)b)->name); }
static int str_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int digest_dir(const char *dir, const char *rel, sha256 *h, char *err, size_t errlen) {
    DIR *d = opendir(dir);
    if (!d) return 0; /* os.walk skips what it cannot list */
    ent *ents = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        int is_dir;
        if (e->d_type == DT_DIR) is_dir = 1;
        else if (e->d_type == DT_UNKNOWN || e->d_type == DT_LNK) { /* os.walk: is_dir() follows links */
            struct stat st;
            is_dir = !fstatat(dirfd(d), e->d_name, &st, 0) && S_ISDIR(st.st_mode);
        } else is_dir = 0;
        if (n == cap) ents = xrealloc(ents, (cap = cap ? cap * 2 : 32) * sizeof(ent));
        ents[n].name = strdup(e->d_name);
        ents[n++].is_dir = is_dir;
    }
    closedir(d);
    qsort(ents, n, sizeof(ent), ent_cmp);
    size_t ndirs = 0;
    for (size_t i = 0; i < n; i++) ndirs += ents[i].is_dir;
    int rc = 0;
    if (n == 0 && rel[0]) { sha_add(h, "D ", 2); sha_add(h, rel, strlen(rel)); sha_add(h, "\n", 1); }
    /* files (every non-dir) and links among the dirs, sorted together */
    char **names = xmalloc((n + 1) * sizeof(char *));
    size_t nn = 0;
    for (size_t i = 0; i < n; i++) {
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", dir, ents[i].name);
        struct stat lst;
        if (!ents[i].is_dir || (!lstat(full, &lst) && S_ISLNK(lst.st_mode))) names[nn++] = ents[i].name;
    }
    qsort(names, nn, sizeof(char *), str_cmp);
    for (size_t i = 0; i < nn && !rc; i++) {
        char full[4096], r[4096];
        snprintf(full, sizeof full, "%s/%s", dir, names[i]);
        snprintf(r, sizeof r, "%s%s%s", rel, rel[0] ? "/" : "", names[i]);
        struct stat lst, st;
        if (lstat(full, &lst)) continue;
        if (S_ISLNK(lst.st_mode)) {
            char target[4096];
            ssize_t tl = readlink(full, target, sizeof target);
            if (tl < 0) tl = 0;
            sha_add(h, "L ", 2); sha_add(h, r, strlen(r)); sha_add(h, " ", 1); sha_add(h, target, tl); sha_add(h, "\n", 1);
        } else if (!stat(full, &st) && S_ISREG(st.st_mode)) {
            int fd = open(full, O_RDONLY | O_CLOEXEC);
            if (fd < 0) { snprintf(err, errlen, "%s: %s", full, strerror(errno)); rc = errno; break; }
            sha256 fh;
            sha_init(&fh);
            char chunk[65536];
            ssize_t got;
            while ((got = read(fd, chunk, sizeof chunk)) > 0) sha_add(&fh, chunk, got);
            close(fd);
            char hex[65];
            sha_hex(&fh, hex);
            sha_add(h, "F ", 2); sha_add(h, r, strlen(r)); sha_add(h, " ", 1); sha_add(h, hex, 64); sha_add(h, "\n", 1);
        }
    }
    /* then recurse into the real (non-link) dirs, in sorted order */
    for (size_t i = 0; i < n && !rc; i++) {
        if (!ents[i].is_dir) continue;
        char full[4096], r[4096];
        snprintf(full, sizeof full, "%s/%s", dir, ents[i].name);
        struct stat lst;
        if (lstat(full, &lst) || S_ISLNK(lst.st_mode)) continue;
        snprintf(r, sizeof r, "%s%s%s", rel, rel[0] ? "/" : "", ents[i].name);
        rc = digest_dir(full, r, h, err, errlen);
    }
    (void)ndirs;
    for (size_t i = 0; i < n; i++) free(ents[i].name);
    free(ents);
    free(names);
    return rc;
}

static int op_digest(json *req, buf_t *res, char *err, size_t errlen) {
    const char *path = jstr(req, "path");
    if (!path) { snprintf(err, errlen, "digest: path needed"); return EINVAL; }
    sha256 h;
    sha_init(&h);
    struct stat st;
    if (!stat(path, &st) && S_ISDIR(st.st_mode)) {
        int e = digest_dir(path, "", &h, err, errlen);
        if (e) return e;
    }
    char hex[65];
    sha_hex(&h, hex);
    buf_fmt(res, ",\"digest\":\"sha256:%s\"", hex);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* canary scan: drumsbench.core.canary_scan.scan_tokens (regular files, links not followed, size-capped)        */

static void scan_dir(const char *dir, json *tokens, char *found, size_t max_bytes) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(full, &st)) continue;
        if (S_ISDIR(st.st_mode)) { scan_dir(full, tokens, found, max_bytes); continue; }
        if (!S_ISREG(st.st_mode) || (size_t)st.st_size > max_bytes) continue;
        int fd = open(full, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0) continue;
        char *data = xmalloc(st.st_size + 1);
        size_t got = 0;
        ssize_t r;
        while (got < (size_t)st.st_size && (r = read(fd, data + got, st.st_size - got)) > 0) got += r;
        close(fd);
        for (size_t t = 0; t < tokens->count; t++)
            if (!found[t] && tokens->items[t].len && memmem(data, got, tokens->items[t].str, tokens->items[t].len))
                found[t] = 1;
        free(data);
    }
    closedir(d);
}

static int op_scan(json *req, buf_t *res, char *err, size_t errlen) {
    json *folders = jget(req, "folders"), *tokens = jget(req, "tokens");
    size_t max_bytes = (size_t)jnum(req, "max_bytes", 8 << 20);
    if (!folders || folders->type != J_ARR || !tokens || tokens->type != J_ARR) {
        snprintf(err, errlen, "scan: folders and tokens needed");
        return EINVAL;
    }
    char *found = calloc(tokens->count + 1, 1);
    for (size_t i = 0; i < folders->count; i++)
        if (folders->items[i].str) scan_dir(folders->items[i].str, tokens, found, max_bytes);
    buf_str(res, ",\"hits\":[");
    int first = 1;
    for (size_t t = 0; t < tokens->count; t++)
        if (found[t]) {
            if (!first) buf_add(res, ",", 1);
            jw_str(res, tokens->items[t].str, tokens->items[t].len);
            first = 0;
        }
    buf_add(res, "]", 1);
    free(found);
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* clock and randomness                                                                            */

static int op_hello(json *req, buf_t *res, char *err, size_t errlen) {
    json *t = jget(req, "time");
    if (t && t->type == J_NUM) {
        struct timespec ts = {(time_t)t->num, (long)((t->num - (time_t)t->num) * 1e9)};
        if (clock_settime(CLOCK_REALTIME, &ts)) logmsg("clock_settime: %s", strerror(errno));
    }
    json *seed = jget(req, "seed");
    if (seed && seed->type == J_STR && seed->len) {
        size_t n;
        unsigned char *d = b64_dec(seed->str, seed->len, &n);
        int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
        if (fd < 0) { snprintf(err, errlen, "/dev/urandom: %s", strerror(errno)); free(d); return errno; }
        if (write(fd, d, n) < 0) logmsg("urandom write: %s", strerror(errno));
        /* credit the host's bytes and force a reseed of the CRNG (needs CAP_SYS_ADMIN: we are root) */
        struct rand_pool_info *info = xmalloc(sizeof *info + n);
        info->entropy_count = (int)n * 8;
        info->buf_size = (int)n;
        memcpy(info->buf, d, n);
        if (ioctl(fd, RNDADDENTROPY, info)) logmsg("RNDADDENTROPY: %s", strerror(errno));
        if (ioctl(fd, RNDRESEEDCRNG)) logmsg("RNDRESEEDCRNG: %s", strerror(errno));
        free(info);
        free(d);
        close(fd);
    }
    buf_fmt(res, ",\"pid\":%d", getpid());
    return 0;
}

static int op_sync(json *req, buf_t *res, char *err, size_t errlen) {
    (void)req; (void)res; (void)err; (void)errlen;
    sync();
    return 0;
}

static int op_ping(json *req, buf_t *res, char *err, size_t errlen) {
    (void)req; (void)res; (void)err; (void)errlen;
    return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* dispatch                                                                                        */

typedef int (*op_fn)(json *, buf_t *, char *, size_t);
static const struct { const char *name; op_fn fn; } OPS[] = {
    {"ping", op_ping}, {"hello", op_hello}, {"exec", op_exec}, {"write", op_write}, {"put", op_put},
    {"read", op_read}, {"reset", op_reset}, {"end", op_end}, {"digest", op_digest}, {"scan", op_scan}, {"sync", op_sync},
    {"sopen", op_sopen}, {"sread", op_sread}, {"swrite", op_swrite}, {"spoll", op_spoll}, {"sclose", op_sclose},
};

static void *handle(void *arg) {
    json *req = arg;
    buf_t res = {0};
    buf_str(&res, "{\"id\":");
    json *id = jget(req, "id");
    if (id && id->type == J_NUM) buf_fmt(&res, "%.0f", id->num);
    else buf_str(&res, "null");
    size_t mark = res.n;
    const char *op = jstr(req, "op");
    char err[1024] = "";
    int rc = -1;
    for (size_t i = 0; op && i < sizeof OPS / sizeof OPS[0]; i++)
        if (!strcmp(op, OPS[i].name)) { rc = OPS[i].fn(req, &res, err, sizeof err); break; }
    if (rc == -1) snprintf(err, sizeof err, "unknown op %s", op ? op : "(none)");
    if (rc) {
        res.n = mark;
        buf_str(&res, ",\"ok\":false,\"error\":");
        jw_str(&res, err, strlen(err));
        if (rc > 0) buf_fmt(&res, ",\"errno\":%d", rc);
        else buf_str(&res, ",\"errno\":null");
        buf_str(&res, "}");
    } else buf_str(&res, ",\"ok\":true}");
    send_line(&res);
    free(res.p);
    jfree(req);
    free(req);
    return NULL;
}

static void dispatch(const char *line, size_t n) {
    json *req = xmalloc(sizeof *req);
    jp p = {line, line + n, 0};
    if (jp_value(&p, req, 0) || req->type != J_OBJ) {
        jfree(req);
        free(req);
        buf_t res = {0};
        buf_str(&res, "{\"id\":null,\"ok\":false,\"error\":\"bad request line\"}");
        send_line(&res);
        free(res.p);
        return;
    }
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&at, 1 << 20);
    if (pthread_create(&t, &at, handle, req)) handle(req);
    pthread_attr_destroy(&at);
}

/* ---------------------------------------------------------------------------------------------- */
/* start-up                                                                                        */

static char *find_port(const char *name) {
    for (int tries = 0; tries < 500; tries++) {
        DIR *d = opendir("/sys/class/virtio-ports");
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char path[512], got[128] = "";
            snprintf(path, sizeof path, "/sys/class/virtio-ports/%s/name", e->d_name);
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0) continue;
            ssize_t r = read(fd, got, sizeof got - 1);
            close(fd);
            if (r > 0 && got[r - 1] == '\n') r--;
            if (r > 0) got[r] = 0;
            if (!strcmp(got, name)) {
                char *dev;
                if (asprintf(&dev, "/dev/%s", e->d_name) < 0) dev = NULL;
                closedir(d);
                return dev;
            }
        }
        if (d) closedir(d);
        usleep(10000);
    }
    return NULL;
}

static void setup_system(void) {
    mkdir("/dev/pts", 0755);
    if (mount("devpts", "/dev/pts", "devpts", 0, "gid=5,mode=620")) logmsg("mount devpts: %s", strerror(errno));
    mkdir("/dev/shm", 01777);
    if (mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777"))
        logmsg("mount /dev/shm: %s", strerror(errno));
    mkdir("/tmp", 01777);
    chmod("/tmp", 01777);
    mkdir("/var/tmp", 01777);
    chmod("/var/tmp", 01777);
    if (sethostname("sandbox", 7)) logmsg("sethostname: %s", strerror(errno));
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0); /* bring up loopback: no other device */
    if (s >= 0) {
        struct ifreq ifr;
        memset(&ifr, 0, sizeof ifr);
        strcpy(ifr.ifr_name, "lo");
        ifr.ifr_flags = IFF_UP | IFF_RUNNING;
        if (ioctl(s, SIOCSIFFLAGS, &ifr)) logmsg("loopback: %s", strerror(errno));
        close(s);
    }
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN); /* EPIPE instead; children get default dispositions (SETSIGDEF) */
    umask(022);
    setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
    if (chdir("/")) logmsg("chdir /: %s", strerror(errno));
    setup_system();
    pthread_t r;
    pthread_create(&r, NULL, reaper, NULL);
    char *dev = find_port(argc > 1 ? argv[1] : "ctl");
    if (!dev) { logmsg("no virtio port named %s", argc > 1 ? argv[1] : "ctl"); for (;;) pause(); }
    port_fd = open(dev, O_RDWR | O_CLOEXEC);
    if (port_fd < 0) { logmsg("open %s: %s", dev, strerror(errno)); for (;;) pause(); }
    logmsg("ready");
    buf_t in = {0};
    char chunk[65536];
    for (;;) {
        ssize_t r = read(port_fd, chunk, sizeof chunk);
        if (r <= 0) { /* no host connected (before the first connect, after a snapshot) */
            if (r < 0 && errno == EINTR) continue;
            in.n = 0;
            usleep(10000);
            continue;
        }
        buf_add(&in, chunk, r);
        size_t start = 0;
        for (size_t i = in.n - r; i < in.n; i++)
            if (in.p[i] == '\n') {
                if (i > start) dispatch(in.p + start, i - start);
                start = i + 1;
            }
        if (start) {
            memmove(in.p, in.p + start, in.n - start);
            in.n -= start;
        }
    }
}
