/* SPDX-License-Identifier: MIT */
/* Owns fake-nvml-ctl, the operator's side of the fake NVML: what a GPU reset does to the state file
 * (the pending MIG mode becomes current, instances are gone), instances made behind the agent's back (as
 * `nvidia-smi mig -cgi … -C` does), and a readable dump of that state. It also answers nvidia-smi's
 * "-r -i <bus id>" so that it can stand in for nvidia-smi where the agent resets GPUs. */
#include <dirent.h>
#include <getopt.h>
#include <limits.h>
#include <unistd.h>

#include "fake-node.h"
#include "fake-nvml.h"

#ifndef FAKE_NVML_DEFAULT_PROFILES
#  error "meson passes the model table's path as FAKE_NVML_DEFAULT_PROFILES"
#endif

static void usage(FILE *f) {
        fputs("Usage: fake-nvml-ctl [--description FILE] [--state FILE] COMMAND\n"
              "  show               every GPU's MIG mode and instances, as the fake NVML reports them\n"
              "  reset [GPU...]     reset GPUs (all if none given): the pending MIG mode becomes current and\n"
              "                     every GPU/compute instance is gone; refused while a GPU is busy\n"
              "  -r -i GPU[,GPU…]   the same as reset, in nvidia-smi's words\n"
              "  create GPU PROFILE[,PROFILE…]\n"
              "                     create a GPU instance of each profile (name such as 3g.20gb, or profile\n"
              "                     id), placed where the driver would, each with one compute instance over\n"
              "                     all of it: what `nvidia-smi mig -i GPU -cgi PROFILE,… -C` does\n"
              "GPU is an NVML index or a PCI bus id (0000:1b:00.0 or 00000000:1B:00.0).\n"
              "Defaults come from FAKE_NVML_DESCRIPTION, FAKE_NVML_STATE and FAKE_NVML_PROFILES; FAKE_NVML_BUSY\n"
              "and the description's processes make a GPU busy, and so does any process holding its\n"
              "<FAKE_NVML_DEV>/nvidia<minor> open (the reset is then refused as the driver refuses it).\n", f);
}

/* FAKE_NVML_DEV (the fake library holds <dir>/nvidia<minor> open while NVML is initialised, as the real
 * one holds /dev/nvidia<minor>): the first process other than us that has GPU idx's node open, 0 none.
 * The driver refuses to reset a GPU that any process (a CUDA job, DCGM, an NVML monitor) still holds. */
static pid_t holder(const FakeNode *n, size_t idx) {
        const char *dir = getenv("FAKE_NVML_DEV");
        _cleanup_(closedirp) DIR *proc = NULL;
        char node[PATH_MAX];
        struct dirent *de;

        if (isempty(dir) || !(proc = opendir("/proc")))
                return 0;
        snprintf(node, sizeof node, "%s/nvidia%u", dir, n->gpus[idx].minor);
        while ((de = readdir(proc))) {
                char fds[64], *end;
                long pid = strtol(de->d_name, &end, 10);
                if (pid <= 0 || *end || pid == getpid())
                        continue;
                snprintf(fds, sizeof fds, "/proc/%ld/fd", pid);
                _cleanup_(closedirp) DIR *d = opendir(fds);
                for (struct dirent *f; d && (f = readdir(d));) {
                        char link[PATH_MAX + 64], target[PATH_MAX];
                        snprintf(link, sizeof link, "%s/%s", fds, f->d_name);
                        ssize_t len = readlink(link, target, sizeof target - 1);
                        if (len > 0 && (target[len] = 0, streq(target, node)))
                                return (pid_t) pid;
                }
        }
        return 0;
}

static bool busy(const FakeNode *n, size_t idx) {
        const char *env = getenv("FAKE_NVML_BUSY");
        if (n->gpus[idx].n_procs > 0)
                return true;
        if (isempty(env))
                return false;
        _cleanup_free_ char *copy = strdup(env);
        char *save = NULL;
        for (char *item = copy ? strtok_r(copy, ",", &save) : NULL; item; item = strtok_r(NULL, ",", &save)) {
                char *end;
                unsigned long i = strtoul(item, &end, 10);
                if (streq(item, "all") || streq(item, "*") || (end != item && !*end && i == idx))
                        return true;
        }
        return false;
}

