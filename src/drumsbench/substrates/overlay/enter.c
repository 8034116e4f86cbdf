/* enter: run a command inside an overlay sandbox, with no program of the sandbox run privileged.
 *
 * Usage (as root on the host): enter HOLDER_PID WORKDIR KEEP_MASK -- COMMAND [ARG...]
 *
 * 1. Opens the holder's ipc, uts, net, pid and mount namespaces and its root folder (all before
 *    any of them is entered: every later path is the sandbox's).
 * 2. Enters them (setns), roots itself at the holder's root (fchdir + chroot), forks (a pid
 *    namespace takes effect for children) and waits; exits as the child did (a child killed by a
 *    signal: the same signal on itself, as nsenter does).
 * 3. The child goes to WORKDIR (inside), drops every capability not in KEEP_MASK (a decimal bit
 *    mask of capability numbers) from its bounding set, clears the inheritable and ambient sets,
 *    sets no_new_privs, and only then execs COMMAND (looked up in PATH inside the sandbox).
 *
 * Why not `nsenter -r ... env --chdir=W setpriv ... COMMAND`: nsenter execs `env` and `setpriv`
 * from the sandbox's own file system with every capability of host root; a command that replaced
 * either (or the loader) in an earlier step ran its own code there, unconfined. Here the only
 * exec is the last one, after the privileges are gone.
 *
 * Exit codes of its own (the command never started): 125 a set-up step failed (message on
 * stderr), 126 WORKDIR cannot be entered or COMMAND cannot be run, 127 COMMAND not found.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *NS[] = {"ipc", "uts", "net", "pid", "mnt"};
#define NNS (sizeof NS / sizeof NS[0])

static void die(const char *what) {
    fprintf(stderr, "enter: %s: %s\n", what, strerror(errno));
    _exit(125);
}

static int last_cap(void) {
    char buf[16] = {0};
    int fd = open("/proc/sys/kernel/cap_last_cap", O_RDONLY | O_CLOEXEC);
    if (fd < 0) die("open /proc/sys/kernel/cap_last_cap");
    if (read(fd, buf, sizeof buf - 1) <= 0) die("read cap_last_cap");
    close(fd);
    return atoi(buf);
}

static void confine(unsigned long long keep, int last) {
    for (int cap = 0; cap <= last; cap++) {
        if (cap < 64 && (keep >> cap) & 1) continue;
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) die("PR_CAPBSET_DROP");
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
        die("PR_CAP_AMBIENT_CLEAR_ALL");
    struct __user_cap_header_struct head = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &head, data) != 0) die("capget");
    for (int i = 0; i < 2; i++) {
        unsigned int mask = (unsigned int)(keep >> (32 * i));
        data[i].inheritable = 0;
        data[i].effective &= mask;
        data[i].permitted &= mask;
    }
    if (syscall(SYS_capset, &head, data) != 0) die("capset");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die("PR_SET_NO_NEW_PRIVS");
}

int main(int argc, char **argv) {
    if (argc < 6 || strcmp(argv[4], "--") != 0) {
        fprintf(stderr, "usage: enter HOLDER_PID WORKDIR KEEP_MASK -- COMMAND [ARG...]\n");
        return 125;
    }
    const char *pid = argv[1], *workdir = argv[2];
    char *end;
    errno = 0;
    unsigned long long keep = strtoull(argv[3], &end, 10);
    if (errno || *end) {
        fprintf(stderr, "enter: KEEP_MASK %s is not a decimal number\n", argv[3]);
        return 125;
    }
    int last = last_cap();
    int fds[NNS], root;
    char path[64];
    for (size_t i = 0; i < NNS; i++) {
        snprintf(path, sizeof path, "/proc/%s/ns/%s", pid, NS[i]);
        if ((fds[i] = open(path, O_RDONLY | O_CLOEXEC)) < 0) die(path);
    }
    snprintf(path, sizeof path, "/proc/%s/root", pid);
    if ((root = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) die(path);
    for (size_t i = 0; i < NNS; i++) {
        if (setns(fds[i], 0) != 0) die(NS[i]);
        close(fds[i]);
    }
    if (fchdir(root) != 0) die("fchdir to the holder's root");
    if (chroot(".") != 0) die("chroot");
    close(root);

    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        if (chdir(workdir) != 0) {
            fprintf(stderr, "enter: %s: %s\n", workdir, strerror(errno));
            _exit(126);
        }
        confine(keep, last);
        execvp(argv[5], argv + 5);
        int code = errno == ENOENT ? 127 : 126;
        fprintf(stderr, "enter: %s: %s\n", argv[5], strerror(errno));
        _exit(code);
    }
    /* Signals a caller sends to this process (a timeout's SIGTERM/SIGKILL go to the whole process
     * group, the child included) need no relay; wait and exit as the child did. */
    int status;
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR) die("waitpid");
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    int sig = WTERMSIG(status);
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core); /* the child's signal, raised again: no core file of ours */
    signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    kill(getpid(), sig);
    return 128 + sig;
}
