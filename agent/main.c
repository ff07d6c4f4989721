/* SPDX-License-Identifier: MIT */
/* Owns the command line of gpu-node-agent: argv → Manager → exit code. */
#include <getopt.h>
#include <signal.h>
#include <syslog.h>

#include "build-config.h"
#include "bus.h"
#include "cleanup.h"
#include "config.h"
#include "driver.h"
#include "log.h"
#include "manager.h"
#include "strv.h"

static char *arg_config = NULL;
static char **arg_config_dirs = NULL;
static char *arg_root = NULL;
static bool arg_check_config = false;
static bool arg_oneshot = false;
static bool arg_cleanup = false;
static int arg_log_level = -1;
static char *arg_prepare_kernel = NULL;

static void help(void) {
        printf("gpu-node-agent [OPTIONS...]\n\n"
               "Brings an NVIDIA GPU node to \"ready for GPU work\" and keeps it there.\n\n"
               "  -h --help              Show this help\n"
               "     --version           Show the version\n"
               "  -c --config=FILE       Main configuration file\n"
               "                         (default: <root>/etc/gpu-node-agent/agent.yaml)\n"
               "     --config-dir=DIR    Drop-in directory, repeatable; replaces the defaults\n"
               "                         <root>/usr/lib/gpu-node-agent/conf.d and <root>/etc/gpu-node-agent/conf.d\n"
               "     --root=DIR          Host root: every host path resolves under DIR (overrides paths.root)\n"
               "     --check-config      Validate the configuration, print the merged result, exit\n"
               "     --oneshot           Run the stages once without D-Bus; exit 0 when all succeeded\n"
               "     --cleanup           Remove the NFD feature file, the agent's CDI spec and the\n"
               "                         readiness files (what the package does on removal), exit\n"
               "     --prepare-kernel=KVER\n"
               "                         Build (never load) the NVIDIA module for kernel KVER with DKMS,\n"
               "                         as driver.dkms.* configures; exit 0 when it is ready\n"
               "     --log-level=LEVEL   emerg, alert, crit, err, warning, notice, info or debug\n\n"
               "See gpu-node-agent(8) and gpu-node-agent.yaml(5).\n");
}

static int parse_log_level(const char *s) {
        static const char *const names[] = { "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug" };
        for (size_t i = 0; i < ELEMENTSOF(names); i++)
                if (streq(s, names[i]))
                        return (int) i;
        return -EINVAL;
}

static int parse_argv(int argc, char *argv[]) {
        enum { ARG_VERSION = 0x100, ARG_CONFIG_DIR, ARG_ROOT, ARG_CHECK_CONFIG, ARG_ONESHOT, ARG_LOG_LEVEL,
               ARG_PREPARE_KERNEL, ARG_CLEANUP };
        static const struct option options[] = {
                { "help", no_argument, NULL, 'h' },
                { "version", no_argument, NULL, ARG_VERSION },
                { "config", required_argument, NULL, 'c' },
                { "config-dir", required_argument, NULL, ARG_CONFIG_DIR },
                { "root", required_argument, NULL, ARG_ROOT },
                { "check-config", no_argument, NULL, ARG_CHECK_CONFIG },
                { "oneshot", no_argument, NULL, ARG_ONESHOT },
                { "cleanup", no_argument, NULL, ARG_CLEANUP },
                { "log-level", required_argument, NULL, ARG_LOG_LEVEL },
                { "prepare-kernel", required_argument, NULL, ARG_PREPARE_KERNEL },
                {}
        };
        int c;

        while ((c = getopt_long(argc, argv, "hc:", options, NULL)) >= 0)
                switch (c) {
                case 'h':
                        help();
                        return 0;
                case ARG_VERSION:
                        printf("gpu-node-agent %s\n", GPU_NODE_AGENT_VERSION);
                        return 0;
                case 'c':
                        arg_config = optarg;
                        break;
                case ARG_CONFIG_DIR:
                        if (strv_extend(&arg_config_dirs, optarg) < 0)
                                return log_oom();
                        break;
                case ARG_ROOT:
                        if (optarg[0] != '/')
                                return log_error_errno(EINVAL, "--root needs an absolute path, got '%s'.", optarg);
                        arg_root = optarg;
                        break;
                case ARG_CHECK_CONFIG:
                        arg_check_config = true;
                        break;
                case ARG_ONESHOT:
                        arg_oneshot = true;
                        break;
                case ARG_CLEANUP:
                        arg_cleanup = true;
                        break;
                case ARG_LOG_LEVEL:
                        arg_log_level = parse_log_level(optarg);
                        if (arg_log_level < 0)
                                return log_error_errno(EINVAL, "Unknown log level '%s': use emerg, alert, crit, "
                                                       "err, warning, notice, info or debug.", optarg);
                        break;
                case ARG_PREPARE_KERNEL:
                        if (isempty(optarg) || strchr(optarg, '/'))
                                return log_error_errno(EINVAL, "--prepare-kernel needs a kernel release such as "
                                                       "6.1.0-57-amd64, got '%s'.", optarg);
                        arg_prepare_kernel = optarg;
                        break;
                case '?':
                        return -EINVAL;
                default:
                        assert(false);
                }

        if (optind < argc)
                return log_error_errno(EINVAL, "This program takes no arguments (got '%s'); see --help.", argv[optind]);
        return 1;
}