static void show(const FakeNode *n) {
        for (size_t i = 0; i < n->n_gpus; i++) {
                const FakeGpu *g = &n->gpus[i];
                printf("GPU %zu %s %s (%s)", i, g->pci, g->model->name, g->uuid);
                if (g->model->mig_capable)
                        printf(": MIG current %s, pending %s", g->mig_current ? "enabled" : "disabled",
                               g->mig_pending ? "enabled" : "disabled");
                putchar('\n');
                for (unsigned k = 0; k < FAKE_MAX_GI; k++) {
                        const FakeGi *gi = &g->gi[k];
                        if (!gi->used)
                                continue;
                        const FakeGiProfile *p = fake_model_gi_by_id(g->model, gi->profile);
                        printf("  GI %u profile %u (%s) placement %u+%u\n", k, gi->profile, p ? p->name : "?",
                               gi->start, gi->size);
                        for (unsigned c = 0; c < FAKE_MAX_CI; c++) {
                                char name[64] = "?";
                                if (!gi->ci[c].used)
                                        continue;
                                if (p)
                                        fake_ci_name(p, gi->ci[c].size, name, sizeof name);
                                printf("    CI %u profile %u (%s) placement %u+%u %s\n", c, gi->ci[c].profile, name,
                                       gi->ci[c].start, gi->ci[c].size, gi->ci[c].uuid);
                        }
                }
        }
}

static int reset(FakeNode *n, char **targets, size_t n_targets) {
        FakeError e = {};
        int fd, r;
        bool any_failed = false;

        /* The latency model's "reset" rules (a real reset takes seconds per GPU; the bundled slow node:
         * reset:*:8000), before the state is locked: NVML keeps answering for the other GPUs meanwhile. */
        fake_faults_load(n->latency);
        for (size_t i = 0; i < (n_targets > 0 ? n_targets : n->n_gpus); i++)
                fake_faults_apply("reset", 1);

        r = fake_node_lock(n, &fd, &e);
        if (r < 0) {
                fprintf(stderr, "fake-nvml-ctl: %s\n", e.msg[0] ? e.msg : strerror(-r));
                return 1;
        }
        bool *selected = calloc(n->n_gpus ?: 1, sizeof *selected);
        if (!selected) {
                close(fd);
                return 1;
        }
        for (size_t t = 0; t < n_targets; t++) {
                FakeGpu *g = fake_node_find_gpu(n, targets[t]);
                if (!g) {
                        fprintf(stderr, "fake-nvml-ctl: no GPU '%s' in %s; give an index below %zu or a PCI bus id "
                                "of the description\n", targets[t], n->description_path, n->n_gpus);
                        free(selected);
                        close(fd);
                        return 1;
                }
                selected[g - n->gpus] = true;
        }
        for (size_t i = 0; i < n->n_gpus; i++) {
                if (n_targets > 0 && !selected[i])
                        continue;
                FakeGpu *g = &n->gpus[i];
                pid_t h = holder(n, i);
                if (h > 0) {
                        fprintf(stderr, "Unable to reset GPU %s because it's being used by some other process "
                                "(pid %d holds %s/nvidia%u): stop every process that has the GPU open, NVML "
                                "monitors included, first.\n", g->pci, (int) h, getenv("FAKE_NVML_DEV"), g->minor);
                        any_failed = true;
                        continue;
                }
                if (fake_mig_reset(g, busy(n, i)) != FAKE_OK) {
                        fprintf(stderr, "Unable to reset GPU %s: it is in use by running processes "
                                "(FAKE_NVML_BUSY or the description's processes); stop them first.\n", g->pci);
                        any_failed = true;
                        continue;
                }
                printf("GPU %08X:%02X:%02X.%X was successfully reset.\n", g->domain, g->bus, g->device, g->function);
        }
        free(selected);
        r = fake_node_save(n, &e);
        close(fd);
        if (r < 0) {
                fprintf(stderr, "fake-nvml-ctl: %s\n", e.msg[0] ? e.msg : strerror(-r));
                return 1;
        }
        return any_failed ? 1 : 0;
}

