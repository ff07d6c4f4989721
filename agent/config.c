/* SPDX-License-Identifier: MIT */
/* Owns loading the agent configuration: agent.yaml and the conf.d drop-ins are read into small node
 * trees that remember file:line:column (config-yaml.c), each file is checked against the key table
 * below, the trees are merged (mappings key by key, everything else replaces), and the merged tree
 * becomes the immutable Config. Also prints a Config back as YAML that loads to the same Config. */
#include <assert.h>
#include <ctype.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <syslog.h>

#include "config-remote.h"
#include "config-signature.h"
#include "config-yaml.h"
#include "config.h"
#include "fileio.h"
#include "macro.h"
#include "string-table.h"
#include "strv.h"
#include "yaml-reader.h"

/* A configuration file larger than this is a mistake (a binary, a log), not a configuration. */
#define CONFIG_FILE_MAX GNA_YAML_SIZE_MAX
typedef enum ConfigType {
        CONFIG_STRING,
        CONFIG_PATH,      /* absolute */
        CONFIG_FILE_NAME, /* no '/', no leading '.' */
        CONFIG_LIBRARY,   /* a name for the loader's search, or an absolute path */
        CONFIG_BOOL,
        CONFIG_DURATION,
        CONFIG_UINT,
        CONFIG_ENUM,      /* stored as the index into .values */
        CONFIG_UNITS,     /* a list of systemd unit names (char **), replaced whole by a later file */
        CONFIG_FLAGS,     /* a comma-separated, non-empty set of .values, stored as unsigned bits (bit i = values[i]) */
        CONFIG_XIDS,      /* a list of XID numbers (char **, decimal), replaced whole by a later file */
} ConfigType;

typedef enum PathBase {
        BASE_NONE,
        BASE_ROOT,        /* unset: <paths.root>/<default> */
        BASE_ETC,         /* unset: <paths.etc>/<default> */
        BASE_RUN,         /* unset: <paths.run>/<default> */
} PathBase;

/* Why a key may not come from the remote document (config.remote): a fleet's configuration server is
 * a source of policy, not a root shell on every node. Whoever controls that server, its TLS key or a
 * proxy in front of it must not be able to name what the agent loads, runs, writes or trusts as root. */
typedef enum ConfigLocal {
        LOCAL_UNREVIEWED,  /* a row without .remote or .local: never reviewed for the network, so refused */
        LOCAL_PATH,        /* a file or directory the agent reads or writes as root */
        LOCAL_LIBRARY,     /* a shared object loaded as root */
        LOCAL_PROGRAM,     /* a program run as root */
        LOCAL_COMMAND,     /* a shell command run as root */
        LOCAL_ARGUMENTS,   /* arguments of a program, or kernel module options, run or loaded as root */
        LOCAL_UNITS,       /* systemd units stopped and started as root */
        LOCAL_SOURCE,      /* where the node takes its configuration or its MIG selection from */
        LOCAL_IDENTITY,    /* which Kubernetes Node object (and so whose labels) this node is */
        LOCAL_NODE,        /* how this node's kernel modules, device nodes and services are set up */
        _LOCAL_MAX,
} ConfigLocal;

typedef struct ConfigKey {
        const char *path;            /* dotted key */
        ConfigType type;
        size_t offset;               /* into Config */
        const char *def;             /* default, written as in a file; relative to base if any */
        PathBase base;
        const char *const *values;   /* CONFIG_ENUM and CONFIG_FLAGS, NULL-terminated */
        bool remote;                 /* policy: the remote document may set it; otherwise only local files */
        ConfigLocal local;           /* !remote: why (a path-typed key is LOCAL_PATH without saying so) */
} ConfigKey;

/* The short word of the reference's "remote" column, and the reason a refusal gives. */
static const struct {
        const char *tag;
        const char *why;
} config_local_reasons[_LOCAL_MAX] = {
        [LOCAL_UNREVIEWED] = { "unreviewed", "has not been reviewed as safe to take from the network" },
        [LOCAL_PATH] = { "path", "names a file or directory the agent reads or writes as root" },
        [LOCAL_LIBRARY] = { "library", "names a shared object the agent loads as root" },
        [LOCAL_PROGRAM] = { "program", "names a program the agent runs as root" },
        [LOCAL_COMMAND] = { "command", "is a shell command the agent runs as root" },
        [LOCAL_ARGUMENTS] = { "arguments", "is passed as root to a program's command line or to the kernel as "
                                           "module options" },
        [LOCAL_UNITS] = { "units", "names systemd units the agent stops and starts as root" },
        [LOCAL_SOURCE] = { "source", "decides where the node takes its configuration or its MIG selection from" },
        [LOCAL_IDENTITY] = { "identity", "decides which Kubernetes node this node is" },
        [LOCAL_NODE] = { "node", "sets up this node's kernel modules, device nodes or system services, which "
                                 "depend on its hardware and image" },
};

/* Index = LOG_* value from syslog.h. */
static const char *const log_level_names[] = {
        "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug", NULL,
};

static const char *const mig_strategy_names[_MIG_STRATEGY_MAX + 1] = {
        [MIG_STRATEGY_NONE] = "none",
        [MIG_STRATEGY_SINGLE] = "single",
        [MIG_STRATEGY_MIXED] = "mixed",
};

static const char *const auto_off_names[] = { "off", "auto", NULL };
static const char *const mig_reset_names[] = { "never", "auto", NULL };
static const char *const reload_on_mismatch_names[] = { "never", "when-idle", NULL };
static const char *const kernel_module_type_names[] = { "auto", "open", "proprietary", NULL };
static const char *const mig_selected_from_names[_MIG_SELECTED_FROM_MAX + 1] = {
        [MIG_SELECTED_FROM_CONFIG] = "config",
        [MIG_SELECTED_FROM_NODE_LABEL] = "node-label",
};
static const char *const kube_credentials_names[_KUBE_CREDENTIALS_MAX + 1] = {
        [KUBE_CREDENTIALS_KUBECONFIG] = "kubeconfig",
        [KUBE_CREDENTIALS_IN_CLUSTER] = "in-cluster",
};

/* Bit i is the CdiDeviceNames value 1 << i. */
static const char *const cdi_device_names[] = { "index", "uuid", "type-index", NULL };
_Static_assert(CDI_NAMES_INDEX == 1 << 0 && CDI_NAMES_UUID == 1 << 1 && CDI_NAMES_TYPE_INDEX == 1 << 2,
               "cdi_device_names[] follows CdiDeviceNames");

static const char *const sharing_strategy_names[_SHARING_STRATEGY_MAX + 1] = {
        [SHARING_NONE] = "none",
        [SHARING_TIME_SLICING] = "time-slicing",
        [SHARING_MPS] = "mps",
};

DEFINE_STRING_TABLE_LOOKUP_TO_STRING(mig_strategy, MigStrategy, mig_strategy_names, _MIG_STRATEGY_MAX)
DEFINE_STRING_TABLE_LOOKUP_TO_STRING(sharing_strategy, SharingStrategy, sharing_strategy_names, _SHARING_STRATEGY_MAX)

#define CONFIG_OFF(field) offsetof(Config, field)

/* One line per key. Sections must stay together (config_dump prints them in this order), and a key
 * derived from another path must come after it (paths.etc before labels.directory).
 *
 * .remote = true lets the remote document (config.remote) set the key: policy only — what the GPUs are
 * made into and how they are shared, labelled and watched, the driver version and when to upgrade to
 * it, which consumer outputs are on, timing and logging. Every other key is refused there, the
 * document as a whole with it: anything that names a program, a shared object, a command line, a unit,
 * a file or a directory, where the configuration comes from, and how the node's kernel modules and
 * services are set up. A new row without .remote is refused from the network until someone decides. */