/* Loads the configuration for the one-shot modes, with the last-known-good remote document as the
 * daemon would (labels.directory, driver.dkms may come from it); an error is logged at the given
 * priority. */
static int load_config(const ConfigLoadOptions *o, int priority, Config **ret) {
        _cleanup_(manager_freep) Manager *m = NULL;
        _cleanup_free_ char *error = NULL;
        ManagerOptions mo = { .config = *o, .oneshot = true, .log_level = -1 };
        int r;

        r = manager_new(&mo, &m);
        if (r < 0)
                return log_error_errno(r, "Failed to allocate the manager: %m");
        r = manager_config_load(m, ret, &error);
        if (r < 0)
                log_full(priority, "%s", error ?: strerror(-r));
        return r;
}

static int check_config(const ConfigLoadOptions *o) {
        Config *c = NULL;
        int r;

        r = load_config(o, LOG_ERR, &c);
        if (r < 0)
                return r;
        r = config_dump(c, stdout);
        config_free(c);
        return r;
}

/* The package's removal step. An invalid configuration must not keep stale labels around: the files
 * are then looked for where the built-in defaults put them, and the error is still reported. */
static int cleanup(const ConfigLoadOptions *o) {
        Config *c = NULL;
        int r;

        r = load_config(o, LOG_WARNING, &c);
        if (r < 0) {
                log_warning("Removing the agent's files from their default locations instead.");
                r = config_load_defaults(o->root, &c);
                if (r < 0)
                        return log_error_errno(r, "Failed to set up the default configuration: %m");
        }
        /* The configuration error was reported; what matters to the caller (a package removal) is
         * whether the files are gone. */
        r = agent_cleanup_outputs(c);
        config_free(c);
        return r;
}

/* The kernel postinst hook's entry point: the module for a kernel that is not running yet, built
 * before the reboot into it. Blocking is fine here: there is no event loop to keep answering. */
static int prepare_kernel(const ConfigLoadOptions *o, const char *kver) {
        _cleanup_free_ char *error = NULL;
        DkmsOptions d;
        Config *c = NULL;
        int r;

        r = load_config(o, LOG_ERR, &c);
        if (r < 0)
                return r;
        if (!c->driver.dkms_enabled) {
                log_notice("Not building the NVIDIA module for kernel %s: DKMS rebuilds are off "
                           "(driver.dkms.enabled: false).", kver);
                config_free(c);
                return 0;
        }
        driver_dkms_options(c, &d);
        log_info("Building the NVIDIA kernel module for kernel %s with DKMS (%s).", kver, d.program);
        r = dkms_prepare_kernel(kver, &d, &error);
        if (r >= 0) {
                r = driver_verify_built(c, kver, &error);
                if (r < 0) {
                        /* Say why nothing was built when that is the reason. */
                        DkmsModule *l = NULL;
                        size_t n = 0;
                        if (dkms_status(NULL, &d, &l, &n, NULL) >= 0 && n == 0) {
                                char *more = strprintf("%s No DKMS module is registered at all (`dkms status` is "
                                                       "empty): install the driver's DKMS package (Debian: "
                                                       "nvidia-kernel-dkms or nvidia-open-kernel-dkms).",
                                                       strna(error));
                                if (more) {
                                        free(error);
                                        error = more;
                                }
                        }
                        dkms_module_list_free(l, n);
                }
        }
        config_free(c);
        if (r < 0)
                return log_error_errno(r, "%s", error ?: strerror(-r));
        log_info("The NVIDIA kernel module is ready for kernel %s.", kver);
        return 0;
}

static int run(int argc, char *argv[]) {
        _cleanup_(manager_freep) Manager *m = NULL;
        int r;

        log_setup(LOG_TARGET_AUTO);
        /* A write to a worker that has just crashed (its socket's far end gone) must fail with EPIPE,
         * which the caller handles as that worker's death, not kill the agent: SIGPIPE's default action
         * is a silent exit. systemd ignores SIGPIPE for services (IgnoreSIGPIPE=yes), but --oneshot from an
         * image build and every run outside a unit do not have that. Children get it back (spawn-child.c). */
        (void) signal(SIGPIPE, SIG_IGN);
        r = parse_argv(argc, argv);
        if (r <= 0)
                return r;
        if (arg_log_level >= 0)
                log_set_max_level(arg_log_level);

        ManagerOptions o = {
                .config = {
                        .root = arg_root,
                        .main_file = arg_config,
                        .dropin_dirs = arg_config_dirs,
                },
                .oneshot = arg_oneshot,
                .log_level = arg_log_level,
                .bus = &manager_bus_ops,
        };

        if (arg_check_config)
                return check_config(&o.config);
        if (arg_prepare_kernel)
                return prepare_kernel(&o.config, arg_prepare_kernel);
        if (arg_cleanup)
                return cleanup(&o.config);

        r = manager_new(&o, &m);
        if (r < 0)
                return log_error_errno(r, "Failed to allocate the manager: %m");
        r = manager_startup(m);
        if (r < 0)
                return r;
        r = manager_run(m);
        return r;
}

int main(int argc, char *argv[]) {
        int r = run(argc, argv);
        strv_free(arg_config_dirs);
        if (r < 0)
                return EXIT_FAILURE;
        return r;
}
