/* SPDX-License-Identifier: MIT */
/* Owns the fake NVML's latency and fault model: per-call delays (FAKE_NVML_DELAY), calls that hang until
 * released (FAKE_NVML_HANG, FAKE_NVML_HANG_FILE) and calls that crash the process (FAKE_NVML_CRASH, while
 * FAKE_NVML_CRASH_FILE exists when that is set), so
 * that the simulated node is as slow and as hostile as a real one (TESTING.md, "Realism"). The delays can
 * also come with the node (the description's "latency:"; the variable wins). The rules are read at each
 * first nvmlInit of a process, like FAKE_NVML_FAIL; README.md documents the syntax. */
#include <signal.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>

#include "fake-nvml.h"

typedef enum FaultKind {
        FAULT_DELAY,
        FAULT_HANG,
        FAULT_CRASH,
} FaultKind;

typedef struct FaultRule {
        FaultKind kind;
        char name[64];   /* entry point, or "*" for every one */
        unsigned nth;    /* 1-based call number; 0 = every call */
        bool onwards;
        unsigned calls;
        unsigned ms;     /* FAULT_DELAY */
        bool per_gpu;    /* FAULT_DELAY: ms times the node's GPU count ("2000/gpu") */
} FaultRule;

static FaultRule *rules;
static size_t n_rules;

static void say(const char *fmt, ...) _printf_(1, 2);
static void say(const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        fputs("fake-nvml: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
}

/* "<entry>:<nth>" or, for delays, "<entry>:<nth>:<ms>[/gpu]"; nth as N, N+ or *. fallback: the
 * node's rules, when the variable is not set. */
static void parse(const char *var, FaultKind kind, const char *fallback) {
        const char *env = getenv(var) ?: fallback;
        _cleanup_free_ char *copy = NULL;
        char *save = NULL;

        if (isempty(env) || !(copy = strdup(env)))
                return;
        for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
                char *c1 = strchr(item, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL, *end = NULL;
                FaultRule rule = { .kind = kind };
                FaultRule *n;

                if (!c1 || (size_t) (c1 - item) >= sizeof rule.name || (kind == FAULT_DELAY) != !!c2) {
                        say("%s entry '%s' is not <entry point>:<nth call>%s; ignored", var, item,
                            kind == FAULT_DELAY ? ":<ms>[/gpu]" : "");
                        continue;
                }
                *c1 = 0;
                if (c2)
                        *c2 = 0;
                snprintf(rule.name, sizeof rule.name, "%s", item);
                if (!streq(c1 + 1, "*")) {
                        rule.nth = (unsigned) strtoul(c1 + 1, &end, 10);
                        rule.onwards = end && *end == '+';
                        if (end == c1 + 1 || rule.nth == 0 || (*end && !(rule.onwards && !end[1]))) {
                                say("%s entry for %s: want <nth call> as N, N+ or *; ignored", var, item);
                                continue;
                        }
                }
                if (c2) {
                        rule.ms = (unsigned) strtoul(c2 + 1, &end, 10);
                        rule.per_gpu = end && streq(end, "/gpu");
                        if (end == c2 + 1 || (*end && !rule.per_gpu)) {
                                say("%s entry for %s: want a delay as <ms> or <ms>/gpu; ignored", var, item);
                                continue;
                        }
                }
                n = realloc(rules, (n_rules + 1) * sizeof *rules);
                if (!n)
                        return;
                rules = n;
                rules[n_rules++] = rule;
        }
}

void fake_faults_load(const char *node_latency) {
        rules = mfree(rules);
        n_rules = 0;
        parse("FAKE_NVML_DELAY", FAULT_DELAY, node_latency);
        parse("FAKE_NVML_HANG", FAULT_HANG, NULL);
        parse("FAKE_NVML_CRASH", FAULT_CRASH, NULL);
}

static void sleep_ms(uint64_t ms) {
        struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}

/* Hangs as a wedged driver call would: until FAKE_NVML_HANG_FILE is removed, or for ever. With
 * FAKE_NVML_HANG_UNINTERRUPTIBLE set, the whole process ignores SIGTERM, SIGINT and SIGHUP while the
 * call hangs, as a process with a thread inside a driver call does not go away on them; SIGKILL still
 * ends it. (Process-wide: a signal mask would hold them back in this thread only, and another thread of
 * the process would take them.) */
static void hang(const char *name) {
        static const int sigs[] = { SIGTERM, SIGINT, SIGHUP };
        const char *file = getenv("FAKE_NVML_HANG_FILE");
        bool held = getenv("FAKE_NVML_HANG_UNINTERRUPTIBLE");
        struct sigaction ign = { .sa_handler = SIG_IGN }, old[3];

        for (size_t i = 0; held && i < 3; i++)
                (void) sigaction(sigs[i], &ign, &old[i]);
        say("%s hangs%s%s%s", name, file ? " until this file is removed: " : "", file ?: "",
            held ? " (SIGTERM held back)" : "");
        while (!file || access(file, F_OK) == 0)
                sleep_ms(50);
        say("%s released", name);
        for (size_t i = 0; held && i < 3; i++)
                (void) sigaction(sigs[i], &old[i], NULL);
}

void fake_faults_apply(const char *name, size_t n_gpus) {
        for (size_t i = 0; i < n_rules; i++) {
                FaultRule *r = &rules[i];

                if (!streq(r->name, "*") && !streq(r->name, name))
                        continue;
                r->calls++;
                if (!(r->nth == 0 || r->calls == r->nth || (r->onwards && r->calls > r->nth)))
                        continue;
                switch (r->kind) {
                case FAULT_DELAY:
                        sleep_ms((uint64_t) r->ms * (r->per_gpu ? n_gpus : 1));
                        break;
                case FAULT_HANG:
                        hang(name);
                        break;
                case FAULT_CRASH: {
                        const char *file = getenv("FAKE_NVML_CRASH_FILE");

                        if (file && access(file, F_OK) < 0)
                                break; /* the library was "fixed" */
                        say("%s crashes (FAKE_NVML_CRASH)", name);
                        (void) raise(SIGSEGV);
                        break;
                }
                }
        }
}

__attribute__((destructor)) static void fake_faults_unload(void) {
        rules = mfree(rules);
        n_rules = 0;
}