static const ConfigKey config_keys[] = {
        { "paths.root",       CONFIG_PATH,      CONFIG_OFF(paths.root),     "/" },
        { "paths.sys",        CONFIG_PATH,      CONFIG_OFF(paths.sys),      "sys",              BASE_ROOT },
        { "paths.proc",       CONFIG_PATH,      CONFIG_OFF(paths.proc),     "proc",             BASE_ROOT },
        { "paths.dev",        CONFIG_PATH,      CONFIG_OFF(paths.dev),      "dev",              BASE_ROOT },
        { "paths.modules",    CONFIG_PATH,      CONFIG_OFF(paths.modules),  "lib/modules",      BASE_ROOT },
        { "paths.etc",        CONFIG_PATH,      CONFIG_OFF(paths.etc),      "etc",              BASE_ROOT },
        { "paths.run",        CONFIG_PATH,      CONFIG_OFF(paths.run),      "run",              BASE_ROOT },
        { "paths.state",      CONFIG_PATH,      CONFIG_OFF(paths.state),    "var/lib/gpu-node-agent", BASE_ROOT },
        { "paths.pci-ids",    CONFIG_PATH,      CONFIG_OFF(paths.pci_ids),  "" },
        { "nvml.library",     CONFIG_LIBRARY,   CONFIG_OFF(nvml.library),   "libnvidia-ml.so.1", .local = LOCAL_LIBRARY },
        { "nvml.timeout",     CONFIG_DURATION,  CONFIG_OFF(nvml.timeout_usec), "30s", .remote = true },
        { "labels.enabled",   CONFIG_BOOL,      CONFIG_OFF(labels.enabled), "true", .remote = true },
        { "labels.directory", CONFIG_PATH,      CONFIG_OFF(labels.directory),
          "kubernetes/node-feature-discovery/features.d", BASE_ETC },
        { "labels.file",      CONFIG_FILE_NAME, CONFIG_OFF(labels.file),    "gpu-node-agent", .local = LOCAL_PATH },
        { "labels.expiry",    CONFIG_DURATION,  CONFIG_OFF(labels.expiry_usec), "0", .remote = true },
        { "labels.mig-strategy", CONFIG_ENUM,   CONFIG_OFF(labels.mig_strategy), "none", .values = mig_strategy_names,
          .remote = true },
        { "labels.timestamp", CONFIG_BOOL,      CONFIG_OFF(labels.timestamp), "false", .remote = true },
        { "sharing.strategy", CONFIG_ENUM,      CONFIG_OFF(sharing.strategy), "none", .values = sharing_strategy_names,
          .remote = true },
        { "sharing.replicas", CONFIG_UINT,      CONFIG_OFF(sharing.replicas), "1", .remote = true },
        { "sharing.rename-by-default", CONFIG_BOOL, CONFIG_OFF(sharing.rename_by_default), "false", .remote = true },
        { "driver.enabled",   CONFIG_BOOL,      CONFIG_OFF(driver.enabled), "true", .local = LOCAL_NODE },
        { "driver.version",   CONFIG_STRING,    CONFIG_OFF(driver.version), "", .remote = true },
        { "driver.modeset",   CONFIG_BOOL,      CONFIG_OFF(driver.modeset), "false", .local = LOCAL_NODE },
        { "driver.peermem",   CONFIG_ENUM,      CONFIG_OFF(driver.peermem), "auto", .values = auto_off_names,
          .local = LOCAL_NODE },
        { "driver.parameters.nvidia", CONFIG_STRING, CONFIG_OFF(driver.parameters[DRIVER_MODULE_NVIDIA]), "",
          .local = LOCAL_ARGUMENTS },
        { "driver.parameters.nvidia-uvm", CONFIG_STRING, CONFIG_OFF(driver.parameters[DRIVER_MODULE_UVM]), "",
          .local = LOCAL_ARGUMENTS },
        { "driver.parameters.nvidia-modeset", CONFIG_STRING, CONFIG_OFF(driver.parameters[DRIVER_MODULE_MODESET]), "",
          .local = LOCAL_ARGUMENTS },
        { "driver.parameters.nvidia-peermem", CONFIG_STRING, CONFIG_OFF(driver.parameters[DRIVER_MODULE_PEERMEM]), "",
          .local = LOCAL_ARGUMENTS },
        { "driver.dkms.enabled", CONFIG_BOOL,   CONFIG_OFF(driver.dkms_enabled), "true", .local = LOCAL_NODE },
        { "driver.dkms.program", CONFIG_LIBRARY, CONFIG_OFF(driver.dkms_program), "dkms", .local = LOCAL_PROGRAM },
        { "driver.dkms.module", CONFIG_STRING,  CONFIG_OFF(driver.dkms_module), "", .local = LOCAL_ARGUMENTS },
        { "driver.dkms.timeout", CONFIG_DURATION, CONFIG_OFF(driver.dkms_timeout_usec), "30min", .remote = true },
        { "driver.reload-on-mismatch", CONFIG_ENUM, CONFIG_OFF(driver.reload_on_mismatch), "never",
          .values = reload_on_mismatch_names, .remote = true },
        { "driver.kernel-module-type", CONFIG_ENUM, CONFIG_OFF(driver.kernel_module_type), "auto",
          .values = kernel_module_type_names, .local = LOCAL_NODE },
        { "devices.enabled",  CONFIG_BOOL,      CONFIG_OFF(devices.enabled), "true", .local = LOCAL_NODE },
        { "fabric.persistenced", CONFIG_ENUM,   CONFIG_OFF(fabric.persistenced), "auto", .values = auto_off_names,
          .local = LOCAL_NODE },
        { "fabric.fabricmanager", CONFIG_ENUM,  CONFIG_OFF(fabric.fabricmanager), "auto", .values = auto_off_names,
          .local = LOCAL_NODE },
        { "fabric.timeout",   CONFIG_DURATION,  CONFIG_OFF(fabric.timeout_usec), "2min", .remote = true },
        { "fabric.imex",      CONFIG_ENUM,      CONFIG_OFF(fabric.imex),    "auto", .values = auto_off_names,
          .remote = true },
        { "fabric.imex-channels", CONFIG_UINT,  CONFIG_OFF(fabric.imex_channels), "1", .remote = true },
        { "mig.config-file",  CONFIG_PATH,      CONFIG_OFF(mig.config_file), "gpu-node-agent/mig-config.yaml", BASE_ETC },
        { "mig.selected",     CONFIG_STRING,    CONFIG_OFF(mig.selected),   "", .remote = true },
        { "mig.reset",        CONFIG_ENUM,      CONFIG_OFF(mig.reset),      "auto", .values = mig_reset_names,
          .remote = true },
        { "mig.hooks.stop-units", CONFIG_UNITS, CONFIG_OFF(mig.stop_units), "", .local = LOCAL_UNITS },
        { "mig.selected-from", CONFIG_ENUM,     CONFIG_OFF(mig.selected_from), "config", .values = mig_selected_from_names,
          .local = LOCAL_SOURCE },
        { "cdi.enabled",      CONFIG_BOOL,      CONFIG_OFF(cdi.enabled),    "true", .remote = true },
        { "cdi.spec",         CONFIG_PATH,      CONFIG_OFF(cdi.spec),       "cdi/nvidia.yaml",  BASE_RUN },
        { "cdi.driver-root",  CONFIG_PATH,      CONFIG_OFF(cdi.driver_root), "",                BASE_ROOT },
        { "cdi.imex-spec",    CONFIG_PATH,      CONFIG_OFF(cdi.imex_spec),  "cdi/nvidia-imex-channel.yaml", BASE_RUN },
        { "cdi.device-name-strategy", CONFIG_FLAGS, CONFIG_OFF(cdi.device_names), "index,uuid", .values = cdi_device_names,
          .remote = true },
        { "gres.slurm.enabled", CONFIG_BOOL,    CONFIG_OFF(gres.slurm_enabled), "false", .remote = true },
        { "gres.slurm.file",  CONFIG_PATH,      CONFIG_OFF(gres.slurm_file), "slurm/gres-gpu-node-agent.conf", BASE_ETC },
        { "validations.operator-compat", CONFIG_BOOL, CONFIG_OFF(validations.operator_compat), "false", .remote = true },
        { "validations.directory", CONFIG_PATH, CONFIG_OFF(validations.directory), "nvidia/validations", BASE_RUN },
        { "probe.expect-gpus", CONFIG_UINT,     CONFIG_OFF(probe.expect_gpus), "0", .remote = true },
        { "health.enabled",   CONFIG_BOOL,      CONFIG_OFF(health.enabled), "true", .remote = true },
        { "health.xid.ignore", CONFIG_XIDS,     CONFIG_OFF(health.xid_ignore), "", .remote = true },
        { "health.xid.fatal", CONFIG_XIDS,      CONFIG_OFF(health.xid_fatal), "", .remote = true },
        { "health.on-unhealthy", CONFIG_STRING, CONFIG_OFF(health.on_unhealthy), "", .local = LOCAL_COMMAND },
        { "health.recheck-delay", CONFIG_DURATION, CONFIG_OFF(health.recheck_delay_usec), "10s", .remote = true },
        { "metrics.textfile", CONFIG_STRING,   CONFIG_OFF(metrics.textfile), "", .local = LOCAL_PATH },
        { "engine.retry-min", CONFIG_DURATION,  CONFIG_OFF(engine.retry_min_usec), "1s", .remote = true },
        { "engine.retry-max", CONFIG_DURATION,  CONFIG_OFF(engine.retry_max_usec), "5min", .remote = true },
        { "log.level",        CONFIG_ENUM,      CONFIG_OFF(log_level),      "info", .values = log_level_names,
          .remote = true },
        { "kubernetes.node-name", CONFIG_STRING, CONFIG_OFF(kubernetes.node_name), "", .local = LOCAL_IDENTITY },
        { "kubernetes.kubeconfig", CONFIG_PATH, CONFIG_OFF(kubernetes.kubeconfig), "kubernetes/kubelet.conf", BASE_ETC },
        { "kubernetes.credentials", CONFIG_ENUM, CONFIG_OFF(kubernetes.credentials), "kubeconfig", .values = kube_credentials_names,
          .local = LOCAL_SOURCE },
        { "kubernetes.service-account-dir", CONFIG_PATH, CONFIG_OFF(kubernetes.service_account_dir),
          "/var/run/secrets/kubernetes.io/serviceaccount", .local = LOCAL_PATH },
        { "config.remote.url", CONFIG_STRING,   CONFIG_OFF(remote.url),     "", .local = LOCAL_SOURCE },
        { "config.remote.ca-file", CONFIG_STRING, CONFIG_OFF(remote.ca_file), "", .local = LOCAL_PATH },
        { "config.remote.cert", CONFIG_STRING,  CONFIG_OFF(remote.cert),    "", .local = LOCAL_PATH },
        { "config.remote.key", CONFIG_STRING,   CONFIG_OFF(remote.key),     "", .local = LOCAL_PATH },
        { "config.remote.signing-key", CONFIG_PATH, CONFIG_OFF(remote.signing_key), "" },
        { "config.remote.signature-url", CONFIG_STRING, CONFIG_OFF(remote.signature_url), "", .local = LOCAL_SOURCE },
        { "config.remote.interval", CONFIG_DURATION, CONFIG_OFF(remote.interval_usec), "5min", .local = LOCAL_SOURCE },
        { "config.remote.timeout", CONFIG_DURATION, CONFIG_OFF(remote.timeout_usec), "30s", .local = LOCAL_SOURCE },
};