static int create(FakeNode *n, const char *target, char *profiles) {
        FakeError e = {};
        int fd, r, ret = 0;
        char *save = NULL;

        r = fake_node_lock(n, &fd, &e);
        if (r < 0) {
                fprintf(stderr, "fake-nvml-ctl: %s\n", e.msg[0] ? e.msg : strerror(-r));
                return 1;
        }
        FakeGpu *g = fake_node_find_gpu(n, target);
        if (!g) {
                fprintf(stderr, "fake-nvml-ctl: no GPU '%s' in %s; give an index below %zu or a PCI bus id of the "
                        "description\n", target, n->description_path, n->n_gpus);
                close(fd);
                return 1;
        }
        for (char *t = strtok_r(profiles, ",", &save); t && ret == 0; t = strtok_r(NULL, ",", &save)) {
                const FakeGiProfile *p = fake_model_gi_lookup(g->model, t);
                int ci = p ? fake_ci_index_for_slices(p->g) : -1;
                unsigned id, ci_id;
                if (!p || ci < 0) {
                        fprintf(stderr, "fake-nvml-ctl: GPU %s (%s) has no GPU instance profile '%s'\n", g->pci,
                                g->model->name, t);
                        ret = 1;
                } else if (fake_mig_create_gi(g, p, -1, fake_fit_from_string(getenv("FAKE_NVML_FIT")), &id) != FAKE_OK ||
                           fake_mig_create_ci(n, g, id, (unsigned) ci, &ci_id) != FAKE_OK) {
                        fprintf(stderr, "Unable to create a GPU instance on GPU %s using profile %s: Insufficient "
                                "Resources (or MIG mode is not enabled)\n", g->pci, p->name);
                        ret = 1;
                } else
                        printf("Successfully created GPU instance ID %u on GPU %s using profile MIG %s (ID %u)\n"
                               "Successfully created compute instance ID %u on GPU %s GPU instance ID %u\n", id,
                               g->pci, p->name, p->id, ci_id, g->pci, id);
        }
        r = fake_node_save(n, &e);
        close(fd);
        if (r < 0) {
                fprintf(stderr, "fake-nvml-ctl: %s\n", e.msg[0] ? e.msg : strerror(-r));
                return 1;
        }
        return ret;
}

int main(int argc, char **argv) {
        static const struct option options[] = {
                { "description", required_argument, NULL, 'd' },
                { "state", required_argument, NULL, 's' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        const char *desc = getenv("FAKE_NVML_DESCRIPTION"), *state = getenv("FAKE_NVML_STATE");
        const char *profiles = getenv("FAKE_NVML_PROFILES");
        _cleanup_free_ char **targets = calloc(argc + 1, sizeof *targets);
        _cleanup_free_ char *ids = NULL;
        size_t n_targets = 0;
        bool smi_reset = false;
        int c;

        if (!targets)
                return 1;
        while ((c = getopt_long(argc, argv, "+d:s:hri:", options, NULL)) >= 0)
                switch (c) {
                case 'd':
                        desc = optarg;
                        break;
                case 's':
                        state = optarg;
                        break;
                case 'h':
                        usage(stdout);
                        return 0;
                case 'r':
                        smi_reset = true;
                        break;
                case 'i':
                        free(ids);
                        ids = strdup(optarg);
                        break;
                default:
                        usage(stderr);
                        return 2;
                }
        if (isempty(desc)) {
                fprintf(stderr, "fake-nvml-ctl: no node description: set FAKE_NVML_DESCRIPTION or pass "
                        "--description FILE\n");
                return 2;
        }
        if (isempty(state))
                state = NULL;
        const char *cmd = smi_reset ? "reset" : optind < argc ? argv[optind++] : NULL;
        if (!cmd || (!streq(cmd, "show") && !streq(cmd, "reset") && !streq(cmd, "create")) ||
            (smi_reset && optind < argc) || (ids && !smi_reset) || (streq(cmd, "create") && argc - optind != 2)) {
                usage(stderr);
                return 2;
        }
        char *save = NULL;
        for (char *t = ids ? strtok_r(ids, ",", &save) : NULL; t; t = strtok_r(NULL, ",", &save))
                targets[n_targets++] = t;
        while (optind < argc)
                targets[n_targets++] = argv[optind++];

        _cleanup_(fake_node_freep) FakeNode *n = NULL;
        FakeError e = {};
        int r = fake_node_load(&n, desc, state, isempty(profiles) ? FAKE_NVML_DEFAULT_PROFILES : profiles, &e);
        if (r < 0) {
                fprintf(stderr, "fake-nvml-ctl: %s\n", e.msg[0] ? e.msg : strerror(-r));
                return 1;
        }
        if (streq(cmd, "show")) {
                show(n);
                return 0;
        }
        if (streq(cmd, "create"))
                return create(n, targets[0], targets[1]);
        return reset(n, targets, n_targets);
}