static bool config_type_is_list(ConfigType t) {
        return t == CONFIG_UNITS || t == CONFIG_XIDS;
}

static bool config_type_is_string(ConfigType t) {
        return t == CONFIG_STRING || t == CONFIG_PATH || t == CONFIG_FILE_NAME || t == CONFIG_LIBRARY;
}

static void *config_field(const Config *c, const ConfigKey *k) {
        return (uint8_t *) c + k->offset;
}

static const ConfigKey *config_key_find(const char *path) {
        for (size_t i = 0; i < ELEMENTSOF(config_keys); i++)
                if (streq(config_keys[i].path, path))
                        return config_keys + i;
        return NULL;
}

/* Whether path names a section, i.e. a mapping that holds keys ("labels" for "labels.file"). */
static bool config_section_exists(const char *path) {
        size_t n = strlen(path);
        for (size_t i = 0; i < ELEMENTSOF(config_keys); i++)
                if (strncmp(config_keys[i].path, path, n) == 0 && config_keys[i].path[n] == '.')
                        return true;
        return false;
}

/* "paths, nvml, labels, engine, log": the keys directly below section (NULL: the top level). */
static char *config_section_keys(const char *section) {
        _cleanup_strv_free_ char **l = NULL;
        size_t n = section ? strlen(section) + 1 : 0;

        for (size_t i = 0; i < ELEMENTSOF(config_keys); i++) {
                const char *p = config_keys[i].path;
                if (section && !(strncmp(p, section, n - 1) == 0 && p[n - 1] == '.'))
                        continue;
                p += n;
                _cleanup_free_ char *name = strndup(p, strcspn(p, "."));
                if (!name)
                        return NULL;
                if (!strv_contains(l, name) && strv_consume(&l, TAKE_PTR(name)) < 0)
                        return NULL;
        }
        return strv_join(l, ", ");
}

static int parse_boolean(const char *s) {
        /* YAML 1.1 spellings, so "enabled: yes" means what its author meant. */
        static const char *const yes[] = { "true", "yes", "on" }, *const no[] = { "false", "no", "off" };
        for (size_t i = 0; i < ELEMENTSOF(yes); i++) {
                if (strcasecmp(s, yes[i]) == 0)
                        return 1;
                if (strcasecmp(s, no[i]) == 0)
                        return 0;
        }
        return -EINVAL;
}

/* Largest first: format_duration() picks the first that divides exactly. */
static const struct {
        const char *name;
        uint64_t usec;
} duration_units[] = {
        { "d", 86400 * USEC_PER_SEC },
        { "h", 3600 * USEC_PER_SEC },
        { "min", 60 * USEC_PER_SEC },
        { "s", USEC_PER_SEC },
        { "ms", USEC_PER_MSEC },
};

int config_parse_duration(const char *s, uint64_t *ret_usec) {
        uint64_t whole = 0, frac = 0, frac_div = 1, unit = USEC_PER_SEC;
        const char *p = s;

        if (!s || !isdigit((unsigned char) *p))
                return -EINVAL;
        for (; isdigit((unsigned char) *p); p++) {
                if (whole > (UINT64_MAX - 9) / 10)
                        return -ERANGE;
                whole = whole * 10 + (uint64_t) (*p - '0');
        }
        if (*p == '.') {
                p++;
                if (!isdigit((unsigned char) *p))
                        return -EINVAL;
                /* Digits below a microsecond of the largest unit cannot matter; they are dropped. */
                for (; isdigit((unsigned char) *p); p++)
                        if (frac_div < 1000000) {
                                frac = frac * 10 + (uint64_t) (*p - '0');
                                frac_div *= 10;
                        }
        }
        const char *u = p + strspn(p, " ");
        if (*u) {
                size_t i;
                for (i = 0; i < ELEMENTSOF(duration_units); i++)
                        if (streq(u, duration_units[i].name))
                                break;
                if (i >= ELEMENTSOF(duration_units))
                        return -EINVAL;
                unit = duration_units[i].usec;
        } else if (u != p)
                return -EINVAL;

        if (whole > UINT64_MAX / unit)
                return -ERANGE;
        uint64_t f = frac * unit / frac_div;
        if (whole * unit > UINT64_MAX - f)
                return -ERANGE;
        *ret_usec = whole * unit + f;
        return 0;
}

/* The largest unit that represents usec exactly, so that the text parses back to the same value. */
static void format_duration(uint64_t usec, char *buf, size_t size) {
        if (usec == 0) {
                snprintf(buf, size, "0");
                return;
        }
        for (size_t i = 0; i < ELEMENTSOF(duration_units); i++)
                if (usec % duration_units[i].usec == 0) {
                        snprintf(buf, size, "%" PRIu64 "%s", usec / duration_units[i].usec,
                                 duration_units[i].name);
                        return;
                }
        snprintf(buf, size, "%" PRIu64 ".%03" PRIu64, usec / USEC_PER_MSEC, usec % USEC_PER_MSEC);
        size_t n = strlen(buf);
        while (buf[n - 1] == '0')
                buf[--n] = 0;
        snprintf(buf + n, size - n, "ms");
}

/* Checks s for key k and, when c is set, stores it there. On a bad value returns -EINVAL and
 * *ret_msg says what was expected, without the location. */
static int value_parse(const ConfigKey *k, const char *s, Config *c, char **ret_msg) {
        void *dst = c ? config_field(c, k) : NULL;
        uint64_t u;
        int r;

        switch (k->type) {
        case CONFIG_STRING:
                break;
        case CONFIG_PATH:
                /* "" is "unset" for a path whose default is unset (paths.pci-ids), as --check-config prints it. */
                if (s[0] != '/' && !(isempty(s) && k->base == BASE_NONE && isempty(k->def)))
                        return config_yaml_set_error(ret_msg, -EINVAL,
                                                     "'%s' is not an absolute path; write it starting with '/'", s);
                break;
        case CONFIG_FILE_NAME:
                if (isempty(s) || strchr(s, '/') || s[0] == '.')
                        return config_yaml_set_error(ret_msg, -EINVAL,
                                                     "'%s' is not a plain file name; use a name without '/' that does "
                                                     "not start with '.' (such as gpu-node-agent)", s);
                break;
        case CONFIG_LIBRARY:
                if (isempty(s) || (strchr(s, '/') && s[0] != '/'))
                        return config_yaml_set_error(ret_msg, -EINVAL,
                                                     "'%s' is neither a library name (such as libnvidia-ml.so.1) "
                                                     "nor an absolute path", s);
                break;
        case CONFIG_BOOL:
                r = parse_boolean(s);
                if (r < 0)
                        return config_yaml_set_error(ret_msg, -EINVAL, "expected a boolean (true/false), got '%s'", s);
                if (dst)
                        *(bool *) dst = r;
                return 0;
        case CONFIG_DURATION:
                r = config_parse_duration(s, &u);
                if (r == -ERANGE)
                        return config_yaml_set_error(ret_msg, -EINVAL, "the duration '%s' is too large", s);
                if (r < 0)
                        return config_yaml_set_error(ret_msg, -EINVAL,
                                                     "expected a duration such as 90s, 5min or 1h (a number of "
                                                     "seconds or a number with one of the units ms, s, min, h, d), "
                                                     "got '%s'", s);
                if (dst)
                        *(uint64_t *) dst = u;
                return 0;
        case CONFIG_UINT: {
                char *end;
                errno = 0;
                unsigned long long v = isdigit((unsigned char) s[0]) ? strtoull(s, &end, 10) : 0;
                if (!isdigit((unsigned char) s[0]) || *end || errno != 0 || v > UINT_MAX)
                        return config_yaml_set_error(ret_msg, -EINVAL, "expected a whole number from 0 to %u, got '%s'",
                                                     UINT_MAX, s);
                if (dst)
                        *(unsigned *) dst = (unsigned) v;
                return 0;
        }
        case CONFIG_UNITS:
                /* One list item: a unit name as systemctl takes it, with its type suffix. */
                if (isempty(s) || strchr(s, '/') || !strchr(s, '.') || strlen(s) > 255)
                        return config_yaml_set_error(ret_msg, -EINVAL,
                                                     "'%s' is not a systemd unit name; write it with its type, "
                                                     "such as nvidia-dcgm.service", s);
                return 0;
        case CONFIG_FLAGS: {
                _cleanup_free_ char *copy = strdup(s), *list = strv_join((char *const *) k->values, ", ");
                unsigned bits = 0;
                bool twice = false;
                char *save = NULL;
                if (!copy || !list)
                        return -ENOMEM;
                for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                        size_t i = 0, n;
                        t += strspn(t, " \t");
                        for (n = strlen(t); n > 0 && strchr(" \t", t[n - 1]); n--)
                                t[n - 1] = 0;
                        while (k->values[i] && strcasecmp(t, k->values[i]) != 0)
                                i++;
                        twice = k->values[i] && (bits & (1u << i));
                        if (!k->values[i] || twice) {
                                bits = 0;
                                break;
                        }
                        bits |= 1u << i;
                }
                if (bits == 0)
                        return config_yaml_set_error(ret_msg, -EINVAL,
                                                     "expected one of %s, or several of them separated by commas "
                                                     "(such as %s,%s), got '%s'%s", list, k->values[0], k->values[1], s,
                                                     twice ? " (a name listed twice)" : "");
                if (dst)
                        *(unsigned *) dst = bits;
                return 0;
        }
        case CONFIG_XIDS: {
                /* One list item: an XID as NVIDIA's catalog numbers them. */
                char *end;
                errno = 0;
                unsigned long v = isdigit((unsigned char) s[0]) ? strtoul(s, &end, 10) : 0;
                if (!isdigit((unsigned char) s[0]) || s[0] == '0' || *end || errno != 0 || v > 65535)
                        return config_yaml_set_error(ret_msg, -EINVAL,
                                                     "'%s' is not an XID; write the number from NVIDIA's XID "
                                                     "catalog, such as 13 or 79", s);
                return 0;
        }
        case CONFIG_ENUM:
                for (size_t i = 0; k->values[i]; i++)
                        if (strcasecmp(s, k->values[i]) == 0) {
                                if (dst)
                                        *(int *) dst = (int) i;
                                return 0;
                        }
                _cleanup_free_ char *list = strv_join((char *const *) k->values, ", ");
                if (!list)
                        return -ENOMEM;
                return config_yaml_set_error(ret_msg, -EINVAL, "expected one of %s, got '%s'", list, s);
        }

        if (dst) {
                char *t = strdup(s);
                if (!t)
                        return -ENOMEM;
                free(*(char **) dst);
                *(char **) dst = t;
        }
        return 0;
}

/* A list key: a YAML sequence of scalars ([] for none) replaces the list whole. */
static int units_apply(const ConfigKey *k, const Node *item, const char *path, Config *c, char **error) {
        _cleanup_strv_free_ char **l = NULL;
        int r;

        if (item->type != NODE_SEQUENCE)
                return config_yaml_located_error(error, item->file, item->line, item->column,
                                                 "%s: expected a list such as %s, got %s", path,
                                                 k->type == CONFIG_XIDS ? "[13, 31, 43]"
                                                                        : "[nvidia-dcgm.service, kubelet.service]",
                                                 config_node_kind(item));
        for (size_t j = 0; j < item->n_items; j++) {
                const Node *e = item->items[j];
                _cleanup_free_ char *msg = NULL;

                if (e->type != NODE_SCALAR || e->null)
                        return config_yaml_located_error(error, e->file, e->line, e->column,
                                                         "%s: each item must be %s, got %s", path,
                                                         k->type == CONFIG_XIDS ? "an XID number" : "a unit name",
                                                         config_node_kind(e));
                r = value_parse(k, e->value, NULL, &msg);
                if (r == -EINVAL && msg)
                        return config_yaml_located_error(error, e->file, e->line, e->column, "%s: %s", path, msg);
                if (r < 0)
                        return r;
                if (strv_contains(l, e->value))
                        return config_yaml_located_error(error, e->file, e->line, e->column,
                                                         "%s: '%s' is listed twice", path, e->value);
                if (strv_extend(&l, e->value) < 0)
                        return -ENOMEM;
        }
        if (c) {
                char ***dst = config_field(c, k);
                strv_free(*dst);
                *dst = TAKE_PTR(l);
        }
        return 0;
}

/* Walks a mapping against the key table: unknown keys and values of the wrong type are errors that
 * name the file, line and column. With c NULL it only checks (each file on its own, before merging,
 * so a mistake is reported even when a later file overrides it); otherwise it also stores. */
static int tree_apply(const Node *n, const char *section, Config *c, char **error) {
        int r;

        for (size_t i = 0; n && i < n->n_items; i++) {
                const Node *item = n->items[i];
                _cleanup_free_ char *path = NULL, *msg = NULL;

                if (asprintf(&path, "%s%s%s", section ?: "", section ? "." : "", item->key) < 0)
                        return -ENOMEM;

                const ConfigKey *k = config_key_find(path);
                if (k && config_type_is_list(k->type)) {
                        if (item->null)
                                continue;
                        r = units_apply(k, item, path, c, error);
                        if (r < 0)
                                return r;
                        continue;
                }
                if (k) {
                        if (item->null)
                                continue; /* back to the default */
                        if (item->type != NODE_SCALAR)
                                return config_yaml_located_error(error, item->file, item->line, item->column,
                                                                 "%s: expected a single value, got %s", path,
                                                                 config_node_kind(item));
                        r = value_parse(k, item->value, c, &msg);
                        if (r == -EINVAL && msg)
                                return config_yaml_located_error(error, item->file, item->line, item->column,
                                                                 "%s: %s", path, msg);
                        if (r < 0)
                                return r;
                        continue;
                }
                if (config_section_exists(path)) {
                        if (item->null)
                                continue;
                        if (item->type != NODE_MAPPING)
                                return config_yaml_located_error(error, item->file, item->line, item->column,
                                                                 "%s: expected a mapping of keys (indented "
                                                                 "'key: value' lines below '%s:'), got %s", path,
                                                                 item->key, config_node_kind(item));
                        r = tree_apply(item, path, c, error);
                        if (r < 0)
                                return r;
                        continue;
                }

                _cleanup_free_ char *valid = config_section_keys(section);
                if (!valid)
                        return -ENOMEM;
                return config_yaml_located_error(error, item->file, item->key_line, item->key_column,
                                                 "unknown key '%s' (valid %s%s%s: %s)%s", path,
                                                 section ? "keys under '" : "top-level keys", section ?: "",
                                                 section ? "'" : "", valid,
                                                 streq(path, "serial") ? "; only the remote document "
                                                                         "(config.remote) carries a serial" : "");
        }
        return 0;
}

static int dir_error(const char *dir, char **error) {
        int r = negative_errno();
        return config_yaml_set_error(error, r, "%s: cannot read the drop-in directory: %s", dir, strerror(-r));
}

/* The *.yaml names found in any of the directories, each once, in lexical order. Missing directories
 * are fine; hidden files are editors' and package managers' temporaries. */
static int dropin_names(char *const *dirs, char ***ret, char **error) {
        _cleanup_strv_free_ char **names = NULL;

        STRV_FOREACH(dir, dirs) {
                _cleanup_closedir_ DIR *d = opendir(*dir);
                struct dirent *de;

                if (!d && errno == ENOENT)
                        continue;
                if (!d)
                        return dir_error(*dir, error);
                for (errno = 0; (de = readdir(d)); errno = 0) {
                        size_t len = strlen(de->d_name);

                        if (de->d_name[0] == '.' || len <= 5 || !streq(de->d_name + len - 5, ".yaml") ||
                            strv_contains(names, de->d_name))
                                continue;
                        if (strv_extend(&names, de->d_name) < 0)
                                return -ENOMEM;
                }
                if (errno != 0)
                        return dir_error(*dir, error);
        }
        strv_sort(names);
        *ret = TAKE_PTR(names);
        return 0;
}

static ConfigLocal config_key_local(const ConfigKey *k) {
        return k->local == LOCAL_UNREVIEWED && k->type == CONFIG_PATH ? LOCAL_PATH : k->local;
}

/* What a remote document sets that it may not: the first such key (where, and the key), and the names
 * of the others. A section set to null puts every key under it back to its default, so it sets those
 * keys too. Unknown keys and values of the wrong shape are left to tree_apply(). */
typedef struct Refusals {
        const Node *node;
        const ConfigKey *key;
        bool via_null;      /* node is a section set to null */
        char **others;
} Refusals;

static int refusal_add(Refusals *f, const Node *node, const ConfigKey *k, bool via_null) {
        if (!f->key) {
                *f = (Refusals) { .node = node, .key = k, .via_null = via_null, .others = f->others };
                return 0;
        }
        if (f->key == k || strv_contains(f->others, k->path))
                return 0;
        return strv_extend(&f->others, k->path);
}

static int remote_refusals(const Node *n, const char *section, Refusals *f) {
        int r;

        for (size_t i = 0; n && i < n->n_items; i++) {
                const Node *item = n->items[i];
                _cleanup_free_ char *path = NULL;

                if (asprintf(&path, "%s%s%s", section ?: "", section ? "." : "", item->key) < 0)
                        return -ENOMEM;
                const ConfigKey *k = config_key_find(path);
                if (k) {
                        r = k->remote ? 0 : refusal_add(f, item, k, false);
                        if (r < 0)
                                return r;
                        continue;
                }
                if (!config_section_exists(path) || (!item->null && item->type != NODE_MAPPING))
                        continue; /* unknown, or not a mapping: tree_apply() says so */
                if (item->null) {
                        size_t len = strlen(path);
                        for (size_t j = 0; j < ELEMENTSOF(config_keys); j++)
                                if (!config_keys[j].remote && strncmp(config_keys[j].path, path, len) == 0 &&
                                    config_keys[j].path[len] == '.') {
                                        r = refusal_add(f, item, config_keys + j, true);
                                        if (r < 0)
                                                return r;
                                }
                        continue;
                }
                r = remote_refusals(item, path, f);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Refuses a remote document that sets any key not marked .remote, naming the first with why, and the
 * others. The whole document goes: half a document is a configuration nobody wrote. */
static int remote_check(const Node *t, char **error) {
        _cleanup_free_ char *others = NULL;
        Refusals f = {};
        int r;

        r = remote_refusals(t, NULL, &f);
        if (r < 0 || !f.key) {
                strv_free(f.others);
                return r;
        }
        if (f.others) {
                _cleanup_free_ char *list = strv_join(f.others, ", ");
                if (!list || asprintf(&others, " (it also sets %s)", list) < 0) {
                        strv_free(f.others);
                        return -ENOMEM;
                }
        }
        strv_free(f.others);
        const char *why = config_local_reasons[config_key_local(f.key)].why;
        if (f.via_null)
                return config_yaml_located_error(error, f.node->file, f.node->key_line, f.node->key_column,
                                                 "%s: a null section puts %s back to its default, and the remote "
                                                 "configuration may not set that key: it %s; set it in a local "
                                                 "file such as /etc/gpu-node-agent/agent.yaml. The whole "
                                                 "document is refused%s", f.node->key, f.key->path, why,
                                                 others ?: "");
        return config_yaml_located_error(error, f.node->file, f.node->key_line, f.node->key_column,
                                         "%s: may not be set by the remote configuration: it %s; set it in a "
                                         "local file such as /etc/gpu-node-agent/agent.yaml. The whole document "
                                         "is refused%s", f.key->path, why, others ?: "");
}

/* The top-level "serial: N" of a remote document: its version, which a signature covers so that an
 * older document cannot be served again (manager-remote.c). */
static int serial_parse(const Node *n, uint64_t *ret, char **error) {
        char *end;

        if (n->type == NODE_SCALAR && !n->null && isdigit((unsigned char) n->value[0])) {
                errno = 0;
                unsigned long long v = strtoull(n->value, &end, 10);
                if (!*end && errno == 0) {
                        *ret = v;
                        return 0;
                }
        }
        return config_yaml_located_error(error, n->file, n->line, n->column,
                                         "serial: expected a whole number from 0 to %" PRIu64 " (the document's "
                                         "version, raised with every change, such as 2026120101), got %s",
                                         UINT64_MAX, n->type == NODE_SCALAR && !n->null ? n->value
                                                                                        : config_node_kind(n));
}

int config_remote_document_serial(const char *name, const char *data, size_t size, uint64_t *ret,
                                  char **ret_error) {
        _cleanup_(config_node_freep) Node *t = NULL, *s = NULL;
        int r;

        r = config_yaml_parse_file(name, data, size, ret_error, &t);
        if (r < 0)
                return r;
        s = config_node_take(t, "serial");
        if (!s)
                return -ENOENT;
        return serial_parse(s, ret, ret_error);
}

/* Parses and checks one document (name is its file or URL) and merges it into *tree. A remote
 * document may set only the keys marked .remote (remote_check()), and may carry a serial. */
static int load_data(const char *path, const char *data, size_t size, bool remote, char ***files, Node **tree,
                     char **error) {
        Node *t = NULL;
        int r;

        r = strv_extend(files, path);
        if (r < 0)
                return r;
        /* Nodes point at this copy, which lives as long as the Config (as an entry of its sources). */
        const char *name = (*files)[strv_length(*files) - 1];

        r = config_yaml_parse_file(name, data, size, error, &t);
        if (r < 0)
                return r;
        if (!t)
                return 0;
        if (remote) {
                _cleanup_(config_node_freep) Node *s = config_node_take(t, "serial");
                uint64_t serial;
                r = s ? serial_parse(s, &serial, error) : 0;
                if (r < 0) {
                        config_node_free(t);
                        return r;
                }
        }
        /* A key the remote document may not set is refused before its value is looked at: whatever
         * else is wrong with the document, that is what its author needs to know. */
        r = remote ? remote_check(t, error) : 0;
        if (r >= 0)
                r = tree_apply(t, NULL, NULL, error);
        if (r < 0) {
                config_node_free(t);
                return r;
        }
        return config_node_merge(tree, t);
}

/* Reads, parses and checks one file and merges it into *tree. */
static int load_file(const char *path, bool missing_ok, char ***files, Node **tree, char **error) {
        _cleanup_free_ char *data = NULL;
        size_t size;
        int r;

        r = read_full_file(path, CONFIG_FILE_MAX, &data, &size);
        if (r == -ENOENT && missing_ok)
                return 0;
        if (r == -EFBIG)
                return config_yaml_set_error(error, r,
                                             "%s: the file is larger than %u KiB; this is not a configuration file",
                                             path, CONFIG_FILE_MAX / 1024);
        if (r == -EBADFD)
                return config_yaml_set_error(error, r,
                                             "%s: not a regular file (a FIFO, socket or device); only regular "
                                             "files are read as configuration", path);
        if (r < 0)
                return config_yaml_set_error(error, r, "%s: cannot read the file: %s", path, strerror(-r));

        return load_data(path, data, size, false, files, tree, error);
}

/* /dev/null itself, whatever the name or link that leads to it, as systemd's null_or_empty(): any other
 * character device is not a mask (and is then refused as not a regular file). */
static bool is_dev_null(const struct stat *st) {
        return S_ISCHR(st->st_mode) && st->st_rdev == makedev(1, 3);
}

/* Loads each drop-in whose winning copy lies in dirs[first..last]: the copy in the last directory
 * that has the name masks the others, and a copy that links to /dev/null masks without adding. */
static int dropins_load(char *const *dirs, char *const *names, size_t first, size_t last, char ***files,
                        Node **tree, char **error) {
        STRV_FOREACH(name, names)
                for (size_t i = strv_length(dirs); i-- > 0;) {
                        _cleanup_free_ char *path = path_join(dirs[i], *name);
                        struct stat st;

                        if (!path)
                                return -ENOMEM;
                        if (lstat(path, &st) < 0)
                                continue;
                        if (i < first || i > last || (stat(path, &st) >= 0 && is_dev_null(&st)))
                                break;
                        int r = load_file(path, false, files, tree, error);
                        if (r < 0)
                                return r;
                        break;
                }
        return 0;
}

static int config_defaults(Config **ret) {
        Config *c = calloc(1, sizeof(Config));
        if (!c)
                return -ENOMEM;
        for (size_t i = 0; i < ELEMENTSOF(config_keys); i++) {
                const ConfigKey *k = config_keys + i;
                _cleanup_free_ char *msg = NULL;

                if (k->base != BASE_NONE || config_type_is_list(k->type))
                        continue; /* derived after merging, from the final root or etc; lists start empty */
                int r = value_parse(k, k->def, c, &msg);
                assert(r != -EINVAL);
                if (r < 0) {
                        config_free(c);
                        return r;
                }
        }
        *ret = c;
        return 0;
}

static int config_resolve(Config *c, const char *root) {
        if (root) {
                char *t = root[0] == '/' ? strdup(root) : NULL;
                if (root[0] != '/') {
                        _cleanup_free_ char *cwd = get_current_dir_name();
                        if (!cwd)
                                return negative_errno();
                        t = path_join(cwd, root);
                }
                if (!t)
                        return -ENOMEM;
                free(c->paths.root);
                c->paths.root = t;
        }
        for (size_t i = 0; i < ELEMENTSOF(config_keys); i++) {
                const ConfigKey *k = config_keys + i;
                char **p = config_field(c, k);

                if (k->base == BASE_NONE || *p)
                        continue;
                *p = path_join(k->base == BASE_ROOT  ? c->paths.root
                               : k->base == BASE_ETC ? c->paths.etc
                                                     : c->paths.run,
                               k->def);
                if (!*p)
                        return -ENOMEM;
        }

        return 0;
}

/* Checks that involve more than one key; the error points at the key a file set (the defaults are
 * consistent, so at least one of them was). */
static int config_verify(const Config *c, const Node *tree, char **error) {
        const Node *n = config_node_find(tree, "engine.retry-min");
        char min[32], max[32];

        if (!n || n->null)
                n = config_node_find(tree, "engine.retry-max");
        if (c->engine.retry_min_usec == 0) {
                assert(n);
                return config_yaml_located_error(error, n->file, n->line, n->column,
                                                 "engine.retry-min: must be greater than 0, or a failed stage would be "
                                                 "retried in a busy loop");
        }
        n = config_node_find(tree, "sharing.replicas");
        if (c->sharing.replicas == 0) {
                assert(n);
                return config_yaml_located_error(error, n->file, n->line, n->column,
                                                 "sharing.replicas: must be at least 1 (1 = no sharing)");
        }
        if (c->sharing.replicas > 1 && c->sharing.strategy == SHARING_NONE) {
                assert(n);
                return config_yaml_located_error(error, n->file, n->line, n->column,
                                                 "sharing.replicas is %u but sharing.strategy is none: set "
                                                 "sharing.strategy to time-slicing or mps", c->sharing.replicas);
        }
        n = config_node_find(tree, "metrics.textfile");
        if (!isempty(c->metrics.textfile) && (c->metrics.textfile[0] != '/' || strlen(c->metrics.textfile) < 6 ||
                                            !streq(c->metrics.textfile + strlen(c->metrics.textfile) - 5, ".prom")))
                return config_yaml_located_error(error, n->file, n->line, n->column,
                                                 "metrics.textfile: '%s' is not an absolute path ending in .prom; "
                                                 "node_exporter's textfile collector reads only *.prom files, e.g. "
                                                 "/var/lib/prometheus/node-exporter/gpu-node-agent.prom",
                                                 c->metrics.textfile);
        n = config_node_find(tree, "config.remote.timeout");
        if (c->remote.timeout_usec == 0) {
                assert(n);
                return config_yaml_located_error(error, n->file, n->line, n->column,
                                                 "config.remote.timeout: must be greater than 0, or a server that "
                                                 "never answers would hold the fetch forever");
        }
        n = config_node_find(tree, "config.remote.url");
        if (!isempty(c->remote.url) && !startswith(c->remote.url, "https://"))
                return config_yaml_located_error(error, n->file, n->line, n->column,
                                                 "config.remote.url: '%s' is not an https:// URL; the configuration "
                                                 "is only fetched over TLS", c->remote.url);
        if (!isempty(c->remote.url)) {
                _cleanup_free_ char *url = NULL, *bad = NULL;
                int r = config_remote_expand_url(c->remote.url, "h", "m", "p", &url, &bad);
                if (r == -EINVAL)
                        return config_yaml_located_error(error, n->file, n->line, n->column,
                                                         "config.remote.url: unknown placeholder %s; the placeholders "
                                                         "are {hostname}, {machine-id} and {product}", strna(bad));
                if (r < 0)
                        return r;
        }
        n = config_node_find(tree, "config.remote.signature-url");
        if (!isempty(c->remote.signature_url) && !startswith(c->remote.signature_url, "https://"))
                return config_yaml_located_error(error, n->file, n->line, n->column,
                                                 "config.remote.signature-url: '%s' is not an https:// URL",
                                                 c->remote.signature_url);
        if (!isempty(c->remote.signature_url)) {
                _cleanup_free_ char *url = NULL, *bad = NULL;
                int r = config_remote_expand_url(c->remote.signature_url, "h", "m", "p", &url, &bad);
                if (r == -EINVAL)
                        return config_yaml_located_error(error, n->file, n->line, n->column,
                                                         "config.remote.signature-url: unknown placeholder %s; "
                                                         "the placeholders are {hostname}, {machine-id} and "
                                                         "{product}", strna(bad));
                if (r < 0)
                        return r;
        }
        /* The key is read now, so that a missing or wrong file fails the load that names it rather than
         * every fetch after it. */
        n = config_node_find(tree, "config.remote.signing-key");
        if (!isempty(c->remote.signing_key)) {
                _cleanup_free_ char *msg = NULL;
                int r = config_signature_key_check(c->remote.signing_key, &msg);
                if (r == -ENOMEM)
                        return r;
                if (r < 0)
                        return config_yaml_located_error(error, n->file, n->line, n->column,
                                                         "config.remote.signing-key: %s", strna(msg));
        }
        static const char *const remote_files[] = { "config.remote.ca-file", "config.remote.cert",
                                                    "config.remote.key" };
        for (size_t i = 0; i < ELEMENTSOF(remote_files); i++) {
                n = config_node_find(tree, remote_files[i]);
                if (n && !n->null && n->value && !isempty(n->value) && n->value[0] != '/')
                        return config_yaml_located_error(error, n->file, n->line, n->column,
                                                         "%s: '%s' is not an absolute path; write it starting "
                                                         "with '/'", remote_files[i], n->value);
        }
        if (isempty(c->remote.cert) != isempty(c->remote.key)) {
                n = config_node_find(tree, isempty(c->remote.cert) ? "config.remote.key" : "config.remote.cert");
                assert(n);
                return config_yaml_located_error(error, n->file, n->line, n->column,
                                                 "config.remote.cert and config.remote.key go together: set "
                                                 "both for mutual TLS, or neither");
        }
        n = config_node_find(tree, "engine.retry-min");
        if (!n || n->null)
                n = config_node_find(tree, "engine.retry-max");
        if (c->engine.retry_min_usec > c->engine.retry_max_usec) {
                assert(n);
                format_duration(c->engine.retry_min_usec, min, sizeof(min));
                format_duration(c->engine.retry_max_usec, max, sizeof(max));
                return config_yaml_located_error(error, n->file, n->line, n->column,
                                                 "engine.retry-min (%s) must not be larger than engine.retry-max "
                                                 "(%s)", min, max);
        }
        return 0;
}

DEFINE_CLEANUP_FUNC(Config *, config_free);

static int config_load_internal(const ConfigLoadOptions *o, Config **ret, char **error) {
        static const ConfigLoadOptions no_options = {};
        _cleanup_free_ char *main_file = NULL;
        _cleanup_strv_free_ char **dirs = NULL, **names = NULL, **files = NULL;
        _cleanup_(config_node_freep) Node *tree = NULL;
        _cleanup_(config_freep) Config *c = NULL;
        const char *root;
        int r;

        o = o ?: &no_options;
        root = o->root ?: "/";
        main_file = o->main_file ? strdup(o->main_file) : path_join(root, "etc/gpu-node-agent/agent.yaml");
        if (!main_file)
                return -ENOMEM;
        if (o->dropin_dirs)
                dirs = strv_copy(o->dropin_dirs);
        else {
                r = strv_consume(&dirs, path_join(root, "usr/lib/gpu-node-agent/conf.d"));
                if (r >= 0)
                        r = strv_consume(&dirs, path_join(root, "etc/gpu-node-agent/conf.d"));
                if (r < 0)
                        return r;
        }
        if (!dirs)
                return -ENOMEM;

        r = dropin_names(dirs, &names, error);
        if (r < 0)
                return r;
        /* Every directory but the last holds vendor defaults that agent.yaml overrides; the last one is
         * the administrator's and overrides agent.yaml. */
        size_t n_dirs = strv_length(dirs);
        if (n_dirs > 1) {
                r = dropins_load(dirs, names, 0, n_dirs - 2, &files, &tree, error);
                if (r < 0)
                        return r;
        }
        /* The default agent.yaml is optional; a file named with --config is not: running on the
         * defaults because of a typo in a path would surprise whoever wrote that file. */
        r = load_file(main_file, !o->main_file, &files, &tree, error);
        if (r < 0)
                return r;
        if (o->remote_data) {
                if (o->remote_size > CONFIG_FILE_MAX)
                        return config_yaml_set_error(error, -EFBIG,
                                                     "%s: the document is larger than %u KiB; this is not a "
                                                     "configuration file", o->remote_name, CONFIG_FILE_MAX / 1024);
                r = load_data(o->remote_name, o->remote_data, o->remote_size, true, &files, &tree, error);
                if (r < 0)
                        return r;
        }
        if (n_dirs > 0) {
                r = dropins_load(dirs, names, n_dirs - 1, n_dirs - 1, &files, &tree, error);
                if (r < 0)
                        return r;
        }

        r = config_defaults(&c);
        if (r < 0)
                return r;
        r = tree_apply(tree, NULL, c, error);
        if (r < 0)
                return r;
        r = config_resolve(c, o->root);
        if (r < 0)
                return r;
        r = o->partial ? 0 : config_verify(c, tree, error);
        if (r < 0)
                return r;
        if (!files && !(files = calloc(1, sizeof(char *))))
                return -ENOMEM;
        c->sources = TAKE_PTR(files);
        *ret = TAKE_PTR(c);
        return 0;
}

int config_load_defaults(const char *root, Config **ret) {
        _cleanup_(config_freep) Config *c = NULL;
        int r;

        r = config_defaults(&c);
        if (r < 0)
                return r;
        r = config_resolve(c, root);
        if (r < 0)
                return r;
        if (!(c->sources = calloc(1, sizeof(char *))))
                return -ENOMEM;
        *ret = TAKE_PTR(c);
        return 0;
}

int config_load(const ConfigLoadOptions *o, Config **ret, char **ret_error) {
        _cleanup_free_ char *error = NULL;
        int r;

        assert(ret);
        r = config_load_internal(o, ret, &error);
        if (r < 0 && !error && asprintf(&error, "Failed to load the configuration: %s", strerror(-r)) < 0)
                error = NULL;
        if (ret_error)
                *ret_error = r < 0 ? TAKE_PTR(error) : NULL;
        return r;
}

Config *config_free(Config *c) {
        if (!c)
                return NULL;
        for (size_t i = 0; i < ELEMENTSOF(config_keys); i++)
                if (config_type_is_string(config_keys[i].type))
                        free(*(char **) config_field(c, config_keys + i));
                else if (config_type_is_list(config_keys[i].type))
                        strv_free(*(char ***) config_field(c, config_keys + i));
        strv_free(c->sources);
        free(c);
        return NULL;
}

int config_keys_dump(FILE *f) {
        for (size_t i = 0; i < ELEMENTSOF(config_keys); i++) {
                const ConfigKey *k = config_keys + i;
                static const char *const base[] = { [BASE_ROOT] = "<root>", [BASE_ETC] = "<etc>", [BASE_RUN] = "<run>" };

                fprintf(f, "%s\t", k->path);
                if (k->base != BASE_NONE)
                        fprintf(f, "%s%s%s", base[k->base], isempty(k->def) ? "" : "/", k->def);
                else if (config_type_is_list(k->type) && isempty(k->def))
                        fputs("[]", f);
                else
                        fputs(k->def, f);
                if (k->remote)
                        fputs("\tyes\n", f);
                else
                        fprintf(f, "\tno (%s)\n", config_local_reasons[config_key_local(k)].tag);
        }
        return fflush(f) == 0 && !ferror(f) ? 0 : -EIO;
}

/* Prints s so that YAML reads back exactly s: plain when that is unambiguous, else double-quoted. */
static void dump_string(const char *s, FILE *f) {
        static const char *const special[] = { "~", "null", "true", "false", "yes", "no", "on", "off", "y", "n" };
        bool plain = !isempty(s) && (isalnum((unsigned char) s[0]) || s[0] == '/');

        for (const char *p = s; plain && *p; p++)
                plain = isalnum((unsigned char) *p) || strchr("/._+-@", *p);
        for (size_t i = 0; plain && i < ELEMENTSOF(special); i++)
                plain = strcasecmp(s, special[i]) != 0;
        if (plain) {
                fputs(s, f);
                return;
        }
        fputc('"', f);
        for (const unsigned char *p = (const unsigned char *) s; *p; p++)
                if (*p == '"' || *p == '\\')
                        fprintf(f, "\\%c", *p);
                else if (*p < 0x20 || *p == 0x7f)
                        fprintf(f, "\\x%02x", *p);
                else
                        fputc(*p, f);
        fputc('"', f);
}

int config_dump(const Config *c, FILE *f) {
        const char *prev = NULL;

        fputs("# gpu-node-agent configuration, merged and resolved (see gpu-node-agent.yaml(5))\n", f);
        if (strv_length(c->sources) == 0)
                fputs("# sources: none, built-in defaults only\n", f);
        else
                fputs("# sources:\n", f);
        STRV_FOREACH(s, c->sources) {
                fputs("#   ", f);
                for (const char *p = *s; *p; p++)
                        fputc((unsigned char) *p < 0x20 ? '?' : *p, f);
                fputc('\n', f);
        }

        for (size_t i = 0; i < ELEMENTSOF(config_keys); i++) {
                const ConfigKey *k = config_keys + i;
                const void *v = config_field(c, k);
                const char *p = k->path, *q = prev;
                unsigned depth = 0;
                char buf[64];

                /* Skip the sections this key shares with the previous one, open the others. */
                for (const char *dot; q && (dot = strchr(p, '.')) && strncmp(p, q, (size_t) (dot - p) + 1) == 0;
                     depth++) {
                        q += dot + 1 - p;
                        p = dot + 1;
                }
                for (const char *dot; (dot = strchr(p, '.')); p = dot + 1, depth++) {
                        if (depth == 0)
                                fputc('\n', f);
                        fprintf(f, "%*s%.*s:\n", (int) depth * 2, "", (int) (dot - p), p);
                }
                fprintf(f, "%*s%s: ", (int) depth * 2, "", p);
                prev = k->path;

                switch (k->type) {
                case CONFIG_STRING:
                case CONFIG_PATH:
                case CONFIG_FILE_NAME:
                case CONFIG_LIBRARY:
                        dump_string(*(char *const *) v, f);
                        break;
                case CONFIG_BOOL:
                        fputs(*(const bool *) v ? "true" : "false", f);
                        break;
                case CONFIG_DURATION:
                        format_duration(*(const uint64_t *) v, buf, sizeof(buf));
                        fputs(buf, f);
                        break;
                case CONFIG_UINT:
                        fprintf(f, "%u", *(const unsigned *) v);
                        break;
                case CONFIG_ENUM:
                        fputs(k->values[*(const int *) v], f);
                        break;
                case CONFIG_FLAGS:
                        for (unsigned b = 0, first = 1; k->values[b]; b++)
                                if (*(const unsigned *) v & (1u << b)) {
                                        fprintf(f, "%s%s", first ? "" : ",", k->values[b]);
                                        first = 0;
                                }
                        break;
                case CONFIG_UNITS:
                case CONFIG_XIDS:
                        fputc('[', f);
                        STRV_FOREACH(u, *(char **const *) v) {
                                if (u != *(char **const *) v)
                                        fputs(", ", f);
                                dump_string(*u, f);
                        }
                        fputc(']', f);
                        break;
                }
                fputc('\n', f);
        }
        return fflush(f) == 0 && !ferror(f) ? 0 : -EIO;
}
